"""A job's supervision: which phase it is in, and whether its supervisor stopped it.

The daemon gives each job a :class:`JobWatch`. The driver says which phase it
enters; a supervisor that finds the job past its time limit calls
:meth:`JobWatch.stop`. From then on the job commits nothing: every rename
that would publish its output or sidecar happens inside
:meth:`JobWatch.committing`, under the same lock, and raises
:class:`JobStopped` instead. So a job is either committed by its own thread
or refused by its supervisor, never both, even when its thread is stuck in a
kernel or a read and only wakes up later.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

#: The phases a job goes through, as a supervisor reports them.
PHASES = ("claimed", "read", "parse", "multiply", "emit", "write", "committed")


class JobStopped(Exception):
    """Raised in a job's own thread when its supervisor stopped it: it must leave everything as it is."""


class JobWatch:
    """Shared by a job's thread (which reports) and its supervisor (which may stop it)."""

    def __init__(self, limit_s: float, on_phase: Callable[[str], None] | None = None) -> None:
        #: The job's time limit in seconds (its settings can change it once they are read).
        self.limit_s = limit_s
        self.started = time.monotonic()
        self.phase = "claimed"
        #: Told each phase as it is entered (a worker process shows it to its supervisor in shared memory).
        self.on_phase = on_phase
        self._lock = threading.Lock()
        self._stopped = False
        self._committed = False

    def enter(self, phase: str) -> None:
        self.phase = phase
        if self.on_phase is not None:
            self.on_phase(phase)

    def overdue(self, now: float | None = None) -> bool:
        """Whether the job has run past its limit and is still running."""
        now = time.monotonic() if now is None else now
        return not self._committed and not self._stopped and now - self.started > self.limit_s

    def stop(self) -> bool:
        """Stop the job unless it has committed its sidecar already; True when it was stopped."""
        with self._lock:
            if self._committed:
                return False
            self._stopped = True
            return True

    @property
    def stopped(self) -> bool:
        return self._stopped

    @contextlib.contextmanager
    def committing(self, last: bool = False) -> Iterator[None]:
        """Hold this around a rename that publishes the job's output (``last``: its sidecar)."""
        with self._lock:
            if self._stopped:
                raise JobStopped()
            yield
            if last:
                self._committed = True
                self.phase = "committed"

    def check(self) -> None:
        """Raise JobStopped when stopped (between phases: no point going on)."""
        if self._stopped:
            raise JobStopped()
