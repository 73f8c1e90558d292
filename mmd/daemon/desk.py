"""What the daemon answers on its local socket (:mod:`.local`): each asker's own jobs, never another's.

A job is its submitter's: the owner of its input file (:mod:`mmd.submitters`).
The asker sees and cancels their own jobs and removes their own outputs;
root, the service's own user and members of ``graders_group`` see every
job and may cancel any. Runs on the main loop (it reads the queue and the
workers as they are), so a student's request costs their own jobs and the
jobs in hand, never the whole queue nor a look at the inbox's files; the
stopping itself is the supervisor's (:class:`Stops`), as for a job past its
time limit, and lands only on the job that was checked. A student's status
also lists the kernels they handed in (class mode): one listing of their own
folder in the store, at most :data:`~mmd.kernelfile.store.SHOWN_HANDINS` of
them; root's and a grader's lists no one's.
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import Settings
from ..errors import JobCancelled, MmdError
from ..kernelfile.store import KernelStore
from ..record import ERROR_SUFFIX, TIMING_SUFFIX, now_iso
from ..spool import CLAIM_SUFFIX, OUTPUT_SUFFIX, Claim, Spool, shown
from ..submitters import login_of
from .messages import Asked, Resume, RunOrder
from .pool import WorkerPool
from .scheduler import Scheduler

#: The most queued jobs a status for everyone (root, mmd, a grader) lists; the rest are counted.
SHOWN_QUEUE = 1000


class Stops(Protocol):
    """How a running job that a request cancels is ended (:class:`~.supervisor.Supervisor`)."""

    def stop_running(self, worker: int, seq: int, error: MmdError) -> bool:
        """End worker ``worker`` for its job ``seq`` (which gets ``error``'s sidecar), as for a time limit;
        False, and nothing done, when the worker no longer runs that job."""


class Refusals(Protocol):
    """How a claimed job that a request cancels is ended (:class:`~.ends.Ends`)."""

    def refuse_claimed(self, claim: Claim, error: MmdError, device: int | None) -> None:
        """Give a claimed job that no worker has its error sidecar, and archive it."""


@dataclass(frozen=True)
class ShownJob:
    """A job as the desk sees it: in the queue, handed to a worker, or running."""

    state: str  # queued | starting | running
    file: str
    submitter: str | None  # a login (None: not known)
    job: str | None = None
    position: int | None = None  # in the queue, 1 = next
    worker: int | None = None  # the index of its worker in the pool
    seq: int | None = None  # its order's number there (a running job's identity)
    since: float | None = None  # monotonic, when it started running
    phase: str | None = None
    claimed: bool = False  # in the state folder's .work (else still a file in the inbox)

    def shown(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "file": shown(self.file)}
        if self.job is not None:
            out["job"] = self.job
        if self.position is not None:
            out["position"] = self.position
        if self.since is not None:
            out["running_s"] = round(time.monotonic() - self.since, 3)
            out["phase"] = self.phase
        if self.submitter is not None:
            out["submitter"] = self.submitter
        return out


class Desk:
    def __init__(
        self,
        spool: Spool,
        scheduler: Scheduler,
        workers: WorkerPool,
        stops: Stops,
        refusals: Refusals,
        settings: Callable[[], Settings],
        graders: Sequence[int] = (),
    ) -> None:
        #: The settings in effect (a reload changes them): the bounds a student is told of.
        self.settings = settings
        self.spool = spool
        self.scheduler = scheduler
        self.workers = workers
        self.stops = stops
        self.refusals = refusals
        self.graders = set(graders)
        self.store = KernelStore.of(spool.shared.private)

    def answer(self, asked: Asked) -> dict[str, Any]:
        """The answer to one request; never raises (a fault is an answer that says so)."""
        try:
            if asked.op == "status":
                return self._status(asked.uid)
            if asked.op == "cancel":
                return self._cancel(asked.uid, asked.request)
            if asked.op == "rm":
                return self._rm(asked.uid, asked.request)
            return _no(f"unknown op {asked.op!r}")
        except MmdError as exc:
            return _no(exc.reason)

    # -- who --
    def sees_all(self, uid: int) -> bool:
        if uid in (0, os.geteuid()):
            return True
        if not self.graders:
            return False
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            return False
        return bool(self.graders & set(os.getgrouplist(entry.pw_name, entry.pw_gid)))

    # -- the jobs --
    def jobs(self, submitter: str | None, *, everyone: bool = False, limit: int | None = None) -> list[ShownJob]:
        """``submitter``'s jobs (``everyone``: every job, the queue's first ``limit``), running and handed to
        workers first, then the queue in its order. A submitter's cost their own jobs and the jobs in hand,
        never the whole queue: the queue's items and the workers' orders say whose each is, and no file is
        looked at."""
        out: list[ShownJob] = []
        for index, w in enumerate(self.workers.handles):
            running = w.control.running()
            owner = login_of(running.owner) if running is not None and running.owner is not None else None
            for seq, order in w.in_hand.items():
                if isinstance(order, RunOrder):
                    name, job_id, whose = order.name, order.job_id, w.submitters.get(seq)
                else:
                    name, job_id, whose = order.claim.name, order.claim.job_id, order.claim.submitter
                if running is not None and running.seq == seq:
                    whose = owner if running.owner is not None else whose
                    if everyone or whose == submitter:
                        out.append(ShownJob("running", name, whose, job_id, worker=index, seq=seq,
                                            since=running.started, phase=running.phase, claimed=True))  # fmt: skip
                elif everyone or whose == submitter:
                    out.append(
                        ShownJob("starting", name, whose, job_id, worker=index, claimed=isinstance(order, Resume))
                    )
        now = time.monotonic()
        queued = enumerate(self.scheduler.queued(now, limit), 1) if everyone else self.scheduler.places(submitter, now)
        for position, item in queued:
            claimed = item.claim.job_id if item.claim is not None else None
            out.append(ShownJob("queued", item.name, item.submitter, claimed, position=position,
                                claimed=item.claim is not None))  # fmt: skip
        return out

    def _status(self, uid: int) -> dict[str, Any]:
        you, everyone = login_of(uid), self.sees_all(uid)
        shown_jobs = self.jobs(you, everyone=everyone, limit=SHOWN_QUEUE if everyone else None)
        out = {
            "ok": True,
            "serving": True,
            "you": you,
            "everyone": everyone,  # every job (root, mmd, a grader), else the asker's own
            "jobs": [j.shown() for j in shown_jobs],
            "queued_total": self.scheduler.waiting,
        }
        if self.spool.shared.class_mode and not everyone:
            kernels, total = self.store.current(you)
            out["kernels"] = [
                {"name": k.name, "version": k.version, "handed_in": now_iso(k.handed_in)} for k in kernels
            ]
            out["kernels_total"] = total
            if self.spool.ledger is not None:
                # the GPU time their own kernels used, and what they may (student_kernel_gpu_s; None: no bound)
                out["kernel_gpu_s"] = round(self.spool.ledger.gpu_seconds(you), 3)
                out["kernel_gpu_limit_s"] = self.settings().student_kernel_gpu_s
        return out

    def _cancel(self, uid: int, request: dict[str, Any]) -> dict[str, Any]:
        key = "job" if "job" in request else "file"
        wanted = request.get(key)
        if not isinstance(wanted, str) or not wanted:
            return _no('cancel needs "job" (a job id) or "file" (a name in the inbox)')
        you, everyone = login_of(uid), self.sees_all(uid)
        mine = _no(f"no job of yours is {shown(wanted)} (finished already, or not yours)")
        matches = [j for j in self.jobs(you, everyone=everyone) if (j.job if key == "job" else j.file) == wanted]
        if not matches:
            return mine
        job = matches[0]
        who = "its submitter" if job.submitter == you else "a grader or the admin"
        error = JobCancelled(f"cancelled by {who} ({you})", {"by": you})
        if job.state == "running" and job.worker is not None and job.seq is not None:
            # Stopped only if its worker still runs this very job: between the listing and the stop it may have
            # moved on to the next of its group (another student's, say), which is left alone.
            if self.stops.stop_running(job.worker, job.seq, error):
                return {"ok": True, "cancelled": shown(job.file), "job": job.job, "was": "running"}
            return _no(f"{shown(job.file)} has finished; nothing was stopped")
        again = _no(f"{shown(job.file)} is starting; cancel it again in a moment")
        if job.claimed:  # a job taken back from .work: refused, as a stopped one is, unless a worker has it
            item = self.scheduler.cancel(job.file, job.submitter) if job.state == "queued" else None
            if item is None or item.claim is None:
                return again
            self.refusals.refuse_claimed(item.claim, error, None)
            return {"ok": True, "cancelled": shown(job.file), "job": job.job, "was": "queued"}
        # Still a file in the inbox (queued here, or handed to a worker that has not claimed it yet): claimed here
        # and refused, so its worker finds nothing to claim. Its owner is judged again once it is ours: a file
        # put in its place meanwhile by someone else is not theirs to cancel, and runs.
        self.scheduler.cancel(job.file, job.submitter)
        claim = self.spool.claims.claim(job.file)
        if claim is None:
            return again
        if claim.owner != uid and not everyone:
            self.scheduler.resume([claim])
            return mine
        self.refusals.refuse_claimed(claim, error, None)
        return {"ok": True, "cancelled": shown(job.file), "job": claim.job_id, "was": "queued"}

    def _rm(self, uid: int, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("name")
        if not self.spool.shared.class_mode:
            return _no("mmd rm is for a class's box (class_mode): here the outbox is yours to clean")
        if not isinstance(name, str) or not name or "/" in name or name.startswith(".") or "\0" in name:
            return _no("rm needs the name of one of your outputs or sidecars (no folder)")
        base = next((name[: -len(s)] for s in (OUTPUT_SUFFIX, TIMING_SUFFIX, ERROR_SUFFIX) if name.endswith(s)), None)
        if not base:
            return _no(f"{shown(name)} is not an output or sidecar name (NAME.out, .timing.yaml, .error.yaml)")
        folder = self.spool.shared.output_folder(uid)
        if os.path.lexists(folder / f".{base}{CLAIM_SUFFIX}"):
            return _no(f"a job is writing {shown(base)}{OUTPUT_SUFFIX}; cancel it first")
        removed = self.spool.archive.remove_output(uid, base)  # and the input kept of it, uncounted from their share
        if not removed:
            return _no(f"you have no {shown(base)}{OUTPUT_SUFFIX} or sidecar")
        return {"ok": True, "removed": [shown(n) for n in removed]}


def _no(reason: str) -> dict[str, Any]:
    return {"ok": False, "error": reason}
