"""The spool protocol: which inbox names are jobs, claim, output names, archive, holds, recovery.

Layout (the dot folders are created on demand)::

    inbox/m.txt                       a job waiting
    inbox/.work/<job>.<v>/m.txt       claimed: job id and output version in the folder name
    inbox/.work/<job>.<v>/.mmd-attempts.json  its starts and holds (see :meth:`Spool.attempt`, :meth:`Spool.hold`)
    inbox/.work/<host>/<job>.<v>/m.txt  the same on a shared inbox: each host claims into its own folder
    inbox/.done/m.txt                 finished with an output
    inbox/.failed/m.txt               refused (the error sidecar says why)
    inbox/.mmd.lock, .mmd-state.json  the daemon's lock and state (see mmd.daemon)
    outbox/.m.claim                   the output version reserved at the claim (``<job> <host> <pid>``)
    outbox/m.out + m.timing.yaml      the result; the sidecar is committed last
    outbox/m.error.yaml               a refusal

A claim is one ``rename`` into ``.work``: of two claimers exactly one wins,
the other gets FileNotFoundError, which is harmless. The claimed file keeps its
name (the sidecar and logs say ``m.txt``) inside a folder named for the job.
The output name is chosen before the claim and recorded in that folder's name
(``<v>``), so after a kill -9
the job resumes into the same output name, and a sidecar carrying the job id
proves that the job finished and only its archive is left to do.

A job's fate is one of three, whatever fails: its output and sidecar
(archived to ``.done``); its error sidecar (archived to ``.failed``); or it
is kept: in the inbox when it could not be claimed, else claimed in
``.work`` (*held* when the outbox refused what it had to write, or left when
its archive failed) and taken back by the daemon after a pause
(:meth:`Spool.take_back`). Nothing is ever put back into the inbox.

Every file operation that moves a job goes through a :class:`~mmd.fileops.FileOps`
(the daemon's is ``os`` itself; the tests inject faults). Everything here
but :class:`Spool`'s methods is pure; :class:`Readiness` and :func:`scan`
take their clock and ``scandir`` as parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import stat
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import record
from .atomic import fsync_folder, temporary_name
from .errors import SpoolError
from .fileops import OPS, FileOps, write_all
from .job import new_id
from .jobname import stem_of

WORK_DIR, DONE_DIR, FAILED_DIR = ".work", ".done", ".failed"
#: An empty folder kept in ``.work`` and renamed to the next job's folder.
SPARE_DIR = ".spare"
LOCK_NAME = ".mmd.lock"
STATE_NAME = ".mmd-state.json"
OUTPUT_SUFFIX = ".out"
#: The reservation of an output version: ``outbox/.<stem>[.<v>].claim``, made at the claim.
CLAIM_SUFFIX = ".claim"
#: A claimed job's record of its starts and holds, in its ``.work`` folder (a dot name: never a job's).
ATTEMPTS_NAME = ".mmd-attempts.json"
#: mmd writes a reservation in full before it takes its name, so an empty one is only what an older mmd
#: (or a filesystem without hard links) leaves when killed between creating and writing it. Such a
#: reservation that no job of this host maps to is stale once it is this old (seconds): its content
#: cannot say whose it is, and a live writer fills it within microseconds.
EMPTY_RESERVATION_GRACE_S = 60.0
#: What ``link`` says on a filesystem without hard links (the reservation is then created in place).
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS})

#: Names that are never jobs: hidden files (our own folders and temporaries
#: included), and the usual "still being written" suffixes.
IGNORED_PREFIXES: tuple[str, ...] = (".",)
IGNORED_SUFFIXES: tuple[str, ...] = (".tmp", ".part", "~")

#: Versions tried before giving up on an output name (m.out, m.1.out ...).
MAX_VERSIONS = 10_000

#: The longest name (UTF-8 bytes) a claimed job keeps. Every name derived from it
#: must fit NAME_MAX (255): ``<stem>.9999.timing.yaml`` (+17), the archive's
#: ``<name>.<job id>`` (+13) and write_atomic's ``.<name>.<pid>.tmp`` (+13 for a
#: 7-digit pid) on top of the output's own name.
MAX_NAME_BYTES = 224
#: Characters never kept in a claimed name: C0/C1 controls (newline, tab, escape
#: ...), DEL, and the bidirectional overrides that make ``txt.exe`` read as
#: ``exe.txt``. Each becomes ``_``.
_BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")

_WORK_RE = re.compile(r"(?P<job>[0-9a-f]{12})\.(?P<version>[0-9]+)")
# write_atomic's temporaries: .<name>.<pid>.tmp (.<name>.<host>.<pid>.tmp on a shared inbox)
_TMP_RE = re.compile(r"\..+\.(?P<pid>[0-9]+)\.tmp")


def host_lock_name(host_id: str) -> str:
    """A shared inbox's per-host lock: ``.mmd.<host_id>.lock``."""
    return f".mmd.{host_id}.lock"


def state_name(host_id: str | None) -> str:
    """The daemon's state file: ``.mmd-state.json``, or ``.mmd-state.<host_id>.json`` on a shared inbox."""
    return f".mmd-state.{host_id}.json" if host_id else STATE_NAME


def is_job_name(name: str) -> bool:
    """Whether a file called ``name`` in the inbox is a job (not hidden, not a partial)."""
    return bool(name) and not name.startswith(IGNORED_PREFIXES) and not name.endswith(IGNORED_SUFFIXES)


