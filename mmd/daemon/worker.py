"""The worker: a process of its own that claims, runs and archives jobs, one at a time, on one device.

The main process (:mod:`.server`) sends :mod:`.messages` orders over a pipe;
the worker answers with events. Inside, :class:`Runner` does a job's whole
life: claim → :func:`mmd.pipeline.run_job` → archive (or hold). It sees the
daemon only through a :class:`Reporter` (where its events go) and a
:class:`~.control.Control` (its shared numbers), so the tests drive it in
their own process, faults injected (tests/test_spool_faults.py).

A job's fate is one of three, whatever fails: its output and sidecar
(archived to ``.done``), its error sidecar (archived to ``.failed``), or kept:
in the inbox when it cannot be claimed, else in ``.work``, *held* when the
outbox refuses what the job has to write (its reservation, output or
sidecar) or left when its archive fails, and taken back by the daemon after
a pause that doubles with each failure in a row (docs/reliability.md).

**Group commit.** A small job (input under :data:`GROUP_INPUT_BYTES`) whose
worker has more orders waiting does not publish at once: its output and
sidecar wait in their temporaries, and the batch is published together,
with one sync (:func:`mmd.atomic.publish`), when no order waits, when
:data:`MAX_GROUP` jobs wait, or before a job that is not small. A lone job
is never held back waiting for company.

A worker is ended by its supervisor (SIGTERM, then SIGKILL) when its job
runs past its limit; what it had claimed stays in ``.work`` and the
supervisor resumes or refuses it. SIGINT and SIGHUP are the main process's
business: a worker ignores them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .. import atomic, record, spawning
from ..atomic import Staged
from ..backends import BackendPool
from ..backends.base import Backend
from ..backends.kernelfile import KernelFileBackend
from ..config import Settings, graders_gids
from ..errors import CrashedError, CudaError, InternalError, LimitError, MmdError, OutputError, SpoolError
from ..hooks import JobEnd
from ..job import Job, describe
from ..logs import configure, get_logger
from ..pipeline import JobResult, Room, kernel_file_backend, refuse, run_job
from ..record import Context, now_iso
from ..spawning import die_with_parent
from ..spool import Attempts, Candidate, Claim, Shared, Spool, Usage, finished, shown
from ..spool.archive import refused_keep
from ..spool.claims import took_seen
from ..spool.ledger import Ledger
from ..submitters import login_of
from .control import Control
from .messages import (
    Configure,
    Ended,
    Event,
    InboxRemade,
    Kept,
    NotRun,
    Order,
    Quit,
    Ready,
    Resume,
    RunOrder,
    StartFailed,
    WorkerSpec,
)
from .tunables import GROUP_INPUT_BYTES, HEARTBEAT, MAX_GROUP, MAX_OUTPUT_ATTEMPTS, OPEN_TURN_S, tighten_umask
from .warmup import ORDER_WAIT_S, WarmUp

#: Where a runner's events go (the pipe to the main process in a worker; a list's ``append`` in the tests).
Reporter = Callable[[Event], None]


class DaemonGone(BaseException):
    """The main process is gone (its pipe is closed): stop at once, touch nothing more.

    A BaseException, so that no job boundary takes it for the job's fault:
    the job in hand is resumed (or found finished) by the next daemon.
    """


@dataclass
class _Pending:
    """A job whose result waits for its group's commit."""

    seq: int
    claim: Claim
    job: Job
    result: JobResult
    staged: Staged


@dataclass(frozen=True)
class _GpuBudget:
    """A student's GPU time for their own kernels (``student_kernel_gpu_s``), read and charged in the ledger."""

    ledger: Ledger
    login: str
    most: float

    def refusal(self) -> LimitError | None:
        """The job's refusal where their kernels have used all of it (a job that starts under it may overrun it
        by its launches' time limits)."""
        used = self.ledger.gpu_seconds(self.login)
        if used < self.most:
            return None
        return LimitError(
            f"your kernels have used {used:.1f} s of GPU time, all of the {self.most:g} s each student's may use "
            "(student_kernel_gpu_s); mmd's own kernels still run for you",
            {"used_s": round(used, 3), "student_kernel_gpu_s": self.most},
        )

    def charge(self, seconds: float) -> None:
        self.ledger.charge_gpu(self.login, seconds)


