"""Whether a file can reach the inbox by a rename from a folder where one user may move another's file.

A job's submitter is its input file's owner (:mod:`mmd.submitters`), and a
rename keeps the owner. A student who may move a classmate's file (out of a
team folder: group-writable, without the sticky bit) into the inbox makes a
job in the classmate's name. ``rename(2)`` and ``link(2)`` never cross a
mount (EXDEV, even between two bind mounts of one filesystem), and ``mv``
then copies, and a copy belongs to its copier: with the inbox on a
filesystem of its own, holding no such folder, a file enters it only as its
dropper's.

:func:`check` looks for such folders on the inbox's filesystem as this
process sees it: from the top of that filesystem (its parents while
``st_dev`` stays the inbox's), breadth first, never onto another
filesystem, within a bound of entries and seconds (a big ``/home`` must not
stall a start). A folder counts when the users of its group or others may
add and remove entries in it (write and search) and it is not sticky, or
sticky but owned by someone other than root and the inbox's owner (the
service), who may then remove anyone's file from it. Under the unit, a
mount hides parts of the filesystem from the service (``ProtectHome=yes``
covers ``/home``, ``PrivateTmp=yes`` ``/tmp``): those are named, not looked
under. Run as root outside the unit (``python -m mmd.inboxfs INBOX``, which
``systemd/install.sh`` runs) it sees what the students see.

Stdlib only: the installer runs it from a release whose dependencies may
still be missing.
"""

from __future__ import annotations

import argparse
import collections
import grp
import os
import posixpath
import re
import stat
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .submitters import login_of

#: The daemon's bound at start (it walks as the service, before it serves).
START_ENTRIES, START_SECONDS = 50_000, 0.5
#: The command's bound (an admin, or the installer, waiting for the whole picture).
COMMAND_ENTRIES, COMMAND_SECONDS = 5_000_000, 60.0
#: How many of the folders found are named.
SHOWN = 5
#: Where the fix is told.
FIX = (
    "give the spool a filesystem of its own: systemd/install.sh --spool-image SIZE, or docs/operations.md, "
    '"The inbox\'s own filesystem"'
)

_GROUP_MOVE = stat.S_IWGRP | stat.S_IXGRP
_OTHER_MOVE = stat.S_IWOTH | stat.S_IXOTH


@dataclass(frozen=True)
class OpenFolder:
    """A folder where one user may move another's file."""

    path: Path
    mode: int
    uid: int
    gid: int

    def __str__(self) -> str:
        try:
            group = grp.getgrgid(self.gid).gr_name
        except KeyError:
            group = str(self.gid)
        return f"{self.path} ({stat.S_IMODE(self.mode):04o} {login_of(self.uid)}:{group})"


@dataclass(frozen=True)
class InboxFilesystem:
    """What :func:`check` found on the inbox's filesystem."""

    inbox: Path
    #: The filesystem's top as this process sees it (where the walk began).
    top: Path
    #: The first :data:`SHOWN` folders found, in the walk's order; ``found`` counts them all.
    shown: tuple[OpenFolder, ...]
    found: int
    #: Folders of this filesystem that a mount hides here: not looked under.
    covered: tuple[Path, ...]
    #: Entries looked at, and folders that could not be listed (no permission).
    entries: int
    unlisted: int
    #: The walk stopped at its bound before it had looked at everything.
    partial: bool
    seconds: float

    @property
    def safe(self) -> bool:
        """Nothing found, nothing hidden, everything looked at."""
        return not (self.found or self.covered or self.partial)

    def describe(self) -> str:
        """One line: what was found (or that nothing was) and, when something was, the fix."""
        where = f"the inbox's filesystem (from {self.top})"
        looked = f"{self.entries:,} entries looked at" + (
            f", {self.unlisted} folder{'s' * (self.unlisted != 1)} it may not list" if self.unlisted else ""
        )
        if self.safe:
            return f"{where} holds no folder where one user may move another's file into the inbox ({looked})"
        parts = []
        if self.found:
            more = f" and {self.found - len(self.shown)} more" if self.found > len(self.shown) else ""
            parts.append(
                f"holds {self.found} folder{'s' * (self.found != 1)} where one user may move another's file "
                f"into the inbox, a job in that file's owner's name: {', '.join(map(str, self.shown))}{more}"
            )
        if self.covered:
            parts.append(f"has folders a mount hides here, not looked under: {', '.join(map(str, self.covered))}")
        if self.partial:
            parts.append(f"was looked at in part ({looked} in {self.seconds:.1f} s, its bound)")
        return f"{where} {'; '.join(parts)}: {FIX}"


