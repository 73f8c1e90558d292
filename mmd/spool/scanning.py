"""What waits in the inbox, and when a file there is completely written.

:meth:`Scanner.survey` lists the inbox once: the job files waiting (:class:`Candidate`),
oldest first, the folders under job names (in class mode every folder), the
uploads and the kernels handed in (:class:`Survey`);
:meth:`Scanner.scan` the job files alone; :meth:`Scanner.stat` looks at one of them;
:class:`Readiness` decides when a file seen there is complete;
:class:`Arrivals` remembers when the daemon first saw each entry. All pure:
:class:`Scanner` takes its ``scandir``, :class:`Readiness` its clocks and
:class:`Arrivals` the time as parameters (:mod:`.dropbox` keeps its record
across restarts).
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .handins import is_declaration, is_handin
from .names import DONE_DIR, FAILED_DIR, IGNORED_SUFFIXES, WORK_DIR, is_job_name


@dataclass(frozen=True)
class Candidate:
    """A job file seen in the inbox."""

    name: str
    size: int
    mtime_ns: int
    #: Its owner's uid: who dropped it.
    owner: int | None = None
    #: Its inode: a file renamed over the name is another file (the claim checks it took the one offered).
    ino: int | None = None
    #: A folder (under a job's name; in class mode any): never a job, set aside once ``drop_box_grace_s`` has passed.
    folder: bool = False
    #: The version of its submitter's own handed-in kernel its name picked when the daemon offered it (class mode,
    #: ``student_kernels``): the job runs that one, whatever was handed in since.
    kernel: Path | None = None
    #: When the daemon first saw it (``time.time()``), as offered to the scheduler: its sidecar's turnaround
    #: counts from here. None: not known.
    arrived: float | None = None


@dataclass(frozen=True)
class Survey:
    """One listing of the inbox: what may be a job, and what lies under a name without being one."""

    #: Job files, oldest first (mtime, then name): links and other non-regular files too (refused at claim, so
    #: they do not sit in the inbox for ever).
    jobs: list[Candidate]
    #: Folders under job names (``mkdir hw1.txt``: the name is blocked while one is there); with ``every_folder``
    #: (class mode) every folder but the spool's own, whatever its name (a student's ``.team``: a teammate's file
    #: copied into it could be renamed into the inbox, a job in the teammate's name).
    folders: list[Candidate]
    #: Uploads: regular files whose names end ``.part``, ``.tmp`` or ``~``, hidden or not, and hand-ins'
    #: declarations (``NAME.kernel.yaml``) waiting for their kernel (never jobs).
    uploads: list[Candidate]
    #: Kernels handed in: ``NAME.cu`` (:func:`~.handins.is_handin`), any kind of entry, oldest first (never jobs).
    handins: list[Candidate] = field(default_factory=list)


#: The spool's own folders, which an inbox without ``state_dir`` holds.
_SPOOL_FOLDERS = frozenset((WORK_DIR, DONE_DIR, FAILED_DIR))


@dataclass(frozen=True)
class Scanner:
    """What lies in one inbox, listed through ``scandir`` (a spool's: its :class:`~mmd.fileops.FileOps`'s, where
    the tests inject faults); stat never follows a link.

    ``every_folder`` (class mode): the survey takes in the inbox's folders of
    any name, but the spool's own (``.work``, ``.done``, ``.failed``, this
    process's user's): one in a drop box lets its owner rename a classmate's
    file copied into it into the inbox, a job in the classmate's name. Not
    without class mode: a personal inbox's owner is its only user, and a
    folder there holds only files its owner may move in anyway.
    """

    inbox: Path
    scandir: Callable[[Path], Any] = os.scandir
    every_folder: bool = False

    def survey(self) -> Survey:
        """What lies in the inbox (:class:`Survey`), from one listing."""
        every_folder = self.every_folder
        jobs, folders, uploads, handins = [], [], [], []
        try:
            with self.scandir(self.inbox) as it:
                for entry in it:
                    name = entry.name
                    handin = is_handin(name)
                    declaration = is_declaration(name)  # waits for its NAME.cu: swept as an upload is
                    job = is_job_name(name) and not handin and not declaration
                    upload = not job and (declaration or name.endswith(IGNORED_SUFFIXES))
                    try:
                        folder = (job or handin or every_folder) and entry.is_dir(follow_symlinks=False)
                        if not (job or upload or folder or handin):
                            continue
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # claimed or removed meanwhile
                    if folder and name in _SPOOL_FOLDERS and info.st_uid == os.geteuid():
                        continue  # an inbox without state_dir keeps them there (or kept them, before it)
                    cand = Candidate(name, info.st_size, info.st_mtime_ns, info.st_uid, info.st_ino, folder)
                    if folder:
                        folders.append(cand)
                    elif job:
                        jobs.append(cand)
                    elif handin:
                        handins.append(cand)
                    elif stat.S_ISREG(info.st_mode):
                        uploads.append(cand)
        except FileNotFoundError:
            return Survey([], [], [])
        jobs.sort(key=lambda c: (c.mtime_ns, c.name))
        handins.sort(key=lambda c: (c.mtime_ns, c.name))
        return Survey(jobs, folders, uploads, handins)

    def scan(self) -> list[Candidate]:
        """Job files in the inbox, oldest first (mtime, then name); folders are skipped (the survey's jobs, folders
        of other names never looked at)."""
        return Scanner(self.inbox, self.scandir).survey().jobs

    def stat(self, name: str) -> Candidate | None:
        """The inbox entry ``name`` if it is still there and not a folder."""
        try:
            info = os.lstat(self.inbox / name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISDIR(info.st_mode):
            return None
        return Candidate(name, info.st_size, info.st_mtime_ns, info.st_uid, info.st_ino)


#: What :class:`Arrivals` knows of one name: (its entry's inode, when the daemon first saw that entry there).
Arrival = tuple[int | None, float]


class Arrivals:
    """When the daemon first saw each inbox entry, by its own clock (the wall clock's seconds, so that a record
    of them outlives the process): a backlog is offered in that order, and what is not a job (a folder, a file
    still being written, an upload) is judged by its age so counted, never by the entry's mtime, which its
    owner sets (``touch -d 2001-01-01`` put a flood before everyone's files, ``touch -d 2099-01-01`` kept an
    upload young for ever).

    An entry renamed over a name (another inode) is a new arrival. Pure: the time is given.
    """

    def __init__(self, known: dict[str, Arrival] | None = None) -> None:
        #: name -> (inode, first seen); ``known``: a record kept from an earlier daemon (:meth:`record`).
        self._first: dict[str, Arrival] = dict(known or {})
        self._complete: set[str] = set()

    def seen(self, cand: Candidate, now: float) -> float:
        """When ``cand`` was first seen (``now`` if this is the first time)."""
        known = self._first.get(cand.name)
        if known is not None and known[0] == cand.ino:
            return known[1]
        self._first[cand.name] = (cand.ino, now)
        self._complete.discard(cand.name)
        return now

    def hidden(self, name: str, ino: int | None) -> None:
        """The entry ``ino`` now lies under ``name``, set aside in place (a folder mmd may not move out of the
        inbox, renamed there): it is never judged again (first seen "never": no bound passes), so that it is
        not set aside, and its owner told, at every bound."""
        self._first[name] = (ino, math.inf)

    def completed(self, name: str) -> None:
        """The entry seen under ``name`` was found complete: a job from now on (one waiting for its turn may look
        unfinished again for a moment: a rescan's first look at a file whose mtime is ahead of the clock)."""
        self._complete.add(name)

    def is_complete(self, name: str) -> bool:
        """Whether the entry seen under ``name`` was found complete (:meth:`completed`)."""
        return name in self._complete

    def keep(self, names: set[str]) -> None:
        """Forget every entry but ``names`` (those still in the inbox)."""
        self._first = {name: first for name, first in self._first.items() if name in names}
        self._complete &= names

    def record(self, names: set[str]) -> dict[str, Arrival]:
        """What is known of ``names``: the part worth keeping across a restart (what waits to be judged)."""
        return {name: self._first[name] for name in names if name in self._first}


#: How long a file seen being written (a write, no close yet) must stay unchanged before it is taken without its
#: close: only where the close was missed (an inotify queue overflow). A writer that pauses with the file open
#: (scp over a slow link) is waited for this long.
WRITING_QUIET_S = 300.0


class Readiness:
    """Decides when a file is completely written.

    A close-after-write or a rename into the inbox makes it complete at once
    (the daemon takes it without asking). Otherwise (polling, rescans, a
    file moved in from another folder) it is complete once its size and
    mtime have stayed the same for ``quiet_seconds``: either seen unchanged
    over that long, or with an mtime at least that old (:meth:`observe`);
    for a file seen being written (:meth:`writing`) and not yet closed, for
    :data:`WRITING_QUIET_S` instead. Pure: the clocks are parameters.
    """

    def __init__(
        self,
        quiet_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.quiet = quiet_seconds
        self._clock = clock
        self._wall = wall
        self._seen: dict[str, tuple[int, int, float]] = {}
        self._writing: set[str] = set()

    def writing(self, name: str) -> None:
        """``name`` is being written (a write was seen and no close yet): only its close or a rename (the
        daemon's to see), or :data:`WRITING_QUIET_S` unchanged, make it complete."""
        self._writing.add(name)

    def _quiet_for(self, name: str) -> float:
        return max(self.quiet, WRITING_QUIET_S) if name in self._writing else self.quiet

    def observe(self, name: str, size: int, mtime_ns: int) -> bool:
        """Record a stat of ``name``; True when it has been quiet long enough."""
        now = self._clock()
        last = self._seen.get(name)
        if last is None or last[:2] != (size, mtime_ns):
            self._seen[name] = (size, mtime_ns, now)
            since = now
        else:
            since = last[2]
        quiet = self._quiet_for(name)
        if now - since >= quiet or self._wall() - mtime_ns / 1e9 >= quiet:
            self.forget(name)
            return True
        return False

    def forget(self, name: str) -> None:
        """Stop tracking ``name`` (taken, or gone)."""
        self._seen.pop(name, None)
        self._writing.discard(name)

    @property
    def pending(self) -> list[str]:
        """Names seen (or seen being written) but not yet quiet."""
        return list(self._seen.keys() | self._writing)

    def due_in(self) -> float | None:
        """Seconds until the earliest pending name could be quiet (None: nothing pending)."""
        if not self._seen:
            return None
        now = self._clock()
        return max(0.0, min(since + self._quiet_for(name) - now for name, (_, _, since) in self._seen.items()))