class Runner:
    """Runs a worker's orders: each job claimed, run and archived, its fate reported; nothing it raises escapes."""

    def __init__(
        self,
        settings: Settings,
        spool: Spool,
        report: Reporter,
        control: Control,
        *,
        device: int = 0,
        host_id: str | None = None,
        workers: int = 1,
    ) -> None:
        self.settings = settings
        self.spool = spool
        #: Tells the main process an event.
        self.report = report
        self.control = control
        self.device = device
        self.host_id = host_id
        self.workers = workers
        # its first backend's fallback goes in Ready, for the daemon to say once for all workers
        self.backends = BackendPool(device, log_fallback=False)
        #: The warm-up of the backend in use, made while no order waits (:mod:`.warmup`).
        self.warm_up = WarmUp(self.backends, control)
        self._pending: list[_Pending] = []
        #: The handed-in kernel version the job in hand was queued with (:attr:`Candidate.kernel`).
        self._pinned: Path | None = None
        #: When the daemon first saw the job in hand's input (:attr:`Candidate.arrived`; None: not known).
        self._arrived: float | None = None

    # -- backends --
    def _reopen(self) -> None:
        """Close this worker's backends; the next job opens a fresh one, warmed up again once no order waits
        (or it would run without its kept buffers and device memory for good)."""
        self.backends.close()
        self.warm_up.due = True

    def configure(self, order: Configure) -> None:
        self.flush()
        self.settings = order.settings
        if order.reopen:
            self._reopen()

    # -- orders --
    def process(self, order: RunOrder | Resume, more_waiting: bool = False) -> None:
        """One job, claim to archive (or hold); ``more_waiting``: another order is queued behind it (its
        commit may wait for a group). Nothing it raises escapes."""
        name = order.name if isinstance(order, RunOrder) else order.claim.name
        claim: Claim | None = None
        try:
            if isinstance(order, RunOrder):
                if self.control.hold_new:
                    self.report(NotRun(order.seq, order.name, reason="held back"))
                    return
                try:
                    claim = self.spool.claims.claim(order.name, job_id=order.job_id)
                except SpoolError as exc:
                    # Still in the inbox, tried again at a later rescan (or, claimed but not
                    # examinable, left in .work and taken back after the pause).
                    get_logger(file=shown(name)).error("cannot claim", reason=exc.reason)
                    self.report(NotRun(order.seq, order.name, broken=True, reason=exc.reason))
                    return
                if claim is None:
                    get_logger(file=shown(name)).debug("already taken")  # claimed by someone else or removed: harmless
                    self.report(NotRun(order.seq, order.name))
                    return
                if order.seen is not None and not _as_offered(claim, order.seen):
                    # Renamed over the name since it was offered (a small drop swapped for a big one): not run in
                    # the small group it was given to. It stays claimed, no start counted, and goes back to be
                    # given again by what it is.
                    self._log(claim).warning("the claimed file is not the one offered under its name; given back",
                                             offered_bytes=order.seen.size, claimed_bytes=claim.size)  # fmt: skip
                    self.spool.in_hand.forget(claim.job_id)
                    self.report(NotRun(order.seq, order.name, claimed=claim))
                    return
            else:
                claim = order.claim
            # the version of the submitter's own kernel its name picked when it was queued (students' kernels), and
            # when the daemon first saw the file
            seen = order.seen if isinstance(order, RunOrder) else None
            self._pinned, self._arrived = (seen.kernel, seen.arrived) if seen is not None else (None, None)
            self._begin(order.seq, claim, more_waiting)
        except Exception as exc:  # the job boundary: a job never kills the worker
            self._failed(order.seq, name, claim, exc)

    def _begin(self, seq: int, claim: Claim, more_waiting: bool) -> None:
        """Run a claimed job, timed against its limit from here."""
        if claim.original is not None:
            self._log(claim).info("claimed under a safe name", original=shown(claim.original))
        self.control.begin(seq, self.settings.job_timeout_s, claim.owner)
        try:
            self._run(seq, claim, more_waiting)
        finally:
            self.control.end()

    def _failed(self, seq: int, name: str, claim: Claim | None, exc: Exception) -> None:
        """A job raised: refuse it with an internal error, or keep it in ``.work`` when even that fails."""
        log = get_logger(file=shown(name)) if claim is None else self._log(claim)
        log.exception("internal error in job", error=repr(exc))
        if claim is not None:
            try:
                refused = refuse(self._job(claim), InternalError.from_exception(exc), ops=self.spool.shared.ops)
                self._conclude(seq, claim, refused)
            except Exception as again:  # its refusal failed too: keep the job in .work for later
                log.exception("cannot refuse the job; it stays in .work", error=repr(again))
                self.spool.in_hand.leave(claim)
                self.report(Kept(seq, claim, f"internal error: {again!r}", committed=False))

    def _log(self, claim: Claim) -> Any:
        """The logger of ``claim``'s job, its facts bound: made when a line is logged (binding costs more than
        the lines a job usually logs here, none)."""
        facts = {"device_index": self.device} if self.workers > 1 else {}
        return get_logger(job=claim.job_id, file=shown(claim.name), submitter=claim.submitter, **facts)

    def _context(self, claim: Claim) -> Context:
        collision = claim.collision()
        return Context(
            original_name=shown(claim.original) if claim.original is not None else None,
            collision=record.Collision(**collision) if collision else None,
            resumed=True if claim.resumed else None,
            device_index=self.device,
            host=self.host_id,
            submitter=claim.submitter,
        )

    def _job(self, claim: Claim, refusal: MmdError | None = None) -> Job:
        return describe(
            claim.path,
            claim.output,
            self.settings,
            name=claim.original or claim.name,
            job_id=claim.job_id,
            started=claim.started,
            arrived=self._arrived,
            context=self._context(claim),
            refusal=refusal,
            pinned=self._pinned,
        )

    def _run(self, seq: int, claim: Claim, more_waiting: bool) -> None:
        spool = self.spool
        if claim.resumed or claim.again:
            log = self._log(claim)
            done = finished(claim)
            if done is not None:
                ok, path = done
                if self._archive(seq, claim, ok, committed=True):
                    log.info("job was already finished; archived", sidecar=path.name, status="ok" if ok else "error")
                    self._ended(seq, claim, ok, path, None)
                return
            settled = spool.reservations.settle(claim)
            if settled.output != claim.output:
                log.warning("its output version was taken meanwhile; moved", output=settled.output.name)
            claim = settled
            if claim.again:
                log.info("taking a held job back", **_hold_facts(spool.attempts.read(claim)))
            else:
                log.info("resuming job left by an earlier daemon")
        if claim.reservation is None:
            # The outbox refused even the reservation: nothing the job writes could be committed. Held unrun.
            self._hold(seq, claim, claim.unreserved or "cannot reserve its output name", output_failed=False)
            return
        refusal: MmdError | None = None
        if claim.problem is not None or not claim.regular:
            problem = claim.problem or "is not a regular file (a link, folder or device); mmd does not follow it"
            refusal = SpoolError(f"{shown(claim.original or claim.name)} {problem}")
        else:
            starts = spool.attempts.record_start(claim)
            limit = self.settings.max_attempts
            if starts > limit:
                refusal = CrashedError(
                    f"{shown(claim.original or claim.name)} was started {starts - 1} times and its worker died "
                    f"each time (max_attempts: {limit}); it is not started again",
                    {"attempts": starts - 1, "max_attempts": limit},
                )
                self._log(claim).error("a job that kills its worker: failed", attempts=starts - 1)
        job = self._job(claim, refusal)
        budget = self._gpu_budget(claim, job)
        if budget is not None and refusal is None:
            refusal = budget.refusal()
            if refusal is not None:
                job = self._job(claim, refusal)
        self.control.limit(job.settings.job_timeout_s)  # the name may set its own
        small = refusal is not None or _small(claim.size)
        if not small:
            self.flush()  # a big job's batch-mates do not wait for it
        group = small and more_waiting and job.settings.durable
        staged = Staged(durable=job.settings.durable, group=True, ops=spool.shared.ops) if group else None
        room = self._room(claim, job.settings) if refusal is None else None
        made: list[KernelFileBackend] = []  # the job's kernel-file backend, for the GPU time it used

        def kernel_file_for(path: Path, settings: Settings) -> Backend:
            made.append(kernel_file_backend(path, settings))
            return made[-1]

        result = run_job(job, self.backends.get, self.control.phase, ops=spool.shared.ops, staged=staged, room=room,
                         kernel_file_for=kernel_file_for)  # fmt: skip
        if budget is not None:
            budget.charge(sum(backend.launched_s for backend in made))
        if isinstance(result.error, CudaError):
            # A fault inside a kernel (an illegal address) leaves the CUDA context unusable:
            # drop this worker's backends; the next job opens a fresh context.
            self._log(claim).warning("CUDA error: reopening the backend for the next job", reason=result.error.reason)
            self._reopen()
        if staged is not None:
            self._pending.append(_Pending(seq, claim, job, result, staged))
            if len(self._pending) >= MAX_GROUP:
                self.flush()
            return
        self._conclude(seq, claim, result)

    def _gpu_budget(self, claim: Claim, job: Job) -> _GpuBudget | None:
        """The GPU time its submitter's own kernels may still use, where the job runs one (its name picked their
        handed-in kernel) and the service bounds it (``student_kernel_gpu_s``)."""
        most = job.settings.student_kernel_gpu_s
        ledger = self.spool.ledger
        if most is None or ledger is None or claim.owner is None or self._pinned is None or job.kernel_file is None:
            return None
        return _GpuBudget(ledger, login_of(claim.owner), most)

    def _room(self, claim: Claim, settings: Settings) -> Room | None:
        """What the job's output may take now (None: no bound): the disk's free space less the reserve kept for
        everyone (and nothing while its free inodes are fewer than theirs), and in class mode the submitter's
        quota less what the service keeps for them, their input included (nothing once their files are at
        theirs). What they keep is read from the spool's ledger, never by listing their folder."""
        rooms = []
        if settings.min_free_bytes is not None or settings.min_free_inodes is not None:
            with contextlib.suppress(OSError):  # no answer: no bound from it (the write will say)
                try:
                    st = os.statvfs(claim.output.parent)
                except FileNotFoundError:  # a submitter's folder removed: its job makes it again
                    st = os.statvfs(self.spool.shared.outbox)
                if settings.min_free_bytes is not None:
                    free = st.f_bavail * st.f_frsize
                    rooms.append(Room(free - settings.min_free_bytes,
                                      f"the outbox's disk has {free} bytes free and keeps {settings.min_free_bytes} "
                                      f"for everyone (min_free_bytes)", "min_free_bytes"))  # fmt: skip
                # A filesystem that makes inodes as it needs them (btrfs) counts none: no bound from it.
                if settings.min_free_inodes is not None and st.f_files and st.f_favail < settings.min_free_inodes + 3:
                    rooms.append(Room(-1, f"the outbox's disk has {st.f_favail} inodes free and keeps "
                                      f"{settings.min_free_inodes} for everyone (min_free_inodes)",
                                      "min_free_inodes"))  # fmt: skip
        ledger = self.spool.ledger
        used = ledger.usage(claim.submitter) if ledger is not None and claim.submitter is not None else None
        if used is not None:
            # This worker's jobs of the same submitter waiting for their group's commit are not counted yet.
            mine = [p.claim for p in self._pending if p.claim.owner == claim.owner]
            used = used + Usage(sum(c.size or 0 for c in mine), 3 * len(mine))
            if settings.max_submitter_bytes is not None:
                most = settings.max_submitter_bytes
                rooms.append(Room(most - used.bytes - (claim.size or 0),
                                  f"what mmd keeps for you (outputs, sidecars, inputs) takes {used.bytes} of your "
                                  f"{most} bytes (max_submitter_bytes); remove some with mmd rm",
                                  "max_submitter_bytes"))  # fmt: skip
            most_files = settings.max_submitter_files
            if most_files is not None and used.files + 3 > most_files:  # a job keeps three: input, output, sidecar
                rooms.append(Room(-1, f"you keep {used.files} files of your {most_files} (outputs, sidecars, inputs; "
                                  f"max_submitter_files); remove some with mmd rm", "max_submitter_files"))  # fmt: skip
        return min(rooms, key=lambda r: r.bytes) if rooms else None

    def flush(self) -> None:
        """Publish the jobs waiting for a group commit together, then conclude each."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        errors = atomic.publish([p.staged for p in pending])
        for p, error in zip(pending, errors, strict=True):
            result = p.result
            if error is not None:
                # The same as an output the outbox refused on a lone commit: its error sidecar, then a hold.
                result = refuse(p.job, error, ops=self.spool.shared.ops)
            try:
                self._conclude(p.seq, p.claim, result)
            except Exception as exc:  # the job boundary, as in process()
                self._log(p.claim).exception("internal error in job", error=repr(exc))
                self.spool.in_hand.leave(p.claim)
                self.report(Kept(p.seq, p.claim, f"internal error: {exc!r}", committed=False))

    def _conclude(self, seq: int, claim: Claim, result: JobResult) -> None:
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
            tries = self.spool.attempts.read(claim).output_failures + (1 if output_failed else 0)
            if not (output_failed and result.sidecar_failed is None and tries >= MAX_OUTPUT_ATTEMPTS):
                self._hold(seq, claim, reason, output_failed=output_failed)
                return
            self._log(claim).error("output not committed after %d attempts; job failed" % tries, reason=reason)
        unread = isinstance(result.record, record.ErrorRecord) and result.record.input.sha256 is None
        if self._archive(seq, claim, result.ok, committed=True, unread=unread):
            self._ended(seq, claim, result.ok, result.sidecar, result.record)

    def _hold(self, seq: int, claim: Claim, reason: str, output_failed: bool) -> None:
        """Keep the job claimed in ``.work`` (its reservation kept); the daemon pauses and takes it back after.

        What the job committed (its output, its own error sidecar) is removed
        first: nothing half done stays visible.
        """
        spool, log = self.spool, self._log(claim)
        stuck = spool.attempts.discard_outputs(claim)
        if stuck:
            log.warning("cannot remove what the held job committed; it is replaced when it runs again", names=stuck)
        facts: dict[str, Any] = {}
        try:
            facts = _hold_facts(spool.attempts.hold(claim, reason, output_failed=output_failed))
        except SpoolError as err:  # the hold stands; only its count is lost
            log.warning("cannot record the hold in .work", reason=err.reason)
        log.error("the outbox refused the job; held in .work, tried again after a pause", reason=reason, **facts)
        self.report(Kept(seq, claim, reason, committed=False))

    def _archive(self, seq: int, claim: Claim, ok: bool, *, committed: bool, unread: bool = False) -> bool:
        """Archive the job (a refused input only up to ``archive_refused_bytes``, less where it was refused
        ``unread``); when that fails it is left in ``.work``, archived when taken back after a pause."""
        try:
            self.spool.archive.add(claim, ok, None if ok else refused_keep(self.settings.archive_refused_bytes, unread))
        except SpoolError as exc:
            self.spool.in_hand.leave(claim)
            self._log(claim).error("cannot archive; the job stays in .work and is archived later", reason=exc.reason)
            self.report(Kept(seq, claim, exc.reason, committed=committed))
            return False
        return True

    def _ended(self, seq: int, claim: Claim, ok: bool, path: Path | None, rec: record.Record | None) -> None:
        overall = rec.timings_ms.overall if rec is not None else None
        reason = rec.error.reason if isinstance(rec, record.ErrorRecord) else ""
        kernel = rec.kernel if isinstance(rec, record.TimingRecord) else ""
        end = JobEnd(claim.job_id, "ok" if ok else "error", shown(claim.original or claim.name),
                     claim.output if ok else None, path, reason, kernel, claim.submitter or "")  # fmt: skip
        entry: dict[str, object] = {
            "job": claim.job_id,
            "file": claim.name,
            "status": "ok" if ok else "error",
            "output": claim.output.name if ok else None,
            "sidecar": path.name if path else None,
            "overall_ms": overall,
            "device_index": self.device,
            "finished": now_iso(),
        }
        self.report(Ended(seq, end, entry, record.tally(rec) if rec is not None else None, self._memory_used()))

    def _memory_used(self) -> tuple[int, int] | None:
        """(device, bytes of its memory in use) where this worker has a GPU backend open."""
        for backend in self.backends.opened:
            try:
                used = backend.memory_used()
            except Exception:  # only for the metrics: never a job's failure
                return None
            if used is not None:
                return self.device, used
        return None

    def close(self, flush: bool = True) -> None:
        """Publish what waits for a group commit and remove the spool's spares (unless the daemon is gone: the
        next one sweeps them), close the backends."""
        if flush:
            self.flush()
            self.spool.spares.drop()
        self.backends.close()


def _small(size: int | None) -> bool:
    """Whether an input of ``size`` bytes is a small job's (one that may run in a group)."""
    return size is not None and size <= GROUP_INPUT_BYTES


