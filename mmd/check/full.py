"""Checking results: an output's values against a float64 product, or against another output.

The default tolerance follows :mod:`mmd.check.tolerance`'s model of printed fp32
results, so a correct fp32 result passes and a wrong one (a missing term, a
swapped index) does not.

Three checks:

* :func:`against_inputs`, the full check: every element against the float64
  product :func:`reference` (numpy's BLAS, or a ``gemm`` provider such as a
  float64 GEMM on a GPU). The tolerance needs |A|·|B| only where cheap
  bounds on it cannot decide an element, so a correct result costs one
  float64 product, not two.
* :func:`quick`, Freivalds' check in its Gaussian form (:mod:`mmd.check.quick`,
  which holds the method and its verdict; here are its numpy entry points and
  its passes where the C ones are not built): C and A·B projected onto a few
  random Gaussian vectors, from both sides, in O(n²). It refuses, with a
  false-alarm chance of at most ``false_alarm``, anything that moves a
  projection beyond a bound derived from the same tolerance; it cannot see
  one element off by a little.
* :func:`against_output`: one output against another, elementwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from array import array
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

import numpy as np
from threadpoolctl import ThreadpoolController

from .. import accel
from ..cpus import block_rows, usable_cores, worker_rows
from ..textformat import values_array
from . import compare, quick
from .compare import CheckReport, Tally, nan_max, same_values, summed_report
from .tolerance import (
    FACTOR,
    PRINT_HALF_UNIT,
    U64,
    fp32_factor,
    model_factor,
    tolerance_of,
)
from .tolerance import TF32_OPERAND_ERROR as TF32_OPERAND_ERROR  # the bench and tests read them here
from .tolerance import TOLERANCES as TOLERANCES

#: A float64 GEMM: ``gemm(a, b)`` returns a·b for float64 a (m×k) and b (k×n).
Gemm = Callable[[np.ndarray, np.ndarray], np.ndarray]

#: Columns of A (rows of B) summed for the cheap lower bound of |A|·|B|.
_LOWER_TERMS = 64
#: Multiply-adds below which S at scattered elements is one GEMM over their rows and columns.
_SMALL_GEMM = 1 << 26
#: Elements per block of rows the numpy fallback of the model check hands a thread (cpus.BLOCK_ELEMS, a
#: different quantity, is what the C passes take per process).
_BLOCK_ELEMS = 1 << 20
#: Elements per chunk a thread's pass takes at a time: a chunk's float64 temporaries (256 KiB each)
#: stay in a core's L2 cache, where numpy's several passes over them run at cache speed rather than
#: at memory speed, and are reused from chunk to chunk (no allocation).
_CHUNK_ELEMS = 1 << 15


def _c_matrix(mat: np.ndarray) -> np.ndarray:
    """``mat`` as the C passes read it: float32 or float64 (native order) as it is, anything else in float64."""
    if mat.dtype == np.float32 or mat.dtype == np.float64:
        return np.ascontiguousarray(mat)
    return np.ascontiguousarray(mat, dtype=np.float64)


def fp32_tolerance(a: np.ndarray, b: np.ndarray, factor: float = FACTOR) -> np.ndarray:
    """Elementwise fp32 error allowance: factor·sqrt(K)·eps·(|A|·|B|)."""
    return fp32_factor(a.shape[1], factor) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))


def tf32_tolerance(fp32_allowed: np.ndarray, k: int) -> np.ndarray:
    """:func:`fp32_tolerance`'s allowance (for inner dimension ``k``) widened for TF32 operands.

    Scaled from the fp32 allowance rather than recomputed, so |A|·|B| costs one product.
    """
    scaled: np.ndarray = fp32_allowed * (1.0 + TF32_OPERAND_ERROR / fp32_factor(k))
    return scaled


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


def _wrong_shape(shape: tuple[int, int], tolerance: str) -> CheckReport:
    return CheckReport(False, shape, math.prod(shape), float("inf"), None, float("inf"), tolerance)


def _report(out: np.ndarray, ref: np.ndarray, allowed: np.ndarray | float, tolerance: str) -> CheckReport:
    if out.shape != ref.shape:
        return _wrong_shape(out.shape, tolerance)
    err = np.abs(out - ref)
    excess = err - allowed
    bad = excess > 0
    bad |= ~np.isfinite(out)
    ok = not bool(bad.any())
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape) if excess.size and not ok else None
    denom = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(out - ref)) / denom if denom else float(np.linalg.norm(out - ref))
    return CheckReport(
        ok=ok,
        shape=(int(out.shape[0]), int(out.shape[1])),
        mismatches=int(bad.sum()),
        max_abs_error=float(err.max()) if err.size else 0.0,
        worst=(int(worst[0]), int(worst[1])) if worst is not None else None,
        rel_error=rel,
        tolerance=tolerance,
    )


def against_inputs(
    out: np.ndarray, a: np.ndarray, b: np.ndarray, tol: float | None = None, gemm: Gemm | None = None
) -> CheckReport:
    """Check printed values ``out`` against the float64 product of ``a`` and ``b``.

    ``tol`` (absolute, beyond print rounding) replaces the fp32 error model;
    ``gemm`` computes the reference product (see :func:`reference`).
    """
    return against_product(WholeRows.of(out), product(a, b, gemm), tol)


class Rows(Protocol):
    """An output's values (float64), a block of rows at a time, as :meth:`Product.pairs` reads them:
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
    """numpy's BLAS on one thread while any :meth:`Product.pairs` runs (several at once in a folder's
    checks): its workers run a product block each, one per core. A BLAS of several threads beside
    them would spin its idle threads after every call and stall its busy ones behind the workers'
    reads (on the 2-core VM, an output read between multi-threaded product blocks cost 0.2-0.4 s
    at 4096). threadpoolctl finds numpy's BLAS library and sets its threads; OpenBLAS's pool is the
    process's, and threadpoolctl lets one thread at a time set it (another's calls do nothing), so
    every limit here is set and lifted on one thread of this class's own."""

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
class Product:
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
        caller checks the blocks before. At 4096 the output's 134 MB of fresh pages are never
        touched: they cost the 2-core VM 0.1-0.5 s of system time, in a process that maps them.
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


