"""``mmd collect``: a class's hand-in copied into a folder of the grader's, with when each file arrived.

Each student's folder (``SRC/<login>/``) is copied into ``DEST/<login>/``: the files ``mmd check`` reads
(outputs, their sidecars, error sidecars), each opened without following a link (the student's folder too:
one swapped for a link to the grader's answers is never entered), and recorded in DEST's manifest
(:class:`mmd.check.lateness.Manifest`) with its sha256 and its arrival: its inode change time in the
student's folder as it was read, which no student can set back, or the time it was read where that
cannot be trusted (another filesystem, or it changed while it was read). DEST is new and the grader's
alone (0700), so the record is a file only the grader can write; ``mmd check --before`` judges a deadline
by it, and what a student changes or removes after the collection changes nothing in DEST.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .. import record, textcore
from ..errors import UsageError
from .lateness import MANIFEST_NAME, Collected, Manifest, from_ns
from .results import OUTPUT_SUFFIX

#: The files copied: what ``mmd check`` reads in a student's folder.
SUFFIXES = (OUTPUT_SUFFIX, record.TIMING_SUFFIX, record.ERROR_SUFFIX)

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass
class Collection:
    """What one ``mmd collect`` did."""

    dest: Path
    students: list[str] = field(default_factory=list)
    files: int = 0
    #: ``login/name: why`` for each entry not copied (a link, a FIFO, a folder; one that cannot be read).
    skipped: list[str] = field(default_factory=list)
    #: How many of those could not be read (the command then ends in 1).
    unreadable: int = 0


def collect(src: Path, dest: Path) -> Collection:
    """Copy each student's folder of ``src`` into the new folder ``dest`` with its manifest. Raises UsageError
    where ``src`` is not a folder or ``dest`` exists or cannot be made."""
    shown = textcore.printable
    try:
        src_info = os.stat(src)  # the grader's folder, named by them: followed
    except OSError as exc:
        raise UsageError(f"{shown(str(src))}: {exc.strerror}") from None
    if not stat.S_ISDIR(src_info.st_mode):
        raise UsageError(f"{shown(str(src))} is not a folder")
    done = Collection(dest)
    logins = _students(src, done)
    try:
        os.mkdir(dest, 0o700)
    except FileExistsError:
        raise UsageError(f"{shown(str(dest))} exists: collect into a new folder") from None
    except OSError as exc:
        raise UsageError(f"cannot make {shown(str(dest))}: {exc.strerror}") from None
    started = datetime.now(timezone.utc)
    files: dict[str, Collected] = {}
    for login in logins:
        with _folder(src / login, done, login) as fd:
            if fd is None:
                continue
            os.mkdir(dest / login, 0o700)
            done.students.append(login)
            for name in _names(fd, done, login):
                got = _copy(fd, name, dest / login / name, src_info.st_dev, done, f"{login}/{name}")
                if got is not None:
                    files[f"{login}/{name}"] = got
                    done.files += 1
    from ..atomic import write_atomic

    path = dest / MANIFEST_NAME
    write_atomic(path, [Manifest(str(src.absolute()), started, files).dumps()], mode=0o600)  # the grader's alone
    return done


def _students(src: Path, done: Collection) -> list[str]:
    """The folders of ``src`` (a link, FIFO or device named like one is listed as skipped, never followed; dot
    names and plain files are no student's)."""
    try:
        entries = sorted(os.scandir(src), key=lambda e: e.name)
    except OSError as exc:
        raise UsageError(f"cannot read {textcore.printable(str(src))}: {exc.strerror}") from None
    logins = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError:
            continue  # gone since it was listed
        if stat.S_ISDIR(mode):
            logins.append(entry.name)
        elif not stat.S_ISREG(mode):
            done.skipped.append(_not_collected(entry.name, mode))
    return logins


def _names(folder: int, done: Collection, login: str) -> list[str]:
    """The names of the files to copy in the open folder ``folder``, sorted."""
    try:
        names = os.listdir(folder)
    except OSError as exc:
        done.skipped.append(f"{textcore.printable(login)}: cannot list it ({exc.strerror})")
        done.unreadable += 1
        return []
    return sorted(n for n in names if not n.startswith(".") and n.endswith(SUFFIXES))


@contextlib.contextmanager
def _folder(path: Path, done: Collection, login: str) -> Iterator[int | None]:
    """A student's folder, opened as the folder it is (never through a link put in its place)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        done.skipped.append(f"{textcore.printable(login)}: cannot open it ({exc.strerror})")
        done.unreadable += 1
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _copy(folder: int, name: str, to: Path, dev: int, done: Collection, key: str) -> Collected | None:
    """Copy ``name`` of the open folder ``folder`` to ``to``; its record, None where it is not copied."""
    shown = textcore.printable(key)
    try:
        fd = os.open(name, _READ, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symbolic link, never followed
            done.skipped.append(f"{shown} is a symbolic link: not collected")
        else:
            done.skipped.append(f"{shown}: cannot read it ({exc.strerror})")
            done.unreadable += 1
        return None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            done.skipped.append(_not_collected(key, before.st_mode))
            return None
        out = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            sha256, size = _copy_bytes(fd, out)
        finally:
            os.close(out)
        after = os.fstat(fd)
    except OSError as exc:  # reading it, or writing the copy (a full disk)
        done.skipped.append(f"{shown}: cannot copy it ({exc.strerror})")
        done.unreadable += 1
        with contextlib.suppress(OSError):
            to.unlink()
        return None
    finally:
        os.close(fd)
    read_at = datetime.now(timezone.utc)
    same = before.st_ctime_ns == after.st_ctime_ns and before.st_size == after.st_size == size
    changed = from_ns(after.st_ctime_ns) if same and after.st_dev == dev else None
    return Collected(sha256, size, read_at if changed is None else min(changed, read_at), changed)


def _not_collected(name: str, mode: int) -> str:
    """``alice/x.out is a symbolic link: not collected`` (its kind as mmd check words it)."""
    kind = textcore.not_regular(Path(name), mode).details["kind"]
    return f"{textcore.printable(name)} is {kind}: not collected"


def _copy_bytes(src: int, dst: int, chunk: int = 1 << 20) -> tuple[str, int]:
    """Copy what ``src`` reads to ``dst``: the sha256 and size of the bytes copied."""
    import hashlib

    digest, size = hashlib.sha256(), 0
    while data := os.read(src, chunk):
        digest.update(data)
        view = memoryview(data)
        while view:
            view = view[os.write(dst, view) :]
        size += len(data)
    return digest.hexdigest(), size
