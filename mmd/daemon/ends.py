"""A job's end as the main process books it, and the end it gives a claimed job that no worker holds.

Each end is booked in the same places: the state file's list of recent
jobs, the metrics, the submitter's use of the workers (the scheduler's fair
share) and the hooks. A worker reports its jobs' ends (:class:`~.messages.Ended`);
the main process itself refuses a job that was claimed and that no worker
holds: one whose worker was ended for it (a time limit, a cancel), one
cancelled while it waited in ``.work``, and an inbox entry set aside.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import record
from ..config import Settings
from ..errors import MmdError
from ..hooks import Hooks, JobEnd
from ..job import describe
from ..metrics import Metrics
from ..pipeline import refuse
from ..record import now_iso
from ..spool import Claim, Spool, shown
from ..spool.archive import refused_keep
from .messages import Ended
from .scheduler import Scheduler
from .state import State


@dataclass(eq=False)
class Ends:
    """Books each job's end; refuses claimed jobs that no worker holds (:meth:`refuse_claimed`)."""

    #: The daemon's settings now (a reload changes them).
    settings: Callable[[], Settings]
    spool: Spool
    scheduler: Scheduler
    state: State
    metrics: Metrics
    hooks: Hooks
    log: Any

    def ended(self, event: Ended, worker: int) -> None:
        """Book the end worker ``worker`` reported."""
        self.spool.in_hand.forget(event.end.job)
        self.state.finished(event.entry, worker=worker)
        if event.tally is not None:
            self.metrics.job_ended(event.tally)
            self._charge(event.tally)
        if event.memory_used is not None:
            self.metrics.gpu_memory.labels(str(event.memory_used[0])).set(event.memory_used[1])
        self.hooks.ended(event.end)

    def _charge(self, t: record.Tally) -> None:
        """Count a finished job's time toward its submitter's share (the scheduler's fair share)."""
        if t.overall_ms is not None:
            self.scheduler.charge(t.submitter, t.overall_ms / 1e3, time.monotonic())

    def refuse_claimed(
        self, claim: Claim, error: MmdError, device: int | None, overall_ms: float = 0.0, *, set_aside: bool = False
    ) -> None:
        """A claimed job no worker holds (its worker ended for it, or cancelled in the queue): its error
        sidecar (``error``'s kind and reason), archived to ``.failed``. ``set_aside``: an inbox entry that is not
        a job, already moved out of its name's way (by :meth:`~.intake.Intake.rescan`): its sidecar's
        reservation is dropped."""
        settings = self.settings()
        log = self.log.bind(job=claim.job_id, file=shown(claim.name), submitter=claim.submitter)
        context = record.Context(device_index=device, submitter=claim.submitter)
        job = describe(claim.path, claim.output, settings, name=claim.original or claim.name,
                       job_id=claim.job_id, started=claim.started, context=context)  # fmt: skip
        result = refuse(job, error, {"overall": overall_ms}, ops=self.spool.shared.ops)
        counted = record.tally(result.record)
        self._charge(counted)
        if set_aside:
            self.spool.reservations.release(claim)
        else:
            try:
                self.spool.archive.add(claim, False, refused_keep(settings.archive_refused_bytes, False))
            except MmdError as exc:
                log.error("cannot archive", reason=exc.reason)
                self.spool.in_hand.leave(claim)
        log.error("set aside" if set_aside else "job stopped", kind=error.kind, reason=error.reason,
                  **({"path": str(claim.path)} if set_aside else {}))  # fmt: skip
        self.state.finished(
            {
                "job": claim.job_id,
                "file": claim.name,
                "status": "error",
                "output": None,
                "sidecar": result.sidecar.name if result.sidecar_failed is None else None,
                "overall_ms": result.record.timings_ms.overall,
                "device_index": device,
                "finished": now_iso(),
            }
        )
        self.metrics.job_ended(counted)
        self.hooks.ended(JobEnd(claim.job_id, "error", shown(claim.original or claim.name), None, result.sidecar,
                                error.reason, submitter=claim.submitter or ""))  # fmt: skip
        self.scheduler.ended(claim.job_id)
        self.spool.in_hand.forget(claim.job_id)