def product(a: np.ndarray, b: np.ndarray, gemm: Gemm | None = None) -> Product:
    """:class:`Product` of ``a`` and ``b``: ``gemm``'s whole product (:func:`reference`) when one is
    given, else one made in blocks as the check reads it. Arrays already float64 are not copied
    (mmd.check.jobs parses inputs so)."""
    with ThreadPoolExecutor(max_workers=2) as pool:  # two big conversions where needed, one per core
        a64, b64 = pool.map(lambda x: np.asarray(x, dtype=np.float64), (a, b))
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
        raise ValueError(f"cannot multiply {a64.shape} by {b64.shape}")
    return Product(a64, b64, None if gemm is None else reference(a64, b64, gemm))


def against_product(out: Rows, prod: Product, tol: float | None = None, precision: str = "fp32") -> CheckReport:
    """:func:`against_inputs` with the product's inputs at hand, the output's values read by ``out``; a
    ``precision`` of ``tf32`` (a TF32 kernel's product) widens the model by :data:`TF32_OPERAND_ERROR`."""
    tolerance = tolerance_of(tol, precision)
    if out.shape != prod.shape:
        return _wrong_shape(out.shape, tolerance)
    if not prod.shape[0] * prod.shape[1]:
        return _report(np.zeros(prod.shape), np.zeros(prod.shape), 0.0, tolerance)
    if tol is None:
        return _ModelCheck(out, prod, precision).report(tolerance)
    totals = Tally()
    n = prod.shape[1]
    for r0, got, ref in prod.pairs(out):
        rows = ref.shape[0]
        totals.add_uniform(got.reshape(-1), ref.reshape(-1), rows, n, PRINT_HALF_UNIT + tol, r0 * n, uniform_pass)
    return totals.report(prod.shape, tolerance)


