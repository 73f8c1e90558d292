"""The daemon: watch the inbox, take complete files, run them one at a time, archive.

Threads:

* the **main thread** (:meth:`Daemon.serve`) owns the schedule: it reads
  *hints* (observer events, the worker's "done", signals) from one queue,
  decides when a file is complete (:class:`mmd.spool.Readiness`), rescans the
  inbox every ``rescan_seconds`` (events are only hints: inotify drops them on
  overflow), and hands complete names to the worker in arrival order;
* the **observer** (watchdog: inotify, or polling) turns filesystem events
  into hints;
* the **worker** owns the backend (opened, used and closed in that thread) and
  runs each job: claim → :func:`mmd.pipeline.run_job` → archive. A job never
  kills the daemon: anything a job raises becomes an error sidecar.

Signals are installed by :meth:`Daemon.serve`: SIGTERM/SIGINT let the job in
hand finish and exit 0 (a second one exits at once; the job left in ``.work``
resumes at the next start), SIGHUP reloads the settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import signal
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import atomic, record
from ..backends import worker_devices
from ..config import Settings, host_id_of
from ..errors import ConfigError, JobTimeout, MmdError, SpoolError
from ..fileops import OPS, FileOps
from ..hooks import Hooks, JobEnd
from ..job import describe
from ..logs import get_logger
from ..metrics import Metrics
from ..notify import Notifier, WatchdogPinger
from ..pipeline import refuse
from ..spool import Readiness, Spool, state_name
from . import common
from .common import (
    BROKEN,
    COMPLETE,
    DONE,
    HEARTBEAT,
    INBOX,
    MAX_ABANDONED,
    PAUSE,
    RELOAD,
    RESCAN,
    SEEN,
    STOP,
    STUCK_AFTER,
    UMASK_BITS,
    WAKE,
    now_iso,
)
from .lock import SpoolLock
from .observer import make_observer
from .state import State
from .worker import Worker


class Daemon:
    """Serve one inbox: ``Daemon(settings).serve()``; ``serve(once=True)`` drains it and returns."""

    def __init__(self, settings: Settings, reload: Callable[[], Settings] | None = None, *, ops: FileOps = OPS) -> None:
        self.settings = settings
        self._reload = reload
        #: This host's id on a shared inbox (None: the daemon has the inbox to itself).
        self.host_id = host_id_of(settings) if settings.shared_inbox else None
        #: ``ops``: the spool's file operations (the tests inject faults through them).
        self.spool = Spool(settings.inbox, settings.outbox, self.host_id, ops)
        self.hints: queue.SimpleQueue = queue.SimpleQueue()
        self.state = State(
            self.spool.inbox / state_name(self.host_id),
            inbox=str(settings.inbox.resolve()),
            outbox=str(settings.outbox.resolve()),
            backend=settings.backend,
            **({"host": self.host_id} if self.host_id else {}),
        )
        self.log = get_logger()
        #: The jobs queue every worker takes from, in arrival order: ("name", inbox name) or ("resume", Claim).
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.workers: list[Worker] = []
        self._outputs_lock = threading.Lock()
        #: Spool steps refused in a row (an output, a reservation, an archive): the pause doubles with each.
        self._output_failures = 0
        self._swept = 0.0  # monotonic: the last full sweep of the outbox's reservations
        self._queued: set[str] = set()  # names handed to the worker and not yet done
        self._again: set[str] = set()  # completed again while queued: look once more when done
        self._readiness = Readiness(settings.quiet_seconds)
        self._stop_requests = 0
        self._beat = time.monotonic()
        self._backlog = False  # names left in the inbox because the queue was full
        self._broken: set[str] = set()  # names whose claim failed (retried at each rescan when serving)
        self._paused_until = 0.0  # monotonic: no new job before (the outbox refused a result)
        self._rescan_now = False
        self._once_failed: str | None = None  # with --once: why the drain stopped early
        self._lock: SpoolLock | None = None
        self._observer: Any = None
        self._inbox_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the inbox being served
        self._inbox_gone = False
        #: Workers whose job ran past its limit: replaced, their threads left to end on their own.
        self.abandoned: list[Worker] = []
        self.metrics = Metrics(settings.metrics_file, settings.metrics_seconds)
        self.hooks = Hooks(settings.on_done, settings.on_error, settings.hook_timeout_s)

    # -- what workers see (worker.Host) --
    @property
    def worker_count(self) -> int:
        return len(self.workers)

    def hint(self, *hint: Any) -> None:
        self.hints.put(hint)

    def job_ended(self, end: JobEnd, rec: record.Record | None, memory_used: tuple[int, int] | None) -> None:
        if rec is not None:
            self.metrics.job_ended(rec)
        if memory_used is not None:
            self.metrics.gpu_memory.labels(str(memory_used[0])).set(memory_used[1])
        self.metrics.write(force=True)
        self.hooks.ended(end)

    def pause(self, reason: str, seconds: float) -> None:
        # Set here, not only by the hint: the next queued name must already wait.
        self._paused_until = time.monotonic() + seconds
        self.hints.put((PAUSE, reason, seconds))

    # -- outbox trouble, shared by the workers --
    def output_committed(self) -> None:
        with self._outputs_lock:
            self._output_failures = 0

    def output_failed(self) -> int:
        """Count a step the spool refused (the outbox, or an archive); returns how many in a row."""
        with self._outputs_lock:
            self._output_failures += 1
            return self._output_failures

    # -- signals --
    def _on_stop_signal(self, signum: int, _frame: Any) -> None:
        self._stop_requests += 1
        if self._stop_requests >= 2:
            job = self.state.snapshot().get("current")
            os.write(
                2,
                (
                    f"mmd serve: second {signal.Signals(signum).name}: stopping at once"
                    f"{'; ' + job['file'] + ' stays in .work and resumes at the next start' if job else ''}\n"
                ).encode(),
            )
            os._exit(1)
        self.hints.put((STOP, signal.Signals(signum).name))

    def _on_hup(self, _signum: int, _frame: Any) -> None:
        self.hints.put((RELOAD, None))

    def _install_signals(self) -> dict[int, Any]:
        old: dict[int, Any] = {}
        for sig, handler in (
            (signal.SIGTERM, self._on_stop_signal),
            (signal.SIGINT, self._on_stop_signal),
            (signal.SIGHUP, self._on_hup),
        ):
            old[sig] = signal.signal(sig, handler)
        return old

    # -- health, for the systemd watchdog --
    def health(self) -> tuple[bool, str]:
        now = time.monotonic()
        if not self.workers:
            return False, "the worker thread is not running"
        for w in self.workers:
            if not w.is_alive():
                return False, f"the worker thread of device {w.device} is not running"
            if w.busy_since is None and now - w.beat > STUCK_AFTER:
                return False, f"the worker of device {w.device} has not turned for {now - w.beat:.0f} s"
        if now - self._beat > STUCK_AFTER:
            return False, f"the main loop has not turned for {now - self._beat:.0f} s"
        stuck = [w for w in self.abandoned if w.is_alive()]
        if len(stuck) >= MAX_ABANDONED:
            # Jobs that do not return even when stopped (a hung kernel holds its GPU): let systemd restart us.
            return False, f"{len(stuck)} jobs stopped past their time limit are still running in their threads"
        return True, ""

    # -- time limits --
    def _check_timeouts(self) -> None:
        """Stop every job past its time limit: refuse it, archive it, and give its device a new worker."""
        now = time.monotonic()
        for i, w in enumerate(self.workers):
            watch, claim = w.watch, w.claim
            if watch is None or claim is None or not watch.overdue(now) or not watch.stop():
                continue
            phase, limit = watch.phase, watch.limit_s
            log = self.log.bind(job=claim.job_id, file=claim.name, device_index=w.device)
            job = w.job or describe(claim.path, claim.output, self.settings, name=claim.original or claim.name,
                                    job_id=claim.job_id, started=claim.started)  # fmt: skip
            error = JobTimeout(
                f"the job ran past its time limit of {limit:g} s (in {phase}) and was stopped",
                {"limit_s": limit, "phase": phase},
            )
            if record.timing_path(job.output).exists() is False and os.path.lexists(job.output):
                with contextlib.suppress(OSError):  # committed before it was stopped, its sidecar not: ours
                    os.unlink(job.output)
            result = refuse(job, error, {"overall": (time.perf_counter() - job.started) * 1e3})
            try:
                self.spool.archive(claim, False)
            except MmdError as exc:
                log.error("cannot archive", reason=exc.reason)
            log.error("job stopped past its time limit", limit_s=limit, phase=phase)
            w.abandoned = True
            self.abandoned.append(w)
            replacement = Worker(self, self.jobs, w.index, w.device)
            self.workers[i] = replacement
            replacement.start()
            self.state.finished(
                {
                    "job": claim.job_id,
                    "file": claim.name,
                    "status": "error",
                    "output": None,
                    "sidecar": result.sidecar.name if result.sidecar_failed is None else None,
                    "overall_ms": result.record.timings_ms.overall,
                    "device_index": w.device,
                    "finished": now_iso(),
                },
                worker=w.index,
            )
            end = JobEnd(claim.job_id, "error", claim.original or claim.name, None, result.sidecar, error.reason)
            self.job_ended(end, result.record, None)
            self.hints.put((DONE, claim.name))

    def paused(self) -> bool:
        """Whether new jobs wait (the outbox refused a result a moment ago)."""
        return time.monotonic() < self._paused_until

    # -- scheduling --
    def _offer(self, name: str, complete: bool) -> None:
        """A hint that ``name`` may be a job; queue it when it is complete."""
        if name in self._queued:
            if complete:
                self._again.add(name)
            return
        if not complete:
            cand = self.spool.stat(name)
            if cand is None:
                self._readiness.forget(name)
                return
            if not self._readiness.observe(name, cand.size, cand.mtime_ns):
                return
        self._readiness.forget(name)
        if self.paused():
            return  # it stays in the inbox; the rescan after the pause takes it
        if len(self._queued) >= self.settings.max_queue:
            if not self._backlog:
                self.log.warning(
                    "queue full; later files wait in the inbox for a rescan", max_queue=self.settings.max_queue
                )
                self.state.update(backlog=True)
            self._backlog = True
            return
        self._queued.add(name)
        self.jobs.put(("name", name))
        self.state.update(queue=self.jobs.qsize())

    def _rescan(self) -> int:
        """Offer every waiting file; returns how many job files wait (not counting broken ones)."""
        found = [c for c in self.spool.scan() if c.name not in self._broken]
        for cand in found:
            if cand.name not in self._queued and self._readiness.observe(cand.name, cand.size, cand.mtime_ns):
                self._offer(cand.name, complete=True)
        known = {c.name for c in found}
        for name in self._readiness.pending:
            if name not in known:
                self._readiness.forget(name)
        return len(found)

    def _recheck_pending(self) -> None:
        for name in self._readiness.pending:
            self._offer(name, complete=False)

    def _handle(self, hint: tuple[Any, ...]) -> None:
        kind = hint[0]
        if kind == COMPLETE:
            self._offer(hint[1], complete=True)
        elif kind == SEEN:
            self._offer(hint[1], complete=False)
        elif kind == DONE:
            name = hint[1]
            self._queued.discard(name)
            self.state.update(queue=self.jobs.qsize())
            if name in self._again:
                self._again.discard(name)
                self._offer(name, complete=True)
        elif kind == BROKEN:
            self._broken.add(hint[1])
        elif kind == STOP:
            self.log.info("stopping after the job in hand", signal=hint[1])
        elif kind == RELOAD:
            self._reload_settings()
        elif kind == RESCAN:
            self.log.warning("rescanning the inbox", reason=hint[1])
            self._rescan_now = True
        elif kind == INBOX:
            self._check_inbox()
        elif kind == PAUSE:
            _, reason, seconds = hint
            self._paused_until = time.monotonic() + seconds
            self.state.update(paused={"reason": reason, "seconds": seconds, "since": now_iso()})
            self._once_failed = reason

    def _tend(self, now: float) -> None:
        """At a rescan, out of a pause: take back the jobs left in ``.work`` (held ones first, before any new
        name), and sweep stale reservations (the full listing of the outbox at most every
        RESERVATION_SWEEP_SECONDS)."""
        for claim in self.spool.take_back():
            self._queued.add(claim.name)
            self.jobs.put(("resume", claim))
        if now - self._swept >= common.RESERVATION_SWEEP_SECONDS:
            self._swept = now
            for path in self.spool.sweep_reservations():
                self.log.info("removed a stale output reservation left by a dead daemon", path=str(path))

    def _check_inbox(self) -> None:
        """Follow the inbox being deleted (wait) and recreated (serve the new folder)."""
        try:
            info = os.stat(self.spool.inbox)
            ident: tuple[int, int] | None = (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None
        except OSError:
            ident = None
        if ident == self._inbox_id:
            return
        if ident is None:
            if not self._inbox_gone:
                self.log.error("the inbox is gone; waiting for it to be made again", inbox=str(self.spool.inbox))
                self.state.update(status="inbox missing")
            self._inbox_gone = True
            return
        self.log.warning("the inbox was made again; serving the new folder", inbox=str(self.spool.inbox))
        self._inbox_gone = False
        self._inbox_id = ident
        self.spool.forget_folders()
        self.spool.prepare()
        if self._lock is not None:
            self._lock.release()
            self._lock.acquire()  # SpoolError if another daemon took the new inbox meanwhile
        if self._observer is not None:
            self._observer.stop()
            with contextlib.suppress(RuntimeError):
                self._observer.join(timeout=5)
            self._observer, _kind = make_observer(
                self.settings.observer, self.spool.inbox, self.hints, self.settings.poll_seconds, self.log
            )
        self._broken.clear()
        self._rescan_now = True
        self.state.update(status="serving")

    def _reload_settings(self) -> None:
        if self._reload is None:
            self.log.warning("SIGHUP: nothing to reload from")
            return
        try:
            new = self._reload()
        except MmdError as exc:
            self.log.error("SIGHUP: config not reloaded", reason=exc.reason)
            return
        if (new.inbox, new.outbox) != (self.settings.inbox, self.settings.outbox):
            self.log.warning(
                "SIGHUP: inbox/outbox changes need a restart; keeping the old ones",
                inbox=str(self.settings.inbox),
                outbox=str(self.settings.outbox),
            )
            new = new.replace(inbox=self.settings.inbox, outbox=self.settings.outbox)
        if (new.devices, new.shared_inbox, new.host_id) != (
            self.settings.devices,
            self.settings.shared_inbox,
            self.settings.host_id,
        ):
            self.log.warning("SIGHUP: devices, shared_inbox and host_id changes need a restart; keeping the old ones")
            new = dataclasses.replace(
                new,
                devices=self.settings.devices,
                shared_inbox=self.settings.shared_inbox,
                host_id=self.settings.host_id,
            )
        backend_changed = (new.backend, new.kernel_cache) != (self.settings.backend, self.settings.kernel_cache)
        self.settings = new
        self._readiness.quiet = new.quiet_seconds
        if backend_changed:
            for w in self.workers:
                w.drop_backends()
        self.state.update(backend=new.backend)
        self.log.info("SIGHUP: settings reloaded", sources=list(new.sources))

    # -- the loop --
    def serve(self, once: bool = False) -> int:
        """Serve until SIGTERM/SIGINT (exit 0), or with ``once`` until the inbox is drained."""
        old_umask = os.umask(UMASK_BITS)
        os.umask(old_umask | UMASK_BITS)
        lock = self._lock = SpoolLock(self.spool.inbox, self.host_id)
        if not self.settings.create_folders:
            for what, folder in (("inbox", self.spool.inbox), ("outbox", self.spool.outbox)):
                if not folder.is_dir():
                    os.umask(old_umask)
                    raise ConfigError(
                        f"the {what} folder {str(folder)!r} does not exist; make it, fix the path, or give --create "
                        "(create_folders: true) to have mmd make it"
                    )
        try:
            self.spool.prepare()
            lock.acquire()
        except BaseException:
            os.umask(old_umask)
            raise
        info = os.stat(self.spool.inbox)
        self._inbox_id = (info.st_dev, info.st_ino)
        old_signals = self._install_signals()
        atomic.set_host(self.host_id)
        notifier = Notifier()
        pinger: WatchdogPinger | None = None
        try:
            for path in self.spool.sweep_temporaries():
                self.log.info("removed a temporary left by a killed process", path=str(path))
            devices = worker_devices(self.settings.backend, self.settings.devices)
            self.workers = [Worker(self, self.jobs, i, device) for i, device in enumerate(devices)]
            for w in self.workers:
                w.start()
            for w in self.workers:
                w.ready.wait()
            for w in self.workers:
                if w.failed is not None:
                    raise w.failed
            resumed = self.spool.resumable()
            for path in self.spool.sweep_reservations(resumed):
                self.log.info("removed a stale output reservation left by a dead daemon", path=str(path))
            self._swept = time.monotonic()
            for claim in resumed:
                self._queued.add(claim.name)
                self.jobs.put(("resume", claim))
            kind = "once"
            if not once:
                self._observer, kind = make_observer(
                    self.settings.observer, self.spool.inbox, self.hints, self.settings.poll_seconds, self.log
                )
            self.state.update(status="serving", observer=kind)
            waiting = self._rescan()
            self.log.info(
                "serving",
                inbox=str(self.spool.inbox),
                outbox=str(self.spool.outbox),
                observer=kind,
                backend=self.settings.backend,
                devices=devices,
                waiting=waiting,
                resumed=len(resumed),
                **({"host": self.host_id} if self.host_id else {}),
            )
            notifier.ready(f"serving {self.spool.inbox}")
            self.metrics.up.set(1)
            pinger = WatchdogPinger.start_for(notifier, self.health)
            return self._loop(once)
        finally:
            self.state.update(status="stopping")
            notifier.stopping("finishing the job in hand")
            observer = self._observer
            if observer is not None:
                observer.stop()
            running = [w for w in self.workers if w.is_alive()]
            for w in running:
                w.stop_event.set()
            for _ in running:
                self.jobs.put(("stop", None))
            for w in running:
                w.join()
            if pinger is not None:
                pinger.stop()
            self.state.update(status="stopped", queue=0, current=None)
            self.state.write(force=True)
            self.hooks.close()
            self.metrics.up.set(0)
            self._write_metrics(force=True)
            if observer is not None:
                with contextlib.suppress(RuntimeError):
                    observer.join(timeout=5)
            self._lock.release()
            atomic.set_host(None)
            os.umask(old_umask)
            for sig, handler in old_signals.items():
                signal.signal(sig, handler)
            notifier.close()
            self.log.info("stopped", done=self.state.snapshot()["done"])

    def _write_metrics(self, force: bool = False) -> None:
        """The periodic metrics: queue depth, what waits in the inbox and for how long (then the file)."""
        if self.metrics.path is None or (not force and (self.metrics.due_in() or 0) > 0):
            return
        waiting = self.spool.scan()
        self.metrics.queue.set(self.jobs.qsize())
        self.metrics.waiting.set(len(waiting))
        oldest = min((c.mtime_ns for c in waiting), default=None)
        self.metrics.oldest.set(max(0.0, time.time() - oldest / 1e9) if oldest is not None else 0.0)
        try:
            self.metrics.write(force=True)
        except OSError as exc:
            self.log.warning("cannot write the metrics file", path=str(self.metrics.path), reason=exc.strerror)

    def _loop(self, once: bool) -> int:
        next_rescan = time.monotonic() + (
            min(self.settings.quiet_seconds / 2, 0.1) if once else self.settings.rescan_seconds
        )
        while True:
            self._beat = time.monotonic()
            waits = [next_rescan - self._beat, HEARTBEAT]
            if self.paused():
                waits.append(self._paused_until - self._beat)
            for due in (self._readiness.due_in(), self.state.due_in(), self.metrics.due_in()):
                if due is not None:
                    waits.append(due)
            try:
                hint = self.hints.get(timeout=max(0.0, min(waits)))
            except queue.Empty:
                hint = (WAKE,)
            while True:
                self._handle(hint)
                if hint[0] == STOP:
                    return 0
                try:
                    hint = self.hints.get_nowait()
                except queue.Empty:
                    break
            if once and self._once_failed is not None:
                self.log.error("stopping: a result could not be committed", reason=self._once_failed)
                return 1
            self._check_inbox()
            now = time.monotonic()
            due = self._readiness.due_in()
            if due is not None and due <= 0:
                self._recheck_pending()
            if self._paused_until and now >= self._paused_until:
                self._paused_until = 0.0
                self.state.update(paused=None)
                self._rescan_now = True
            # A full queue is refilled by a rescan once it has drained to half (not after
            # every job: each rescan lists the whole inbox).
            refill = self._backlog and len(self._queued) <= self.settings.max_queue // 2
            if now >= next_rescan or refill or self._rescan_now:
                self._backlog = self._rescan_now = False
                self.state.update(backlog=False)
                if not once:
                    self._broken.clear()
                if not self.paused():
                    self._tend(now)
                found = self._rescan()
                next_rescan = now + (
                    min(self.settings.quiet_seconds / 2, 0.1) if once else self.settings.rescan_seconds
                )
                if once and not self._queued and not found:
                    return 0
            self._check_timeouts()
            self.state.write()
            self._write_metrics()
            if any(not w.is_alive() for w in self.workers):
                raise SpoolError("a worker thread stopped unexpectedly")
