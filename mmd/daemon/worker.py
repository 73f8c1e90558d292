"""The worker: one thread per device owns its backends and runs jobs in arrival order.

A worker sees the daemon only through :class:`Host`, the few things it needs
(settings, the spool, the state file, hints back to the main loop, and the
shared bookkeeping of outbox trouble); it imports nothing of the server.

A job's fate is one of three, whatever fails: its output and sidecar
(archived to ``.done``), its error sidecar (archived to ``.failed``), or kept:
in the inbox when it cannot be claimed, else in ``.work``, *held* when the
outbox refuses what the job has to write (its reservation, output or
sidecar) or left when its archive fails, and taken back by the daemon after
a pause that doubles with each failure in a row (docs/reliability.md).
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from .. import record
from ..backends import BackendPool
from ..backends.base import Backend
from ..config import Settings
from ..errors import CrashedError, CudaError, InternalError, MmdError, OutputError, SpoolError
from ..hooks import JobEnd
from ..job import Job, describe
from ..logs import get_logger
from ..pipeline import JobResult, JobStopped, JobWatch, refuse, run_job
from ..record import Context
from ..spool import Attempts, Claim, Spool, shown
from .common import BROKEN, DONE, HEARTBEAT, MAX_OUTPUT_ATTEMPTS, MAX_PAUSE, now_iso
from .state import State


class Host(Protocol):
    """What a worker needs of the daemon that runs it (:class:`mmd.daemon.Daemon`)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def spool(self) -> Spool: ...
    @property
    def state(self) -> State: ...
    @property
    def host_id(self) -> str | None: ...
    @property
    def worker_count(self) -> int: ...

    def hint(self, *hint: Any) -> None:
        """Tell the main loop something (a job done, a claim that failed, a pause)."""

    def paused(self) -> bool:
        """Whether new jobs wait (the outbox refused a result a moment ago)."""
        ...

    def pause(self, reason: str, seconds: float) -> None:
        """Take no new job for ``seconds`` (jobs left in ``.work`` are taken back when it ends)."""

    def output_committed(self) -> None: ...
    def output_failed(self) -> int:
        """Count a step the spool refused (the outbox, or an archive); returns how many in a row."""
        ...

    def job_ended(self, end: JobEnd, rec: record.Record | None, memory_used: tuple[int, int] | None) -> None:
        """A job's fate is committed: count it, run its hook; ``memory_used``: (device, bytes) in use now."""