def safe_name(name: str) -> str:
    """The name a job is claimed under: ``name`` itself when it is harmless.

    Control characters, bidirectional overrides and bytes that are not UTF-8
    (Python's surrogate escapes) become ``_``; a name longer than
    :data:`MAX_NAME_BYTES` is cut (on a character boundary, keeping its last
    suffix) and given 8 hex digits of the original's sha256, so two long names
    that share a prefix stay apart. A name from a folder listing cannot hold
    ``/`` or be ``.``/``..``, so the result is one plain name in its folder.
    """
    clean = "".join("_" if unicodedata.category(ch) in ("Cc", "Cs") or ch in _BIDI else ch for ch in name)
    if len(clean.encode("utf-8")) <= MAX_NAME_BYTES:
        return clean
    tag = hashlib.sha256(os.fsencode(name)).hexdigest()[:8]
    stem, dot, suffix = clean.rpartition(".")
    if not dot or not stem or len(suffix.encode()) > 16:
        stem, suffix = clean, ""
    tail = f"-{tag}" + (f".{suffix}" if suffix else "")
    room = MAX_NAME_BYTES - len(tail.encode())
    cut = stem.encode("utf-8")[:room].decode("utf-8", "ignore")
    return cut + tail


def shown(name: str) -> str:
    """``name`` for a log line or a message: controls and undecodable bytes escaped, never raw."""
    return "".join(ch if ch.isprintable() and ch not in _BIDI else ascii(ch)[1:-1] for ch in name)


def output_path(outbox: Path, stem: str, version: int = 0) -> Path:
    """``outbox/<stem>.out``, or ``outbox/<stem>.<version>.out`` for a later version."""
    return outbox / (f"{stem}.{version}{OUTPUT_SUFFIX}" if version else f"{stem}{OUTPUT_SUFFIX}")


def names_of(output: Path) -> tuple[Path, Path, Path]:
    """The three names a job may commit: output, timing sidecar, error sidecar."""
    return output, record.timing_path(output), record.error_path(output)


def claim_path(outbox: Path, stem: str, version: int = 0) -> Path:
    """The reservation of output version ``version`` of ``stem``: ``outbox/.<stem>[.<v>].claim``."""
    return outbox / (f".{stem}.{version}{CLAIM_SUFFIX}" if version else f".{stem}{CLAIM_SUFFIX}")


def resolve_output(
    outbox: Path, stem: str, exists: Callable[[Path], bool] = os.path.lexists, start: int = 0
) -> tuple[int, list[str]]:
    """The first free output version for ``stem`` (from ``start``) and the names that made earlier ones taken.

    A version is taken when its reservation (a job holds it) or any of its
    output, timing or error sidecar exists, so a new result never overwrites,
    or sits beside, an older job's files. The reservation is looked at first:
    a job commits its output before it drops its reservation.
    """
    collided: list[str] = []
    for version in range(start, MAX_VERSIONS):
        names = (claim_path(outbox, stem, version), *names_of(output_path(outbox, stem, version)))
        taken = [p.name for p in names if exists(p)]
        if not taken:
            return version, collided
        collided.extend(taken)
    raise SpoolError(f"{MAX_VERSIONS} outputs named {stem}.* already exist in {outbox}; clear some")


def read_reservation(path: Path) -> tuple[str, str, int] | None:
    """(job id, host, pid) from a reservation file; None when missing or not mmd's."""
    try:
        job, host, pid = path.read_text(encoding="ascii").split()
        return job, host, int(pid)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Candidate:
    """A job file seen in the inbox."""

    name: str
    size: int
    mtime_ns: int


def scan(inbox: Path, scandir: Callable[[Path], Any] = os.scandir) -> list[Candidate]:
    """Job files in ``inbox``, oldest first (mtime, then name); folders are skipped.

    Links and other non-regular files are listed (they are refused at claim, so
    they do not sit in the inbox forever); stat never follows a link.
    """
    found = []
    try:
        with scandir(inbox) as it:
            for entry in it:
                if not is_job_name(entry.name):
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        continue
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # claimed or removed meanwhile
                found.append(Candidate(entry.name, info.st_size, info.st_mtime_ns))
    except FileNotFoundError:
        return []
    found.sort(key=lambda c: (c.mtime_ns, c.name))
    return found


class Readiness:
    """Decides when a file is completely written.

    A close-after-write or a rename into the inbox makes it complete at once
    (:meth:`complete`). Otherwise (polling, rescans, a file moved in from
    another folder) it is complete once its size and mtime have stayed the
    same for ``quiet_seconds``: either seen unchanged over that long, or with
    an mtime at least that old (:meth:`observe`). Pure: the clocks are
    parameters.
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

    def observe(self, name: str, size: int, mtime_ns: int) -> bool:
        """Record a stat of ``name``; True when it has been quiet long enough."""
        now = self._clock()
        last = self._seen.get(name)
        if last is None or last[:2] != (size, mtime_ns):
            self._seen[name] = (size, mtime_ns, now)
            since = now
        else:
            since = last[2]
        if now - since >= self.quiet or self._wall() - mtime_ns / 1e9 >= self.quiet:
            self._seen.pop(name, None)
            return True
        return False

    def forget(self, name: str) -> None:
        """Stop tracking ``name`` (taken, or gone)."""
        self._seen.pop(name, None)

    @property
    def pending(self) -> list[str]:
        """Names seen but not yet quiet."""
        return list(self._seen)

    def due_in(self) -> float | None:
        """Seconds until the earliest pending name could be quiet (None: nothing pending)."""
        if not self._seen:
            return None
        now = self._clock()
        return max(0.0, min(since + self.quiet - now for _, _, since in self._seen.values()))


@dataclass(frozen=True)
class Claim:
    """A claimed job: its file sits at ``path`` (``.work/<job>.<v>/<name>``) until it is archived."""

    job_id: str
    name: str
    version: int
    path: Path
    output: Path
    #: ``time.perf_counter()`` at the claim (the job's ``overall`` starts here).
    started: float
    regular: bool = True
    resumed: bool = False
    #: Names in the outbox that pushed the output to a later version.
    collided: list[str] = field(default_factory=list)
    #: The inbox name when the claim had to rename it (see :func:`safe_name`).
    original: str | None = None
    #: Why the claimed entry must not be read (a link, a hard link, not a file); None: read it.
    problem: str | None = None
    #: ``outbox/.<stem>[.<v>].claim``: the output version this job holds until its sidecar is committed.
    reservation: Path | None = None
    #: Why no reservation could be made (the outbox refused it): the job is held, not run. None: not refused.
    unreserved: str | None = None
    #: Taken back by the daemon that left it in ``.work`` (held, or its archive failed), not resumed at a start.
    again: bool = False

    @property
    def stem(self) -> str:
        return stem_of(self.name)

    def collision(self) -> dict[str, Any] | None:
        """The sidecar's ``collision`` entry, when the output had to be versioned."""
        if not self.version:
            return None
        return {"wanted": f"{self.stem}{OUTPUT_SUFFIX}", "existing": list(self.collided), "used": self.output.name}


