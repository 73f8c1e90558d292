"""The main loop's chores: at a rescan, held jobs taken back and stale reservations and old files swept; the
metrics file when it is due.

Each sweep lists a whole folder, so each has a period of its own: the
outbox's reservations at most every
:data:`~.tunables.RESERVATION_SWEEP_SECONDS`, what is older than
``retention_days`` every :data:`~.tunables.RETENTION_SWEEP_S`; the metrics
(which list the inbox) every ``metrics_seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import Settings
from ..metrics import Metrics
from ..spool import Claim, Spool
from . import tunables
from .handins import HandInDesk
from .scheduler import Scheduler


@dataclass(eq=False)
class Upkeep:
    """When each sweep last ran, and the chores."""

    #: The daemon's settings now (a reload changes them).
    settings: Callable[[], Settings]
    spool: Spool
    scheduler: Scheduler
    handins: HandInDesk
    metrics: Metrics
    log: Any
    _swept: float = field(default=0.0, init=False)  # monotonic: the last full sweep of the outbox's reservations
    _kept: float = field(default=float("-inf"), init=False)  # monotonic: the last retention sweep

    def start(self, resumed: list[Claim]) -> None:
        """At the start, with ``resumed`` the jobs found in ``.work``: the reservations of dead daemons swept."""
        for path in self.spool.reservations.sweep(resumed):
            self.log.info("removed a stale output reservation left by a dead daemon", path=str(path))
        self._swept = time.monotonic()

    def tend(self, now: float) -> None:
        """At a rescan, out of a pause: take back the jobs left in ``.work`` (held ones first, before any new
        name), and sweep stale reservations and, with ``retention_days``, what is older (each at most every
        its period); the uploads are judged at each rescan (:meth:`~.intake.Intake.rescan`)."""
        self.scheduler.resume(self.spool.claims.take_back())
        if now - self._swept >= tunables.RESERVATION_SWEEP_SECONDS:
            self._swept = now
            for path in self.spool.reservations.sweep(self.spool.claims.in_work()):
                self.log.info("removed a stale output reservation left by a dead daemon", path=str(path))
        days = self.settings().retention_days
        if days is not None and now - self._kept >= tunables.RETENTION_SWEEP_S:
            self._kept = now
            old = self.spool.archive.sweep_old(days * 86400)
            self.handins.sweep(days * 86400)
            if old:
                self.log.info("removed what is older than retention_days", files=len(old), retention_days=days)

    def write_metrics(self, force: bool = False) -> None:
        """The periodic metrics, when due (``force``: now): queue depth, what waits in the inbox and for how long
        (then the file)."""
        metrics = self.metrics
        if metrics.path is None or (not force and (metrics.due_in() or 0) > 0):
            return
        waiting = self.spool.scanner.scan()
        metrics.queue.set(self.scheduler.waiting)
        metrics.waiting.set(len(waiting))
        oldest = min((c.mtime_ns for c in waiting), default=None)
        metrics.oldest.set(max(0.0, time.time() - oldest / 1e9) if oldest is not None else 0.0)
        try:
            metrics.write(force=True)
        except OSError as exc:
            self.log.warning("cannot write the metrics file", path=str(metrics.path), reason=exc.strerror)
