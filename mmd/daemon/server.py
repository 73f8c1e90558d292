"""The daemon: watch the inbox, hand complete files to worker processes, supervise them.

Processes and threads:

* the **main process** (:meth:`Daemon.serve`) owns the schedule. Its one
  loop waits on the inbox's inotify descriptor, its :class:`~.mailbox.Mailbox`
  (hints from the signal handlers, the local socket and a polling observer)
  and every worker's pipe at once; it decides when a
  file is complete (:class:`mmd.spool.Readiness`), rescans the inbox every
  ``rescan_seconds`` (events are only hints: inotify drops them on
  overflow), asks the :class:`~.scheduler.Scheduler` which job goes to
  which worker, and ends a job past its time limit by ending its worker. It
  keeps the state file, the metrics and the hooks. It opens no backend.
* the **observer** (:mod:`.observer`) turns filesystem events into hints:
  the inbox's inotify descriptor, read by the main loop itself, or
  watchdog's polling observer, a thread that posts to the mailbox;
* the **workers** (:mod:`.worker`, one process each, :mod:`.pool`) claim,
  run and archive the jobs they are given, each with its own backend (its
  own CUDA context), and report each job's end. A job never kills the
  daemon: anything a job raises becomes an error sidecar, and a worker that
  dies (a time limit, OOM, a crash) costs only its job.

Signals are installed by :meth:`Daemon.serve`: SIGTERM/SIGINT let the jobs in
hand finish and exit 0 (a second one ends the workers and exits at once; the
jobs left in ``.work`` resume at the next start), SIGHUP reloads the settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import signal
import stat
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from .. import atomic, inboxfs, jobname, record, spawning
from ..backends import worker_devices
from ..config import Settings, graders_gids, host_id_of, listen_address
from ..errors import ConfigError, JobTimeout, MmdError, OutputError, SpoolError
from ..fileops import OPS, FileOps
from ..hooks import Hooks, JobEnd
from ..job import describe, new_id, own_kernels
from ..logs import get_logger
from ..metrics import Metrics
from ..notify import Notifier, WatchdogPinger
from ..pipeline import refuse
from ..record import now_iso
from ..spool import Arrival, Arrivals, Candidate, Claim, Readiness, Spool, Survey, Usage, shown, state_name
from ..spool.archive import refused_keep
from ..spool.handins import is_declaration, is_handin
from ..submitters import login_of
from . import common
from .common import HEARTBEAT, MAX_PAUSE, STOP_GRACE_S, STUCK_AFTER, SUPERVISE_S, tighten_umask
from .control import Running
from .desk import Desk
from .handins import HandInDesk
from .local import Limits, LocalSocket
from .lock import SpoolLock, lock_holder
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
    Run,
    StartFailed,
    StopRequested,
    WorkerSpec,
    Writing,
)
from .observer import Watcher, make_observer
from .pool import WorkerHandle, WorkerPool
from .scheduler import Scheduler, workers_per_submitter
from .state import State

#: Seconds the main loop pauses after a turn that found this process's descriptors used up (EMFILE, ENFILE),
#: doubled while it happens again soon, up to FD_PAUSE_MAX_S: a listing or an open failed; nothing is lost.
FD_PAUSE_S, FD_PAUSE_MAX_S = 0.5, 8.0


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
        self.spool = Spool(settings.inbox, settings.outbox, self.host_id, ops, state_dir=settings.state_dir,
                           class_mode=settings.class_mode, graders=graders_gids(settings))  # fmt: skip
        self.mailbox = Mailbox()
        self._waits = Waits()
        self.state = State(
            self.spool.private / state_name(self.host_id),
            inbox=str(settings.inbox.resolve()),
            outbox=str(settings.outbox.resolve()),
            backend=settings.backend,
            # Where the metrics are, so that `mmd status --metrics` needs no config to find them.
            metrics_file=str(settings.metrics_file.resolve()) if settings.metrics_file else None,
            **({"host": self.host_id} if self.host_id else {}),
        )
        self.log = get_logger()
        self.scheduler = Scheduler(settings.max_queue, max_waiting=settings.max_waiting_per_submitter)
        #: When this daemon (or the one before it, for what waits to be judged) first saw each inbox entry: a
        #: backlog's order, and the age of what is not a job (never an entry's mtime). Read from state_dir at start.
        self._arrivals = Arrivals()
        #: The part of it last written to state_dir (what waits to be judged), and whether that write failed.
        self._arrivals_kept: dict[str, Arrival] = {}
        self._arrivals_failed = False
        #: The worker processes (made when serving starts).
        self.workers = WorkerPool(None, self._spec, self._lock_fds)
        #: Spool steps refused in a row (an output, a reservation, an archive): the pause doubles with each.
        self._output_failures = 0
        self._swept = 0.0  # monotonic: the last full sweep of the outbox's reservations
        self._kept = float("-inf")  # monotonic: the last retention sweep
        self._readiness = Readiness(settings.quiet_seconds)
        self._stopping: str | None = None  # the signal that asked for a stop
        self._stop_requests = 0
        self._beat = time.monotonic()
        self._paused_until = 0.0  # monotonic: no new job before (the outbox refused a result)
        self._rescan_now = False
        self._once_failed: str | None = None  # with --once: why the drain stopped early
        self._lock: SpoolLock | None = None
        self._observer: Watcher | None = None
        self._local: LocalSocket | None = None  # the control socket, while serving
        self._inbox_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the inbox being served
        self._inbox_gone = False
        self._serving: Callable[[], Any] | None = None  # the "serving" line, until it is said
        self._fallbacks_said: set[str] = set()  # the workers' backend fallbacks, each said once
        self.metrics = Metrics(settings.metrics_file, settings.metrics_seconds)
        self.hooks = Hooks(settings.on_done, settings.on_error, settings.hook_timeout_s)
        #: What the control socket's askers are answered (their own jobs).
        self.desk = Desk(self.spool, self.scheduler, self.workers, self, graders_gids(settings))
        #: Where the kernels students hand in are taken, off the main loop.
        self.handins = HandInDesk(settings, self.spool.private, self.log)

    def _charge(self, t: record.Tally) -> None:
        """Count a finished job's time toward its submitter's share (the scheduler's fair share)."""
        if t.overall_ms is not None:
            self.scheduler.charge(t.submitter, t.overall_ms / 1e3, time.monotonic())

    def _adopt_inbox_folders(self) -> None:
        """With a state_dir: take over the jobs a daemon of the inbox-only layout kept in the inbox, and in class
        mode set aside the outputs it left in the outbox itself (once no such daemon runs: its lock is in the
        inbox)."""
        if self.spool.private == self.spool.inbox:
            return
        holder = lock_holder(self.spool.inbox)
        if holder is not None:
            self.log.warning(
                "the inbox's own lock is held (a daemon without state_dir, or a user): its .work, .done and "
                ".failed are left where they are",
                pid=holder if holder > 0 else None,
            )
            return
        moved = self.spool.adopt_inbox_folders()
        if moved:
            self.log.info("moved the inbox's job folders into the state folder", moved=moved)
        aside = self.spool.set_aside_shared_outputs()
        if aside:
            self.log.warning("class mode: outputs from before it set aside, out of the class's reach",
                             folder=".before-class-mode", files=len(aside))  # fmt: skip

    def _check_inbox_filesystem(self) -> None:
        """Class mode: warn when a file can reach the inbox by a rename from a folder where one student may move
        another's (a job in its owner's name; mmd.inboxfs). A warning only: the fix is the admin's (a mount)."""
        if not self.spool.class_mode:
            return
        try:
            found = inboxfs.check(self.spool.inbox)
        except OSError as exc:
            self.log.warning("cannot look at the inbox's filesystem", reason=exc.strerror or str(exc))
            return
        fields = {"filesystem": str(found.top), "entries": found.entries, "seconds": round(found.seconds, 3)}
        if found.safe:
            self.log.info(found.describe(), **fields)
        else:
            self.log.warning(found.describe(), open_folders=found.found, shown=[str(f) for f in found.shown],
                             covered=[str(p) for p in found.covered], partial=found.partial, **fields)  # fmt: skip

    # -- asked from outside --
    def request_stop(self, why: str = "request") -> None:
        """Stop as SIGTERM does (the jobs in hand finish); safe from any thread."""
        self.mailbox.post(StopRequested(why))

    def paused(self) -> bool:
        """Whether new jobs wait (the outbox refused a result a moment ago)."""
        return time.monotonic() < self._paused_until

    # -- signals --
    def _on_stop_signal(self, signum: int, _frame: Any) -> None:
        self._stop_requests += 1
        if self._stop_requests >= 2:
            busy = self.workers.kill_all()  # a worker must not go on with a job the next daemon resumes
            os.write(
                2,
                (
                    f"mmd serve: second {signal.Signals(signum).name}: stopping at once"
                    f"{f'; {busy} job(s) in hand stay in .work and resume at the next start' if busy else ''}\n"
                ).encode(),
            )
            os._exit(1)
        self.mailbox.post(StopRequested(signal.Signals(signum).name))

    def _on_hup(self, _signum: int, _frame: Any) -> None:
        self.mailbox.post(ReloadRequested())

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
        if now - self._beat > STUCK_AFTER:
            return False, f"the main loop has not turned for {now - self._beat:.0f} s"
        return self.workers.health(now, STUCK_AFTER)

    # -- workers --
    def _spec(self, index: int, device: int, count: int) -> WorkerSpec:
        return WorkerSpec(index, device, self.settings, os.getpid(), self.host_id, count, self.ops, self.worker_setup)

    def _lock_fds(self) -> list[int]:
        return self._lock.fds() if self._lock is not None else []

    def _dispatch(self) -> None:
        if not self.scheduler.waiting:
            self.state.update(queue=0)
            return
        if self.paused() or self._stopping is not None:
            return
        for index, item in self.scheduler.assign(self.workers.loads(), time.monotonic()):
            seq = self.workers.handles[index].next_seq()
            order: Run | Resume
            if item.claim is not None:
                order = Resume(seq, item.claim)
            else:
                order = Run(seq, item.name, item.job_id, item.seen)
                self.spool.expect(order.job_id)  # in hand before its claim: a sweep never takes its reservation
            self.workers.give(index, order, item.small, item.submitter)
        self.state.update(queue=self.scheduler.waiting)

    # -- events from workers --
    def _on_event(self, w: WorkerHandle, event: Event, order: Run | Resume | None = None) -> None:
        """One event of worker ``w``; ``order``: the order it answers (its inbox name is what the scheduler
        holds: a job claimed under a safe name reports that name, not the one it was dropped under)."""
        held = order.name if isinstance(order, Run) else order.claim.name if isinstance(order, Resume) else None
        if isinstance(event, Ended):
            self._output_failures = 0  # the outbox took this job's sidecar: whatever refused before has passed
            self.spool.forget(event.end.job)
            self.state.finished(event.entry, worker=w.index)
            if event.tally is not None:
                self.metrics.job_ended(event.tally)
                self._charge(event.tally)
            if event.memory_used is not None:
                self.metrics.gpu_memory.labels(str(event.memory_used[0])).set(event.memory_used[1])
            self.hooks.ended(event.end)
            self._ended(event.end.job, held or str(event.entry["file"]))
        elif isinstance(event, NotRun) and event.claimed is not None:
            # Claimed, but another file than the one offered: it waits again, by its real size and owner.
            again = isinstance(order, Run) and self.scheduler.ended(order.job_id)
            self.scheduler.returned(event.claimed)
            if again:
                self._offer(event.name, complete=True)
        elif isinstance(event, NotRun):
            if isinstance(order, Run):
                self.spool.forget(order.job_id)
                self._ended(order.job_id, event.name, broken=event.broken)
        elif isinstance(event, Kept):
            self.spool.leave(event.claim)
            if event.committed:
                self._output_failures = 0
            self._pause(event.reason)
            self.scheduler.ended(event.claim.job_id)
        elif isinstance(event, Ready):
            self.state.worker(w.index, backend=event.backend, device=event.device)
            if event.fallback is not None and event.fallback not in self._fallbacks_said:
                self._fallbacks_said.add(event.fallback)
                self.log.info("backend fallback", note=event.fallback, device_index=w.device)
        elif isinstance(event, StartFailed):
            self.log.error("a worker cannot open its backend", worker=w.index, reason=event.error.reason)

    def _ended(self, job_id: str, name: str, broken: bool = False) -> None:
        """Job ``job_id`` (of inbox name ``name``) ended or was not run: ``name`` is looked at again when a file
        was completed under it meanwhile."""
        if self.scheduler.ended(job_id, broken=broken):
            self._offer(name, complete=True)

    def _pause(self, reason: str) -> None:
        """Take no new job for ``rescan_seconds``, doubled for each spool failure in a row (up to MAX_PAUSE)."""
        self._output_failures += 1
        seconds = min(self.settings.rescan_seconds * 2 ** (self._output_failures - 1), MAX_PAUSE)
        self._paused_until = time.monotonic() + seconds
        self.workers.hold_new(True)  # names given and not yet claimed stay in the inbox
        for item in self.scheduler.drop_waiting():
            self._readiness.forget(item.name)
        self.state.update(paused={"reason": reason, "seconds": seconds, "since": now_iso()})
        self.log.warning("pausing new jobs", reason=reason, pause_s=seconds)
        self._once_failed = reason

    def _unpause(self) -> None:
        self._paused_until = 0.0
        self.workers.hold_new(False)
        self.state.update(paused=None)
        self._rescan_now = True

    # -- a worker past its job's limit, or dead --
    def _check_workers(self, now: float) -> None:
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
            elif not w.alive() and w.failed is None and self._stopping is None:
                self.log.error("a worker died", worker=w.index, exitcode=w.process.exitcode, jobs=len(w.in_hand))
                self._recover(i, running, None)

    def stop_running(self, worker: int, seq: int, error: MmdError) -> bool:
        """End a worker for its job ``seq`` (past its limit, or cancelled), if it runs that job now: the job gets
        ``error``'s sidecar, the others it held go back to the queue with no start charged, and a fresh worker
        takes its place. False, and nothing done, when the worker has moved on (the job ended meanwhile)."""
        running = self.workers.handles[worker].stop_job(seq, STOP_GRACE_S)
        if running is None:
            return False
        self._recover(worker, running, error)
        return True

    def _recover(self, i: int, running: Running | None, stopped: MmdError | None) -> None:
        """A worker is gone: read what it said last, refuse the job it was ended for (``stopped``: why), resume
        the jobs it had claimed (each counted as a start, as after a crash, unless it was ended for another
        job: then those its group had run are excused), give back the names it had not, replace it."""
        w = self.workers.handles[i]
        w.join()
        for event, order in w.events():
            self._on_event(w, event, order)
        left: dict[int, Run | Resume] = {**w.in_hand}
        w.close()
        ended_for = left.get(running.seq) if stopped is not None and running is not None else None
        ids = {order.claim.job_id if isinstance(order, Resume) else order.job_id: order for order in left.values()}
        found = {c.job_id: c for c in self.spool.in_work() if c.job_id in ids}
        resume = []
        for job_id, order in ids.items():
            claim = found.get(job_id)
            if claim is None:  # never claimed (or archived already): the name is the inbox's again, queued anew
                self.spool.forget(job_id)
                name = order.name if isinstance(order, Run) else order.claim.name
                self.scheduler.ended(job_id)
                self._offer(name, complete=True)
            elif order is ended_for and running is not None and stopped is not None:
                if not record.timing_path(claim.output).exists() and os.path.lexists(claim.output):
                    with contextlib.suppress(OSError):  # committed before it was stopped, its sidecar not: ours
                        os.unlink(claim.output)
                self.refuse_claimed(claim, stopped, w.device, (time.monotonic() - running.started) * 1e3)
            else:
                if stopped is not None and running is not None and order.seq < running.seq:
                    self._excuse(claim)  # run before the stopped job, its group's commit pending: not its fault
                resume.append(claim)
        for claim in resume:
            self.scheduler.ended(claim.job_id)
        self.scheduler.resume(resume)
        for path in self.spool.sweep_temporaries():
            self.log.info("removed a temporary left by a stopped worker", path=str(path))
        fresh = self.workers.replace(i)
        self.state.worker(fresh.index, device_index=fresh.device, current=None, pid=fresh.pid)

    def _excuse(self, claim: Claim) -> None:
        """``claim``'s start ended through no fault of its own (its worker was ended for another job): not
        counted toward ``max_attempts``."""
        try:
            self.spool.excuse(claim)
        except SpoolError as exc:  # then its start counts as a crashed one
            self.log.warning("cannot record that a job's start was not its fault", job=claim.job_id,
                             file=shown(claim.name), reason=exc.reason)  # fmt: skip

    def refuse_claimed(
        self, claim: Claim, error: MmdError, device: int | None, overall_ms: float = 0.0, *, set_aside: bool = False
    ) -> None:
        """A claimed job no worker holds (its worker ended for it, or cancelled in the queue): its error
        sidecar (``error``'s kind and reason), archived to ``.failed``. ``set_aside``: an inbox entry that is not
        a job, already moved out of its name's way (:meth:`_set_aside`): its sidecar's reservation is dropped."""
        log = self.log.bind(job=claim.job_id, file=shown(claim.name), submitter=claim.submitter)
        context = record.Context(device_index=device, submitter=claim.submitter)
        job = describe(claim.path, claim.output, self.settings, name=claim.original or claim.name,
                       job_id=claim.job_id, started=claim.started, context=context)  # fmt: skip
        result = refuse(job, error, {"overall": overall_ms}, ops=self.ops)
        counted = record.tally(result.record)
        self._charge(counted)
        if set_aside:
            self.spool.release(claim)
        else:
            try:
                self.spool.archive(claim, False, refused_keep(self.settings.archive_refused_bytes, False))
            except MmdError as exc:
                log.error("cannot archive", reason=exc.reason)
                self.spool.leave(claim)
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
        self.spool.forget(claim.job_id)

    # -- scheduling --
    def _offer(self, name: str, complete: bool) -> None:
        """A hint that ``name`` may be a job; give it to the scheduler when it is complete."""
        cand = self.spool.stat(name)
        if cand is None:
            self._readiness.forget(name)
            return
        if not complete and not self._readiness.observe(name, cand.size, cand.mtime_ns):
            return
        self._readiness.forget(name)
        self._arrivals.seen(cand, time.time())
        self._arrivals.completed(name)
        if self.paused():
            return  # it stays in the inbox; the rescan after the pause takes it
        if is_handin(name):
            self.handins.take(cand, self.settings)
            return
        if is_declaration(name):
            return  # its NAME.cu takes it; the rescans sweep one left alone as an upload
        full = self.scheduler.full
        self.scheduler.offer(name, cand.size, _submitter(cand.owner), self._pin(cand))
        if self.scheduler.full and not full:
            self.log.warning(
                "queue full; later files wait in the inbox for a rescan", max_queue=self.settings.max_queue
            )
            self.state.update(backlog=True)

    def _pin(self, cand: Candidate) -> Candidate:
        """``cand``, with the version of its submitter's own kernel its name picks now (students' kernels): a
        hand-in of that name while it waits does not change what it runs."""
        own = own_kernels(self.settings, _submitter(cand.owner))
        if own is None or "@" not in cand.name:
            return cand
        try:
            picked = jobname.parse(cand.name, (), own).kernel_file
        except MmdError:
            return cand  # refused when its worker reads the name, saying why
        return cand if picked is None else dataclasses.replace(cand, kernel=picked)

    def _rescan(self) -> int:
        """Offer every waiting file; returns how many job files wait (not counting broken ones).

        The files go to the scheduler by share (the submitters in turn), each submitter's in the order this
        daemon first saw them (a scan's own in their mtime's order: they reorder only their owner's files).
        What is not a job is judged then (:meth:`_judge`).
        """
        now, wall = time.monotonic(), time.time()
        survey = self.spool.survey()
        scanned = survey.jobs
        found: list[Candidate] = []
        found_names: set[str] = set()  # hand-ins waiting to be complete (never jobs)
        complete: dict[str | None, list[tuple[float, Candidate]]] = {}
        unfinished: list[tuple[float, Candidate]] = []
        for cand in scanned:
            submitter = _submitter(cand.owner)
            if self.scheduler.is_broken(cand.name, submitter):
                continue
            found.append(cand)
            arrived = self._arrivals.seen(cand, wall)
            if self._readiness.observe(cand.name, cand.size, cand.mtime_ns):
                self._readiness.forget(cand.name)
                self._arrivals.completed(cand.name)
                if not self.paused():
                    complete.setdefault(submitter, []).append((arrived, cand))
            elif not self._arrivals.is_complete(cand.name):
                unfinished.append((arrived, cand))
        for cand in survey.handins:
            if self._readiness.observe(cand.name, cand.size, cand.mtime_ns):
                self._readiness.forget(cand.name)
                if not self.paused():
                    self.handins.take(cand, self.settings)
            found_names.add(cand.name)
        self._arrivals.keep({c.name for c in (*scanned, *survey.folders, *survey.uploads, *survey.handins)})
        first = sorted(complete, key=lambda s: (min(a for a, _ in complete[s]), str(s)))
        groups = {s: [c for _, c in sorted(complete[s], key=lambda ac: ac[0])] for s in first}
        for cand in self.scheduler.by_share(groups, now):
            self.scheduler.offer(cand.name, cand.size, _submitter(cand.owner), self._pin(cand))
        known = {c.name for c in found} | found_names
        for name in self._readiness.pending:
            if name not in known:
                self._readiness.forget(name)
        set_aside = self._judge(survey, unfinished, wall)
        return len(found) - set_aside

    def _judge(self, survey: Survey, unfinished: list[tuple[float, Candidate]], wall: float) -> int:
        """What lies in the inbox that is not a job, judged by its age since this daemon (or the one before it)
        first saw it, never by its mtime: a folder under a job's name, or a file ``unfinished`` (still being
        written: (first seen, it)), is set aside after ``drop_box_grace_s`` (:meth:`_set_aside`), an upload
        removed after ``upload_max_age_s``. The first sightings of what waits are kept in state_dir for the next
        start. Returns how many job files were set aside."""
        grace, max_age = self.settings.drop_box_grace_s, self.settings.upload_max_age_s
        folder = (
            f"is a folder, not a file: it was set aside {grace:g} s after mmd first saw it, as the drop box takes "
            f"files only (ask the admin for it back)"
        )
        writing = (
            f"was still being written {grace:g} s after mmd first saw it: set aside unread, so that the name is free; "
            f"write it under a .part name and rename it into the inbox once complete (mv -T)"
        )
        waiting: set[str] = set()
        for cand in survey.folders:
            if wall - self._arrivals.seen(cand, wall) < grace:
                waiting.add(cand.name)
            else:
                self._set_aside(cand, folder)
        set_aside = 0
        for arrived, cand in unfinished:
            if wall - arrived < grace:
                waiting.add(cand.name)
            elif self._set_aside(cand, writing):
                set_aside += 1
        for cand in survey.uploads:
            if wall - self._arrivals.seen(cand, wall) < max_age:
                waiting.add(cand.name)
            elif self.spool.remove_upload(cand):
                self.log.info("removed an upload nobody finished", file=shown(cand.name),
                              submitter=_submitter(cand.owner))  # fmt: skip
        self._keep_arrivals(waiting)
        return set_aside

    def _set_aside(self, cand: Candidate, why: str) -> bool:
        """Move inbox entry ``cand`` (not a job) out of its name's way, its owner told ``why`` by an error sidecar
        (kind ``spool``); False when it was gone or another meanwhile, or could not be moved (logged)."""
        try:
            claim = self.spool.set_aside(cand, new_id())
        except SpoolError as exc:
            self.log.error("cannot set aside what holds a name in the inbox", file=shown(cand.name), reason=exc.reason)
            return False
        if claim is None:
            return False
        if claim.path.parent == self.spool.inbox:  # hidden in place (mmd may not move it out): judged once only
            self._arrivals.hidden(claim.path.name, claim.ino)
        self._readiness.forget(cand.name)
        error = SpoolError(f"{shown(cand.name)} {why}")
        if claim.reservation is None:  # the outbox refused even the name of its note
            self.log.error("set aside", file=shown(cand.name), submitter=claim.submitter, path=str(claim.path),
                           reason=error.reason, note=claim.unreserved)  # fmt: skip
            self.spool.forget(claim.job_id)
        else:
            self.refuse_claimed(claim, error, None, set_aside=True)
        return True

    def _keep_arrivals(self, waiting: set[str]) -> None:
        """Write the first sightings of ``waiting`` (what is still to be judged) to state_dir when they changed."""
        record = self._arrivals.record(waiting)
        if record == self._arrivals_kept:
            return
        try:
            self.spool.write_arrivals(record)
        except OutputError as exc:
            if not self._arrivals_failed:
                self.log.warning("cannot keep the inbox's arrivals for the next start", reason=exc.reason)
            self._arrivals_failed = True
            return
        self._arrivals_kept, self._arrivals_failed = record, False

    def _handle(self, hint: Hint) -> None:
        if isinstance(hint, Arrived):
            self._offer(hint.name, hint.complete)
        elif isinstance(hint, Writing):
            self._readiness.writing(hint.name)
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

    def _tend(self, now: float) -> None:
        """At a rescan, out of a pause: take back the jobs left in ``.work`` (held ones first, before any new
        name), and sweep stale reservations (the full listing of the outbox at most every
        RESERVATION_SWEEP_SECONDS); the uploads are judged at each rescan (:meth:`_judge`)."""
        self.scheduler.resume(self.spool.take_back())
        if now - self._swept >= common.RESERVATION_SWEEP_SECONDS:
            self._swept = now
            for path in self.spool.sweep_reservations():
                self.log.info("removed a stale output reservation left by a dead daemon", path=str(path))
        if self.settings.retention_days is not None and now - self._kept >= common.RETENTION_SWEEP_S:
            self._kept = now
            old = self.spool.sweep_old(self.settings.retention_days * 86400)
            self.handins.sweep(self.settings.retention_days * 86400)
            if old:
                self.log.info("removed what is older than retention_days", files=len(old),
                              retention_days=self.settings.retention_days)  # fmt: skip

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
        self.workers.broadcast(InboxRemade())
        if self._lock is not None:
            self._lock.release()
            self._lock.acquire()  # SpoolError if another daemon took the new inbox meanwhile
        if self._observer is not None:
            self._observer.stop()
            with contextlib.suppress(RuntimeError):
                self._observer.join(timeout=5)
            self._observer, _kind = make_observer(
                self.settings.observer, self.spool.inbox, self.mailbox.post, self.settings.poll_seconds, self.log
            )
        self.scheduler.forgive()
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
        kept = ("devices", "workers_per_device", "shared_inbox", "host_id", "max_queue", "state_dir", "class_mode",
                "graders_group", "control_socket")  # fmt: skip
        if any(getattr(new, k) != getattr(self.settings, k) for k in kept):
            self.log.warning(f"SIGHUP: {', '.join(kept)} changes need a restart; keeping the old ones")
            new = dataclasses.replace(new, **{k: getattr(self.settings, k) for k in kept})
        reopen = (new.backend, new.kernel_cache) != (self.settings.backend, self.settings.kernel_cache)
        self.settings = new
        self._readiness.quiet = new.quiet_seconds
        self._cap_submitters()
        if self._local is not None:
            self._local.limits = Limits.of(new)
        self.workers.broadcast(Configure(new, reopen))
        if reopen:  # until a worker opens the new backend; otherwise the workers keep the ones they opened
            self.state.update(backend=new.backend)
        self.log.info("SIGHUP: settings reloaded", sources=list(new.sources))

    # -- the loop --
    def serve(self, once: bool = False) -> int:
        """Serve until SIGTERM/SIGINT (exit 0), or with ``once`` until the inbox is drained."""
        old_umask = tighten_umask()
        lock = self._lock = SpoolLock(self.spool.private, self.host_id)
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
            self.workers.ctx = spawning.context()
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
            self._adopt_inbox_folders()
            kept = self.spool.recount()  # class mode: what each submitter keeps, counted once, then kept up to date
            if kept:
                total = sum(kept.values(), Usage())
                self.log.info("counted what the service keeps for each submitter", submitters=len(kept),
                              files=total.files, bytes=total.bytes)  # fmt: skip
            self._check_inbox_filesystem()
            self._arrivals = Arrivals(self.spool.read_arrivals())  # what waited to be judged keeps its age
            devices = worker_devices(self.settings.backend, self.settings.devices, self.settings.workers_per_device)
            resumed = self.spool.resumable()
            for path in self.spool.sweep_reservations(resumed):
                self.log.info("removed a stale output reservation left by a dead daemon", path=str(path))
            self._swept = time.monotonic()
            self.scheduler.resume(resumed)
            kind = "once"
            if not once:
                self._observer, kind = make_observer(
                    self.settings.observer, self.spool.inbox, self.mailbox.post, self.settings.poll_seconds, self.log
                )
                if self.settings.control_socket is not None:
                    self._local = LocalSocket(self.settings.control_socket, self.mailbox.post, self.log,
                                              Limits.of(self.settings))  # fmt: skip
                    self._local.start()
                if self.settings.metrics_listen is not None:
                    host, port = listen_address(self.settings.metrics_listen)
                    try:
                        self.metrics.listen(host, port)
                    except OSError as exc:
                        raise ConfigError(f"metrics_listen: cannot listen on {host}:{port}: {exc.strerror}") from None
            waiting = self._rescan()
            # Started last: each start waits for the fork server's imports, which have run meanwhile.
            self.workers.start(devices)
            self._cap_submitters()
            for w in self.workers:
                self.state.worker(w.index, device_index=w.device, current=None, pid=w.pid)
            # said once the first worker is ready, before it is given a job (jobs go out as each one is ready)
            self._serving = functools.partial(
                self.log.info,
                "serving",
                inbox=str(self.spool.inbox),
                outbox=str(self.spool.outbox),
                observer=kind,
                backend=self.settings.backend,
                workers=len(devices),
                devices=sorted(set(devices)),
                waiting=waiting,
                resumed=len(resumed),
                **({"host": self.host_id} if self.host_id else {}),
            )
            self._await_workers()
            self.state.update(status="serving", observer=kind)
            self._say_serving()
            notifier.ready(f"serving {self.spool.inbox}")
            self.metrics.up.set(1)
            pinger = WatchdogPinger.start_for(notifier, self.health)
            return self._loop(once)
        finally:
            if self._local is not None:
                self._local.close()
            self.state.update(status="stopping")
            notifier.stopping("finishing the jobs in hand")
            observer = self._observer
            if observer is not None:
                observer.stop()
            self.workers.stop(self._on_event, STUCK_AFTER)
            self.handins.close()
            self.spool.drop_spares()
            if pinger is not None:
                pinger.stop()
            self.state.update(status="stopped", queue=0, current=None)
            self.state.write(force=True)
            self.hooks.close()
            self.metrics.up.set(0)
            self._write_metrics(force=True)
            self.metrics.close()
            if observer is not None:
                with contextlib.suppress(RuntimeError):
                    observer.join(timeout=5)
            self._lock.release()
            atomic.set_host(None)
            os.umask(old_umask)
            for sig, handler in old_signals.items():
                signal.signal(sig, handler)
            notifier.close()
            self.mailbox.close()
            self._waits.close()
            self.log.info("stopped", done=self.state.snapshot()["done"])

    def _cap_submitters(self) -> None:
        """The scheduler's per-submitter limits, from the settings and the workers there are."""
        s = self.settings
        self.scheduler.max_waiting = s.max_waiting_per_submitter
        self.scheduler.max_workers = workers_per_submitter(s.max_workers_per_submitter, len(self.workers),
                                                           s.class_mode)  # fmt: skip

    def _await_workers(self) -> None:
        """Wait until every worker has opened its backend (or failed to: SpoolError, the daemon cannot serve).

        Jobs are dispatched as each worker becomes ready, so the first one
        does not wait for the last to start.
        """
        while True:
            pending = [w for w in self.workers if w.ready is None]
            if not pending:
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
            if any(w.ready is not None for w in self.workers):
                self._say_serving()
            self._dispatch()

    def _say_serving(self) -> None:
        """Log "serving" (once)."""
        if self._serving is not None:
            self._serving()
            self._serving = None

    def _write_metrics(self, force: bool = False) -> None:
        """The periodic metrics: queue depth, what waits in the inbox and for how long (then the file)."""
        if self.metrics.path is None or (not force and (self.metrics.due_in() or 0) > 0):
            return
        waiting = self.spool.scan()
        self.metrics.queue.set(self.scheduler.waiting)
        self.metrics.waiting.set(len(waiting))
        oldest = min((c.mtime_ns for c in waiting), default=None)
        self.metrics.oldest.set(max(0.0, time.time() - oldest / 1e9) if oldest is not None else 0.0)
        try:
            self.metrics.write(force=True)
        except OSError as exc:
            self.log.warning("cannot write the metrics file", path=str(self.metrics.path), reason=exc.strerror)

    def _show_current(self) -> None:
        """Each worker's job in hand, for the state file (when it changed)."""
        for index, current in self.workers.current():
            self.state.worker(index, current=current)

    def _loop(self, once: bool) -> int:
        """:meth:`_turns` until it returns; a turn that found no descriptor left (EMFILE, ENFILE: this
        process's limit or the system's, by whatever took them) is logged and taken up again after a pause,
        never the daemon's end."""
        pause, failed = 0.0, float("-inf")
        while True:
            try:
                return self._turns(once)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                now = time.monotonic()
                pause = min(pause * 2, FD_PAUSE_MAX_S) if now - failed < 2 * FD_PAUSE_MAX_S else FD_PAUSE_S
                failed = now
                self.log.error("out of file descriptors; serving again after a pause", reason=exc.strerror,
                               pause_s=pause)  # fmt: skip
                time.sleep(pause)

    def _turns(self, once: bool) -> int:
        period = min(self.settings.quiet_seconds / 2, 0.1) if once else self.settings.rescan_seconds
        next_rescan = time.monotonic() + period
        while True:
            self._beat = now = time.monotonic()
            waits = [next_rescan - now, HEARTBEAT]
            if self.paused():
                waits.append(self._paused_until - now)
            for due in (self._readiness.due_in(), self.state.due_in(), self.metrics.due_in()):
                if due is not None:
                    waits.append(due)
            waits += self.workers.waits(now, SUPERVISE_S)
            watcher = self._observer
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
            due = self._readiness.due_in()
            if due is not None and due <= 0:
                for name in self._readiness.pending:
                    self._offer(name, complete=False)
            if self._paused_until and now >= self._paused_until:
                self._unpause()
            # A full queue is refilled by a rescan once it has drained to half (not after
            # every job: each rescan lists the whole inbox).
            if now >= next_rescan or self.scheduler.refill_due() or self._rescan_now:
                self.scheduler.refilling()
                self._rescan_now = False
                self.state.update(backlog=False)
                if not once:
                    self.scheduler.forgive()
                if not self.paused():
                    self._tend(now)
                found = self._rescan()
                next_rescan = now + period
                if once and not self.scheduler.held and not found and not self.spool.left:
                    return 0
            # Orders first: a worker found dead or overdue below gives back what it was given, and a name given
            # from an inbox found replaced is not claimed.
            self._dispatch()
            self._check_inbox()
            self._check_workers(now)
            self._show_current()
            self.state.write()
            self._write_metrics()


def _submitter(owner: int | None) -> str | None:
    """The scheduler's name for who dropped a file (its owner's login)."""
    return None if owner is None else login_of(owner)