@dataclass(frozen=True)
class Attempts:
    """A claimed job's starts and holds, kept beside it in ``.work`` (:data:`ATTEMPTS_NAME`).

    Written atomically and fsynced at each change, so the counts survive a
    kill -9 and a power loss; the file lives in the job's folder, so it moves
    with the job (a resumed or re-versioned job keeps it) and goes with its
    archive.
    """

    #: :meth:`Spool.attempt` calls: how often the job was started (or resumed).
    starts: int = 0
    #: Of those starts, how many ended cleanly in a hold (not in a crash).
    settled: int = 0
    #: How often the job was held (the outbox refused what it had to write).
    holds: int = 0
    #: Of the holds, those where the job's own output could not be committed.
    output_failures: int = 0
    #: The last hold's reason.
    reason: str | None = None
    #: When it was first held (ISO time).
    held_since: str | None = None

    @property
    def unfinished(self) -> int:
        """Starts that did not end in a hold: the job crashed the process that ran it (or is running now)."""
        return self.starts - self.settled


@dataclass(frozen=True)
class HeldJob:
    """A job kept in ``.work`` because the outbox refused it, as `mmd status` shows it."""

    job: str
    file: str
    #: The host whose ``.work`` holds it (a shared inbox), else None.
    host: str | None
    reason: str
    since: str | None
    holds: int
    output_failures: int


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def entry_problem(info: os.stat_result) -> str | None:
    """Why an inbox entry (its ``lstat``) must not be read, or None for a plain file.

    A symbolic link is never followed. A regular file with more than one name
    may be a hard link to a file outside the spool (``ln /etc/shadow inbox/x``
    on the same filesystem): mmd cannot tell, so it reads none.
    """
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link; mmd never follows links"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file (a folder, device, pipe or socket)"
    if info.st_nlink > 1:
        return f"has {info.st_nlink} hard links; mmd reads only files with one name (copy it, do not link it)"
    return None


def work_folder_name(job_id: str, version: int) -> str:
    """The ``.work`` folder of a claimed job: ``<job>.<version>``."""
    return f"{job_id}.{version}"


