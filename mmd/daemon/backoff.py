"""Back-off: a pause that doubles with each failure in a row, up to a bound.

The daemon takes no new job for a while after the outbox refused a result
(``rescan_seconds``, doubled for each refusal in a row, up to
:data:`~.tunables.MAX_PAUSE`), and its main loop pauses after a turn that
found no file descriptor left (:data:`FD_PAUSE_S`, doubled while it happens
again soon, up to :data:`FD_PAUSE_MAX_S`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds the main loop pauses after a turn that found this process's descriptors used up (EMFILE, ENFILE),
#: doubled while it happens again within twice FD_PAUSE_MAX_S, up to FD_PAUSE_MAX_S: a listing or an open failed;
#: nothing is lost.
FD_PAUSE_S, FD_PAUSE_MAX_S = 0.5, 8.0


@dataclass
class Backoff:
    """Pauses doubled for each failure in a row before, up to ``most`` seconds. A row ends at a success
    (:meth:`passed`), or with ``row_s``, at a failure that long after the one before."""

    most: float
    row_s: float | None = None
    #: Failures in a row.
    failures: int = 0
    #: Monotonic: paused until then (0: not paused).
    until: float = 0.0
    #: Monotonic: the last failure.
    last: float = float("-inf")

    def fail(self, now: float, first: float) -> float:
        """A failure at ``now``: paused from now, for ``first`` seconds if it is the first of its row; returns for
        how many seconds."""
        if self.row_s is not None and now - self.last >= self.row_s:
            self.failures = 0
        seconds = min(first * 2**self.failures, self.most)
        self.failures += 1
        self.last, self.until = now, now + seconds
        return seconds

    def passed(self) -> None:
        """A success: the next failure is the first of a row."""
        self.failures = 0

    def paused(self, now: float) -> bool:
        return now < self.until

    def over(self, now: float) -> bool:
        """Whether a pause has run out (and is not :meth:`clear`-ed yet)."""
        return bool(self.until) and now >= self.until

    def clear(self) -> None:
        self.until = 0.0
