"""When an answer in a folder being graded arrived, by a time the grader can trust: the one home of which
time judges a deadline (``mmd check --before``).

A folder's sidecars may be a student's own files (a hand-in folder): their ``finished_at`` is a claim, as
their kernel is, and an output made after the deadline must not count as in time because its sidecar was
edited. A deadline is judged by times no student can set (:class:`Source`):

- ``collected``: the arrival that ``mmd collect`` recorded as it copied the file into the grader's folder
  (:class:`Manifest`, ``.mmd-collect.json`` there; used only where it is the grader's alone, and for a
  file only while its bytes are those it copied): the file's inode change time in the student's folder
  then, or the time it was read where that time cannot be trusted;
- ``ctime``: the file's inode change time where it lies, which the kernel sets from its own clock at every
  change (a write, a rename, a link, a chmod) and nobody but root can set back; on the folder's own
  filesystem only (a filesystem mounted inside it, FUSE, says what its owner likes). A copy is a new
  inode (``cp -a`` too): its ctime is the copy's time;
- ``none``: neither (a file on another filesystem, one changed since mmd collect copied it): never shown
  to be in time.

An answer's arrival is the latest of its files' (:func:`answer_files`): its output and whatever lies at
its sidecar's name (a sidecar changed after the deadline claims another kernel or another test, which
changes the grade), or its error sidecar.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from enum import Enum
from pathlib import Path
from typing import Any

from .. import textcore
from ..errors import UnreadableError

#: The manifest ``mmd collect`` writes in the folder it collects into (a dot name: no student's, no job's).
MANIFEST_NAME = ".mmd-collect.json"
#: The manifest's format, written as ``mmd_collect``; another is not read.
MANIFEST_FORMAT = 1


class LatenessWarning(UserWarning):
    """A manifest in a folder being graded that is not used (not the grader's alone, or not mmd collect's)."""


def parse_time(text: str) -> datetime:
    """An ISO 8601 time (``--before``, a sidecar's ``finished_at``, a manifest's); one without an offset is
    local time. Raises ValueError."""
    when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    return when if when.tzinfo is not None else when.astimezone()


def shown_time(when: datetime) -> str:
    """A time as sidecars write it (to the millisecond, where it has a fraction)."""
    return when.isoformat(timespec="milliseconds" if when.microsecond else "seconds")


def from_ns(ns: int) -> datetime:
    """A time in nanoseconds since the epoch (``st_ctime_ns``), to the microsecond (truncated: never later)."""
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=ns // 1000)


class Source(str, Enum):
    """What judged an answer's arrival."""

    COLLECTED = "collected"  # the arrival mmd collect recorded in the grader's copy
    CTIME = "ctime"  # its files' inode change time, where they lie
    RECEIVED = "received"  # when the service received a hand-in: its store's record (mmd grade)
    NONE = "none"  # no time the grader can trust: never in time


#: How a reason names each source.
_SAID = {
    Source.COLLECTED: "as mmd collect recorded it",
    Source.CTIME: "its files' ctime",
    Source.RECEIVED: "when the service received it",
}


@dataclass(frozen=True)
class Arrival:
    """When an answer arrived, and what says so (``at`` None: nothing the grader can trust; ``why`` says so)."""

    source: Source
    at: datetime | None = None
    why: str = ""

    def in_time(self, deadline: datetime) -> bool:
        return self.at is not None and self.at < deadline

    def shown(self) -> str:
        """``2025-03-14T22:58:01.123+00:00 (ctime)``, or ``unknown (none)``."""
        return f"{'unknown' if self.at is None else shown_time(self.at)} ({self.source.value})"

    def late_reason(self, deadline: datetime) -> str:
        if self.at is None:
            return f"{self.why}: not shown to be before the deadline {shown_time(deadline)}"
        return f"arrived {shown_time(self.at)} ({_SAID[self.source]}), not before the deadline {shown_time(deadline)}"


def answer_files(found: Path) -> tuple[Path, ...]:
    """The files whose arrival is an answer's: an output and what lies at its sidecar's name, or an error
    sidecar alone."""
    from .. import record

    if found.name.endswith(record.ERROR_SUFFIX):
        return (found,)
    return (found, record.timing_path(found))


# ---------------------------------------------------------------------------
# the manifest


@dataclass(frozen=True)
class Collected:
    """One file ``mmd collect`` copied: its bytes, and when they arrived."""

    sha256: str
    bytes: int
    #: The time that judges it: its ``changed_at`` where there is one, else when mmd collect read it.
    arrived_at: datetime
    #: Its inode change time in the student's folder as it was read (None: on another filesystem, or it
    #: changed while it was read).
    changed_at: datetime | None