class Worker(threading.Thread):
    """Claims, runs and archives jobs one at a time on one device; its backends live and die in this thread.

    ``mmd serve`` starts one worker per device (``devices``); all of them take
    jobs from the daemon's one queue in arrival order, so the next idle
    worker takes the next job.
    """

    def __init__(self, host: Host, jobs: queue.Queue[Any], index: int = 0, device: int = 0) -> None:
        super().__init__(name=f"mmd-worker-{index}", daemon=True)
        self.host = host
        self.index = index
        self.device = device
        self.jobs = jobs
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.reopen = threading.Event()
        self.failed: MmdError | None = None
        self.busy_since: float | None = None
        self.beat = time.monotonic()
        self.backends = BackendPool(device)
        #: The job in hand (claim, description, watch), for the supervisor; None between jobs.
        self.claim: Claim | None = None
        self.job: Job | None = None
        self.watch: JobWatch | None = None
        #: Set by the supervisor that stopped this worker's job and started a replacement: when its job
        #: returns (if it ever does), the thread ends without touching the spool or the state again.
        self.abandoned = False

    # -- backends (only ever touched in this thread) --
    def backend(self, settings: Settings) -> Backend:
        """The backend ``settings`` ask for, opened once in this thread and kept."""
        return self.backends.get(settings)

    def drop_backends(self) -> None:
        """Forget backends so the next job opens them with new settings (after a reload)."""
        self.reopen.set()

    def _state(self, **changes: Any) -> None:
        self.host.state.worker(self.index, **changes)

    # -- the loop --
    def run(self) -> None:
        try:
            try:
                backend = self.backend(self.host.settings)
                self._state(device_index=self.device, backend=backend.name, device=_device_name(backend))
            except MmdError as exc:
                self.failed = exc
                return
            finally:
                self.ready.set()
            while not self.stop_event.is_set():
                self.beat = time.monotonic()
                try:
                    kind, item = self.jobs.get(timeout=HEARTBEAT)
                except queue.Empty:
                    continue
                if self.stop_event.is_set() or kind == "stop" or self.abandoned:
                    break
                if self.reopen.is_set():
                    self.reopen.clear()
                    self.backends.close()
                self.busy_since = time.monotonic()
                try:
                    self.process(kind, item)
                except Exception as exc:  # last line: the worker thread must outlive any job
                    get_logger().exception("job escaped the job boundary", error=repr(exc))
                finally:
                    if not self.abandoned:  # else the supervisor has done all this for the job
                        self.busy_since = None
                        self.claim = self.job = self.watch = None
                        self._state(current=None)
                        self.host.hint(DONE, item if kind == "name" else item.name)
                if self.abandoned:
                    break
        finally:
            self.backends.close()

    def submit(self, kind: str, item: Any) -> None:
        """Queue a job: ``("name", inbox name)`` or ``("resume", Claim)`` (on the queue all workers share)."""
        self.jobs.put((kind, item))

    def process(self, kind: str, item: Any) -> None:
        """One job, start to archive (or hold); nothing it raises escapes.

        ``kind``: ``"name"`` (an inbox name to claim) or ``"resume"`` (a
        :class:`Claim` from ``.work``: resumed at start, or taken back).
        """
        spool = self.host.spool
        log = get_logger(file=shown(item if kind == "name" else item.name))
        claim: Claim | None = None
        if kind == "name" and self.host.paused():
            return  # outbox trouble: the file stays in the inbox until the pause ends
        try:
            if kind == "name":
                try:
                    claim = spool.claim(item)
                except SpoolError as exc:
                    # Still in the inbox, tried again at a later rescan (or, claimed but not
                    # examinable, left in .work and taken back after the pause).
                    log.error("cannot claim", reason=exc.reason)
                    self.host.hint(BROKEN, item)
                    return
            else:
                claim = item
            if claim is None:
                log.debug("already taken")  # claimed by someone else or removed: harmless
                return
            self.watch = JobWatch(self.host.settings.job_timeout_s)
            self.claim = claim
            log = log.bind(job=claim.job_id, file=shown(claim.name))
            if self.host.worker_count > 1:
                log = log.bind(device_index=self.device)
            if claim.original is not None:
                log.info("claimed under a safe name", original=shown(claim.original))
            self._state(current={"job": claim.job_id, "file": shown(claim.name), "since": now_iso()})
            self._run(claim, log)
        except Exception as exc:  # the job boundary: a job never kills the daemon
            log.exception("internal error in job", error=repr(exc))
            if claim is not None:
                try:
                    refused = refuse(self._job(claim), InternalError.from_exception(exc), ops=spool.ops)
                    self._conclude(claim, refused, log)
                except Exception as again:  # its refusal failed too: keep the job in .work for later
                    log.exception("cannot refuse the job; it stays in .work", error=repr(again))
                    spool.leave(claim)

    def _context(self, claim: Claim) -> Context:
        collision = claim.collision()
        return Context(
            original_name=shown(claim.original) if claim.original is not None else None,
            collision=record.Collision(**collision) if collision else None,
            resumed=True if claim.resumed else None,
            device_index=self.device,
            host=self.host.host_id,
        )

    def _job(self, claim: Claim, refusal: MmdError | None = None) -> Job:
        return describe(
            claim.path,
            claim.output,
            self.host.settings,
            name=claim.original or claim.name,
            job_id=claim.job_id,
            started=claim.started,
            context=self._context(claim),
            refusal=refusal,
        )

    def _run(self, claim: Claim, log: Any) -> None:
        spool = self.host.spool
        if claim.resumed or claim.again:
            finished = spool.finished(claim)
            if finished is not None:
                ok, path = finished
                if self._archive(claim, ok, log):
                    log.info("job was already finished; archived", sidecar=path.name, status="ok" if ok else "error")
                    self._record(claim, ok, path, None)
                return
            settled = spool.settle(claim)
            if settled.output != claim.output:
                log.warning("its output version was taken meanwhile; moved", output=settled.output.name)
            claim = settled
            if claim.again:
                log.info("taking a held job back", **_hold_facts(spool.attempts(claim)))
            else:
                log.info("resuming job left by an earlier daemon")
        if claim.reservation is None:
            # The outbox refused even the reservation: nothing the job writes could be committed. Held unrun.
            self._hold(claim, claim.unreserved or "cannot reserve its output name", log, output_failed=False)
            return
        refusal: MmdError | None = None
        if claim.problem is not None or not claim.regular:
            problem = claim.problem or "is not a regular file (a link, folder or device); mmd does not follow it"
            refusal = SpoolError(f"{shown(claim.original or claim.name)} {problem}")
        else:
            starts = spool.attempt(claim)
            limit = self.host.settings.max_attempts
            if starts > limit:
                refusal = CrashedError(
                    f"{shown(claim.original or claim.name)} was started {starts - 1} times and the daemon died "
                    f"each time (max_attempts: {limit}); it is not started again",
                    {"attempts": starts - 1, "max_attempts": limit},
                )
                log.error("a job that kills the daemon: failed", attempts=starts - 1)
        job = self.job = self._job(claim, refusal)
        watch = self.watch or JobWatch(job.settings.job_timeout_s)
        watch.limit_s = job.settings.job_timeout_s  # the name may set its own
        try:
            result = run_job(job, self.backend, watch, ops=spool.ops)
        except JobStopped:
            log.warning("stopped past its time limit; its supervisor refused it", phase=watch.phase)
            return
        if isinstance(result.error, CudaError):
            # A fault inside a kernel (an illegal address) leaves the CUDA context unusable:
            # drop this worker's backends; the next job opens a fresh context.
            log.warning("CUDA error: reopening the backend for the next job", reason=result.error.reason)
            self.backends.close()
        self._conclude(claim, result, log)

    def _conclude(self, claim: Claim, result: JobResult, log: Any) -> None:
        """Archive the job by its fate, or hold it when the outbox refused what it had to write.

        An output the outbox refuses is the outbox's fault, not the input's:
        the job is held. Only when the same job's output has failed
        :data:`MAX_OUTPUT_ATTEMPTS` times while the outbox still took its
        error sidecar (an output too big for the space left, say) is it
        failed with the reason, so that it does not block the jobs behind it.
        A job whose error sidecar cannot be written is never failed without
        one: it is held until the outbox takes it.
        """
        output_failed = isinstance(result.error, OutputError)
        if output_failed or result.sidecar_failed is not None:
            # Held for what the outbox refused: the output, else the error sidecar (not the refusal's reason).
            reason = result.error.reason if output_failed and result.error is not None else str(result.sidecar_failed)
            tries = self.host.spool.attempts(claim).output_failures + (1 if output_failed else 0)
            if not (output_failed and result.sidecar_failed is None and tries >= MAX_OUTPUT_ATTEMPTS):
                self._hold(claim, reason, log, output_failed=output_failed)
                return
            log.error("output not committed after %d attempts; job failed" % tries, reason=reason)
        self.host.output_committed()  # the outbox took this job's sidecar: whatever refused before has passed
        if self._archive(claim, result.ok, log):
            self._record(claim, result.ok, result.sidecar, result.record)

    def _hold(self, claim: Claim, reason: str, log: Any, output_failed: bool) -> None:
        """Keep the job claimed in ``.work`` (its reservation kept) and pause; the daemon takes it back after.

        What the job committed (its output, its own error sidecar) is removed
        first: nothing half done stays visible. The daemon takes no new job
        for ``rescan_seconds``, doubling with each failure in a row up to
        :data:`MAX_PAUSE`; then it takes the held jobs back before new ones.
        """
        spool = self.host.spool
        stuck = spool.discard_outputs(claim)
        if stuck:
            log.warning("cannot remove what the held job committed; it is replaced when it runs again", names=stuck)
        facts: dict[str, Any] = {}
        try:
            facts = _hold_facts(spool.hold(claim, reason, output_failed=output_failed))
        except SpoolError as err:  # the hold stands; only its count is lost
            log.warning("cannot record the hold in .work", reason=err.reason)
        pause = self._pause_for(reason)
        log.error(
            "the outbox refused the job; held in .work, tried again after the pause",
            reason=reason,
            pause_s=pause,
            **facts,
        )

    def _archive(self, claim: Claim, ok: bool, log: Any) -> bool:
        """Archive the job; when that fails it is left in ``.work``, archived when taken back after a pause."""
        try:
            self.host.spool.archive(claim, ok)
        except SpoolError as exc:
            self.host.spool.leave(claim)
            pause = self._pause_for(exc.reason)
            log.error("cannot archive; the job stays in .work and is archived later", reason=exc.reason, pause_s=pause)
            return False
        return True

    def _pause_for(self, reason: str) -> float:
        """Pause new jobs for ``rescan_seconds``, doubled for each spool failure in a row (up to MAX_PAUSE)."""
        failures = self.host.output_failed()
        pause = min(self.host.settings.rescan_seconds * 2 ** (failures - 1), MAX_PAUSE)
        self.host.pause(reason, pause)
        return pause

    def _record(self, claim: Claim, ok: bool, path: Path | None, rec: record.Record | None) -> None:
        overall = rec.timings_ms.overall if rec is not None else None
        reason = rec.error.reason if isinstance(rec, record.ErrorRecord) else ""
        kernel = rec.kernel if isinstance(rec, record.TimingRecord) else ""
        end = JobEnd(claim.job_id, "ok" if ok else "error", claim.original or claim.name,
                     claim.output if ok else None, path, reason, kernel)  # fmt: skip
        self.host.job_ended(end, rec, self._memory_used())
        self.host.state.finished(
            {
                "job": claim.job_id,
                "file": claim.name,
                "status": "ok" if ok else "error",
                "output": claim.output.name if ok else None,
                "sidecar": path.name if path else None,
                "overall_ms": overall,
                "device_index": self.device,
                "finished": now_iso(),
            },
            worker=self.index,
        )

    def _memory_used(self) -> tuple[int, int] | None:
        """(device, bytes of its memory in use) where this worker has a GPU backend open."""
        for backend in self.backends.opened:
            used = backend.memory_used()
            if used is not None:
                return self.device, used
        return None


def _hold_facts(attempts: Attempts) -> dict[str, Any]:
    """What a log line says of a job's holds."""
    return {"holds": attempts.holds, "output_failures": attempts.output_failures, "held_since": attempts.held_since}


def _device_name(backend: Backend) -> str | None:
    try:
        return backend.device_name()
    except Exception:  # a name is only for the status display
        return None
