"""What the daemon answers on its local socket (:mod:`.local`): each asker's own jobs, never another's.

A job is its submitter's: the owner of its input file (:mod:`mmd.submitters`).
The asker sees and cancels their own jobs and removes their own outputs;
root, the service's own user and members of ``graders_group`` see every
job and may cancel any. Runs on the main loop (it reads the queue and the
workers as they are); the stopping itself is the server's
(:class:`Stops`), as for a job past its time limit.
"""

from __future__ import annotations

import os
import pwd
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import JobCancelled, MmdError
from ..record import ERROR_SUFFIX, TIMING_SUFFIX
from ..spool import CLAIM_SUFFIX, OUTPUT_SUFFIX, Claim, Spool, shown
from ..submitters import login_of
from .control import Running
from .messages import Asked, Resume, Run
from .pool import WorkerPool
from .scheduler import Scheduler


class Stops(Protocol):
    """The server's ways to end a job that a request cancels."""

    def stop_running(self, worker: int, running: Running, error: MmdError) -> None:
        """End worker ``worker`` (its job ``running`` gets ``error``'s sidecar), as for a time limit."""

    def refuse_claimed(self, claim: Claim, error: MmdError, device: int | None) -> None:
        """Give a claimed job that no worker has its error sidecar, and archive it."""


@dataclass(frozen=True)
class Job:
    """A job as the desk sees it: in the queue, handed to a worker, or running."""

    state: str  # queued | starting | running
    file: str
    owner: int | None
    job: str | None = None
    position: int | None = None  # in the queue, 1 = next
    worker: int | None = None
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
        if self.owner is not None:
            out["submitter"] = login_of(self.owner)
        return out


