"""Fresh inputs for every timed launch of a grading, and the check of each product: what makes a replayed or
remembered product fail (no input is ever given twice, no one can know the next); and the grading's launch
processes that are going, which the GPU may still list."""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np

from ..check import quickarrays
from ..check.quick import fresh_seed
from ..errors import ProductRangeError
from ..kernelfile.exchange import Operands
from ..textformat import check_product

#: Threads that check timed launches' products (Freivalds' check, in C without the GIL) while the next launches
#: run, and threads that make fresh inputs: half the cores each, 2 to 8 (CPU work beside the timed launches,
#: which time the GPU alone).
CHECKERS = MAKERS = max(2, min(8, (os.cpu_count() or 2) // 2))


class FreshInputs:
    """Fresh inputs made a launch ahead on a thread of their own, their rows filled on :data:`MAKERS` threads by
    Generators of their own (seeded from the operating system: no one can know them), while the current launch
    runs; none is ever given twice. The memory they lie in is used again (:meth:`done_with`) once nothing reads
    the last ones: new values, and no page faults on the timed path. A context manager: leaving it stops its
    threads and closes every memory file it made."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, "mmd-grade-inputs")
        self._rows = ThreadPoolExecutor(MAKERS, "mmd-grade-input-rows")
        # one Generator per part of a matrix, each used by one thread at a time (fresh_inputs waits for its parts)
        self._rngs = np.random.default_rng(secrets.randbits(128)).spawn(MAKERS)
        self._next: tuple[int, Future[Operands]] | None = None
        self._lock = threading.Lock()
        #: Memory of each size whose inputs nothing reads any more, and every one made (closed at the end).
        self._spare: dict[int, list[Operands]] = {}
        self._made: list[Operands] = []

    def __enter__(self) -> FreshInputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self._drop()
        self._pool.shutdown()
        self._rows.shutdown()
        with self._lock:
            for ops in self._made:
                ops.close()

    def _make(self, size: int) -> Future[Operands]:
        with self._lock:
            spare = self._spare.get(size)
            ops = spare.pop() if spare else None
        return self._pool.submit(self._fresh, size, ops)

    def _fresh(self, size: int, ops: Operands | None) -> Operands:
        if ops is None:
            ops = Operands(size, size, size)
            with self._lock:
                self._made.append(ops)
        return fresh_inputs(self._rngs, ops, self._rows)

    def _drop(self) -> None:
        if self._next is not None:
            self._next[1].add_done_callback(self._dropped)
            self._next = None

    def _dropped(self, made: Future[Operands]) -> None:
        if made.exception() is None:
            self.done_with(made.result())

    def ahead(self, size: int) -> None:
        """Start making inputs of ``size`` (those being made for another size are dropped)."""
        if self._next is None or self._next[0] != size:
            self._drop()
            self._next = (size, self._make(size))

    def take(self, size: int) -> Operands:
        """Inputs of ``size`` (given back with :meth:`done_with`): those made ahead, else new ones."""
        if self._next is not None and self._next[0] == size:
            ahead, self._next = self._next[1], None
            return ahead.result()
        self._drop()
        return self._make(size).result()

    def done_with(self, ops: Operands) -> None:
        """``ops`` back, for new inputs of a later launch: nothing reads them (or their product) any more."""
        with self._lock:
            self._spare.setdefault(ops.a.shape[0], []).append(ops)


def fresh_inputs(rngs: Sequence[np.random.Generator], ops: Operands, pool: ThreadPoolExecutor) -> Operands:
    """``ops``' A and B filled with new random values in [-1, 1) (float32, in place), each cut into as many row
    parts as ``rngs`` has Generators, the parts filled at once in ``pool`` (numpy fills without the GIL). They lie
    where a kernel file's launch process reads them (with room for its product): no copy on the launch's way."""
    for x in (ops.a, ops.b):
        parts = np.array_split(x, len(rngs))
        for done in [pool.submit(_fill, rng, part) for rng, part in zip(rngs, parts, strict=True)]:
            done.result()
    return ops


def _fill(rng: np.random.Generator, x: np.ndarray) -> None:
    rng.random(out=x, dtype=np.float32)
    x *= 2
    x -= 1


def fresh_check(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[str, str]:
    """(why ``c`` is not A·B, the check's summary line); why is empty where it is. A value that is not finite
    is wrong at once; else Freivalds' check, with a fresh seed, judges it."""
    try:
        check_product(c)
    except ProductRangeError as exc:
        return exc.reason, ""
    report = quickarrays.quick_of(c, a, b, seed=fresh_seed())
    return report.reason(), report.summary()


#: How long after a launch process has gone the GPU may still list it: NVML's list lags a process's end, on an
#: H100 by more than a second after the process was reaped (docs/grading.md).
GONE_S = 3.0


class Closable(Protocol):
    def close(self) -> None: ...


class Going:
    """The grading's launch processes being closed, and those closed less than :data:`GONE_S` ago: the GPU may
    list them, and they are the grading's own, not another's. Thread-safe (phase 1 closes from its workers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closing = 0
        self._ends: list[float] = []

    def close(self, backend: Closable) -> None:
        """Close ``backend`` (its launch process killed and waited for), counted while it goes."""
        with self._lock:
            self._closing += 1
        try:
            backend.close()
        finally:
            with self._lock:
                self._closing -= 1
                self._ends.append(time.monotonic())

    def count(self) -> int:
        now = time.monotonic()
        with self._lock:
            self._ends = [t for t in self._ends if now - t < GONE_S]
            return self._closing + len(self._ends)
