"""What waits in the inbox, and when a file there is completely written.

:func:`scan` lists the job files waiting (:class:`Candidate`), oldest first;
:func:`stat_entry` looks at one of them; :class:`Readiness` decides when a
file seen there is complete; :class:`Arrivals` remembers when the daemon
first saw each. All pure: :func:`scan` takes its ``scandir``,
:class:`Readiness` its clocks and :class:`Arrivals` the time as parameters.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .names import is_job_name


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
                found.append(Candidate(entry.name, info.st_size, info.st_mtime_ns, info.st_uid, info.st_ino))
    except FileNotFoundError:
        return []
    found.sort(key=lambda c: (c.mtime_ns, c.name))
    return found


def stat_entry(inbox: Path, name: str) -> Candidate | None:
    """The inbox entry ``name`` if it is still there and not a folder."""
    try:
        info = os.lstat(inbox / name)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISDIR(info.st_mode):
        return None
    return Candidate(name, info.st_size, info.st_mtime_ns, info.st_uid, info.st_ino)


class Arrivals:
    """When the daemon first saw each inbox file, by its own clock: a backlog is offered in that order, never by
    the file's mtime, which its owner sets (``touch -d 2001-01-01`` put a flood before everyone's files).

    A file renamed over a name (another inode) is a new arrival. Pure: the time is given.
    """

    def __init__(self) -> None:
        self._first: dict[str, tuple[int | None, float]] = {}  # name -> (inode, first seen)

    def seen(self, cand: Candidate, now: float) -> float:
        """When ``cand`` was first seen (``now`` if this is the first time)."""
        known = self._first.get(cand.name)
        if known is not None and known[0] == cand.ino:
            return known[1]
        self._first[cand.name] = (cand.ino, now)
        return now

    def keep(self, names: set[str]) -> None:
        """Forget every file but ``names`` (those still in the inbox)."""
        self._first = {name: first for name, first in self._first.items() if name in names}


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