def against_output(out: np.ndarray, expected: np.ndarray, tol: float = 0.01) -> CheckReport:
    """Check printed values against another output (both rounded: default 0.01 apart at most).

    ``expected`` may be ``out`` itself (mmd.check.jobs passes it for an expected output with the
    output's very bytes): finite values are then all right, with no pass over them but one
    that finds any NaN or infinity.
    """
    allowed = tol * (1 + 1e-9)
    if expected is out and allowed >= 0 and out.size and bool(np.isfinite(out).all()):
        m, n = out.shape
        return same_values((int(m), int(n)), tol)
    return _uniform_report(out, expected, allowed, f"{tol:g}")


def _uniform_report(out: np.ndarray, ref: np.ndarray, allowed: float, tolerance: str) -> CheckReport:
    """:func:`_report` for one allowance everywhere, in blocks of rows on two threads (the same report)."""
    if out.shape != ref.shape or out.size == 0:
        return _report(out, ref, allowed, tolerance)
    m, n = (int(x) for x in out.shape)
    totals = Tally()
    totals.add_uniform(out.reshape(-1), ref.reshape(-1), m, n, allowed, 0, uniform_pass)
    return totals.report((m, n), tolerance)


def uniform_pass(
    out: np.ndarray, ref: np.ndarray, rows: int, n: int, allowed: float
) -> tuple[int, float, float, float, int]:
    """The :data:`mmd.check.compare.UniformPass` for numpy's arrays (flat, rows×n, any float type): mmd._fastcheck's
    where it is on, else :func:`_uniform_numpy`."""
    out64, ref64 = np.ascontiguousarray(out, dtype=np.float64), np.ascontiguousarray(ref, dtype=np.float64)
    if accel.passes() is not None:
        return compare.c_uniform(out64, ref64, rows, n, allowed)
    return _uniform_numpy(out64.reshape(rows, n), ref64.reshape(rows, n), allowed)


def _uniform_numpy(out: np.ndarray, ref: np.ndarray, allowed: float) -> tuple[int, float, float, float, int]:
    """:func:`uniform_pass` in plain numpy, over the whole matrices (the fallback where mmd._fastcheck is not
    built, and the C pass's oracle): (mismatches, max |error|, Σ error², Σ ref², the worst's flat index)."""
    err = np.abs(out - ref).ravel()
    excess = err - allowed
    worst = int(np.argmax(excess))  # the first NaN, else the first largest
    top = float(err.max())
    if math.isnan(top):  # a NaN error: a non-finite output counts whatever its error
        bad = int(np.count_nonzero((excess > 0) | ~np.isfinite(out.ravel())))
    else:  # no NaN error, so every non-finite output has an infinite error, > 0 excess
        bad = int(np.count_nonzero(excess > 0))
    rf = ref.ravel()
    return bad, top, float(np.einsum("i,i->", err, err)), float(np.einsum("i,i->", rf, rf)), worst


def quick_of(
    out: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    seed: int = 0,
    vectors: int = quick.VECTORS,
    false_alarm: float = 1e-9,
    tol: float | None = None,
) -> quick.QuickReport:
    """The quick check (:mod:`mmd.check.quick`) of an output held whole: O(n²) work for an m×n output."""
    shape = (int(out.shape[0]), int(out.shape[1])) if out.ndim == 2 else (0, 0)
    sums = output_sums([(0, out)] if out.ndim == 2 else [], shape, seed, vectors)
    return quick.verdict(sums, project(a, b, seed, vectors), false_alarm, tol)


def _series(x: np.ndarray) -> array[float]:
    """``x`` as :mod:`mmd.check.quick` keeps its series: a flat float64 array in C order."""
    return array("d", np.ascontiguousarray(x, dtype=np.float64).tobytes())


