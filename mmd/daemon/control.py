"""A worker's control block: a few numbers in shared memory, written by the worker, read by its supervisor.

The main process must know which job a worker runs, whose, since when,
under what time limit and in which phase, at every turn of its loop, and a
message per phase would cost more than a small job. So each worker writes
these into a block of shared memory (``multiprocessing.RawArray``), and the
main process reads them without a message or a lock. The one flag the other way,
``hold_new``, tells a worker not to claim new names (a pause, a stop).

A reader may see a write half done: the worker sets the sequence number to
0 when a job ends and writes the next job's start and limit before its
sequence number, and :meth:`Control.running` reads the sequence number
before and after the rest and gives None when it changed, so that a start
and a limit are never paired across two jobs.

The sequence number is the job's identity (each job of a group is an order
of its own), and the worker changes it only under the block's lock. A
supervisor that stops a worker for one job holds that lock while it checks
the number and signals (:meth:`Control.frozen`): the worker cannot move on
to another job in between, so a stop never lands on a job it was not meant
for. The lock is taken twice a job, uncontended but for such a stop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..pipeline.phases import PHASES

_SEQ, _STARTED, _LIMIT, _PHASE, _BEAT, _HOLD, _OWNER = range(7)
_SIZE = 7


@dataclass(frozen=True)
class Running:
    """What a worker runs now: its order's ``seq``, since when (monotonic clock), its limit, its phase, and
    its input's owner (the submitter's uid; None: not known)."""

    seq: int
    started: float
    limit_s: float
    phase: str
    owner: int | None = None

    def overdue(self, now: float) -> bool:
        return now - self.started > self.limit_s


class Control:
    """One worker's shared numbers. Make it with :meth:`new` in the main process; it pickles to the worker."""

    def __init__(self, array: Any, lock: Any) -> None:
        self.array = array
        self.lock = lock

    @classmethod
    def new(cls, context: Any) -> Control:
        """A zeroed block from a multiprocessing context (so that it can be passed to that context's processes)."""
        return cls(context.RawArray("d", _SIZE), context.Lock())

    # -- the worker's side --
    def begin(self, seq: int, limit_s: float, owner: int | None = None) -> None:
        a = self.array
        with self.lock:
            a[_STARTED] = time.monotonic()
            a[_LIMIT] = limit_s
            a[_PHASE] = 0
            a[_OWNER] = -1 if owner is None else owner
            a[_SEQ] = seq

    def limit(self, limit_s: float) -> None:
        """The job's own limit, once its settings (a name may lower it) are known."""
        self.array[_LIMIT] = limit_s

    def phase(self, name: str) -> None:
        self.array[_PHASE] = PHASES.index(name)

    def end(self) -> None:
        with self.lock:
            self.array[_SEQ] = 0

    def beat(self) -> None:
        self.array[_BEAT] = time.monotonic()

    def off_loop(self) -> None:
        """The worker leaves its loop for a while outside any job (its warm-up, which may wait for a compile):
        as before its first beat, it is not judged stuck until it beats again."""
        self.array[_BEAT] = 0.0

    @property
    def hold_new(self) -> bool:
        return bool(self.array[_HOLD])

    # -- the supervisor's side --
    @hold_new.setter
    def hold_new(self, value: bool) -> None:
        self.array[_HOLD] = 1.0 if value else 0.0

    def running(self) -> Running | None:
        """The job in hand, or None (idle, or a write under way: look again at the next turn)."""
        a = self.array
        seq = int(a[_SEQ])
        if not seq:
            return None
        started, limit, phase, owner = a[_STARTED], a[_LIMIT], int(a[_PHASE]), int(a[_OWNER])
        if int(a[_SEQ]) != seq:
            return None
        return Running(seq, started, limit, PHASES[phase] if 0 <= phase < len(PHASES) else "?",
                       None if owner < 0 else owner)  # fmt: skip

    @contextlib.contextmanager
    def frozen(self, timeout: float) -> Iterator[Running | None]:
        """The job in hand, held there: the worker cannot end it nor begin another until the block is left
        (a stop signalled inside lands on this job or on none). None when idle, or when the lock is not had
        within ``timeout`` (a worker killed while it held it: the block is a dead worker's)."""
        if not self.lock.acquire(timeout=timeout):
            yield None
            return
        try:
            yield self.running()
        finally:
            self.lock.release()

    @property
    def last_beat(self) -> float:
        """When the worker's loop last turned (monotonic clock; 0: never)."""
        return float(self.array[_BEAT])