def check(
    inbox: Path,
    max_entries: int = START_ENTRIES,
    max_seconds: float = START_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> InboxFilesystem:
    """Look for the folders on ``inbox``'s filesystem where one user may move another's file (module doc),
    within ``max_entries`` entries and ``max_seconds``. Raises OSError when the inbox cannot be looked at."""
    start = clock()
    inbox = Path(os.path.realpath(inbox))
    info = os.stat(inbox)
    dev, trusted = info.st_dev, frozenset({0, info.st_uid})
    top = _top(inbox, dev)
    shown: list[OpenFolder] = []
    found = entries = unlisted = 0

    def judge(path: Path, st: os.stat_result) -> None:
        nonlocal found
        if _lets_move_others(st, trusted):
            found += 1
            if len(shown) < SHOWN:
                shown.append(OpenFolder(path, st.st_mode, st.st_uid, st.st_gid))

    first = os.lstat(top)
    judge(top, first)
    seen = {first.st_ino}  # a bind mount of this filesystem within it shows a folder twice
    queue = collections.deque([top])
    partial = False
    while queue and not partial:
        folder = queue.popleft()
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    entries += 1
                    if entries >= max_entries or clock() - start >= max_seconds:
                        partial = True
                        break
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_dev == dev and st.st_ino not in seen:
                        seen.add(st.st_ino)
                        judge(Path(entry.path), st)
                        queue.append(Path(entry.path))
        except OSError:
            unlisted += 1
    return InboxFilesystem(inbox, top, tuple(shown), found, tuple(_covered(top, dev)), entries, unlisted, partial,
                           clock() - start)  # fmt: skip


def _lets_move_others(st: os.stat_result, trusted: frozenset[int]) -> bool:
    """Whether users besides the folder's owner may move entries in it, anyone's (an ACL's entries show
    in the group bits, its mask)."""
    if st.st_mode & _GROUP_MOVE != _GROUP_MOVE and st.st_mode & _OTHER_MOVE != _OTHER_MOVE:
        return False
    return not (st.st_mode & stat.S_ISVTX and st.st_uid in trusted)


def _top(path: Path, dev: int) -> Path:
    """The highest folder above ``path`` on the filesystem ``dev`` (as far as this process may look)."""
    while path.parent != path:
        try:
            if os.stat(path.parent).st_dev != dev:
                break
        except OSError:
            break
        path = path.parent
    return path


@dataclass(frozen=True)
class _Mount:
    ident: int
    parent: int
    dev: int
    root: str
    point: str


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _mounts(text: str) -> list[_Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        major, minor = fields[2].split(":")
        mounts.append(_Mount(int(fields[0]), int(fields[1]), os.makedev(int(major), int(minor)),
                             _unescape(fields[3]), _unescape(fields[4])))  # fmt: skip
    return mounts


def _covered(top: Path, dev: int, mountinfo: str = "/proc/self/mountinfo") -> list[Path]:
    """The folders of filesystem ``dev`` at or under ``top`` over which this process sees a mount of another
    folder (a bind, as systemd's ``ProtectHome=`` and ``PrivateTmp=`` make): what they hold here is not
    what lies there. A filesystem mounted whole (``/proc``, a ``/home`` of its own) hides nothing of it that
    anyone else sees, and a folder bound onto itself (``ReadWritePaths=``) shows what lies there."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            mounts = _mounts(f.read())
    except OSError:
        return []
    by_id = {m.ident: m for m in mounts}
    covered = []
    for m in mounts:
        parent = by_id.get(m.parent)
        if parent is None or parent.dev != dev or m.root == "/" or m.point == str(top):
            continue
        if not (m.point + "/").startswith(str(top).rstrip("/") + "/"):
            continue
        itself = posixpath.normpath(posixpath.join(parent.root, posixpath.relpath(m.point, parent.point)))
        if m.dev == dev and m.root == itself:
            continue
        covered.append(Path(m.point))
    return sorted(set(covered))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mmd.inboxfs INBOX``: print what :func:`check` finds, in one line; exit 0 (a warning)."""
    parser = argparse.ArgumentParser(prog="python -m mmd.inboxfs", description=__doc__.split("\n\n")[0])
    parser.add_argument("inbox", type=Path)
    parser.add_argument("--max-entries", type=int, default=COMMAND_ENTRIES)
    parser.add_argument("--max-seconds", type=float, default=COMMAND_SECONDS)
    args = parser.parse_args(argv)
    try:
        found = check(args.inbox, args.max_entries, args.max_seconds)
    except OSError as exc:
        print(f"mmd.inboxfs: cannot look at {args.inbox}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"{'ok' if found.safe else 'warning'}: {args.inbox}: {found.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
