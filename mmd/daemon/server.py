"""The daemon: watch the inbox, hand complete files to worker processes, supervise them.

Processes and threads:

* the **main process** (:meth:`Daemon.serve`) owns the schedule. Its one
  loop waits on the inbox's inotify descriptor, its :class:`~.mailbox.Mailbox`
  (hints from the signal handlers, the local socket and a polling observer)
  and every worker's pipe at once; it hands what arrives to the
  :class:`~.intake.Intake` (which says when a file is complete and offers it
  to the :class:`~.scheduler.Scheduler`), rescans the inbox every
  ``rescan_seconds`` (events are only hints: inotify drops them on
  overflow), gives each worker the jobs the scheduler assigns it, and asks
  the :class:`~.supervisor.Supervisor` to look at the workers (time limits,
  deaths). It keeps the state file, the metrics and the hooks
  (:class:`~.ends.Ends`). It opens no backend.
* the **observer** (:mod:`.observer`, held by :class:`~.inbox.Inbox`)
  turns filesystem events into hints: the inbox's inotify descriptor, read
  by the main loop itself, or watchdog's polling observer, a thread that
  posts to the mailbox;
* the **workers** (:mod:`.worker`, one process each, :mod:`.pool`) claim,
  run and archive the jobs they are given, each with its own backend (its
  own CUDA context), and report each job's end. A job never kills the
  daemon: anything a job raises becomes an error sidecar, and a worker that
  dies (a time limit, OOM, a crash) costs only its job.

What the daemon holds while it serves (the umask, the lock, the signal
handlers, the observer, the control socket, the workers ...) is entered on
one :class:`contextlib.ExitStack` by :meth:`Daemon.serve` (:mod:`.service`),
and undone in the reverse order. SIGTERM/SIGINT let the jobs in hand finish
and exit 0 (a second one ends the workers and exits at once; the jobs left
in ``.work`` resume at the next start), SIGHUP reloads the settings.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from .. import logs, spawning
from ..backends import worker_devices
from ..config import Settings, graders_gids, host_id_of, listen_address
from ..errors import ConfigError, MmdError, SpoolError
from ..fileops import OPS, FileOps
from ..hooks import Hooks
from ..logs import get_logger
from ..metrics import Metrics
from ..notify import Notifier
from ..record import now_iso
from ..spool import Shared, Spool, state_name
from . import service
from .backoff import FD_PAUSE_MAX_S, FD_PAUSE_S, Backoff
from .desk import Desk
from .ends import Ends
from .handins import HandInDesk
from .inbox import Inbox
from .intake import Intake
from .local import Limits, LocalSocket
from .lock import SpoolLock
from .mailbox import Mailbox, Waits
from .messages import (
    Arrived,
    Asked,
    Configure,
    Ended,
    Event,
    Hint,
    InboxChanged,
    InboxRemade,
    Kept,
    NotRun,
    Overflowed,
    Ready,
    ReloadRequested,
    Resume,
    RunOrder,
    StartFailed,
    StopRequested,
    WorkerSpec,
    Writing,
)
from .pool import WorkerHandle, WorkerPool
from .scheduler import Scheduler, workers_per_submitter
from .state import State
from .supervisor import Supervisor
from .tunables import HEARTBEAT, MAX_PAUSE, STUCK_AFTER, SUPERVISE_S
from .upkeep import Upkeep
from .windows import WINDOW_OPS, Windows


class Daemon:
    """Serve one inbox: ``Daemon(settings).serve()``; ``serve(once=True)`` drains it and returns."""

    def __init__(
        self,
        settings: Settings,
        reload: Callable[[], Settings] | None = None,
        *,
        ops: FileOps = OPS,
        worker_setup: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self._reload = reload
        #: This host's id on a shared inbox (None: the daemon has the inbox to itself).
        self.host_id = host_id_of(settings) if settings.shared_inbox else None
        #: ``ops``: the spool's file operations, the workers' too (the tests inject faults through them).
        self.ops = ops
        #: Called first in each worker process (a top-level function: the tests install fakes through it).
        self.worker_setup = worker_setup
        graders = graders_gids(settings)
        self.spool = Spool(Shared(settings.inbox, settings.outbox, self.host_id, ops, state_dir=settings.state_dir,
                                  class_mode=settings.class_mode, graders=graders))  # fmt: skip
        self.mailbox = Mailbox()
        self._waits = Waits()
        self.state = State(
            self.spool.shared.private / state_name(self.host_id),
            inbox=str(settings.inbox.resolve()),
            outbox=str(settings.outbox.resolve()),
            backend=settings.backend,
            # Where the metrics are, so that `mmd status --metrics` needs no config to find them.
            metrics_file=str(settings.metrics_file.resolve()) if settings.metrics_file else None,
            **({"host": self.host_id} if self.host_id else {}),
        )
        self.log = get_logger()
        self.scheduler = Scheduler(settings.max_queue, max_waiting=settings.max_waiting_per_submitter)
        self._lock = SpoolLock(self.spool.shared.private, self.host_id)
        #: The worker processes (made when serving starts), each holding the daemon's lock files.
        self.workers = WorkerPool(None, self._spec, self._lock.fds)
        self.metrics = Metrics(settings.metrics_file, settings.metrics_seconds)
        self.hooks = Hooks(settings.on_done, settings.on_error, settings.hook_timeout_s)
        #: Where the kernels students hand in are taken, off the main loop.
        self.handins = HandInDesk(settings, self.spool.shared.private, self.log)
        #: No new job while it lasts: the outbox refused a result (rescan_seconds, doubled for each in a row).
        self.pause = Backoff(MAX_PAUSE)

        def current() -> Settings:
            return self.settings

        self.ends = Ends(current, self.spool, self.scheduler, self.state, self.metrics, self.hooks, self.log)
        self.intake = Intake(current, self.spool, self.scheduler, self.handins, self.pause, self.ends, self.state,
                             self.log)  # fmt: skip
        self.upkeep = Upkeep(current, self.spool, self.scheduler, self.handins, self.metrics, self.log)
        self.supervisor = Supervisor(self.workers, self.spool, self.scheduler, self.intake, self.ends, self.state,
                                     self._on_event, self.log)  # fmt: skip
        #: What the control socket's askers are answered (their own jobs).
        self.desk = Desk(self.spool, self.scheduler, self.workers, self.supervisor, self.ends, current, graders)
        #: Graders' timed windows: a device's workers given no new job while one is held (``mmd grade --service``).
        self.windows = Windows(self.scheduler, self.workers, self.desk.sees_all, current, self.log)
        #: The inbox folder: watched, and followed when it is made again.
        self.inbox = Inbox(self.spool, self._lock, self.mailbox.post, self.log)
        self._local: LocalSocket | None = None  # the control socket, while serving
        self._stopping: str | None = None  # the signal that asked for a stop
        self._beat = time.monotonic()
        self._rescan_now = False
        self._once_failed: str | None = None  # with --once: why the drain stopped early
        self._serving: Callable[[], Any] | None = None  # the "serving" line, until it is said
        self._fallbacks_said: set[str] = set()  # the workers' backend fallbacks, each said once

    # -- asked from outside --
    def request_stop(self, why: str = "request") -> None:
        """Stop as SIGTERM does (the jobs in hand finish); safe from any thread."""
        self.mailbox.post(StopRequested(why))

    def health(self) -> tuple[bool, str]:
        """Whether the main loop and the idle workers turn (for systemd's watchdog)."""
        now = time.monotonic()
        if now - self._beat > STUCK_AFTER:
            return False, f"the main loop has not turned for {now - self._beat:.0f} s"
        return self.workers.health(now, STUCK_AFTER)

    # -- the start and the end --
    def serve(self, once: bool = False) -> int:
        """Serve until SIGTERM/SIGINT (exit 0), or with ``once`` until the inbox is drained.

        What it holds while serving is entered on one ExitStack, in the order its teardown needs (:mod:`.service`).
        """
        with contextlib.ExitStack() as stack:
            stack.enter_context(service.tightened_umask())
            stack.enter_context(service.locked(self.spool, self._lock, self.settings.create_folders))
            self.workers.ctx = spawning.context()
            self.inbox.served()
            stack.enter_context(contextlib.closing(self.mailbox))
            stack.enter_context(contextlib.closing(self._waits))
            stack.enter_context(service.Signals(self.mailbox.post, self.workers))
            stack.enter_context(service.host_named(self.host_id))
            notifier = stack.enter_context(contextlib.closing(Notifier()))
            stack.enter_context(service.books_closed(self.state, self.hooks, self.metrics, self.upkeep.write_metrics,
                                                     self.log))  # fmt: skip
            service.take_over(self.spool, self.log)
            self.intake.start()
            resumed = self.spool.claims.resumable()
            self.upkeep.start(resumed)
            self.scheduler.resume(resumed)
            stack.callback(self.spool.spares.drop)
            stack.callback(self.handins.close)
            pings = stack.enter_context(service.AlivePings(notifier, self.health))
            # The jobs in hand finish once the observer and the control socket (entered below) are closed.
            stack.enter_context(service.draining(self.workers, self._on_event, self.state, notifier))
            kind = "once" if once else stack.enter_context(self.inbox.watched(self.settings))
            if not once:
                self._listen(stack)
            self._start_workers(kind, self.intake.rescan(), len(resumed))
            self.state.update(status="serving", observer=kind)
            self._say_serving()
            notifier.ready(f"serving {self.spool.shared.inbox}")
            self.metrics.up.set(1)
            pings.start()
            return self._loop(once)

    def _listen(self, stack: contextlib.ExitStack) -> None:
        """The control socket and the metrics' HTTP listener, where the settings ask for them."""
        if self.settings.control_socket is not None:
            self._local = LocalSocket(self.settings.control_socket, self.mailbox.post, self.log,
                                      Limits.of(self.settings))  # fmt: skip
            self._local.start()
            stack.enter_context(contextlib.closing(self._local))
        if self.settings.metrics_listen is not None:
            host, port = listen_address(self.settings.metrics_listen)
            try:
                self.metrics.listen(host, port)  # closed with the metrics (service.books_closed)
            except OSError as exc:
                raise ConfigError(f"metrics_listen: cannot listen on {host}:{port}: {exc.strerror}") from None

    def _start_workers(self, kind: str, waiting: int, resumed: int) -> None:
        """Start the workers (last: each start waits for the fork server's imports, which have run meanwhile) and
        wait until the first has opened its backend, giving it the jobs waiting (the others are taken as they come)."""
        devices = worker_devices(self.settings.backend, self.settings.devices, self.settings.workers_per_device)
        self.workers.start(devices)
        logs.ready()  # while the first worker starts: "serving" then waits for no import
        self._cap_submitters()
        for w in self.workers:
            self.state.worker(w.index, device_index=w.device, current=None, pid=w.pid)
        # said once the first worker is ready, once it has been given the jobs waiting (jobs go out as each is ready)
        self._serving = functools.partial(
            self.log.info, "serving", inbox=str(self.spool.shared.inbox), outbox=str(self.spool.shared.outbox),
            observer=kind, backend=self.settings.backend, workers=len(devices), devices=sorted(set(devices)),
            waiting=waiting, resumed=resumed, **({"host": self.host_id} if self.host_id else {}))  # fmt: skip
        self._await_workers()

    def _await_workers(self) -> None:
        """Wait for the first worker to open its backend (one that fails to: SpoolError) and give it the jobs
        waiting; the main loop takes the others as they come (the supervisor ends the daemon if one cannot)."""
        while True:
            pending = [w for w in self.workers if w.ready is None]
            if len(pending) < len(self.workers):
                return
            wait([w.conn for w in pending] + [self.mailbox], timeout=HEARTBEAT)
            for w, event, order in self.workers.events():
                self._on_event(w, event, order)
            for hint in self.mailbox.take():
                self._handle(hint)
            for w in pending:
                if w.failed is not None:
                    raise w.failed.error
                if w.ready is None and not w.alive():
                    raise SpoolError(f"worker {w.index} exited while starting (exit status {w.process.exitcode})")
            if self._stopping is not None:
                return
            self._dispatch()  # the first jobs go out before "serving" is said
            if any(w.ready is not None for w in self.workers):
                self._say_serving()

    def _say_serving(self) -> None:
        """Log "serving" (once)."""
        if self._serving is not None:
            self._serving()
            self._serving = None

    # -- workers --
    def _spec(self, index: int, device: int, count: int) -> WorkerSpec:
        return WorkerSpec(index, device, self.settings, os.getpid(), self.host_id, count, self.ops, self.worker_setup)

    def _cap_submitters(self) -> None:
        """The scheduler's per-submitter limits, from the settings and the workers there are."""
        s = self.settings
        self.scheduler.max_waiting = s.max_waiting_per_submitter
        self.scheduler.max_workers = workers_per_submitter(s.max_workers_per_submitter, len(self.workers),
                                                           s.class_mode)  # fmt: skip

    def _dispatch(self) -> None:
        if not self.scheduler.waiting:
            self.state.update(queue=0)
            return
        if self.pause.paused(time.monotonic()) or self._stopping is not None:
            return
        now = time.monotonic()
        for index, item in self.scheduler.assign(self.windows.free(self.workers.loads(), now), now):
            seq = self.workers.handles[index].next_seq()
            order: RunOrder | Resume
            if item.claim is not None:
                order = Resume(seq, item.claim)
            else:
                order = RunOrder(seq, item.name, item.job_id, item.seen)
                self.spool.in_hand.expect(order.job_id)  # in hand before its claim: a sweep never takes its reservation
            self.workers.give(index, order, item.small, item.submitter)
        self.state.update(queue=self.scheduler.waiting)

    def _on_event(self, w: WorkerHandle, event: Event, order: RunOrder | Resume | None = None) -> None:
        """One event of worker ``w``; ``order``: the order it answers (its inbox name is what the scheduler
        holds: a job claimed under a safe name reports that name, not the one it was dropped under)."""
        held = order.name if isinstance(order, RunOrder) else order.claim.name if isinstance(order, Resume) else None
        if isinstance(event, Ended):
            self.pause.passed()  # the outbox took this job's sidecar: whatever refused before has passed
            self.ends.ended(event, w.index)
            self.intake.ended(event.end.job, held or str(event.entry["file"]))
        elif isinstance(event, NotRun) and event.claimed is not None:
            # Claimed, but another file than the one offered: it waits again, by its real size and owner.
            again = isinstance(order, RunOrder) and self.scheduler.ended(order.job_id)
            self.scheduler.returned(event.claimed)
            if again:
                self.intake.offer(event.name, complete=True)
        elif isinstance(event, NotRun):
            if isinstance(order, RunOrder):
                self.spool.in_hand.forget(order.job_id)
                self.intake.ended(order.job_id, event.name, broken=event.broken)
        elif isinstance(event, Kept):
            self.spool.in_hand.leave(event.claim)
            if event.committed:
                self.pause.passed()
            self._pause(event.reason)
            self.scheduler.ended(event.claim.job_id)
        elif isinstance(event, Ready):
            self.state.worker(w.index, backend=event.backend, device=event.device)
            if event.fallback is not None and event.fallback not in self._fallbacks_said:
                self._fallbacks_said.add(event.fallback)
                self.log.info("backend fallback", note=event.fallback, device_index=w.device)
        elif isinstance(event, StartFailed):
            self.log.error("a worker cannot open its backend", worker=w.index, reason=event.error.reason)

    def _pause(self, reason: str) -> None:
        """Take no new job for a while (:attr:`pause`): the names given and not yet claimed stay in the inbox."""
        seconds = self.pause.fail(time.monotonic(), self.settings.rescan_seconds)
        self.workers.hold_new(True)
        for item in self.scheduler.drop_waiting():
            self.intake.readiness.forget(item.name)
        self.state.update(paused={"reason": reason, "seconds": seconds, "since": now_iso()})
        self.log.warning("pausing new jobs", reason=reason, pause_s=seconds)
        self._once_failed = reason

    def _unpause(self) -> None:
        self.pause.clear()
        self.workers.hold_new(False)
        self.state.update(paused=None)
        self._rescan_now = True

    # -- hints --
    def _handle(self, hint: Hint) -> None:
        if isinstance(hint, Arrived):
            self.intake.offer(hint.name, hint.complete)
        elif isinstance(hint, Writing):
            self.intake.readiness.writing(hint.name)
        elif isinstance(hint, Asked) and hint.op in WINDOW_OPS:
            self.windows.asked(hint, time.monotonic())
        elif isinstance(hint, Asked):
            if not hint.reply.done():  # the asker may have given up waiting
                hint.reply.set_result(self.desk.answer(hint))
        elif isinstance(hint, StopRequested):
            # At once, before anything is said: a worker that ends its job from here on claims no name it was
            # given (a job in hand finishing just after the log line would otherwise start the next).
            self.workers.hold_new(True)
            if self._stopping is None:
                self.log.info("stopping after the jobs in hand", signal=hint.signal)
            self._stopping = hint.signal
        elif isinstance(hint, ReloadRequested):
            self._reload_settings()
        elif isinstance(hint, InboxChanged):
            self._check_inbox()
        elif isinstance(hint, Overflowed):
            self.log.warning("inotify's queue overflowed; scanning the inbox")
            self._rescan_now = True

    def _check_inbox(self) -> None:
        """Follow the inbox being deleted (wait) and made again (serve the new folder)."""
        change = self.inbox.check(self.settings)
        if change == "gone":
            self.state.update(status="inbox missing")
        elif change == "remade":
            self.workers.broadcast(InboxRemade())  # the workers' spools make their folders anew too
            self.scheduler.forgive()
            self._rescan_now = True
            self.state.update(status="serving")

    def _reload_settings(self) -> None:
        if self._reload is None:
            self.log.warning("SIGHUP: nothing to reload from")
            return
        try:
            new = service.reloaded(self.settings, self._reload(), self.log)
        except MmdError as exc:
            self.log.error("SIGHUP: config not reloaded", reason=exc.reason)
            return
        reopen = (new.backend, new.kernel_cache) != (self.settings.backend, self.settings.kernel_cache)
        self.settings = new
        self.intake.readiness.quiet = new.quiet_seconds
        self._cap_submitters()
        if self._local is not None:
            self._local.limits = Limits.of(new)
        self.workers.broadcast(Configure(new, reopen))
        if reopen:  # until a worker opens the new backend; otherwise the workers keep the ones they opened
            self.state.update(backend=new.backend)
        self.log.info("SIGHUP: settings reloaded", sources=list(new.sources))

    # -- the loop --
    def _loop(self, once: bool) -> int:
        """:meth:`_turns` until it returns; a turn that found no descriptor left (EMFILE, ENFILE: this
        process's limit or the system's, by whatever took them) is logged and taken up again after a pause,
        never the daemon's end."""
        fds = Backoff(FD_PAUSE_MAX_S, row_s=2 * FD_PAUSE_MAX_S)
        while True:
            try:
                return self._turns(once)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                pause = fds.fail(time.monotonic(), FD_PAUSE_S)
                self.log.error("out of file descriptors; serving again after a pause", reason=exc.strerror,
                               pause_s=pause)  # fmt: skip
                time.sleep(pause)

    def _turns(self, once: bool) -> int:
        period = min(self.settings.quiet_seconds / 2, 0.1) if once else self.settings.rescan_seconds
        next_rescan = time.monotonic() + period
        while True:
            self._beat = now = time.monotonic()
            waits = [next_rescan - now, HEARTBEAT]
            if self.pause.paused(now):
                waits.append(self.pause.until - now)
            for due in (self.intake.readiness.due_in(), self.state.due_in(), self.metrics.due_in(),
                        self.windows.due_in(now)):  # fmt: skip
                if due is not None:
                    waits.append(due)
            waits += self.workers.waits(now, SUPERVISE_S)
            watcher = self.inbox.watcher
            watched = watcher.waitables() if watcher is not None else []
            # The mailbox is readable as a descriptor; so is the inbox's inotify watch, read here, not by a thread.
            # Each is read only when the wait found it readable: most turns are a worker's event alone.
            readable: list[Any] = [*self.workers.conns(), self.mailbox, *watched]
            ready = self._waits.wait(readable, max(0.0, min(waits)))
            if watcher is not None and any(obj in ready for obj in watched):
                arrived = watcher.take()
                for hint in arrived:
                    self._handle(hint)
                if arrived:
                    self._dispatch()  # a lone arrival's order goes out before the rest of the turn
            for w, event, order in self.workers.events(ready):
                self._on_event(w, event, order)
            if self.mailbox in ready:
                for hint in self.mailbox.take():
                    self._handle(hint)
            if self._stopping is not None:
                return 0
            if once and self._once_failed is not None:
                self.log.error("stopping: a result could not be committed", reason=self._once_failed)
                return 1
            now = time.monotonic()
            self.intake.look_again()
            if self.pause.over(now):
                self._unpause()
            # A full queue is refilled by a rescan once it has drained to half (not after
            # every job: each rescan lists the whole inbox).
            if now >= next_rescan or self.scheduler.refill_due() or self._rescan_now:
                self.scheduler.refilling()
                self._rescan_now = False
                self.state.update(backlog=False)
                if not once:
                    self.scheduler.forgive()
                if not self.pause.paused(now):
                    self.upkeep.tend(now)
                found = self.intake.rescan()
                next_rescan = now + period
                if once and not self.scheduler.held and not found and not self.spool.in_hand.left:
                    return 0
            # Orders first: a worker found dead or overdue below gives back what it was given, and a name given
            # from an inbox found replaced is not claimed. A window's time up, its device takes jobs again.
            self.windows.tend(now)
            self._dispatch()
            self._check_inbox()
            self.supervisor.check(now, stopping=self._stopping is not None)
            for index, current in self.workers.current():
                self.state.worker(index, current=current)
            self.state.write()
            self.upkeep.write_metrics()
