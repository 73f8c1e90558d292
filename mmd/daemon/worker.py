"""The worker: one thread per device owns its backends and runs jobs in arrival order.

A worker sees the daemon only through :class:`Host`, the few things it needs
(settings, the spool, the state file, hints back to the main loop, and the
shared bookkeeping of outbox trouble); it imports nothing of the server.
"""

from __future__ import annotations

import contextlib
import os
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
from ..spool import Claim, Spool, shown
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
        """Take no new job for ``seconds``."""

    def output_attempt(self, name: str) -> int:
        """This try's number for inbox file ``name`` (1 unless it was given back after outbox trouble)."""
        ...

    def remember_attempts(self, name: str, tries: int) -> None: ...
    def output_committed(self) -> None: ...
    def output_failed(self) -> int:
        """Count an output the outbox refused; returns how many in a row."""
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
        """One job, start to archive; nothing it raises escapes."""
        spool = self.host.spool
        log = get_logger(file=shown(item if kind == "name" else item.name))
        claim: Claim | None = None
        if kind == "name" and self.host.paused():
            return  # outbox trouble: the file stays in the inbox until the pause ends
        try:
            try:
                if not os.path.isdir(spool.outbox):  # deleted under us: make it again
                    spool.outbox.mkdir(parents=True, exist_ok=True)
                claim = spool.claim(item) if kind == "name" else item
            except OSError as exc:
                raise SpoolError(f"cannot claim {item}: {exc.strerror or exc}") from None
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
            self._run(claim, log, item if kind == "name" else claim.name)
        except SpoolError as exc:
            if claim is None:  # the file stays in the inbox; it is tried again at a later rescan
                log.error("cannot claim", reason=exc.reason)
                self.host.hint(BROKEN, item)
            else:
                log.error("spool error", reason=exc.reason)
        except Exception as exc:  # the job boundary: a job never kills the daemon
            log.exception("internal error in job", error=repr(exc))
            if claim is not None:
                self._finish(claim, refuse(self._job(claim), InternalError.from_exception(exc)), log)

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

    def _run(self, claim: Claim, log: Any, inbox_name: str) -> None:
        spool = self.host.spool
        if claim.resumed:
            finished = spool.finished(claim)
            if finished is not None:
                ok, path = finished
                spool.archive(claim, ok)
                log.info(
                    "resumed job was already finished; archived", sidecar=path.name, status="ok" if ok else "error"
                )
                self._record(claim, ok, path, None)
                return
            settled = spool.settle(claim)
            if settled.output != claim.output:
                log.warning("its output version was taken meanwhile; moved", output=settled.output.name)
            claim = settled
            log.info("resuming job left by an earlier daemon")
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
            result = run_job(job, self.backend, watch)
        except JobStopped:
            log.warning("stopped past its time limit; its supervisor refused it", phase=watch.phase)
            return
        if isinstance(result.error, CudaError):
            # A fault inside a kernel (an illegal address) leaves the CUDA context unusable:
            # drop this worker's backends; the next job opens a fresh context.
            log.warning("CUDA error: reopening the backend for the next job", reason=result.error.reason)
            self.backends.close()
        tries = self.host.output_attempt(inbox_name)
        if isinstance(result.error, OutputError):
            if tries < MAX_OUTPUT_ATTEMPTS:
                self._retry_later(claim, result.error, log, tries)
                return
            log.error("output not committed after %d attempts; job failed" % tries, reason=result.error.reason)
        else:
            self.host.output_committed()
        self._finish(claim, result, log)

    def _finish(self, claim: Claim, result: JobResult, log: Any) -> None:
        """Archive the input by the job's fate and record it."""
        if result.sidecar_failed is not None:
            log.error("no error sidecar could be written; the input is kept in .failed")
        try:
            self.host.spool.archive(claim, result.ok)
        except MmdError as exc:
            log.error("cannot archive", reason=exc.reason)
        path = None if result.sidecar_failed is not None else result.sidecar
        self._record(claim, result.ok, path, result.record)

    def _retry_later(self, claim: Claim, exc: OutputError, log: Any, tries: int) -> None:
        """The outbox refused the result (disk full, quota, permissions): not the input's fault.

        This job's own output and error sidecar are removed (nothing
        half-done stays visible), the input goes back into the inbox, and the
        daemon takes no new job for a pause that doubles with each failure
        in a row; the next rescan after it tries again.
        """
        spool = self.host.spool
        for path in (claim.output, record.error_path(claim.output), record.timing_path(claim.output)):
            if path == claim.output or spool.owned_by(claim, path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        failures = self.host.output_failed()
        pause = min(self.host.settings.rescan_seconds * 2 ** (failures - 1), MAX_PAUSE)
        try:
            back = spool.give_back(claim)
            where = f"back in the inbox as {shown(back.name)}"
            self.host.remember_attempts(back.name, tries)
        except SpoolError as err:
            log.error("cannot give the job back; it stays in .work until the next start", reason=err.reason)
            where = "kept in .work"
        log.error("output not committed; retrying later", reason=exc.reason, input=where, pause_s=pause, attempt=tries)
        self.host.pause(exc.reason, pause)

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


def _device_name(backend: Backend) -> str | None:
    try:
        return backend.device_name()
    except Exception:  # a name is only for the status display
        return None