def parse_work_folder(name: str) -> tuple[str, int] | None:
    """``<job>.<v>`` → (job, v); None for a name mmd did not make."""
    match = _WORK_RE.fullmatch(name)
    if not match:
        return None
    return match["job"], int(match["version"])


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one we may not signal still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Spool:
    """An inbox and an outbox, and the moves between them.

    ``ops`` does every file operation that moves a job (the tests inject
    faults through it). A Spool is shared by the daemon's threads: it keeps
    which jobs this process has in hand and which it left in ``.work`` to take
    back, under a lock.
    """

    def __init__(self, inbox: Path, outbox: Path, host_id: str | None = None, ops: FileOps = OPS) -> None:
        self.inbox = Path(inbox)
        self.outbox = Path(outbox)
        #: Set on a shared inbox: this host claims into and resumes from ``.work/<host_id>`` only.
        self.host_id = host_id
        self.ops = ops
        self.work_root = self.inbox / WORK_DIR
        self.work = self.work_root / host_id if host_id else self.work_root
        self.done = self.inbox / DONE_DIR
        self.failed = self.inbox / FAILED_DIR
        self._made: set[Path] = set()
        self._lock = threading.Lock()
        #: Job ids this process has in hand (claimed, resumed or taken back, and not yet archived or left).
        self._live: set[str] = set()
        #: Jobs this process left in .work (held, or their archive failed), for :meth:`take_back`.
        self._left: dict[str, Claim] = {}

    # -- folders --
    def _folder(self, path: Path) -> Path:
        if path not in self._made:
            if path == self.work and path != self.work_root:  # .work/<host>: never makes the inbox either
                self._folder(self.work_root)
                self._mkdir(path)
                _check_own_folder(path)
            elif path.parent == self.inbox:
                self._mkdir(path)  # never the inbox itself: if it was deleted, it stays so
                _check_own_folder(path)
            else:
                path.mkdir(parents=True, exist_ok=True)
            self._made.add(path)
        return path

    def _mkdir(self, path: Path) -> None:
        with contextlib.suppress(FileExistsError):  # made earlier; _check_own_folder says whether it is ours
            self.ops.mkdir(path)

    def forget_folders(self) -> None:
        """Make and check every folder again at next use (the inbox was deleted and recreated)."""
        self._made.clear()

    def prepare(self) -> None:
        """Create the inbox and the outbox if missing and check the dot folders users could plant.

        The inbox is writable by the users who drop files: a ``.work``,
        ``.done`` or ``.failed`` that is a link, or a folder someone else owns,
        would let them move or swap claimed files, so the daemon refuses to
        serve until it is removed. A world-writable outbox is refused too.
        """
        for folder in (self.inbox, self.outbox):
            try:
                self._folder(folder)
            except OSError as exc:
                raise SpoolError(f"cannot create {folder}: {exc.strerror or exc}") from None
        for folder in (self.work_root, self.work, self.done, self.failed):
            if os.path.lexists(folder):
                _check_own_folder(folder)
        mode = os.stat(self.outbox).st_mode
        if mode & stat.S_IWOTH:
            raise SpoolError(
                f"the outbox {self.outbox} is world-writable (mode {stat.S_IMODE(mode):o}): anyone could replace "
                f"results; chmod o-w it"
            )

    # -- scanning --
    def scan(self) -> list[Candidate]:
        """Job files waiting in the inbox, oldest first."""
        return scan(self.inbox)

    def stat(self, name: str) -> Candidate | None:
        """The inbox entry ``name`` if it is still there and not a folder."""
        try:
            info = os.lstat(self.inbox / name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISDIR(info.st_mode):
            return None
        return Candidate(name, info.st_size, info.st_mtime_ns)

    # -- claim --
    def claim(self, name: str) -> Claim | None:
        """Claim inbox file ``name`` by renaming it into ``.work``; None if it is gone.

        The output version is chosen first and recorded in the claimed name.
        The rename moves a symbolic link itself, never its target; the claim
        says whether the file is a regular one (others are refused unopened).

        Raises SpoolError when the claim fails: the file is then still in the
        inbox, or, when it was claimed but cannot be looked at, in ``.work``
        and left for :meth:`take_back`. A reservation the outbox refuses does
        not fail the claim: the claim says why (``unreserved``) and the job is
        held.
        """
        safe = safe_name(name)
        stem = stem_of(safe)
        guess, collided = resolve_output(self.outbox, stem)
        job_id = new_id()
        with self._lock:  # in hand before its reservation can exist: a sweep never takes it for stale
            self._live.add(job_id)
        try:
            folder = self._job_folder(work_folder_name(job_id, guess))
        except (OSError, SpoolError) as exc:
            self._forget(job_id)
            why = exc.reason if isinstance(exc, SpoolError) else _reason(exc)
            raise SpoolError(f"cannot claim {shown(name)}: cannot make its folder in {WORK_DIR}: {why}") from None
        dst = folder / safe
        try:
            self.ops.rename(self.inbox / name, dst)
        except FileNotFoundError:
            self._release_folder(folder)
            self._forget(job_id)
            return None  # someone else has it, or it was removed: harmless
        except OSError as exc:
            self._release_folder(folder)
            self._forget(job_id)
            raise SpoolError(f"cannot claim {shown(name)}: {_reason(exc)}") from None
        except BaseException:
            self._release_folder(folder)
            self._forget(job_id)
            raise
        started = time.perf_counter()
        # From here the file is in .work: whatever fails now keeps it there.
        # Only the claimer that won the rename reserves (a loser must not push the winner to m.1.out).
        version, reservation, unreserved = guess, None, None
        try:
            version, collided, reservation = self.reserve(stem, job_id)
        except SpoolError as exc:
            unreserved = exc.reason
        if version != guess:
            moved = self.work / work_folder_name(job_id, version)
            try:
                self.ops.rename(folder, moved)
                folder, dst = moved, moved / safe
            except OSError as exc:
                self._unlink_quietly(reservation)
                version, reservation = guess, None
                unreserved = f"cannot rename its folder in {WORK_DIR}: {_reason(exc)}"
        claim = Claim(
            job_id,
            safe,
            version,
            dst,
            output_path(self.outbox, stem, version),
            started,
            collided=collided,
            original=name if safe != name else None,
            reservation=reservation,
            unreserved=unreserved,
        )
        try:
            info = self.ops.lstat(dst)
        except OSError as exc:
            self.leave(claim)
            raise SpoolError(
                f"claimed {shown(name)} but cannot look at it: {_reason(exc)}; it stays in {WORK_DIR} and is "
                f"tried again after a pause"
            ) from None
        return dataclasses.replace(claim, regular=stat.S_ISREG(info.st_mode), problem=entry_problem(info))

    def reserve(self, stem: str, job_id: str) -> tuple[int, list[str], Path]:
        """Reserve the first free output version of ``stem``: (version, names in the way, reservation).

        The reservation ``outbox/.<stem>[.<v>].claim`` holds ``<job> <host>
        <pid>``; it is taken atomically (see :meth:`_create_reservation`), and
        when another job made it first, the next version is tried. After
        taking it the version's own names are looked at again: a job that held
        it a moment ago commits its output before it drops its reservation.
        Raises SpoolError when the outbox refuses it.
        """
        start, collided = 0, []
        while True:
            version, more = resolve_output(self.outbox, stem, start=start)
            collided.extend(more)
            path = claim_path(self.outbox, stem, version)
            if not self._create_reservation(path, job_id):
                collided.append(path.name)
                start = version + 1
                continue
            late = [p.name for p in names_of(output_path(self.outbox, stem, version)) if os.path.lexists(p)]
            if not late:
                return version, collided, path
            self._unlink_quietly(path)
            collided.extend(late)
            start = version + 1

    def _reservation_text(self, job_id: str) -> bytes:
        return f"{job_id} {self.host_id or '-'} {os.getpid()}\n".encode()

    def _create_reservation(self, path: Path, job_id: str) -> bool:
        """Take reservation ``path`` for ``job_id``; False when another job holds it.

        The reservation is written in full under a temporary name and then
        linked to its own name (``link`` fails when the name exists, as
        ``O_EXCL`` does), so no one ever sees it empty: a kill between
        creating and writing it leaves only a temporary, which the start-up
        sweep removes. Where the filesystem has no hard links it is created
        ``O_EXCL`` in place and written. A missing outbox is made again.
        """
        text = self._reservation_text(job_id)
        tmp = path.with_name(temporary_name(path.name))
        try:
            try:
                self._write_new(tmp, text)
            except FileNotFoundError:  # the outbox was deleted under us: make it again
                self.outbox.mkdir(parents=True, exist_ok=True)
                self._write_new(tmp, text)
        except OSError as exc:
            raise SpoolError(f"cannot reserve {path.name} in the outbox: {_reason(exc)}") from None
        try:
            self.ops.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise SpoolError(f"cannot reserve {path.name} in the outbox: {_reason(exc)}") from None
            return self._create_in_place(path, text)
        finally:
            self._unlink_quietly(tmp)
        return True

    def _create_in_place(self, path: Path, text: bytes) -> bool:
        """The reservation created ``O_EXCL`` and written (no hard links here); False when it exists."""
        try:
            fd = self.ops.open_exclusive(path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise SpoolError(f"cannot reserve {path.name} in the outbox: {_reason(exc)}") from None
        try:
            write_all(self.ops, fd, text)
        except OSError as exc:
            self._close_quietly(fd)
            self._unlink_quietly(path)
            raise SpoolError(f"cannot reserve {path.name} in the outbox: {_reason(exc)}") from None
        self._close_quietly(fd)
        return True

    def _write_new(self, path: Path, data: bytes, durable: bool = False) -> None:
        """A new file ``path`` holding ``data`` (a leftover of ours of that name is replaced); OSError on failure."""
        try:
            fd = self.ops.open_exclusive(path)
        except FileExistsError:  # a temporary of a killed process with our pid: never through a link
            self.ops.unlink(path)
            fd = self.ops.open_exclusive(path)
        try:
            write_all(self.ops, fd, data)
            if durable:
                self.ops.fsync(fd)
        except BaseException:
            self._close_quietly(fd)
            self._unlink_quietly(path)
            raise
        try:
            self.ops.close(fd)
        except OSError:
            self._unlink_quietly(path)
            raise

    def _take_empty(self, path: Path, job_id: str) -> bool:
        """Take reservation ``path`` for ``job_id`` if it is empty (a kill between its creation and its write)."""
        try:
            info = self.ops.lstat(path)
        except FileNotFoundError:
            return self._create_reservation(path, job_id)
        except OSError as exc:
            raise SpoolError(f"cannot reserve {path.name} in the outbox: {_reason(exc)}") from None
        if not stat.S_ISREG(info.st_mode) or info.st_size:
            return False  # another job's, or not mmd's
        tmp = path.with_name(temporary_name(path.name))
        try:
            self._write_new(tmp, self._reservation_text(job_id))
            self.ops.replace(tmp, path)
        except OSError as exc:
            self._unlink_quietly(tmp)
            raise SpoolError(f"cannot reserve {path.name} in the outbox: {_reason(exc)}") from None
        held = read_reservation(path)
        return held is not None and held[0] == job_id

    def settle(self, claim: Claim) -> Claim:
        """A job from ``.work`` holding its output version again; moved to the next free version if another job has it.

        A kill between the claim's rename and its reservation leaves a job
        without one, and a kill between creating the reservation and writing
        it leaves an empty one, which is this job's to take over; another
        daemon may meanwhile have reserved (or even finished) that version.
        The job takes its reservation again when it is free and no other job's
        sidecar sits there, else it reserves the next free version and its
        ``.work`` folder is renamed to match. When the outbox refuses, the
        claim comes back without a reservation and says why (``unreserved``).
        """
        path = claim_path(self.outbox, claim.stem, claim.version)
        held = read_reservation(path)
        if held is not None and held[0] == claim.job_id:
            return dataclasses.replace(claim, reservation=path, unreserved=None)
        try:
            if held is None:
                with self._lock:  # two jobs of this process that map to one empty reservation: one takes it
                    taken = self._take_empty(path, claim.job_id)
                if taken:
                    _out, timing, error = names_of(claim.output)
                    others = [p for p in (timing, error) if os.path.lexists(p) and not self.owned_by(claim, p)]
                    if not others:
                        return dataclasses.replace(claim, reservation=path, unreserved=None)
                    self._unlink_quietly(path)
            version, collided, reservation = self.reserve(claim.stem, claim.job_id)
        except SpoolError as exc:
            return dataclasses.replace(claim, reservation=None, unreserved=exc.reason)
        if version == claim.version:
            return dataclasses.replace(claim, reservation=reservation, unreserved=None)
        moved = self.work / work_folder_name(claim.job_id, version)
        try:
            self.ops.rename(claim.path.parent, moved)
        except OSError as exc:
            self._unlink_quietly(reservation)
            why = f"cannot rename its folder in {WORK_DIR}: {_reason(exc)}"
            return dataclasses.replace(claim, reservation=None, unreserved=why)
        return dataclasses.replace(
            claim,
            version=version,
            path=moved / claim.name,
            output=output_path(self.outbox, claim.stem, version),
            collided=collided,
            reservation=reservation,
            unreserved=None,
        )

    def release(self, claim: Claim) -> None:
        """Drop ``claim``'s output reservation (its sidecar is committed); one that cannot be removed is swept later."""
        path = claim.reservation
        if path is None:
            return
        held = read_reservation(path)
        if held is not None and held[0] == claim.job_id:
            self._unlink_quietly(path)

    def sweep_reservations(self, claims: Iterable[Claim] | None = None) -> list[Path]:
        """Remove reservations left by dead daemons of this host; returns those removed.

        Staleness is judged by the owner, not by age (Postfix's rule for its
        queue files): a reservation names ``<job> <host> <pid>``, and it is
        stale when ``<host>`` is this host and its job is not in hand here nor
        in this host's ``.work`` (``claims``: those jobs; by default ``.work``
        is listed), unless ``<pid>`` is another process alive on this host
        (another daemon sharing the outbox). An empty reservation that a job
        in ``.work`` maps to is that job's to take over (:meth:`settle`); one
        no job maps to is stale after :data:`EMPTY_RESERVATION_GRACE_S`, and
        only without a shared inbox (there it could be any host's). Other
        hosts' reservations are theirs.
        """
        work = list(claims) if claims is not None else self._scan_work(tidy=False)
        in_work = {c.job_id for c in work}
        mapped = {claim_path(self.outbox, c.stem, c.version) for c in work}
        me, pid = self.host_id or "-", os.getpid()
        removed = []
        for path in _entries(self.outbox):
            if not path.name.startswith(".") or not path.name.endswith(CLAIM_SUFFIX):
                continue
            held = read_reservation(path)
            if held is None:
                if not self._stale_empty(path, mapped):
                    continue
            else:
                job, host, owner = held
                if host != me or job in in_work or (owner != pid and pid_alive(owner)):
                    continue
                with self._lock:  # decided under the lock: a job claimed meanwhile is in hand before it reserves
                    if job in self._live or job in self._left:
                        continue
            try:
                self.ops.unlink(path)
            except OSError:
                continue  # gone meanwhile, or the outbox refuses: tried again at the next sweep
            removed.append(path)
        return removed

    def _stale_empty(self, path: Path, mapped: set[Path]) -> bool:
        if self.host_id is not None or path in mapped:
            return False
        try:
            info = self.ops.lstat(path)
        except OSError:
            return False
        old = time.time() - info.st_mtime > EMPTY_RESERVATION_GRACE_S
        return stat.S_ISREG(info.st_mode) and info.st_size == 0 and info.st_uid == os.geteuid() and old

    def _job_folder(self, name: str) -> Path:
        """An empty ``.work/<name>``: the spare folder renamed (a mkdir costs more on ext4)."""
        folder = self._folder(self.work) / name
        try:
            self.ops.rename(self.work / SPARE_DIR, folder)
        except FileNotFoundError:
            self.ops.mkdir(folder)
        return folder

    def _release_folder(self, folder: Path) -> None:
        """Keep an emptied job folder as the spare (replacing an empty spare), else remove it.

        mmd's own dot files in it (the attempts record, a killed write's
        temporary) are removed first; a folder that still holds anything else
        is left for the next start's recovery, never made the spare.
        """
        try:
            with os.scandir(folder) as it:
                entries = [e.name for e in it]
        except OSError:
            return
        for name in entries:
            if not name.startswith("."):
                return
            self._unlink_quietly(folder / name)
        try:
            self.ops.rename(folder, self.work / SPARE_DIR)
        except OSError:
            with contextlib.suppress(OSError):
                self.ops.rmdir(folder)

    # -- jobs in .work --
    def resumable(self) -> list[Claim]:
        """Jobs left in ``.work`` by an earlier daemon, oldest first, now in hand; empty job folders are removed.

        Only for a daemon starting up with the inbox's lock: every job in its
        ``.work`` is then its own.
        """
        claims = self._scan_work(tidy=True)
        with self._lock:
            self._live.update(c.job_id for c in claims)
        return claims

    def _scan_work(self, tidy: bool) -> list[Claim]:
        claims = []
        for folder in _entries(self.work):
            parsed = parse_work_folder(folder.name)
            if parsed is None or not folder.is_dir():
                continue  # not mmd's: left alone
            job_id, version = parsed
            files = [p for p in _entries(folder) if not p.name.startswith(".")]
            if not files:  # killed between mkdir and rename, or after the archive
                if tidy:
                    self._release_folder(folder)
                continue
            for path in files:
                try:
                    info = path.lstat()
                except FileNotFoundError:
                    continue
                claims.append(
                    (
                        info.st_mtime_ns,
                        path.name,
                        Claim(
                            job_id,
                            path.name,
                            version,
                            path,
                            output_path(self.outbox, stem_of(path.name), version),
                            time.perf_counter(),
                            regular=stat.S_ISREG(info.st_mode),
                            resumed=True,
                            problem=entry_problem(info),
                            reservation=claim_path(self.outbox, stem_of(path.name), version),
                        ),
                    )
                )
        claims.sort(key=lambda c: (c[0], c[1]))
        return [c for _, _, c in claims]

    def leave(self, claim: Claim) -> None:
        """Leave ``claim`` in ``.work`` (held, or its archive failed) for :meth:`take_back`; its reservation stays."""
        with self._lock:
            self._live.discard(claim.job_id)
            self._left[claim.job_id] = dataclasses.replace(claim, again=True)

    def take_back(self) -> list[Claim]:
        """The jobs this process left in ``.work``, in hand again, to run (or archive) once more.

        A job whose file is gone from ``.work`` (removed by hand) is dropped
        with its reservation; one that cannot be looked at now is kept for
        the next call. Only what this process left is taken: a job in
        ``.work`` that another daemon has in hand is never touched.
        """
        with self._lock:
            left = list(self._left.values())
            self._left.clear()
        back = []
        for claim in left:
            try:
                info = self.ops.lstat(claim.path)
            except FileNotFoundError:
                self.release(claim)
                continue
            except OSError:
                with self._lock:
                    self._left[claim.job_id] = claim
                continue
            with self._lock:
                self._live.add(claim.job_id)
            back.append(
                dataclasses.replace(
                    claim,
                    started=time.perf_counter(),
                    regular=stat.S_ISREG(info.st_mode),
                    problem=entry_problem(info),
                )
            )
        return back

    @property
    def left(self) -> int:
        """How many jobs this process left in ``.work`` to take back."""
        with self._lock:
            return len(self._left)

    def _forget(self, job_id: str) -> None:
        with self._lock:
            self._live.discard(job_id)
            self._left.pop(job_id, None)

    # -- attempts and holds --
    def attempts(self, claim: Claim) -> Attempts:
        """``claim``'s record of starts and holds (all zero before the first)."""
        return read_attempts(claim.path.parent / ATTEMPTS_NAME) or Attempts()

    def attempt(self, claim: Claim) -> int:
        """Record one more start of ``claim``'s job, durably, before it runs; returns its unfinished starts.

        The count returned is how many of the job's starts did not end
        cleanly, this one included: 1 on a first start, and one more for
        each process that died while running it (a start that ended in a
        hold is not counted again). A fresh claim's first start writes
        nothing (the claim records it); every later start is kept in the
        job's ``.work`` folder (:class:`Attempts`), written atomically and
        fsynced before this returns, so it survives kill -9 and goes with the
        job when it is resumed. Raises SpoolError when it cannot be written.
        """
        now = self.attempts(claim)
        if now.starts == 0:
            if not claim.resumed:
                return 1  # the claim itself is the first start: small jobs pay no fsync for a record
            now = dataclasses.replace(now, starts=1)  # that first start, never written
        new = dataclasses.replace(now, starts=now.starts + 1)
        self._write_attempts(claim, new)
        return new.unfinished

    def hold(self, claim: Claim, reason: str, *, output_failed: bool = False) -> Attempts:
        """Keep ``claim`` in ``.work``, its reservation kept, to be taken back after a pause; record why.

        ``output_failed``: the job's own output could not be committed (what
        the daemon's limit on output attempts counts), as opposed to its
        reservation or a sidecar. The record (:class:`Attempts`) is written
        durably; the hold stands even when it cannot be (SpoolError is then
        raised after the hold is in place).
        """
        now = self.attempts(claim)
        starts = max(now.starts, 1)  # a first start is not written (see attempt)
        new = dataclasses.replace(
            now,
            starts=starts,
            settled=starts,
            holds=now.holds + 1,
            output_failures=now.output_failures + (1 if output_failed else 0),
            reason=reason,
            held_since=now.held_since or record.now_iso(),
        )
        self.leave(claim)
        self._write_attempts(claim, new)
        return new

    def _write_attempts(self, claim: Claim, attempts: Attempts) -> None:
        folder = claim.path.parent
        path = folder / ATTEMPTS_NAME
        tmp = folder / f"{ATTEMPTS_NAME}.{os.getpid()}.tmp"
        try:
            self._write_new(tmp, json.dumps(dataclasses.asdict(attempts)).encode(), durable=True)
            self.ops.replace(tmp, path)
        except OSError as exc:
            self._unlink_quietly(tmp)
            why = _reason(exc)
            raise SpoolError(f"cannot record the attempts of {shown(claim.name)} in {WORK_DIR}: {why}") from None
        fsync_folder(folder)

    def discard_outputs(self, claim: Claim) -> list[str]:
        """Remove what ``claim``'s job committed to the outbox before it is held; the names that could not be.

        Its output, when it holds that version's reservation (else the
        output may be another job's by now), and those of its sidecars that
        carry its job id: nothing half done stays visible.
        """
        held = read_reservation(claim.reservation) if claim.reservation is not None else None
        ours = held is not None and held[0] == claim.job_id
        stuck = []
        for path in names_of(claim.output):
            if not (ours and path == claim.output) and not self.owned_by(claim, path):
                continue
            try:
                self.ops.unlink(path)
            except FileNotFoundError:
                continue
            except OSError:
                stuck.append(path.name)
        return stuck

    def finished(self, claim: Claim) -> tuple[bool, Path] | None:
        """(ok, sidecar) when this job's own sidecar is already committed, else None.

        A sidecar is this job's when it carries the job id; it is committed
        last, so its presence means only the archive was left to do.
        """
        _output, timing, error = names_of(claim.output)
        for ok, path in ((True, timing), (False, error)):
            try:
                found = record.load_dict(path)
            except Exception:  # missing, unreadable or not YAML: not this job's
                continue
            if found.get("job") == claim.job_id:
                return ok, path
        return None

    def owned_by(self, claim: Claim, path: Path) -> bool:
        """Whether the sidecar at ``path`` was written by ``claim``'s job (it carries the job id)."""
        try:
            return record.load_dict(path).get("job") == claim.job_id
        except Exception:  # missing, unreadable or not YAML: not this job's
            return False

    # -- archive --
    def archive(self, claim: Claim, ok: bool) -> Path:
        """Move the claimed file to ``.done`` (ok) or ``.failed``; never over an older one.

        Raises SpoolError when it cannot: the file is then still in
        ``.work`` (the caller leaves it there for :meth:`take_back`).
        """
        try:
            folder = self._folder(self.done if ok else self.failed)
        except (OSError, SpoolError) as exc:
            why = exc.reason if isinstance(exc, SpoolError) else _reason(exc)
            raise SpoolError(f"cannot archive {shown(claim.name)}: {why}") from None
        stem, dot, suffix = safe_name(claim.name).rpartition(".")
        other = f"{stem}.{claim.job_id}.{suffix}" if dot and stem else f"{safe_name(claim.name)}.{claim.job_id}"
        names = [other] if len(os.fsencode(claim.name)) > MAX_NAME_BYTES else [claim.name, other]
        target = None
        for name in names:
            # link + unlink: a name another daemon archived meanwhile is never replaced
            try:
                self.ops.link(claim.path, folder / name)
            except FileExistsError:
                if not _same_file(claim.path, folder / name):
                    continue
                # This job's own link from an archive whose unlink failed: finish that one.
            except OSError:
                # No hard links here, or refused (another user's file under fs.protected_hardlinks): rename.
                if os.path.lexists(folder / name):
                    continue
                try:
                    self.ops.rename(claim.path, folder / name)
                except OSError as exc:
                    raise SpoolError(f"cannot archive {shown(claim.name)} to {folder}: {_reason(exc)}") from None
                target = folder / name
                break
            try:
                self.ops.unlink(claim.path)
            except OSError as exc:
                # Two names now: drop the archived one, so that the job is archived once, later (where
                # that fails too, the next archive finds its own link and finishes it).
                self._unlink_quietly(folder / name)
                raise SpoolError(f"cannot archive {shown(claim.name)}: {_reason(exc)}") from None
            target = folder / name
            break
        if target is None:
            raise SpoolError(f"cannot archive {shown(claim.name)} to {folder}: its names are taken")
        self.release(claim)
        self._forget(claim.job_id)
        self._release_folder(claim.path.parent)
        return target

    # -- housekeeping --
    def sweep_temporaries(self) -> list[Path]:
        """Remove commit temporaries (``.<name>.<pid>.tmp``) of processes that are gone.

        In the outbox (mmd's alone) every such name; in the inbox, which users
        write, only the state file's. On a shared inbox only this host's
        (``.<name>.<host>.<pid>.tmp``, and this host's state file): a pid
        says nothing about another machine's processes.
        """
        removed = []
        own = re.compile(r"\..+\." + re.escape(self.host_id) + r"\.(?P<pid>[0-9]+)\.tmp") if self.host_id else _TMP_RE
        state = state_name(self.host_id)
        for folder in (self.outbox, self.inbox):
            for path in _entries(folder):
                match = (_TMP_RE if folder == self.inbox else own).fullmatch(path.name)
                if folder == self.inbox and not path.name.startswith(f".{state}."):
                    continue
                if match and int(match["pid"]) != os.getpid() and not pid_alive(int(match["pid"])):
                    with contextlib.suppress(OSError):
                        path.unlink()
                        removed.append(path)
        return removed

    def _unlink_quietly(self, path: Path | None) -> None:
        if path is not None:
            with contextlib.suppress(OSError):
                self.ops.unlink(path)

    def _close_quietly(self, fd: int) -> None:
        with contextlib.suppress(OSError):
            self.ops.close(fd)


def read_attempts(path: Path) -> Attempts | None:
    """The :class:`Attempts` record at ``path``; None when there is none (or it is not mmd's)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    known = {f.name for f in dataclasses.fields(Attempts)}
    try:
        return Attempts(**{k: v for k, v in data.items() if k in known})
    except TypeError:
        return None


def held_jobs(inbox: Path) -> list[HeldJob]:
    """Jobs held in ``inbox/.work`` (every host's on a shared inbox), oldest hold first, for `mmd status`."""
    work = Path(inbox) / WORK_DIR
    folders: list[tuple[Path, str | None]] = []
    for entry in _entries(work):
        if parse_work_folder(entry.name) is not None:
            folders.append((entry, None))
        elif entry.name != SPARE_DIR and entry.is_dir() and not entry.is_symlink():
            folders.extend((sub, entry.name) for sub in _entries(entry) if parse_work_folder(sub.name) is not None)
    found = []
    for folder, host in folders:
        attempts = read_attempts(folder / ATTEMPTS_NAME)
        if attempts is None or not attempts.holds:
            continue
        files = [p.name for p in _entries(folder) if not p.name.startswith(".")]
        parsed = parse_work_folder(folder.name)
        if not files or parsed is None:
            continue
        found.append(
            HeldJob(
                parsed[0],
                shown(files[0]),
                host,
                attempts.reason or "",
                attempts.held_since,
                attempts.holds,
                attempts.output_failures,
            )
        )
    found.sort(key=lambda h: (h.since or "", h.file))
    return found


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are two names of one file."""
    try:
        return os.path.samestat(os.lstat(a), os.lstat(b))
    except OSError:
        return False


def _check_own_folder(path: Path) -> None:
    """Refuse a spool folder that is a link or that another user owns (planted in the inbox)."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise SpoolError(f"{path} is not a folder (a link or a file); remove it so that mmd can make its own")
    if info.st_uid != os.geteuid():
        raise SpoolError(f"{path} belongs to uid {info.st_uid}, not to mmd (uid {os.geteuid()}); remove it")


def _entries(folder: Path) -> Iterator[Path]:
    try:
        with os.scandir(folder) as it:
            yield from (Path(e.path) for e in list(it))
    except FileNotFoundError:
        return