def _numpy_vectors(m: int, n: int, seed: int, vectors: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`mmd.check.quick.random_vectors` as numpy takes them: x (n × vectors), y (m × vectors)."""
    x_t, y = quick.random_vectors(m, n, seed, vectors)
    return np.frombuffer(x_t).reshape(vectors, n).T, np.frombuffer(y).reshape(m, vectors)


def project(a: np.ndarray, b: np.ndarray, seed: int = 0, vectors: int = quick.VECTORS) -> quick.Projections:
    """A and B's side of the quick check: by mmd._fastcheck where it is usable
    (:func:`mmd.check.quick.c_usable`), else plain numpy in float64 over the whole matrices (the
    fallback, and the oracle the C passes are tested against)."""
    m, k = a.shape
    n = b.shape[1]
    if quick.c_usable(vectors) and a.size and b.size:
        return quick.project(_c_matrix(a), _c_matrix(b), (m, k, n), seed, vectors)
    x, y = _numpy_vectors(m, n, seed, vectors)
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    abs_a, abs_b = np.abs(a64), np.abs(b64)
    a_col_sum, a_col_max = abs_a.sum(axis=0), abs_a.max(axis=0, initial=0.0)
    return quick.Projections(
        shape=(m, k, n),
        seed=seed,
        vectors=vectors,
        x_t=_series(x.T),
        y=_series(y),
        abx_t=_series((a64 @ (b64 @ x)).T),
        yab=_series((y.T @ a64) @ b64),
        row_sum=_series(abs_a @ abs_b.sum(axis=1)),
        row_max=_series(abs_a @ abs_b.max(axis=1, initial=0.0)),
        col_sum=_series(a_col_sum @ abs_b),
        col_max=_series(a_col_max @ abs_b),
        a_row_ssq=_series(np.einsum("ik,ik->i", a64, a64)),
        b_col_ssq=_series(np.einsum("kj,kj->j", b64, b64)),
    )


def output_sums(
    blocks: Iterable[tuple[int, np.ndarray]], shape: tuple[int, int], seed: int = 0, vectors: int = quick.VECTORS
) -> quick.OutputSums:
    """The output's side of the quick check (:class:`mmd.check.quick.OutputSums`) from consecutive
    blocks of rows (first row, rows): no block is needed once it has been summed, so an output read
    a block at a time (:func:`mmd.textformat.output_blocks`) is never held whole. By mmd._fastcheck
    where it is usable, else plain numpy a block at a time (the fallback and oracle)."""
    m, n = shape
    sums = quick.OutputSums.start(shape, seed, vectors)
    if quick.c_usable(vectors):
        for r0, blk in blocks:
            if blk.size:
                sums.add(r0, _c_matrix(blk), blk.shape[0])
        return sums
    x, y = _numpy_vectors(m, n, seed, vectors)
    cx, yc = np.zeros((m, vectors)), np.zeros((vectors, n))
    row_ssq, col_ssq = np.zeros(m), np.zeros(n)
    for r0, blk in blocks:
        r1 = r0 + blk.shape[0]
        if not blk.size:
            continue
        blk64 = np.asarray(blk, dtype=np.float64)
        finite = np.isfinite(blk64)
        bad = int(blk64.size - np.count_nonzero(finite))
        if bad:
            if sums.first_nonfinite is None:
                sums.first_nonfinite = r0 * n + int(np.flatnonzero(~finite)[0])
            sums.nonfinite += bad
            continue
        cx[r0:r1] = blk64 @ x
        yc += y[r0:r1].T @ blk64
        row_ssq[r0:r1] = np.einsum("ij,ij->i", blk64, blk64)
        col_ssq += np.einsum("ij,ij->j", blk64, blk64)
    sums.cx_t[:], sums.row_ssq[:] = _series(cx.T), _series(row_ssq)
    sums.columns[:] = _series(np.concatenate([yc.ravel(), col_ssq]))
    return sums


@dataclass
class _Sieve:
    """What the first pass of :class:`_ModelCheck` found: the elements |ref| ≤ S does not pass."""

    max_err: float = 0.0
    ssq_err: float = 0.0
    ssq_ref: float = 0.0
    nonfinite: int = 0  # NaN and infinite values in the output
    first_nan: int | None = None  # flat index of the first NaN in the output
    first_nonfinite: int | None = None  # and of its first NaN or infinite value
    left: int = 0  # finite elements left; the lists below hold them, unless there are more than m·n/8
    flats: list[np.ndarray] = dataclasses.field(default_factory=list)
    errs: list[np.ndarray] = dataclasses.field(default_factory=list)  # their |error|
    refs: list[np.ndarray] = dataclasses.field(default_factory=list)  # and the reference there

    def add(
        self,
        sums: tuple[float, float, float],
        nonfinite: int,
        first_nonfinite: int | None,
        first_nan: int | None,
        left: int,
        found: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        """A block's findings (max |error|, Σ error², Σ ref²; the NaN and infinite values; the finite
        elements left, then their flat indices, |error| and reference), indices the whole output's."""
        self.max_err = nan_max(self.max_err, sums[0])
        self.ssq_err += sums[1]
        self.ssq_ref += sums[2]
        self.nonfinite += nonfinite
        if self.first_nonfinite is None:
            self.first_nonfinite = first_nonfinite
        if self.first_nan is None:
            self.first_nan = first_nan
        self.left += left
        self.flats.append(found[0])
        self.errs.append(found[1])
        self.refs.append(found[2])

    @property
    def worst_nonfinite(self) -> int | None:
        """As np.argmax over every excess would pick: the first NaN, else the first infinite value."""
        return self.first_nan if self.first_nan is not None else self.first_nonfinite


