"""The scheduler's intake: what lies in the inbox becomes a job waiting in the scheduler, or is judged.

A hint (an inotify event, a polling observer's) or a rescan names an inbox
entry; the intake looks at it (one ``lstat``), says when a file is complete
(:class:`~mmd.spool.Readiness`), and offers a complete job file to the
scheduler under its submitter (the input's owner), a kernel handed in to
the hand-in desk. It keeps when this daemon first saw each entry
(:class:`~mmd.spool.Arrivals`): a backlog's order, and the age by which
what is not a job is judged (:meth:`Intake.rescan`), never an entry's
mtime, which its owner sets.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from .. import jobname
from ..config import Settings
from ..errors import MmdError, OutputError, SpoolError
from ..job import new_id, own_kernels
from ..spool import Arrival, Arrivals, Candidate, Readiness, Spool, Survey, shown
from ..spool.handins import is_declaration, is_handin
from ..submitters import login_of
from .backoff import Backoff
from .ends import Ends
from .handins import HandInDesk
from .scheduler import Scheduler
from .state import State


@dataclasses.dataclass(eq=False)
class Intake:
    """Inbox entries, as hints and rescans name them, offered to the scheduler (or judged: set aside, removed)."""

    #: The daemon's settings now (a reload changes them).
    settings: Callable[[], Settings]
    spool: Spool
    scheduler: Scheduler
    handins: HandInDesk
    #: The outbox's pause: while it lasts, a complete file stays in the inbox (the rescan after it takes it).
    pause: Backoff
    ends: Ends
    state: State
    log: Any
    #: When each file becomes complete.
    readiness: Readiness = dataclasses.field(init=False)
    #: When this daemon (or the one before it, for what waits to be judged) first saw each inbox entry.
    _arrivals: Arrivals = dataclasses.field(default_factory=Arrivals, init=False)
    #: The part of it last written to state_dir (what waits to be judged), and whether that write failed.
    _arrivals_kept: dict[str, Arrival] = dataclasses.field(default_factory=dict, init=False)
    _arrivals_failed: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        self.readiness = Readiness(self.settings().quiet_seconds)

    def start(self) -> None:
        """Read back the first sightings a daemon before this one kept (what waited to be judged keeps its age)."""
        self._arrivals = Arrivals(self.spool.dropbox.read_arrivals())

    def _paused(self) -> bool:
        return self.pause.paused(time.monotonic())

    def offer(self, name: str, complete: bool) -> None:
        """A hint that ``name`` may be a job; give it to the scheduler when it is complete."""
        cand = self.spool.scanner.stat(name)
        if cand is None:
            self.readiness.forget(name)
            return
        if not complete and not self.readiness.observe(name, cand.size, cand.mtime_ns):
            return
        self.readiness.forget(name)
        cand = dataclasses.replace(cand, arrived=self._arrivals.seen(cand, time.time()))
        self._arrivals.completed(name)
        if self._paused():
            return  # it stays in the inbox; the rescan after the pause takes it
        if is_handin(name):
            self.handins.take(cand, self.settings())
            return
        if is_declaration(name):
            return  # its NAME.cu takes it; the rescans sweep one left alone as an upload
        full = self.scheduler.full
        self.scheduler.offer(name, cand.size, submitter_of(cand.owner), self._pin(cand))
        if self.scheduler.full and not full:
            self.log.warning(
                "queue full; later files wait in the inbox for a rescan", max_queue=self.settings().max_queue
            )
            self.state.update(backlog=True)

    def look_again(self) -> None:
        """Offer the files whose quiet time has passed (a polling observer's, and a rescan's unfinished ones)."""
        due = self.readiness.due_in()
        if due is not None and due <= 0:
            for name in self.readiness.pending:
                self.offer(name, complete=False)

    def ended(self, job_id: str, name: str, broken: bool = False) -> None:
        """Job ``job_id`` (of inbox name ``name``) ended or was not run: ``name`` is looked at again when a file
        was completed under it meanwhile."""
        if self.scheduler.ended(job_id, broken=broken):
            self.offer(name, complete=True)

    def _pin(self, cand: Candidate) -> Candidate:
        """``cand``, with the version of its submitter's own kernel its name picks now (students' kernels): a
        hand-in of that name while it waits does not change what it runs."""
        own = own_kernels(self.settings(), submitter_of(cand.owner))
        if own is None or "@" not in cand.name:
            return cand
        try:
            picked = jobname.parse(cand.name, (), own).kernel_file
        except MmdError:
            return cand  # refused when its worker reads the name, saying why
        return cand if picked is None else dataclasses.replace(cand, kernel=picked)

    def rescan(self) -> int:
        """Offer every waiting file; returns how many job files wait (not counting broken ones).

        The files go to the scheduler by share (the submitters in turn), each submitter's in the order this
        daemon first saw them (a scan's own in their mtime's order: they reorder only their owner's files).
        What is not a job is judged then (:meth:`_judge`).
        """
        now, wall = time.monotonic(), time.time()
        paused = self._paused()
        survey = self.spool.scanner.survey()
        scanned = survey.jobs
        found: list[Candidate] = []
        found_names: set[str] = set()  # hand-ins waiting to be complete (never jobs)
        complete: dict[str | None, list[tuple[float, Candidate]]] = {}
        unfinished: list[tuple[float, Candidate]] = []
        for cand in scanned:
            submitter = submitter_of(cand.owner)
            if self.scheduler.is_broken(cand.name, submitter):
                continue
            found.append(cand)
            arrived = self._arrivals.seen(cand, wall)
            if self.readiness.observe(cand.name, cand.size, cand.mtime_ns):
                self.readiness.forget(cand.name)
                self._arrivals.completed(cand.name)
                if not paused:
                    complete.setdefault(submitter, []).append((arrived, dataclasses.replace(cand, arrived=arrived)))
            elif not self._arrivals.is_complete(cand.name):
                unfinished.append((arrived, cand))
        for cand in survey.handins:
            if self.readiness.observe(cand.name, cand.size, cand.mtime_ns):
                self.readiness.forget(cand.name)
                if not paused:
                    self.handins.take(cand, self.settings())
            found_names.add(cand.name)
        self._arrivals.keep({c.name for c in (*scanned, *survey.folders, *survey.uploads, *survey.handins)})
        first = sorted(complete, key=lambda s: (min(a for a, _ in complete[s]), str(s)))
        groups = {s: [c for _, c in sorted(complete[s], key=lambda ac: ac[0])] for s in first}
        for cand in self.scheduler.by_share(groups, now):
            self.scheduler.offer(cand.name, cand.size, submitter_of(cand.owner), self._pin(cand))
        known = {c.name for c in found} | found_names
        for name in self.readiness.pending:
            if name not in known:
                self.readiness.forget(name)
        set_aside = self._judge(survey, unfinished, wall)
        return len(found) - set_aside

    def _judge(self, survey: Survey, unfinished: list[tuple[float, Candidate]], wall: float) -> int:
        """What lies in the inbox that is not a job, judged by its age since this daemon (or the one before it)
        first saw it, never by its mtime: a folder under a job's name, or a file ``unfinished`` (still being
        written: (first seen, it)), is set aside after ``drop_box_grace_s`` (:meth:`_set_aside`), an upload
        removed after ``upload_max_age_s``. The first sightings of what waits are kept in state_dir for the next
        start. Returns how many job files were set aside."""
        settings = self.settings()
        grace, max_age = settings.drop_box_grace_s, settings.upload_max_age_s
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
            elif self.spool.dropbox.remove_upload(cand):
                self.log.info("removed an upload nobody finished", file=shown(cand.name),
                              submitter=submitter_of(cand.owner))  # fmt: skip
        self._keep_arrivals(waiting)
        return set_aside

    def _set_aside(self, cand: Candidate, why: str) -> bool:
        """Move inbox entry ``cand`` (not a job) out of its name's way, its owner told ``why`` by an error sidecar
        (kind ``spool``); False when it was gone or another meanwhile, or could not be moved (logged)."""
        try:
            claim = self.spool.dropbox.set_aside(cand, new_id())
        except SpoolError as exc:
            self.log.error("cannot set aside what holds a name in the inbox", file=shown(cand.name), reason=exc.reason)
            return False
        if claim is None:
            return False
        if claim.path.parent == self.spool.shared.inbox:  # hidden in place (mmd may not move it out): judged once only
            self._arrivals.hidden(claim.path.name, claim.ino)
        self.readiness.forget(cand.name)
        error = SpoolError(f"{shown(cand.name)} {why}")
        if claim.reservation is None:  # the outbox refused even the name of its note
            self.log.error("set aside", file=shown(cand.name), submitter=claim.submitter, path=str(claim.path),
                           reason=error.reason, note=claim.unreserved)  # fmt: skip
            self.spool.in_hand.forget(claim.job_id)
        else:
            self.ends.refuse_claimed(claim, error, None, set_aside=True)
        return True

    def _keep_arrivals(self, waiting: set[str]) -> None:
        """Write the first sightings of ``waiting`` (what is still to be judged) to state_dir when they changed."""
        record = self._arrivals.record(waiting)
        if record == self._arrivals_kept:
            return
        try:
            self.spool.dropbox.write_arrivals(record)
        except OutputError as exc:
            if not self._arrivals_failed:
                self.log.warning("cannot keep the inbox's arrivals for the next start", reason=exc.reason)
            self._arrivals_failed = True
            return
        self._arrivals_kept, self._arrivals_failed = record, False


def submitter_of(owner: int | None) -> str | None:
    """The scheduler's name for who dropped a file (its owner's login)."""
    return None if owner is None else login_of(owner)
