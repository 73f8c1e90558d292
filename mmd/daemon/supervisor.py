"""The workers' supervision: a job past its time limit or cancelled ends with its worker; a dead worker's jobs
go on without it.

A worker is ended for a job (SIGTERM, SIGKILL after
:data:`~.tunables.STOP_GRACE_S`) only while its control block shows it
running that very job (:meth:`~.pool.WorkerHandle.stop_job`). Once a
worker is gone, whatever the cause, its jobs are sorted out
(:meth:`Supervisor.recover`): the one it was ended for gets its error
sidecar, those it had claimed are resumed (a start counted, as after a
crash, unless it was ended for another job's sake), the names it had not
claimed go back to the queue, and a fresh worker takes its place.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from .. import record
from ..errors import JobTimeout, MmdError, SpoolError
from ..spool import Claim, Spool, shown
from .control import Running
from .ends import Ends
from .intake import Intake
from .messages import Resume, RunOrder
from .pool import OnEvent, WorkerPool
from .scheduler import Scheduler
from .state import State
from .tunables import STOP_GRACE_S


class Supervisor:
    """Ends the workers whose job is past its limit or cancelled, and recovers from a worker's end."""

    def __init__(
        self,
        workers: WorkerPool,
        spool: Spool,
        scheduler: Scheduler,
        intake: Intake,
        ends: Ends,
        state: State,
        on_event: OnEvent,
        log: Any,
    ) -> None:
        self.workers = workers
        self.spool = spool
        self.scheduler = scheduler
        self.intake = intake
        self.ends = ends
        self.state = state
        #: What the main process does with an event a worker told before it was gone.
        self.on_event = on_event
        self.log = log

    def check(self, now: float, stopping: bool) -> None:
        """Each worker: ended if its job is past its limit; recovered if it died (not while the daemon stops).
        A worker that cannot open its backend, or died while starting, is the daemon's end (raised)."""
        for i, w in enumerate(self.workers.handles):
            if w.failed is not None:
                raise w.failed.error  # a replacement cannot open its backend: the daemon cannot serve
            if w.ready is None:
                if w.alive():
                    continue  # starting
                raise SpoolError(f"worker {w.index} exited while starting (exit status {w.process.exitcode})")
            running = w.control.running()
            if running is not None and running.overdue(now) and w.alive():
                limit, phase = running.limit_s, running.phase
                error = JobTimeout(
                    f"the job ran past its time limit of {limit:g} s (in {phase}) and was stopped",
                    {"limit_s": limit, "phase": phase},
                )
                if self.stop_running(i, running.seq, error):  # unless it ended meanwhile
                    self.log.error("stopped a job past its time limit", worker=w.index, limit_s=limit, phase=phase)
            elif not w.alive() and w.failed is None and not stopping:
                self.log.error("a worker died", worker=w.index, exitcode=w.process.exitcode, jobs=len(w.in_hand))
                self.recover(i, running, None)

    def stop_running(self, worker: int, seq: int, error: MmdError) -> bool:
        """End a worker for its job ``seq`` (past its limit, or cancelled), if it runs that job now: the job gets
        ``error``'s sidecar, the others it held go back to the queue with no start charged, and a fresh worker
        takes its place. False, and nothing done, when the worker has moved on (the job ended meanwhile)."""
        running = self.workers.handles[worker].stop_job(seq, STOP_GRACE_S)
        if running is None:
            return False
        self.recover(worker, running, error)
        return True

    def recover(self, i: int, running: Running | None, stopped: MmdError | None) -> None:
        """Worker ``i`` is gone: read what it said last, refuse the job it was ended for (``stopped``: why),
        resume the jobs it had claimed (each counted as a start, as after a crash, unless it was ended for another
        job: then those its group had run are excused), give back the names it had not, replace it."""
        w = self.workers.handles[i]
        w.join()
        for event, order in w.events():
            self.on_event(w, event, order)
        left: dict[int, RunOrder | Resume] = {**w.in_hand}
        w.close()
        ended_for = left.get(running.seq) if stopped is not None and running is not None else None
        ids = {order.claim.job_id if isinstance(order, Resume) else order.job_id: order for order in left.values()}
        found = {c.job_id: c for c in self.spool.claims.in_work() if c.job_id in ids}
        resume = []
        for job_id, order in ids.items():
            claim = found.get(job_id)
            if claim is None:  # never claimed (or archived already): the name is the inbox's again, queued anew
                self.spool.in_hand.forget(job_id)
                name = order.name if isinstance(order, RunOrder) else order.claim.name
                self.scheduler.ended(job_id)
                self.intake.offer(name, complete=True)
            elif order is ended_for and running is not None and stopped is not None:
                if not record.timing_path(claim.output).exists() and os.path.lexists(claim.output):
                    with contextlib.suppress(OSError):  # committed before it was stopped, its sidecar not: ours
                        os.unlink(claim.output)
                self.ends.refuse_claimed(claim, stopped, w.device, (time.monotonic() - running.started) * 1e3)
            else:
                if stopped is not None and running is not None and order.seq < running.seq:
                    self._excuse(claim)  # run before the stopped job, its group's commit pending: not its fault
                resume.append(claim)
        for claim in resume:
            self.scheduler.ended(claim.job_id)
        self.scheduler.resume(resume)
        for path in self.spool.archive.sweep_temporaries():
            self.log.info("removed a temporary left by a stopped worker", path=str(path))
        fresh = self.workers.replace(i)
        self.state.worker(fresh.index, device_index=fresh.device, current=None, pid=fresh.pid)

    def _excuse(self, claim: Claim) -> None:
        """``claim``'s start ended through no fault of its own (its worker was ended for another job): not
        counted toward ``max_attempts``."""
        try:
            self.spool.attempts.excuse(claim)
        except SpoolError as exc:  # then its start counts as a crashed one
            self.log.warning("cannot record that a job's start was not its fault", job=claim.job_id,
                             file=shown(claim.name), reason=exc.reason)  # fmt: skip
