"""The worker: one thread per device owns its backend and runs jobs in arrival order."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import jobname, sidecar
from ..backends import open_backend
from ..backends.base import Backend
from ..config import kernel_cache_dir
from ..errors import CudaError, MmdError, OutputError, SpoolError
from ..logs import get_logger
from ..pipeline import commit_refusal, request_for, run_job
from ..spool import Claim, shown
from .common import BROKEN, DONE, HEARTBEAT, MAX_OUTPUT_ATTEMPTS, MAX_PAUSE, PAUSE, now_iso

if TYPE_CHECKING:
    from .server import Daemon


class Worker(threading.Thread):
    """Claims, runs and archives jobs one at a time on one device; its backend lives and dies in this thread.

    ``mmd serve`` starts one worker per device (``devices``); all of them take
    jobs from the daemon's one queue in arrival order, so the next idle
    worker takes the next job.
    """

    def __init__(self, daemon: Daemon, index: int = 0, device: int = 0) -> None:
        super().__init__(name=f"mmd-worker-{index}", daemon=True)
        self.d = daemon
        self.index = index
        self.device = device
        self.jobs: queue.Queue[Any] = daemon.jobs
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.reopen = threading.Event()
        self.failed: MmdError | None = None
        self.busy_since: float | None = None
        self.beat = time.monotonic()
        self._backends: dict[str, Backend] = {}

    # -- backends (only ever touched in this thread) --
    def _backend(self, name: str) -> Backend:
        want = self.d.settings.backend if name == "auto" else name
        if want in self._backends:
            return self._backends[want]
        for backend in self._backends.values():
            if backend.name == want:
                return backend
        backend, note = open_backend(want, self.device, kernel_cache=kernel_cache_dir(self.d.settings))
        if note:
            get_logger().warning("backend fallback", note=note, device_index=self.device)
        self._backends[want] = backend
        return backend

    def _close_backends(self) -> None:
        for backend in self._backends.values():
            try:
                backend.close()
            except Exception as exc:  # closing must not hide the reason we are stopping
                get_logger().warning("backend close failed", error=repr(exc), device_index=self.device)
        self._backends.clear()

    def drop_backends(self) -> None:
        """Forget backends so the next job opens them with new settings (after a reload)."""
        self.reopen.set()

    def _state(self, **changes: Any) -> None:
        self.d.state.worker(self.index, **changes)

    # -- the loop --
    def run(self) -> None:
        try:
            try:
                backend = self._backend(self.d.settings.backend)
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
                if self.stop_event.is_set() or kind == "stop":
                    break
                if self.reopen.is_set():
                    self.reopen.clear()
                    self._close_backends()
                self.busy_since = time.monotonic()
                try:
                    self.process(kind, item)
                except Exception as exc:  # last line: the worker thread must outlive any job
                    get_logger().exception("job escaped the job boundary", error=repr(exc))
                finally:
                    self.busy_since = None
                    self._state(current=None)
                    self.d.hints.put((DONE, item if kind == "name" else item.name))
        finally:
            self._close_backends()

    def submit(self, kind: str, item: Any) -> None:
        """Queue a job: ``("name", inbox name)`` or ``("resume", Claim)`` (on the queue all workers share)."""
        self.jobs.put((kind, item))

    def process(self, kind: str, item: Any) -> None:
        """One job, start to archive; nothing it raises escapes."""
        spool = self.d.spool
        log = get_logger(file=shown(item if kind == "name" else item.name))
        claim: Claim | None = None
        if kind == "name" and self.d.paused():
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
            log = log.bind(job=claim.job_id, file=shown(claim.name))
            if len(self.d.workers) > 1:
                log = log.bind(device_index=self.device)
            if claim.original is not None:
                log.info("claimed under a safe name", original=shown(claim.original))
            self._state(current={"job": claim.job_id, "file": shown(claim.name), "since": now_iso()})
            self._run(claim, log, item if kind == "name" else claim.name)
        except SpoolError as exc:
            if claim is None:  # the file stays in the inbox; it is tried again at a later rescan
                log.error("cannot claim", reason=exc.reason)
                self.d.hints.put((BROKEN, item))
            else:
                log.error("spool error", reason=exc.reason)
        except Exception as exc:  # the job boundary: a job never kills the daemon
            log.exception("internal error in job", error=repr(exc))
            if claim is not None:
                self._refuse(claim, _internal(exc), {}, log)

    def _run(self, claim: Claim, log: Any, inbox_name: str) -> None:
        spool, settings = self.d.spool, self.d.settings
        extra: dict[str, Any] = {}
        if claim.original is not None:
            extra["original_name"] = shown(claim.original)
        if claim.collision():
            extra["collision"] = claim.collision()
        if claim.resumed:
            extra["resumed"] = True
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
        extra["device_index"] = self.device
        if self.d.host_id is not None:
            extra["host"] = self.d.host_id
        if claim.problem is not None or not claim.regular:
            problem = claim.problem or "is not a regular file (a link, folder or device); mmd does not follow it"
            self._refuse(claim, SpoolError(f"{shown(claim.original or claim.name)} {problem}"), extra, log)
            return
        try:
            name = jobname.parse(claim.original or claim.name)
            if name.overrides:
                extra["name_settings"] = dict(name.overrides)
            o = name.overrides
            request = request_for(settings, **o)
            backend = self._backend(o.get("backend", settings.backend))
        except MmdError as exc:  # a bad name or an unavailable backend: refused like bad input
            self._refuse(claim, exc, extra, log)
            return
        result = run_job(
            claim.path,
            claim.output,
            request,
            backend,
            limits=self.d.limits,
            started=claim.started,
            job_id=claim.job_id,
            extra=extra or None,
            durable=self.d.durable,
        )
        if isinstance(result.error, CudaError):
            # A fault inside a kernel (an illegal address) leaves the CUDA context unusable:
            # drop this worker's backends; the next job opens a fresh context.
            log.warning("CUDA error: reopening the backend for the next job", reason=result.error.reason)
            self._close_backends()
        tries = self.d.output_attempt(inbox_name)
        if not result.ok and isinstance(result.error, OutputError):
            if tries < MAX_OUTPUT_ATTEMPTS:
                self._retry_later(claim, result.error, log, tries)
                return
            log.error("output not committed after %d attempts; job failed" % tries, reason=result.error.reason)
        else:
            self.d.output_committed()
        if not result.ok and result.record.get("error", {}).get("sidecar_failed"):
            log.error("no error sidecar could be written; the input is kept in .failed")
        spool.archive(claim, result.ok)
        self._record(claim, result.ok, result.sidecar, result.record)

    def _retry_later(self, claim: Claim, exc: OutputError, log: Any, tries: int) -> None:
        """The outbox refused the result (disk full, quota, permissions): not the input's fault.

        This job's own output and error sidecar are removed (nothing
        half-done stays visible), the input goes back into the inbox, and the
        daemon takes no new job for a pause that doubles with each failure
        in a row; the next rescan after it tries again.
        """
        for path in (claim.output, sidecar.error_path(claim.output), sidecar.timing_path(claim.output)):
            if path == claim.output or self.d.spool.owned_by(claim, path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        failures = self.d.output_failed()
        pause = min(self.d.settings.rescan_seconds * 2 ** (failures - 1), MAX_PAUSE)
        try:
            back = self.d.spool.give_back(claim)
            where = f"back in the inbox as {shown(back.name)}"
            self.d.remember_attempts(back.name, tries)
        except SpoolError as err:
            log.error("cannot give the job back; it stays in .work until the next start", reason=err.reason)
            where = "kept in .work"
        log.error("output not committed; retrying later", reason=exc.reason, input=where, pause_s=pause, attempt=tries)
        self.d._paused_until = time.monotonic() + pause  # before the next queued name is looked at
        self.d.hints.put((PAUSE, exc.reason, pause))

    def _refuse(self, claim: Claim, exc: MmdError, extra: dict[str, Any], log: Any) -> None:
        """Refuse a job that never reached run_job (bad name, not a file, internal error)."""
        path = write_refusal(claim, exc, extra, self.d.durable)
        log.warning("job refused", status="error", kind=exc.kind, reason=exc.reason)
        try:
            self.d.spool.archive(claim, False)
        except MmdError as arch:
            log.error("cannot archive", reason=arch.reason)
        self._record(claim, False, path, None)

    def _record(self, claim: Claim, ok: bool, path: Path | None, record: dict[str, Any] | None) -> None:
        overall = ((record or {}).get("timings_ms") or {}).get("overall")
        self.d.state.finished(
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


def _device_name(backend: Backend) -> str | None:
    name = getattr(backend, "device_name", None)
    try:
        return name() if callable(name) else None
    except Exception:  # a name is only for the status display
        return None


def _internal(exc: BaseException) -> MmdError:
    err = MmdError(f"internal error in mmd: {type(exc).__name__}: {exc}", {"exception": type(exc).__name__})
    err.kind = "internal"  # type: ignore[misc]
    return err


def write_refusal(claim: Claim, exc: MmdError, extra: dict[str, Any], durable: bool) -> Path | None:
    """The error sidecar for a job refused before :func:`run_job`; None if it could not be written."""
    try:
        size: int | None = os.lstat(claim.path).st_size
    except OSError:
        size = None
    record, path = commit_refusal(
        exc,
        job_id=claim.job_id,
        input_info={"name": shown(claim.name), "bytes": size},
        output_path=claim.output,
        timings={"overall": (time.perf_counter() - claim.started) * 1e3},
        extra=extra,
        durable=durable,
        log=get_logger(job=claim.job_id, file=shown(claim.name)),
    )
    return None if "sidecar_failed" in record["error"] else path