class Desk:
    def __init__(
        self, spool: Spool, scheduler: Scheduler, workers: WorkerPool, stops: Stops, graders: Sequence[int] = ()
    ) -> None:
        self.spool = spool
        self.scheduler = scheduler
        self.workers = workers
        self.stops = stops
        self.graders = set(graders)

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
    def jobs(self) -> list[Job]:
        """Every job the daemon holds: running and handed to workers first, then the queue in its order."""
        out: list[Job] = []
        claims = {c.job_id: c for c in self.spool.in_work()}
        for w in self.workers.handles:
            running = w.control.running()
            # A job taken on a watch and not told yet (a small job tells at its end): found by the watch's job id.
            job_id = w.taken_on_watch()
            taken = claims.get(job_id) if job_id is not None else None
            if taken is not None and running is not None:
                out.append(Job("running", taken.name, taken.owner, taken.job_id, worker=w.index, since=running.started,
                               phase=running.phase, claimed=True))  # fmt: skip
            for seq, order in w.in_hand.items():
                job_id = order.job_id if isinstance(order, Run) else order.claim.job_id
                name = order.name if isinstance(order, Run) else order.claim.name
                claim = claims.get(job_id)
                owner = claim.owner if claim is not None else self._inbox_owner(name)
                if running is not None and running.seq == seq:
                    out.append(Job("running", name, owner, job_id, worker=w.index, since=running.started,
                                   phase=running.phase, claimed=True))  # fmt: skip
                else:
                    out.append(Job("starting", name, owner, job_id, worker=w.index, claimed=isinstance(order, Resume)))
        for position, item in enumerate(self.scheduler.queued(time.monotonic()), 1):
            owner = item.claim.owner if item.claim is not None else self._inbox_owner(item.name)
            claimed = item.claim.job_id if item.claim is not None else None
            out.append(Job("queued", item.name, owner, claimed, position=position, claimed=item.claim is not None))
        return out

    def _inbox_owner(self, name: str) -> int | None:
        try:
            return os.lstat(self.spool.inbox / name).st_uid
        except OSError:
            return None

    def _status(self, uid: int) -> dict[str, Any]:
        every = self.jobs()
        shown_jobs = every if self.sees_all(uid) else [j for j in every if j.owner == uid]
        return {
            "ok": True,
            "serving": True,
            "you": login_of(uid),
            "jobs": [j.shown() for j in shown_jobs],
            "queued_total": sum(1 for j in every if j.state == "queued"),
        }

    def _cancel(self, uid: int, request: dict[str, Any]) -> dict[str, Any]:
        key = "job" if "job" in request else "file"
        wanted = request.get(key)
        if not isinstance(wanted, str) or not wanted:
            return _no('cancel needs "job" (a job id) or "file" (a name in the inbox)')
        matches = [j for j in self.jobs() if (j.job if key == "job" else j.file) == wanted]
        if not matches:
            return _no(f"no job of yours is {shown(wanted)} (finished already, or not yours)")
        job = matches[0]
        if job.owner != uid and not self.sees_all(uid):
            return _no(f"no job of yours is {shown(wanted)} (finished already, or not yours)")
        who = "its submitter" if job.owner == uid else "a grader or the admin"
        error = JobCancelled(f"cancelled by {who} ({login_of(uid)})", {"by": login_of(uid)})
        if job.state == "running" and job.worker is not None:
            handle = next(w for w in self.workers.handles if w.index == job.worker)
            running = handle.control.running()
            if running is not None:
                self.stops.stop_running(self.workers.handles.index(handle), running, error)
                return {"ok": True, "cancelled": shown(job.file), "job": job.job, "was": "running"}
        again = _no(f"{shown(job.file)} is starting; cancel it again in a moment")
        if job.claimed:  # a job taken back from .work: refused, as a stopped one is, unless a worker has it
            item = self.scheduler.cancel(job.file) if job.state == "queued" else None
            if item is None or item.claim is None:
                return again
            self.stops.refuse_claimed(item.claim, error, None)
            return {"ok": True, "cancelled": shown(job.file), "job": job.job, "was": "queued"}
        # Still a file in the inbox (queued here, or handed to a worker that has not claimed it yet): claimed here
        # and refused, so its worker finds nothing to claim. Its owner is judged again once it is ours: a file
        # put in its place meanwhile by someone else is not theirs to cancel, and runs.
        self.scheduler.cancel(job.file)
        claim = self.spool.claim(job.file)
        if claim is None:
            return again
        if claim.owner != uid and not self.sees_all(uid):
            self.scheduler.resume([claim])
            return _no(f"no job of yours is {shown(wanted)} (finished already, or not yours)")
        self.stops.refuse_claimed(claim, error, None)
        return {"ok": True, "cancelled": shown(job.file), "job": claim.job_id, "was": "queued"}

    def _rm(self, uid: int, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("name")
        if not self.spool.class_mode:
            return _no("mmd rm is for a class's box (class_mode): here the outbox is yours to clean")
        if not isinstance(name, str) or not name or "/" in name or name.startswith(".") or "\0" in name:
            return _no("rm needs the name of one of your outputs or sidecars (no folder)")
        base = next((name[: -len(s)] for s in (OUTPUT_SUFFIX, TIMING_SUFFIX, ERROR_SUFFIX) if name.endswith(s)), None)
        if not base:
            return _no(f"{shown(name)} is not an output or sidecar name (NAME.out, .timing.yaml, .error.yaml)")
        folder = self.spool.output_folder(uid)
        if os.path.lexists(folder / f".{base}{CLAIM_SUFFIX}"):
            return _no(f"a job is writing {shown(base)}{OUTPUT_SUFFIX}; cancel it first")
        removed = []
        for path in (folder / (base + s) for s in (OUTPUT_SUFFIX, TIMING_SUFFIX, ERROR_SUFFIX)):
            if _remove_own(path):
                removed.append(path.name)
        if not removed:
            return _no(f"you have no {shown(base)}{OUTPUT_SUFFIX} or sidecar")
        return {"ok": True, "removed": [shown(n) for n in removed]}


def _remove_own(path: Path) -> bool:
    """Remove ``path`` if it is a regular file mmd wrote (never a folder or another's)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        return False
    os.unlink(path)
    return True


def _no(reason: str) -> dict[str, Any]:
    return {"ok": False, "error": reason}