def _as_offered(claim: Claim, seen: Candidate) -> bool:
    """Whether a claim may run as the job it was given for: it took the file offered, or one as small as a
    small one offered (a group's job stays a group's)."""
    return took_seen(claim, seen) or (_small(seen.size) and _small(claim.size))


def _hold_facts(attempts: Attempts) -> dict[str, Any]:
    """What a log line says of a job's holds."""
    return {"holds": attempts.holds, "output_failures": attempts.output_failures, "held_since": attempts.held_since}


def _device_name(backend: Backend) -> str | None:
    try:
        return backend.device_name()
    except Exception:  # a name is only for the status display
        return None


# -- the worker process ---------------------------------------------------------------


def serve(conn: Connection, control: Control, spec: WorkerSpec, held: list[Any]) -> None:
    """A worker process's life: open the backend, say Ready, then run orders until told to quit or the pipe
    closes, warming the backend up once no order waits (:mod:`.warmup`).

    ``held``: the daemon's lock files, kept open (never read) for the worker's life, so that no other daemon
    takes the inbox while this worker may still touch it.
    """
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the main process's business (a terminal's Ctrl-C reaches us too)
    # The fork server exits when the daemon does, kill -9 included: a worker left going on with its job would
    # race the next daemon, which resumes the same job from .work. (Not Linux: the pipe's end stops it after
    # its job instead.)
    die_with_parent(os.getppid())
    tighten_umask()
    if spec.setup is not None:
        spec.setup()
    settings = spec.settings
    configure(settings.log_format, settings.log_level)
    atomic.set_host(spec.host_id)
    spool = Spool(Shared(settings.inbox, settings.outbox, spec.host_id, spec.ops, owner_pid=spec.owner_pid,
                         state_dir=settings.state_dir, class_mode=settings.class_mode,
                         graders=graders_gids(settings)))  # fmt: skip

    def report(event: Event) -> None:
        try:
            conn.send(event)
        except (OSError, EOFError):
            raise DaemonGone() from None

    runner = Runner(settings, spool, report, control, device=spec.device, host_id=spec.host_id,
                    workers=spec.workers)  # fmt: skip
    gone = False
    try:
        try:
            with spawning.in_turn(spec.opening, OPEN_TURN_S):
                backend = runner.backends.get(settings)
        except MmdError as exc:
            report(StartFailed(exc))
            return
        report(Ready(backend.name, _device_name(backend), runner.backends.notes[-1] if runner.backends.notes else None))
        runner.backends.log_fallback = True  # a backend opened anew (new settings) says its own
        runner.warm_up.due = True
        wait = ORDER_WAIT_S  # the main process answers Ready with the jobs waiting: they go before the warm-up
        while True:
            control.beat()
            if not conn.poll(wait):
                runner.flush()
                runner.warm_up.run(runner.settings)
                wait = HEARTBEAT
                continue
            wait = HEARTBEAT
            order: Order = conn.recv()
            if isinstance(order, Quit):
                break
            if isinstance(order, Configure):
                runner.configure(order)
                continue
            if isinstance(order, InboxRemade):
                runner.flush()
                spool.shared.forget_folders()
                continue
            runner.process(order, more_waiting=conn.poll())
            if not conn.poll():
                runner.flush()
                runner.warm_up.run(runner.settings)
    except (DaemonGone, EOFError, OSError):
        gone = True  # the main process is gone: nothing left to report to, nothing more to commit
    finally:
        runner.close(flush=not gone)
