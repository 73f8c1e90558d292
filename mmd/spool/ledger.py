"""What the service keeps for each submitter (class mode): their usage, and when each input was archived.

A student's share of the spool's disk is everything mmd keeps for them: the
outputs and sidecars in ``outbox/<login>`` and their inputs archived in
``state_dir``'s ``.done`` and ``.failed``, and the kernels they handed in (every version the kernel store keeps,
:mod:`mmd.kernelfile.store`). :class:`Ledger` counts it in
allocated bytes (``st_blocks`` × 512: a 6-byte file takes a 4 KiB block) and
in files, per login, in ``state_dir/.ledger``:

* ``usage/<login>``: ``<bytes> <files>``, read and rewritten under ``flock``
  by whichever process changes what the login keeps (a worker as it
  archives a job, the main process for ``mmd rm`` and retention): a job's
  quota check reads one small file, never a listing of the student's folder;
* ``gpu/<login>``: the seconds the login's own kernels (kernel files they handed in) held the GPU, charged by
  the worker after each such job, under ``flock`` as usage is: what ``student_kernel_gpu_s`` bounds. History,
  not what lies on disk: a recount keeps it (the admin removes the file to give a student their time back);
* ``archived/<hour>``: one JSON line per archived input (its folder, name,
  inode and the daemon's clock when it archived it), appended
  (``O_APPEND``), so that retention judges an input by when mmd archived it.
  An archived input stays its dropper's file, and its owner could set its
  mtime (through a descriptor held from before the drop); mmd cannot (it may
  only read it), and no student can reach this folder.

Why files, and no fsync: the counts are derived from what lies on disk, and
:meth:`Ledger.recount`, at every start of the daemon, lists the folders once
and writes them anew (logging any archived input that no hour's log has, at
the daemon's clock then). A kill at any moment therefore costs nothing: what
a killed process had counted or not is recounted at the next start. Files
(rather than the main process's memory) because the workers, separate
processes, change the counts as they archive and read them before each job,
and a small file read under a shared lock is cheaper than a message. A
worker killed between an archive and its count leaves that job uncounted
until the next start, and files removed by hand (not by ``mmd rm`` or
retention) count until then.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..kernelfile.store import STORE_DIR, VERSIONS_DIR
from ..submitters import login_of
from .shared import Shared, entries

LEDGER_DIR = ".ledger"
#: The span of one log of archived inputs: retention removes a log's inputs once all of them are due.
LOG_SPAN_S = 3600
#: The note a kept head of a refused input ends with; its last group is the submitter's uid.
NOTE_RE = re.compile(rb"# mmd: kept the first [0-9]+ of this input's [0-9]+ bytes .*\(uid ([0-9]+)\)\n\Z")
#: How much of an archived file's end holds its note.
NOTE_BYTES = 512


@dataclass(frozen=True)
class Usage:
    """What mmd keeps for one submitter: allocated bytes and files."""

    bytes: int = 0
    files: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.bytes + other.bytes, self.files + other.files)

    def __neg__(self) -> Usage:
        return Usage(-self.bytes, -self.files)


def usage_of(info: os.stat_result) -> Usage:
    """What one file takes: its allocated blocks and one file (an inode)."""
    return Usage(info.st_blocks * 512, 1)


@dataclass(frozen=True)
class Logged:
    """An archived input as the log records it: ``folder/name``, its inode, and when mmd archived it."""

    path: Path
    ino: int
    at: float


class Ledger:
    """One state folder's ledger (see the module): usage by login, and the log of archived inputs."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.root = shared.private / LEDGER_DIR
        self._usage = self.root / "usage"
        self._gpu = self.root / "gpu"
        self._log = self.root / "archived"
        self._ready: set[Path] = set()

    # -- usage --
    def usage(self, login: str) -> Usage:
        """What mmd keeps for ``login`` now (zero where nothing is counted, or the count cannot be read)."""
        try:
            fd = os.open(self._usage / login, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return Usage()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return _parse(os.pread(fd, 64, 0))
        except OSError:
            return Usage()
        finally:
            os.close(fd)

    def add(self, login: str, change: Usage) -> None:
        """Count ``change`` toward ``login``; a count that cannot be written is left to the next start's
        recount (it is never a job's failure)."""
        if not change.files and not change.bytes:
            return
        with contextlib.suppress(OSError):
            self._made(self._usage)
            fd = os.open(self._usage / login, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                now = _parse(os.pread(fd, 64, 0)) + change
                os.pwrite(fd, _line(Usage(max(now.bytes, 0), max(now.files, 0))), 0)
            finally:
                os.close(fd)

    # -- GPU time of students' kernels --
    def gpu_seconds(self, login: str) -> float:
        """Seconds ``login``'s own kernels have held the GPU (0 where nothing is charged, or it cannot be read)."""
        try:
            fd = os.open(self._gpu / login, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return 0.0
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return _seconds(os.pread(fd, 64, 0))
        except OSError:
            return 0.0
        finally:
            os.close(fd)

    def charge_gpu(self, login: str, seconds: float) -> None:
        """Charge ``seconds`` of GPU time to ``login``'s kernels; a charge that cannot be written is lost (logged by
        the caller's job as used; never a job's failure)."""
        if not seconds > 0:
            return
        with contextlib.suppress(OSError):
            self._made(self._gpu)
            fd = os.open(self._gpu / login, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.pwrite(fd, b"%20.6f\n" % (_seconds(os.pread(fd, 64, 0)) + seconds), 0)
            finally:
                os.close(fd)

    def kept(self, login: str, outputs: Iterable[Path], archived: Path) -> None:
        """A job archived: count its outputs and sidecars (those that exist) and its input ``archived`` toward
        ``login`` (each looked at once), and log the input at the daemon's clock."""
        total = Usage()
        for path in outputs:
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode):
                    total += usage_of(info)
        with contextlib.suppress(OSError):
            info = os.lstat(archived)
            total += usage_of(info)
            self.archived(archived, info)
        self.add(login, total)

    # -- the log of archived inputs --
    def archived(self, path: Path, info: os.stat_result, now: float | None = None) -> None:
        """Log ``path`` (an input just archived, ``info`` its lstat) at the daemon's clock."""
        now = time.time() if now is None else now
        line = json.dumps([path.parent.name, path.name, info.st_ino, round(now, 3)]) + "\n"
        with contextlib.suppress(OSError):
            self._made(self._log)
            fd = os.open(self._log / str(int(now // LOG_SPAN_S)),
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)  # fmt: skip
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    def logs(self) -> list[tuple[int, Path]]:
        """The logs of archived inputs: (their hour, their path), oldest first."""
        found = [(int(p.name), p) for p in entries(self._log) if p.name.isdigit()]
        return sorted(found)

    def read_log(self, log: Path) -> Iterator[Logged]:
        """The archived inputs ``log`` names (a line cut short by a kill is skipped)."""
        try:
            text = log.read_text()
        except OSError:
            return
        for line in text.splitlines():
            try:
                folder, name, ino, at = json.loads(line)
            except (ValueError, TypeError):
                continue
            if folder in (self.shared.done.name, self.shared.failed.name) and "/" not in name:
                yield Logged(self.shared.private / folder / name, int(ino), float(at))

    def due(self, max_age_s: float, now: float) -> list[Path]:
        """The logs whose every input was archived more than ``max_age_s`` ago."""
        return [log for hour, log in self.logs() if (hour + 1) * LOG_SPAN_S <= now - max_age_s]

    # -- whose --
    def owner_of(self, path: Path, info: os.stat_result) -> str | None:
        """The login an archived input counts toward: its owner's, or for a head mmd kept of a refused input
        (mmd's file), the submitter its note names; None when neither says."""
        if info.st_uid != os.geteuid():
            return login_of(info.st_uid)
        with contextlib.suppress(OSError):
            with open(path, "rb") as fh:
                fh.seek(max(info.st_size - NOTE_BYTES, 0))
                found = NOTE_RE.search(fh.read())
            if found:
                return login_of(int(found[1]))
        return None

    # -- the recount --
    def recount(self, now: float | None = None) -> dict[str, Usage]:
        """Count everything anew from the folders (at the daemon's start, before any worker runs): each
        submitter's outputs and sidecars, and the archived inputs; log those no log names, as archived
        ``now``. Returns the usage by login."""
        now = time.time() if now is None else now
        shared = self.shared
        usage: dict[str, Usage] = defaultdict(Usage)
        for folder in shared.output_folders():
            if folder == shared.outbox:
                continue
            for path in entries(folder):
                if path.name.startswith("."):
                    continue
                with contextlib.suppress(OSError):
                    info = os.lstat(path)
                    if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                        usage[folder.name] += usage_of(info)
        for student, _path, info in kept_kernels(shared.private / STORE_DIR):
            usage[student] += usage_of(info)
        logged = {(e.path, e.ino) for _, log in self.logs() for e in self.read_log(log)}
        for folder in (shared.done, shared.failed):
            for path in entries(folder):
                if path.name.startswith("."):
                    continue
                with contextlib.suppress(OSError):
                    info = os.lstat(path)
                    login = self.owner_of(path, info)
                    if login is not None:
                        usage[login] += usage_of(info)
                    if (path, info.st_ino) not in logged:
                        self.archived(path, info, now)
        with contextlib.suppress(OSError):
            self._made(self._usage)
            for path in entries(self._usage):
                if path.name not in usage:
                    path.unlink()
            for login, used in usage.items():
                self.shared.commit(self._usage / login, _line(used), mode=0o600)
        return dict(usage)

    def _made(self, folder: Path) -> None:
        """``folder`` (and the ledger's), made at its first use here; OSError when it cannot be."""
        if folder in self._ready:
            return
        for path in (self.root, folder):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
        self._ready.add(folder)


def kept_kernels(store: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """Every file the kernel store (:mod:`mmd.kernelfile.store`) keeps: (its student's login, it, its lstat)."""
    for own in entries(store):
        for version in entries(own / VERSIONS_DIR):
            for path in entries(version):
                with contextlib.suppress(OSError):
                    info = os.lstat(path)
                    if stat.S_ISREG(info.st_mode):
                        yield own.name, path, info


def _line(used: Usage) -> bytes:
    """A usage file's text, fixed in width: rewritten in place, it never leaves a longer one's tail."""
    return b"%20d %20d\n" % (used.bytes, used.files)


def _parse(text: bytes) -> Usage:
    parts = text.split()
    if len(parts) != 2:
        return Usage()
    try:
        return Usage(int(parts[0]), int(parts[1]))
    except ValueError:
        return Usage()


def _seconds(text: bytes) -> float:
    try:
        seconds = float(text.split()[0]) if text.strip() else 0.0
    except ValueError:
        return 0.0
    return seconds if seconds >= 0 else 0.0
