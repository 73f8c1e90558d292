"""The spool protocol: which inbox names are jobs, claim, output names, archive, recovery.

Layout (the dot folders are created on demand)::

    inbox/m.txt                       a job waiting
    inbox/.work/<job>.<v>/m.txt       claimed: job id and output version in the folder name
    inbox/.work/<host>/<job>.<v>/m.txt  the same on a shared inbox: each host claims into its own folder
    inbox/.done/m.txt                 finished with an output
    inbox/.failed/m.txt               refused (the error sidecar says why)
    inbox/.mmd.lock, .mmd-state.json  the daemon's lock and state (see mmd.daemon)
    outbox/.m.claim                   the output version reserved at the claim (holds the job id)
    outbox/m.out + m.timing.yaml      the result; the sidecar is committed last
    outbox/m.error.yaml               a refusal

A claim is one ``os.rename`` into ``.work``: of two claimers exactly one wins,
the other gets FileNotFoundError, which is harmless. The claimed file keeps its
name (the sidecar and logs say ``m.txt``) inside a folder named for the job.
The output name is chosen before the claim and recorded in that folder's name
(``<v>``), so after a kill -9
the job resumes into the same output name, and a sidecar carrying the job id
proves that the job finished and only its archive is left to do.

Everything here but :class:`Spool`'s methods is pure; :class:`Readiness` and
:func:`scan` take their clock and ``scandir`` as parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import stat
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import record
from .atomic import write_atomic
from .errors import SpoolError
from .job import new_id
from .jobname import stem_of

WORK_DIR, DONE_DIR, FAILED_DIR = ".work", ".done", ".failed"
#: An empty folder kept in ``.work`` and renamed to the next job's folder.
SPARE_DIR = ".spare"
LOCK_NAME = ".mmd.lock"
STATE_NAME = ".mmd-state.json"
OUTPUT_SUFFIX = ".out"
#: The reservation of an output version: ``outbox/.<stem>[.<v>].claim``, created O_EXCL at the claim.
CLAIM_SUFFIX = ".claim"
#: How many times a claimed job was started, kept beside it in its ``.work`` folder (survives kill -9).
ATTEMPTS_NAME = ".attempts"

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

    @property
    def stem(self) -> str:
        return stem_of(self.name)

    def collision(self) -> dict[str, Any] | None:
        """The sidecar's ``collision`` entry, when the output had to be versioned."""
        if not self.version:
            return None
        return {"wanted": f"{self.stem}{OUTPUT_SUFFIX}", "existing": list(self.collided), "used": self.output.name}


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
    """An inbox and an outbox, and the moves between them."""

    def __init__(self, inbox: Path, outbox: Path, host_id: str | None = None) -> None:
        self.inbox = Path(inbox)
        self.outbox = Path(outbox)
        #: Set on a shared inbox: this host claims into and resumes from ``.work/<host_id>`` only.
        self.host_id = host_id
        self.work_root = self.inbox / WORK_DIR
        self.work = self.work_root / host_id if host_id else self.work_root
        self.done = self.inbox / DONE_DIR
        self.failed = self.inbox / FAILED_DIR
        self._made: set[Path] = set()

    # -- folders --
    def _folder(self, path: Path) -> Path:
        if path not in self._made:
            if path == self.work and path != self.work_root:  # .work/<host>: never makes the inbox either
                self._folder(self.work_root)
                path.mkdir(exist_ok=True)
                _check_own_folder(path)
            elif path.parent == self.inbox:
                path.mkdir(exist_ok=True)  # never the inbox itself: if it was deleted, it stays so
                _check_own_folder(path)
            else:
                path.mkdir(parents=True, exist_ok=True)
            self._made.add(path)
        return path

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
        """
        safe = safe_name(name)
        stem = stem_of(safe)
        guess, collided = resolve_output(self.outbox, stem)
        job_id = new_id()
        folder = self._job_folder(work_folder_name(job_id, guess))
        dst = folder / safe
        try:
            os.rename(self.inbox / name, dst)
        except FileNotFoundError:
            self._release_folder(folder)
            return None  # someone else has it, or it was removed: harmless
        except BaseException:
            self._release_folder(folder)
            raise
        started = time.perf_counter()
        # Only the claimer that won the rename reserves (a loser must not push the winner to m.1.out).
        version, reservation = guess, None
        with contextlib.suppress(SpoolError):  # the outbox cannot be written: the job runs, its commit says why
            version, collided, reservation = self.reserve(stem, job_id)
        if version != guess:
            moved = self.work / work_folder_name(job_id, version)
            try:
                os.rename(folder, moved)
                folder, dst = moved, moved / safe
            except OSError:
                _unlink_quietly(reservation)  # type: ignore[arg-type]
                version, reservation = guess, None
        info = os.lstat(dst)
        return Claim(
            job_id,
            safe,
            version,
            dst,
            output_path(self.outbox, stem, version),
            started,
            regular=stat.S_ISREG(info.st_mode),
            collided=collided,
            original=name if safe != name else None,
            problem=entry_problem(info),
            reservation=reservation,
        )

    def reserve(self, stem: str, job_id: str) -> tuple[int, list[str], Path]:
        """Reserve the first free output version of ``stem``: (version, names in the way, reservation).

        The reservation ``outbox/.<stem>[.<v>].claim`` is created with
        ``O_CREAT | O_EXCL`` (atomic on local filesystems and NFSv3+) and
        holds ``<job> <host> <pid>``; when another job made it first, the
        next version is tried. After creating it the version's own names are
        looked at again: a job that held it a moment ago commits its output
        before it drops its reservation.
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
            _unlink_quietly(path)
            collided.extend(late)
            start = version + 1

    def _create_reservation(self, path: Path, job_id: str) -> bool:
        """Create reservation ``path`` holding ``<job> <host> <pid>``; False when it exists already."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(path, flags, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise SpoolError(f"cannot reserve {path.name} in the outbox: {exc.strerror or exc}") from None
        try:
            os.write(fd, f"{job_id} {self.host_id or '-'} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        return True

    def settle(self, claim: Claim) -> Claim:
        """A resumed job holding its output version again; moved to the next free version if another job has it.

        A kill between the claim's rename and its reservation leaves a job
        without one; another daemon may then have reserved (or even
        finished) that version. The job takes its reservation again when it
        is free and no other job's sidecar sits there, else it reserves the
        next free version and its ``.work`` folder is renamed to match.
        """
        path = claim_path(self.outbox, claim.stem, claim.version)
        held = read_reservation(path)
        if held is not None and held[0] == claim.job_id:
            return dataclasses.replace(claim, reservation=path)
        try:
            if held is None and self._create_reservation(path, claim.job_id):
                _out, timing, error = names_of(claim.output)
                others = [p for p in (timing, error) if os.path.lexists(p) and not self.owned_by(claim, p)]
                if not others:
                    return dataclasses.replace(claim, reservation=path)
                _unlink_quietly(path)
            version, collided, reservation = self.reserve(claim.stem, claim.job_id)
        except SpoolError:
            return claim  # the outbox cannot be written: the job runs and its commit says why
        moved = self.work / work_folder_name(claim.job_id, version)
        try:
            os.rename(claim.path.parent, moved)
        except OSError:
            _unlink_quietly(reservation)
            return claim
        return dataclasses.replace(
            claim,
            version=version,
            path=moved / claim.name,
            output=output_path(self.outbox, claim.stem, version),
            collided=collided,
            reservation=reservation,
        )

    def release(self, claim: Claim) -> None:
        """Drop ``claim``'s output reservation (its sidecar is committed, or it gave the job back)."""
        path = claim.reservation
        if path is None:
            return
        held = read_reservation(path)
        if held is not None and held[0] == claim.job_id:
            _unlink_quietly(path)

    def sweep_reservations(self, keep: set[str]) -> list[Path]:
        """Remove reservations this host made for jobs that are no longer in its ``.work`` (``keep``: job ids).

        On a shared inbox only this host's (other hosts hold theirs while their jobs run).
        """
        removed = []
        for path in _entries(self.outbox):
            if not path.name.startswith(".") or not path.name.endswith(CLAIM_SUFFIX):
                continue
            held = read_reservation(path)
            if held is None:
                continue  # not mmd's, or being written right now: left alone
            job, host, _pid = held
            if job in keep or (self.host_id is not None and host != self.host_id):
                continue
            _unlink_quietly(path)
            removed.append(path)
        return removed

    def _job_folder(self, name: str) -> Path:
        """An empty ``.work/<name>``: the spare folder renamed (a mkdir costs more on ext4)."""
        folder = self._folder(self.work) / name
        try:
            os.rename(self.work / SPARE_DIR, folder)
        except FileNotFoundError:
            folder.mkdir()
        return folder

    def attempt(self, claim: Claim) -> int:
        """Count one more start of ``claim``'s job, durably, and return the count (this start included).

        The claim itself records the first start, so a fresh claim writes
        nothing (small jobs pay no fsync for it); a resumed one (the daemon
        died while it ran) writes its count into the job's ``.work`` folder,
        atomically and fsynced before the job runs again, so a job that kills
        the daemon (kill -9, a crash in a driver) is failed after
        ``max_attempts`` starts instead of killing it for ever.
        """
        if not claim.resumed:
            return 1
        path = claim.path.parent / ATTEMPTS_NAME
        try:
            count = int(path.read_text(encoding="ascii").strip() or 1)
        except (OSError, ValueError):
            count = 1  # never counted: it was started once, at its claim
        write_atomic(path, [f"{count + 1}\n".encode()], durable=True)
        return count + 1

    def _release_folder(self, folder: Path) -> None:
        """Keep an emptied job folder as the spare (replacing an empty spare), else remove it."""
        _unlink_quietly(folder / ATTEMPTS_NAME)
        try:
            os.rename(folder, self.work / SPARE_DIR)
        except OSError:
            with contextlib.suppress(OSError):
                folder.rmdir()

    def resumable(self) -> list[Claim]:
        """Jobs left in ``.work`` by an earlier daemon, oldest first; empty job folders are removed."""
        claims = []
        for folder in _entries(self.work):
            parsed = parse_work_folder(folder.name)
            if parsed is None or not folder.is_dir():
                continue  # not mmd's: left alone
            job_id, version = parsed
            entries = list(_entries(folder))
            # A claimed file keeps its inbox name, never hidden; hidden ones are mmd's (the attempt count).
            files = [p for p in entries if not p.name.startswith(".")]
            if not files:  # killed between mkdir and rename, or after the archive
                for leftover in entries:
                    _unlink_quietly(leftover)
                with contextlib.suppress(OSError):
                    folder.rmdir()
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
        """Move the claimed file to ``.done`` (ok) or ``.failed``; never over an older one."""
        try:
            folder = self._folder(self.done if ok else self.failed)
        except OSError as exc:
            raise SpoolError(f"cannot archive {shown(claim.name)}: {exc.strerror or exc}") from None
        stem, dot, suffix = safe_name(claim.name).rpartition(".")
        other = f"{stem}.{claim.job_id}.{suffix}" if dot and stem else f"{safe_name(claim.name)}.{claim.job_id}"
        names = [other] if len(os.fsencode(claim.name)) > MAX_NAME_BYTES else [claim.name, other]
        target = None
        for name in names:
            # link + unlink: a name another daemon archived meanwhile is never replaced
            try:
                os.link(claim.path, folder / name, follow_symlinks=False)
            except FileExistsError:
                continue
            except OSError:  # no hard links here (a folder, or a filesystem without them): rename
                if os.path.lexists(folder / name):
                    continue
                try:
                    os.rename(claim.path, folder / name)
                except OSError as exc:
                    raise SpoolError(f"cannot archive {shown(claim.name)} to {folder}: {exc.strerror or exc}") from None
                target = folder / name
                break
            _unlink_quietly(claim.path)
            target = folder / name
            break
        if target is None:
            raise SpoolError(f"cannot archive {shown(claim.name)} to {folder}: its names are taken")
        self.release(claim)
        self._release_folder(claim.path.parent)
        return target

    def give_back(self, claim: Claim) -> Path:
        """Put a claimed file back into the inbox (a job to retry later); never over a newer drop.

        The name is linked first and the claimed one removed, so a file
        dropped meanwhile under the same name is never replaced; then the
        file goes back as ``<stem>.<job id>.<suffix>``. Raises SpoolError when
        it cannot (it then stays in ``.work`` and is resumed at the next start).
        """
        stem, dot, suffix = claim.name.rpartition(".")
        for name in (claim.name, f"{stem}.{claim.job_id}.{suffix}" if dot and stem else f"{claim.name}.{claim.job_id}"):
            try:
                os.link(claim.path, self.inbox / name, follow_symlinks=False)
            except FileExistsError:
                continue
            except OSError as exc:
                raise SpoolError(f"cannot put {shown(claim.name)} back into the inbox: {exc.strerror or exc}") from None
            os.unlink(claim.path)
            self.release(claim)
            self._release_folder(claim.path.parent)
            return self.inbox / name
        raise SpoolError(f"cannot put {shown(claim.name)} back into the inbox: its names are taken")

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


def _check_own_folder(path: Path) -> None:
    """Refuse a spool folder that is a link or that another user owns (planted in the inbox)."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise SpoolError(f"{path} is not a folder (a link or a file); remove it so that mmd can make its own")
    if info.st_uid != os.geteuid():
        raise SpoolError(f"{path} belongs to uid {info.st_uid}, not to mmd (uid {os.geteuid()}); remove it")


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _entries(folder: Path) -> Iterator[Path]:
    try:
        with os.scandir(folder) as it:
            yield from (Path(e.path) for e in list(it))
    except FileNotFoundError:
        return