class _ModelCheck:
    """The rule |out − ref| ≤ 0.005 + c·S, S = |A|·|B|, without computing all of S.

    S is bounded below by |ref| (free) and by the sum of its first 64 terms,
    above by ‖a_i‖·‖b_j‖ (Cauchy–Schwarz), with margins for float64 rounding
    wide enough that any order of summation of S agrees with them. An
    element within the lower bound's allowance passes, one beyond the upper
    bound's fails; S itself is computed only for the rest, and for the
    failures that could be the worst one. When most elements are left
    undecided (a result wrong everywhere), S is made in full too, a block of
    rows at a time beside the product's, as it always was before these bounds.
    The reference comes a block of rows at a time beside the output's
    (:meth:`Product.pairs`), each block sieved as it comes.
    """

    def __init__(self, out: Rows, prod: Product, precision: str = "fp32") -> None:
        self.out, self.prod, self.a64, self.b64 = out, prod, prod.a64, prod.b64
        m, k = self.a64.shape
        n = self.b64.shape[1]
        self.m, self.n, self.k = m, n, k
        # c in the allowance 0.005 + c·S: fp32's model, plus TF32's operand rounding for a TF32 product
        self.c = model_factor(k, precision)
        gamma = (k + 4) * U64
        self.lo_scale = 1 - 2 * gamma
        self.hi_scale = 1 + 4 * gamma

    def _block_numpy(
        self, o_all: np.ndarray, rf_all: np.ndarray
    ) -> tuple[tuple[float, float, float], np.ndarray, np.ndarray, np.ndarray]:
        """Sums (max |error|, Σ error², Σ ref²), then the flat indices of the elements left (NaN and
        infinite values among them), their |error| and the reference there, in one block's terms."""
        err_buf = np.empty(min(o_all.size, _CHUNK_ELEMS))
        allowed_buf = np.empty_like(err_buf)
        passed_buf = np.empty(err_buf.shape, dtype=bool)
        scale = self.c * self.lo_scale
        max_err, ssq_err, ssq_ref = 0.0, 0.0, 0.0
        lefts, errs = [], []
        for s in range(0, o_all.size, _CHUNK_ELEMS):
            o, rf = o_all[s : s + _CHUNK_ELEMS], rf_all[s : s + _CHUNK_ELEMS]
            err, allowed, passed = err_buf[: o.size], allowed_buf[: o.size], passed_buf[: o.size]
            np.subtract(o, rf, out=err)
            np.abs(err, out=err)
            np.abs(rf, out=allowed)
            allowed *= scale
            allowed += PRINT_HALF_UNIT
            np.less_equal(err, allowed, out=passed)
            np.logical_not(passed, out=passed)  # not passed: a NaN or infinite value's too
            left = np.flatnonzero(passed)
            if left.size:
                lefts.append(left + s)
                errs.append(err[left])
            max_err = nan_max(max_err, float(err.max()))
            ssq_err += float(np.einsum("i,i->", err, err))
            ssq_ref += float(np.einsum("i,i->", rf, rf))
        left = np.concatenate(lefts) if lefts else np.empty(0, dtype=np.intp)
        err_left = np.concatenate(errs) if errs else np.empty(0)
        return (max_err, ssq_err, ssq_ref), left, err_left, rf_all[left]

    def _sieve_numpy(self, sieve: _Sieve, out: np.ndarray, ref: np.ndarray, base: int) -> None:
        """Rows of the output against the same rows of the reference, in blocks on two threads
        (numpy releases the GIL in these loops)."""
        rows, n = out.shape
        step = max(1, _BLOCK_ELEMS // max(n, 1))
        bounds = [(r, min(rows, r + step)) for r in range(0, rows, step)]

        def block(rb: tuple[int, int]) -> tuple[tuple[float, float, float], np.ndarray, np.ndarray, np.ndarray]:
            return self._block_numpy(out[rb[0] : rb[1]].ravel(), ref[rb[0] : rb[1]].ravel())

        if len(bounds) > 1:
            with ThreadPoolExecutor(max_workers=2) as pool:
                parts = list(pool.map(block, bounds))
        else:
            parts = [block(bd) for bd in bounds]
        for (r0, _), (sums, left, err, rf) in zip(bounds, parts, strict=True):
            o = out[r0:].ravel()[left]
            finite = np.isfinite(o)  # every non-finite value is among those left
            nonfinite, nan = np.flatnonzero(~finite), np.flatnonzero(np.isnan(o))
            at = base + r0 * n
            sieve.add(
                sums,
                int(nonfinite.size),
                int(left[nonfinite[0]]) + at if nonfinite.size else None,
                int(left[nan[0]]) + at if nan.size else None,
                int(np.count_nonzero(finite)),
                (left[finite] + at, err[finite], rf[finite]),
            )

    def _sieve_c(self, fc: ModuleType, sieve: _Sieve, out: np.ndarray, ref: np.ndarray, base: int, limit: int) -> None:
        rows, n = out.shape
        ref = np.ascontiguousarray(ref)
        got = fc.model(out, ref, rows, n, self.c * self.lo_scale, PRINT_HALF_UNIT, limit, accel.C_SPLIT_ELEMS)
        max_err, ssq_err, ssq_ref, nonfinite, first_nan, first_nonfinite, left, flat, err = got
        at = np.frombuffer(flat, dtype=np.int64).astype(np.intp, copy=False)  # empty beyond the limit
        sieve.add(
            (max_err, ssq_err, ssq_ref),
            nonfinite,
            first_nonfinite + base if nonfinite else None,
            first_nan + base if first_nan >= 0 else None,
            left,
            (at + base, np.frombuffer(err, dtype=np.float64), ref.ravel()[at]),
        )

    def _sieve(self, fc: ModuleType | None) -> _Sieve | None:
        """Every block of the reference as it comes; None once more than m·n/8 elements are left
        (S is then made in full: the rest of the sieve would not be used)."""
        sieve = _Sieve()
        limit = self.m * self.n // 8
        with contextlib.closing(self.prod.pairs(self.out)) as pairs:  # stopped early: its workers stop
            for r0, out, ref in pairs:
                if fc is not None:
                    self._sieve_c(fc, sieve, out, ref, r0 * self.n, limit - sieve.left)
                else:
                    self._sieve_numpy(sieve, out, ref, r0 * self.n)
                if sieve.left > limit:
                    return None
        return sieve

    def _exact_s(self, flat: np.ndarray) -> np.ndarray:
        """S = |A|·|B| at the row-major flat indices ``flat``, by the cheaper of two ways."""
        n, k = self.n, self.k
        rows, ri = np.unique(flat // n, return_inverse=True)
        cols, ci = np.unique(flat % n, return_inverse=True)
        if rows.size * cols.size <= 4 * flat.size or rows.size * cols.size * k <= _SMALL_GEMM:
            # few rows or few columns (a wrong row, column or tile): one small GEMM
            sub = np.abs(self.a64[rows]) @ np.abs(self.b64[:, cols])
            return np.asarray(sub[ri, ci])
        # scattered: one dot product each, over columns of B gathered once
        abs_bt = np.abs(self.b64[:, cols]).T.copy()
        got = np.empty(flat.size)
        step = max(1, (1 << 20) // max(k, 1))
        for s in range(0, flat.size, step):
            f = flat[s : s + step]
            got[s : s + step] = np.einsum("ek,ek->e", np.abs(self.a64[f // n]), abs_bt[ci[s : s + step]])
        return got

    def _norms(self, fc: ModuleType | None) -> tuple[np.ndarray, np.ndarray]:
        """‖a_i‖ for every row of A and ‖b_j‖ for every column of B."""
        (m, k), n = self.a64.shape, self.n
        if fc is None or not k:
            return np.sqrt(np.einsum("ik,ik->i", self.a64, self.a64)), np.sqrt(
                np.einsum("kj,kj->j", self.b64, self.b64)
            )
        a_rows, b_rows = np.empty(m), np.empty(k)
        a_cols, b_cols = np.zeros(k), np.zeros(n)  # the passes add to their column sums
        fc.sumsq(np.ascontiguousarray(self.a64), m, k, 1, None, None, a_rows, a_cols, accel.C_SPLIT_ELEMS)
        fc.sumsq(np.ascontiguousarray(self.b64), k, n, 1, None, None, b_rows, b_cols, accel.C_SPLIT_ELEMS)
        return np.sqrt(a_rows), np.sqrt(b_cols)

    def _in_full(self, tolerance: str) -> CheckReport:
        """The rule with S made in full, a block of rows at a time beside the reference's."""
        abs_b = np.abs(self.b64)
        totals = Tally()
        for r0, out, ref in self.prod.pairs(self.out):
            rows = ref.shape[0]
            allowed = PRINT_HALF_UNIT + self.c * (np.abs(self.a64[r0 : r0 + rows]) @ abs_b)
            err = np.abs(out - ref)
            excess = err - allowed
            bad = (excess > 0) | ~np.isfinite(out)
            worst = int(np.argmax(excess))
            totals.add(
                int(np.count_nonzero(bad)),
                float(err.max()),
                float(np.einsum("ij,ij->", err, err)),
                float(np.einsum("ij,ij->", ref, ref)),
                r0 * self.n + worst,
                float(excess.flat[worst]),
            )
        return totals.report((self.m, self.n), tolerance)

    def report(self, tolerance: str) -> CheckReport:
        m, n = self.m, self.n
        fc = accel.passes()
        sieve = self._sieve(fc)
        if sieve is None:  # wrong nearly everywhere
            return self._in_full(tolerance)
        flat = np.concatenate(sieve.flats).astype(np.intp, copy=False)
        err, ref_left = np.concatenate(sieve.errs), np.concatenate(sieve.refs)
        # the sum of S's first p terms, a second lower bound
        p = min(self.k, _LOWER_TERMS)
        i, j = flat // n, flat % n
        s_lo = np.einsum("ek,ek->e", np.abs(self.a64[i, :p]), np.abs(self.b64[:p, :].T[j]))
        s_lo = np.maximum(s_lo, np.abs(ref_left)) * self.lo_scale
        norm_a, norm_b = self._norms(fc)
        allowed_lo = PRINT_HALF_UNIT + self.c * s_lo
        allowed_hi = PRINT_HALF_UNIT + self.c * norm_a[i] * norm_b[j] * self.hi_scale
        sure_bad = err > allowed_hi
        # an element's excess (err - allowance) lies in [err - allowed_hi, err - allowed_lo]: S is
        # needed where the bounds disagree, and for the failures that could be the worst one
        need = (err > allowed_lo) & ~sure_bad
        if sure_bad.any():
            need |= sure_bad & (err - allowed_lo >= np.max((err - allowed_hi)[sure_bad]))
        excess = err - allowed_hi
        excess[err <= allowed_lo] = -1.0  # passes: its excess is never looked at
        idx = np.flatnonzero(need)
        if idx.size:
            excess[idx] = err[idx] - (PRINT_HALF_UNIT + self.c * self._exact_s(flat[idx]))
        bad = sure_bad | (excess > 0)
        mismatches = sieve.nonfinite + int(np.count_nonzero(bad))
        worst = sieve.worst_nonfinite
        if worst is None and bad.any():
            cand = np.flatnonzero(bad)
            worst = int(flat[cand[np.argmax(excess[cand])]])
        return summed_report((m, n), mismatches, sieve.max_err, sieve.ssq_err, sieve.ssq_ref, worst, tolerance)
