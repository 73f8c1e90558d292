"""A class's kernels, as grading finds them: a hand-in folder with a folder per student, or the service's store.

* A hand-in folder (the shape a course site exports): ``KERNELS/<student>/<kernel>.cu``, each with an optional
  same-stem ``<kernel>.kernel.yaml``. Its files are the students' own: a student's folder or a kernel that is a
  link, a FIFO or a device is listed, never followed or opened, and a kernel's declaration must be a plain file
  too (a link there could make the grader read any file it may). A hand-in arrived when its files last changed
  here (:class:`mmd.check.lateness.Clock`: their ctime, which no student can set back; a copy's ctime is the
  copy's, so export the hand-in at the deadline, or grade the service's store).
* The service's store (:class:`mmd.kernelfile.store.KernelStore`, ``state_dir/kernels``): each student's current
  version of each name, which arrived when the service received it (the store's record), never by a file's
  mtime.

Student and kernel names are anyone's: they are kept as they are and escaped wherever they are shown; no path
is ever made from them but the student's own folder and the entries it lists.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from pathlib import Path

from ..check.lateness import Arrival, Clock, Source
from ..errors import UnreadableError, UsageError
from ..kernelchoice import SUFFIX
from ..kernelfile.reading import SIDECAR_SUFFIX
from ..kernelfile.store import KernelStore
from ..textcore import printable


@dataclass(frozen=True)
class Handin:
    """One kernel a student handed in: the file graded, and when it arrived."""

    student: str
    #: The kernel's file name (``p1.cu``).
    kernel: str
    path: Path
    arrival: Arrival


@dataclass(frozen=True)
class Student:
    """A student's folder as grading found it."""

    name: str
    folder: Path
    handins: tuple[Handin, ...] = ()
    #: Entries that are no kernel graded, each with why.
    skipped: tuple[tuple[str, str], ...] = ()
    #: Why none of it could be read (empty: it was) ...
    problem: str = ""
    #: ... and whether it is because it could not be read (else: it is no folder).
    unreadable: bool = False


def _kind(mode: int) -> str | None:
    """What an entry is, where it is not a plain file or folder (never followed)."""
    if stat.S_ISLNK(mode):
        return "a link (never followed)"
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
        return None
    return "not a plain file (a FIFO, socket or device: never opened)"


def _entries(folder: Path) -> list[tuple[str, os.stat_result]]:
    """``folder``'s entries but hidden ones, sorted by name, each lstat'ed."""
    try:
        names = sorted(n for n in os.listdir(folder) if not n.startswith("."))
    except OSError as exc:
        raise UnreadableError(f"cannot read {printable(str(folder))}: {exc.strerror}") from None
    out = []
    for name in names:
        try:
            out.append((name, os.lstat(folder / name)))
        except OSError:
            continue  # removed meanwhile
    return out


def class_folders(kernels: Path) -> tuple[list[tuple[str, Path]], list[tuple[str, str]]]:
    """The students of a class's folder (a hand-in folder or the store alike): (name, their folder) for each
    real folder in it, and (name, why) for each entry that is not one. UsageError where it is not a folder."""
    if not kernels.is_dir():
        raise UsageError(f"{printable(str(kernels))}: not a folder of students' folders")
    students, skipped = [], []
    for name, info in _entries(kernels):
        why = _kind(info.st_mode)
        if why is None and not stat.S_ISDIR(info.st_mode):
            why = "a file, not a student's folder"
        if why is None:
            students.append((name, kernels / name))
        else:
            skipped.append((name, why))
    return students, skipped


def student(folder: Path, store: bool, tz: tzinfo | None = None) -> Student:
    """The kernels in one student's ``folder`` (``KERNELS/<student>``): a hand-in folder's, or with ``store``
    the store's (``state_dir/kernels/<login>``). Arrivals are shown in ``tz`` (the deadline's)."""
    name = folder.name
    try:
        info = os.lstat(folder)
    except OSError as exc:
        return Student(name, folder, problem=f"cannot look at it: {exc.strerror}", unreadable=True)
    why = _kind(info.st_mode) or (None if stat.S_ISDIR(info.st_mode) else "not a folder")
    if why is not None:
        return Student(name, folder, problem=why)
    try:
        return _from_store(name, folder, tz) if store else _from_folder(name, folder, tz)
    except UnreadableError as exc:
        return Student(name, folder, problem=exc.reason, unreadable=True)


def _from_folder(name: str, folder: Path, tz: tzinfo | None) -> Student:
    clock = Clock(folder, tz)
    entries = _entries(folder)
    listed = {entry for entry, _ in entries}
    handins, skipped = [], []
    for entry, info in entries:
        if not entry.endswith(SUFFIX) or entry == SUFFIX:
            if not entry.endswith(SIDECAR_SUFFIX):
                skipped.append((entry, f"not a kernel file (*{SUFFIX})"))
            continue
        why = _kind(info.st_mode) or ("a folder" if stat.S_ISDIR(info.st_mode) else None)
        declaration = entry[: -len(SUFFIX)] + SIDECAR_SUFFIX
        if why is None and declaration in listed:
            try:
                mode = os.lstat(folder / declaration).st_mode
            except OSError:
                mode = stat.S_IFREG
            if not stat.S_ISREG(mode):
                why = f"its declaration {declaration} is {_kind(mode) or 'a folder'}"
        if why is not None:
            skipped.append((entry, why))
            continue
        arrivals = [clock.arrival(folder / entry)]
        if declaration in listed:  # a declaration changed after the deadline changes the grade
            arrivals.append(clock.arrival(folder / declaration))
        handins.append(Handin(name, entry, folder / entry, _latest(arrivals)))
    return Student(name, folder, tuple(handins), tuple(skipped))


def _latest(arrivals: list[Arrival]) -> Arrival:
    unknown = [a for a in arrivals if a.at is None]
    if unknown:
        return unknown[0]
    return max(arrivals, key=lambda a: a.at or datetime.min)


def _from_store(name: str, folder: Path, tz: tzinfo | None) -> Student:
    store = KernelStore(folder.parent)
    current, count = store.current(name, limit=1 << 20)
    handins, skipped = [], []
    for kept in current:
        path = store.pick(name, kept.name)
        if path is None:
            skipped.append((kept.name + SUFFIX, "replaced or removed while it was listed"))
            continue
        at = datetime.fromtimestamp(kept.handed_in, timezone.utc)
        at = at if tz is None else at.astimezone(tz)
        handins.append(Handin(name, kept.name + SUFFIX, path, Arrival(Source.RECEIVED, at)))
    if count > len(current):
        skipped.append(("", f"{count - len(current)} more could not be read"))
    return Student(name, folder, tuple(handins), tuple(skipped))