@dataclass(frozen=True)
class Manifest:
    """What ``mmd collect`` copied from ``source`` into the folder that holds this manifest, by path
    relative to that folder (``alice/x.out``)."""

    source: str
    collected_at: datetime
    files: Mapping[str, Collected]

    def dumps(self) -> bytes:
        def entry(c: Collected) -> dict[str, Any]:
            changed = None if c.changed_at is None else c.changed_at.isoformat()
            return {"sha256": c.sha256, "bytes": c.bytes, "arrived_at": c.arrived_at.isoformat(), "changed_at": changed}

        body = {
            "mmd_collect": MANIFEST_FORMAT,
            "source": self.source,
            "collected_at": self.collected_at.isoformat(),
            "files": {key: entry(c) for key, c in sorted(self.files.items())},
        }
        return (json.dumps(body, indent=1) + "\n").encode("utf-8")

    @classmethod
    def loads(cls, data: bytes) -> Manifest:
        """Raises ValueError where ``data`` is not a manifest of this format."""
        try:
            body = json.loads(data)
            if body["mmd_collect"] != MANIFEST_FORMAT:
                raise ValueError(f"format {body['mmd_collect']!r}, not {MANIFEST_FORMAT}")
            files = {
                str(key): Collected(
                    str(e["sha256"]),
                    int(e["bytes"]),
                    parse_time(e["arrived_at"]),
                    None if e["changed_at"] is None else parse_time(e["changed_at"]),
                )
                for key, e in body["files"].items()
            }
            return cls(str(body["source"]), parse_time(body["collected_at"]), files)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not mmd collect's ({type(exc).__name__}: {exc})") from None


def graders_own(info: os.stat_result) -> str | None:
    """Why a file or folder is not the grader's alone (None where it is): owned by the user who runs this,
    or root, and writable by no one else (with POSIX ACLs the group bits are the mask, which bounds every
    named entry)."""
    if info.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {info.st_uid}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _graders_manifest(folder: Path) -> Manifest | None:
    """``folder``'s manifest where there is one and it is the grader's alone (a file only the grader can
    write, in a folder only the grader can write); one that is not is left unused, with a warning."""
    path = folder / MANIFEST_NAME
    if not os.path.lexists(path):
        return None
    why = _not_graders(path, folder)
    if why is None:
        try:
            return Manifest.loads(bytes(textcore.read_bytes(path, follow=False)))
        except (ValueError, UnreadableError) as exc:
            why = str(exc)
    shown = textcore.printable(str(path))
    warnings.warn(
        f"{shown} is not used ({textcore.printable(why)}): lateness is judged by ctime", LatenessWarning, stacklevel=3
    )
    return None


def _not_graders(path: Path, folder: Path) -> str | None:
    """Why the manifest ``path`` in ``folder`` is no record of the grader's (None: it is)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot look at it: {exc.strerror}"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    why = graders_own(info) or graders_own(os.stat(folder))
    return None if why is None else f"it or its folder is not the grader's alone: {why}"


def _sha256_of(fd: int, chunk: int = 1 << 20) -> tuple[str, int]:
    """The sha256 and size of what ``fd`` reads from its current offset to its end."""
    digest, size = hashlib.sha256(), 0
    while data := os.read(fd, chunk):
        digest.update(data)
        size += len(data)
    return digest.hexdigest(), size


# ---------------------------------------------------------------------------
# judging


class Clock:
    """The arrivals of the answers in one folder being graded (``root``, as the grader named it): by its
    manifest where mmd collect wrote one, else by ctime; times shown in ``tz`` (the deadline's)."""

    def __init__(self, root: Path, tz: tzinfo | None = None) -> None:
        self.root = root
        self.tz = tz
        self.dev = os.stat(root).st_dev
        self.manifest = _graders_manifest(root)

    def arrival(self, found: Path) -> Arrival:
        """The answer ``found`` (an output or an error sidecar): the latest of its files' arrivals (a file
        with none makes the answer's none)."""
        arrivals = [self._file(path) for path in answer_files(found) if path == found or os.path.lexists(path)]
        timed: list[tuple[datetime, Source]] = []
        for a in arrivals:
            if a.at is None:
                return a
            timed.append((a.at, a.source))
        at, source = max(timed)
        return Arrival(source, at if self.tz is None else at.astimezone(self.tz))

    def _file(self, path: Path) -> Arrival:
        name = textcore.printable(path.name)
        try:
            info = os.lstat(path)
        except OSError as exc:
            return Arrival(Source.NONE, why=f"cannot look at {name}: {exc.strerror}")
        collected = self._collected(path)
        if collected is not None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                try:
                    same = stat.S_ISREG(os.fstat(fd).st_mode) and _sha256_of(fd) == (collected.sha256, collected.bytes)
                finally:
                    os.close(fd)
            except OSError:
                same = False
            if not same:
                return Arrival(Source.NONE, why=f"{name} changed since mmd collect copied it")
            return Arrival(Source.COLLECTED, collected.arrived_at)
        if info.st_dev != self.dev:
            shown = textcore.printable(str(self.root))
            return Arrival(Source.NONE, why=f"{name} is on another filesystem than {shown}: its ctime is not judged")
        return Arrival(Source.CTIME, from_ns(info.st_ctime_ns))

    def _collected(self, path: Path) -> Collected | None:
        if self.manifest is None:
            return None
        try:
            key = path.relative_to(self.root).as_posix()
        except ValueError:
            return None
        return self.manifest.files.get(key)
