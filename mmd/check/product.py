"""The float64 product an output is checked against: made by numpy's BLAS a block of rows at a time
beside the output's rows, or whole by a float64 GEMM elsewhere (a GPU's).

:func:`reference` is A·B whole; :func:`product` gives a :class:`Float64Product`, whose :meth:`Float64Product.pairs`
hands out (first row, the output's rows, the same rows of A·B) block by block, as the full check
(:mod:`mmd.check.full`) reads them. The output's side is a :class:`Rows`: one held whole
(:class:`WholeRows`), or one parsed a block at a time (:class:`mmd.textcore.RowBlocks`).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from threadpoolctl import ThreadpoolController

from ..cpus import block_rows, usable_cores, worker_rows
from ..textformat import values_array

#: A float64 GEMM: ``gemm(a, b)`` returns a·b for float64 a (m×k) and b (k×n).
Gemm = Callable[[np.ndarray, np.ndarray], np.ndarray]


def reference(a: np.ndarray, b: np.ndarray, gemm: Gemm | None = None) -> np.ndarray:
    """A·B in float64: numpy's BLAS on the CPU, or ``gemm`` (a float64 GEMM elsewhere) when given."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
        raise ValueError(f"cannot multiply {a64.shape} by {b64.shape}")
    ref = np.matmul(a64, b64) if gemm is None else np.asarray(gemm(a64, b64), dtype=np.float64)
    if ref.shape != (a64.shape[0], b64.shape[1]):
        raise ValueError(f"the GEMM gave shape {ref.shape} for {a64.shape} by {b64.shape}")
    return ref


class Rows(Protocol):
    """An output's values (float64), a block of rows at a time, as :meth:`Float64Product.pairs` reads them:
    from several threads at once, each block into a buffer of its own."""

    @property
    def shape(self) -> tuple[int, int]: ...

    def read(self, r0: int, into: np.ndarray) -> np.ndarray:
        """Rows r0.. of the output, as many as ``into`` (a C-contiguous float64 block) has: in ``into``,
        or a view of them held elsewhere. Raises the output's InputFormatError."""
        ...


@dataclass(frozen=True)
class WholeRows:
    """An output's values already held whole (read ahead, or beside a product made elsewhere)."""

    values: np.ndarray

    @classmethod
    def of(cls, out: np.ndarray) -> WholeRows:
        return cls(np.ascontiguousarray(out, dtype=np.float64))

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.values.shape[0]), int(self.values.shape[1])

    def read(self, r0: int, into: np.ndarray) -> np.ndarray:
        return self.values[r0 : r0 + into.shape[0]]


class _OneBlasThread:
    """numpy's BLAS on one thread while any :meth:`Float64Product.pairs` runs (several at once in a folder's
    checks): its workers run a product block each, one per core. A BLAS of several threads beside
    them would spin its idle threads after every call and stall its busy ones behind the workers'
    reads (docs/grading.md, "Speed", times ``mmd check`` as it runs with this). threadpoolctl finds
    numpy's BLAS library and sets its threads; OpenBLAS's pool is the process's, and threadpoolctl
    lets one thread at a time set it (another's calls do nothing), so every limit here is set and
    lifted on one thread of this class's own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._limits = contextlib.ExitStack()
        self._controller: ThreadpoolController | None = None
        self._setter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmd-blas-threads")

    def _limit(self) -> None:
        if self._controller is None:  # the libraries numpy has loaded by now
            self._controller = ThreadpoolController()
        self._limits.enter_context(self._controller.limit(limits=1, user_api="blas"))

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._setter.submit(self._limit).result()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._setter.submit(self._limits.close).result()


_ONE_BLAS_THREAD = _OneBlasThread()


@dataclass(frozen=True)
class Float64Product:
    """A and B in float64, and their product A·B: whole where a GEMM elsewhere made it (``ref``,
    a GPU's, say), else made by numpy's BLAS a block of rows at a time beside the output's rows
    (:meth:`pairs`)."""

    a64: np.ndarray
    b64: np.ndarray
    ref: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.a64.shape[0]), int(self.b64.shape[1])

    def pairs(self, rows: Rows) -> Generator[tuple[int, np.ndarray, np.ndarray]]:
        """(r0, the output's rows r0.., the same rows of A·B) for consecutive blocks of rows, in order.
        A block's arrays are used again for a later block once the next one is asked for: copy what
        must outlive a step.

        Made here, the product never exists whole, and neither does the output where ``rows`` reads
        it a block at a time: each of :func:`mmd.cpus.usable_cores` workers reads a block of the
        output's rows and makes the same rows of the product (BLAS on one thread,
        :class:`_OneBlasThread`), into buffers of its own used again block to block, while the
        caller checks the blocks before. A whole output's matrix of fresh pages is never touched:
        faulting them in would cost system time on every check of a large output (docs/grading.md,
        "Speed", has the check's times).
        """
        m, n = self.shape
        if self.ref is not None:
            step = block_rows(n)
            into = values_array(min(step, m) * n, np.float64).reshape(min(step, m), n)
            for r0 in range(0, m, step):
                r1 = min(m, r0 + step)
                yield r0, rows.read(r0, into[: r1 - r0]), self.ref[r0:r1]
            return
        step = worker_rows(m, n)
        starts = range(0, m, step)
        workers = min(len(starts), usable_cores())
        if not workers:  # no rows
            return

        def buffer() -> np.ndarray:
            return values_array(min(step, m) * n, np.float64).reshape(min(step, m), n)

        # a pair per worker (the output's rows, the product's): block i takes pair i % workers, which
        # block i - workers left once it was checked
        buffers = [(buffer(), buffer()) for _ in range(workers)]

        def block(i: int) -> tuple[int, np.ndarray, np.ndarray]:
            r0 = starts[i]
            r1 = min(m, r0 + step)
            out_buf, ref_buf = buffers[i % workers]
            got = rows.read(r0, out_buf[: r1 - r0])
            return r0, got, np.matmul(self.a64[r0:r1], self.b64, out=ref_buf[: r1 - r0])

        with _ONE_BLAS_THREAD.held(), ThreadPoolExecutor(max_workers=workers) as pool:
            pending: deque[Future[tuple[int, np.ndarray, np.ndarray]]] = deque(
                pool.submit(block, i) for i in range(workers)
            )
            for i in range(len(starts)):
                yield pending.popleft().result()
                if i + workers < len(starts):  # block i is checked: its buffers are free
                    pending.append(pool.submit(block, i + workers))


def product(a: np.ndarray, b: np.ndarray, gemm: Gemm | None = None) -> Float64Product:
    """:class:`Float64Product` of ``a`` and ``b``: ``gemm``'s whole product (:func:`reference`) when one is
    given, else one made in blocks as the check reads it. Arrays already float64 are not copied
    (mmd.check.jobs parses inputs so)."""
    with ThreadPoolExecutor(max_workers=2) as pool:  # two big conversions where needed, one per core
        a64, b64 = pool.map(lambda x: np.asarray(x, dtype=np.float64), (a, b))
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
        raise ValueError(f"cannot multiply {a64.shape} by {b64.shape}")
    return Float64Product(a64, b64, None if gemm is None else reference(a64, b64, gemm))
