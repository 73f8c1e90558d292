"""A worker's control block: a few numbers in shared memory, written by the worker, read by its supervisor.

The main process must know which job a worker runs, since when, under what
time limit and in which phase, at every turn of its loop, and a message per
phase would cost more than a small job. So each worker writes these into a
block of shared memory (``multiprocessing.RawArray``), and the main process
reads them without a message or a lock. The one flag the other way,
``hold_new``, tells a worker not to claim new names (a pause, a stop).

A reader may see a write half done: the worker sets the sequence number to
0 when a job ends and writes the next job's start and limit before its
sequence number, and :meth:`Control.running` reads the sequence number
before and after the rest and gives None when it changed, so that a start
and a limit are never paired across two jobs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..pipeline.watch import PHASES

_SEQ, _STARTED, _LIMIT, _PHASE, _BEAT, _HOLD = range(6)
_SIZE = 6


@dataclass(frozen=True)
class Running:
    """What a worker runs now: its order's ``seq``, since when (monotonic clock), its limit, its phase."""

    seq: int
    started: float
    limit_s: float
    phase: str

    def overdue(self, now: float) -> bool:
        return now - self.started > self.limit_s


class Control:
    """One worker's shared numbers. Make it with :meth:`new` in the main process; it pickles to the worker."""

    def __init__(self, array: Any) -> None:
        self.array = array

    @classmethod
    def new(cls, context: Any) -> Control:
        """A zeroed block from a multiprocessing context (so that it can be passed to that context's processes)."""
        return cls(context.RawArray("d", _SIZE))

    # -- the worker's side --
    def begin(self, seq: int, limit_s: float) -> None:
        a = self.array
        a[_STARTED] = time.monotonic()
        a[_LIMIT] = limit_s
        a[_PHASE] = 0
        a[_SEQ] = seq

    def limit(self, limit_s: float) -> None:
        """The job's own limit, once its settings (a name may lower it) are known."""
        self.array[_LIMIT] = limit_s

    def phase(self, name: str) -> None:
        self.array[_PHASE] = PHASES.index(name)

    def end(self) -> None:
        self.array[_SEQ] = 0

    def beat(self) -> None:
        self.array[_BEAT] = time.monotonic()

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
        started, limit, phase = a[_STARTED], a[_LIMIT], int(a[_PHASE])
        if int(a[_SEQ]) != seq:
            return None
        return Running(seq, started, limit, PHASES[phase] if 0 <= phase < len(PHASES) else "?")

    @property
    def last_beat(self) -> float:
        """When the worker's loop last turned (monotonic clock; 0: never)."""
        return float(self.array[_BEAT])
