"""Pairing a folder's outputs (and error sidecars) with the tests they answer.

A job ``x`` pairs an input ``x.txt`` (or an expected output ``x.out``) in the reference folder with
an output in the outbox (:func:`pair`, a pure function of the listing and the sidecars' facts): the
one whose sidecar names the input's sha256, else ``x.out`` (or a version ``x.1.out`` whose sidecar
says it wanted that name); of several, the newest by its sidecar's finish time is checked and the
others are *superseded*; with a deadline those that did not arrive before it are *late*, judged by a
time the grader can trust (:mod:`.lateness`), never by what a sidecar says. A class's folder holds a
folder per student (:func:`class_jobs`), each paired alike. Sidecars and folders are students' files:
looked at with ``lstat``, never through a link, never a big one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .. import textcore
from ..errors import UnreadableError, UsageError
from .lateness import Arrival, Clock, Source, parse_time, shown_time
from .results import INPUT_SUFFIX, OUTPUT_SUFFIX, Aside, Pairing, Status, shown

#: The largest sidecar read for pairing: mmd's are about 2 KB; a student's file is not parsed beyond this.
SIDECAR_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Sidecar:
    """What pairing reads from an output's sidecar (or an error sidecar itself)."""

    input_sha256: str | None = None  # the input the job read
    finished_at: datetime | None = None  # when the job's files were committed
    wanted: str | None = None  # the output's name before it was versioned (x.out for x.1.out)
    kernel: str | None = None  # the kernel that made the output (an error sidecar names none)
    precision: str | None = None  # what a kernel file's declaration says its arithmetic is (None: not a file's)


@dataclass(frozen=True)
class Found:
    """An output or error sidecar in a folder being graded, and its sidecar's facts (None: none read)."""

    path: Path
    sidecar: Sidecar | None = None
    arrival: Arrival | None = None  # when it arrived, by a time the grader can trust (with a deadline only)

    @property
    def refusal(self) -> bool:
        from ..record import ERROR_SUFFIX

        return self.path.name.endswith(ERROR_SUFFIX)

    @property
    def name(self) -> str:
        """The job its name gives: the file's, or the one the daemon wanted before it versioned it."""
        from ..record import ERROR_SUFFIX

        wanted = self.sidecar.wanted if self.sidecar is not None else None
        name = wanted if wanted else self.path.name
        for suffix in (ERROR_SUFFIX, OUTPUT_SUFFIX):
            if name.endswith(suffix) and len(name) > len(suffix):
                return name[: -len(suffix)]
        return name

    @property
    def finished_at(self) -> datetime | None:
        return None if self.sidecar is None else self.sidecar.finished_at


def _newest_first(found: Found) -> tuple[bool, float, bool, str]:
    """Sort key, newest first: one without a finish time is older than any with one; at one time an output
    comes before an error sidecar (the daemon never leaves both), then by name."""
    at = found.finished_at
    return (at is None, 0.0 if at is None else -at.timestamp(), found.refusal, found.path.name)


def pair(
    found: Iterable[Found],
    refs: Mapping[str, Path],
    ref_sha256: Mapping[str, str],
    before: datetime | None = None,
) -> list[Pairing]:
    """The jobs of a folder's outputs and error sidecars (``found``) against the references ``refs`` (job
    name -> input or expected output), sorted by name; pure.

    Each file answers the test whose input has the sha256 its sidecar names (``ref_sha256``, name -> sha256;
    the one of its own name where several tests have those bytes), else the test its name gives
    (:attr:`Found.name`), else none (extra). Of a test's answers, the newest by its sidecar's finish time is
    checked and the others are superseded; with ``before``, only those whose :attr:`Found.arrival` is before
    it are answers, and the rest are late (one with no arrival cannot be shown to be in time).
    """
    by_sha: dict[str, list[str]] = {}
    for name in sorted(ref_sha256):
        by_sha.setdefault(ref_sha256[name], []).append(name)
    answers: dict[str, list[Found]] = {}
    for f in found:
        sha = f.sidecar.input_sha256 if f.sidecar is not None else None
        same = by_sha.get(sha, []) if sha else []
        name = f.name if not same or f.name in same else same[0]
        answers.setdefault(name, []).append(f)
    jobs: list[Pairing] = []
    for name in sorted(set(refs) | set(answers)):
        ref = refs.get(name)
        mine = sorted(answers.get(name, []), key=_newest_first)
        if ref is None:  # no test: every file is an extra, as it always was
            jobs.extend(_job(name, f, None) for f in sorted(mine, key=lambda f: (f.refusal, f.path.name)))
            continue
        late = [f for f in mine if before is not None and not _arrival(f).in_time(before)]
        in_time = [f for f in mine if f not in late]
        if in_time:
            jobs.append(_job(name, in_time[0], ref))
        else:
            reason = None if before is None else f"no output and no error sidecar arrived before {shown_time(before)}"
            jobs.append(Pairing(name, None, ref, aside=Aside(Status.MISSING, reason) if reason else None))
        why = f"superseded by {in_time[0].path.name}" if in_time else ""
        jobs.extend(_job(name, f, ref, Aside(Status.SUPERSEDED, why)) for f in in_time[1:])
        for f in late:
            assert before is not None
            jobs.append(_job(name, f, ref, Aside(Status.LATE, _arrival(f).late_reason(before))))
    return jobs


def _arrival(found: Found) -> Arrival:
    return found.arrival or Arrival(Source.NONE, why="its arrival was not judged")


def _job(name: str, found: Found, ref: Path | None, aside: Aside | None = None) -> Pairing:
    if found.refusal:
        return Pairing(name, None, ref, found.path, aside, arrival=found.arrival)
    kernel = found.sidecar.kernel if found.sidecar is not None else None
    precision = found.sidecar.precision if found.sidecar is not None else None
    return Pairing(name, found.path, ref, None, aside, kernel=kernel, precision=precision, arrival=found.arrival)


def _found(folder: Path, clock: Clock | None) -> list[Found]:
    """The outputs and error sidecars in ``folder``, with their sidecars' facts and (``clock``: a deadline
    is judged) their arrivals."""
    from ..record import ERROR_SUFFIX

    return [
        Found(path, read_sidecar(path), None if clock is None else clock.arrival(path))
        for suffix in (OUTPUT_SUFFIX, ERROR_SUFFIX)
        for _, path in _names(folder, suffix)
    ]


def _clock(folder: Path, before: datetime | None) -> Clock | None:
    """What judges arrivals in ``folder`` for the deadline ``before`` (None: no deadline, nothing judged)."""
    if before is None:
        return None
    try:
        return Clock(folder, before.tzinfo)
    except OSError as exc:
        raise UnreadableError(f"cannot read {folder}: {exc.strerror}") from None


def pair_folder(outbox: Path, reference: Path, against: str, before: datetime | None = None) -> list[Pairing]:
    """The jobs of ``outbox`` against the folder ``reference`` (:func:`pair`), sorted by name. Raises
    UnreadableError."""
    ref_suffix = OUTPUT_SUFFIX if against == "expected" else INPUT_SUFFIX
    refs = dict(_names(reference, ref_suffix))
    found = _found(outbox, _clock(outbox, before))
    return pair(found, refs, _sha256s(refs, found, against), before)


def _sha256s(refs: Mapping[str, Path], found: Sequence[Found], against: str) -> dict[str, str]:
    """The inputs' sha256, where an answer's sidecar names one (an input's is what the daemon hashed)."""
    if against != "inputs" or not any(f.sidecar is not None and f.sidecar.input_sha256 for f in found):
        return {}
    sums = {}
    for name, path in refs.items():
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as fh:  # the grader's file: followed, as every reference is
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
        except OSError:
            continue  # its check says why
        sums[name] = digest.hexdigest()
    return sums


def read_sidecar(path: Path) -> Sidecar | None:
    """The facts of an output's sidecar (or of the error sidecar ``path``), None where there is none that
    mmd could have written. A student's file: never through a link, never a big one."""
    import yaml

    from .. import record
    from ..record.reader import parse

    sidecar = path if path.name.endswith(record.ERROR_SUFFIX) else record.timing_path(path)
    try:
        data = textcore.read_bytes(sidecar, follow=False)
        if len(data) > SIDECAR_MAX_BYTES:
            return None
        rec = parse(bytes(data), sidecar)
    except (UnreadableError, ValueError, yaml.YAMLError):  # NotRegularFile is an UnreadableError
        return None
    try:
        finished = parse_time(rec.finished_at) if rec.finished_at else None
    except ValueError:
        finished = None
    wanted = rec.context.collision.wanted if rec.context.collision is not None else None
    kernel = rec.kernel if isinstance(rec, record.TimingRecord) else None
    declared = rec.kernel_file if isinstance(rec, record.TimingRecord) else None
    return Sidecar(rec.input.sha256, finished, wanted, kernel, declared.precision if declared is not None else None)


def _names(folder: Path, suffix: str) -> Iterable[tuple[str, Path]]:
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        raise UnreadableError(f"cannot read {folder}: {exc.strerror}") from None
    for e in entries:
        if e.name.startswith(".") or not e.name.endswith(suffix) or len(e.name) == len(suffix):
            continue  # hidden files: the daemon's claims and temporaries
        yield e.name[: -len(suffix)], Path(folder) / e.name


def class_jobs(
    folder: Path, reference: Path, against: str, before: datetime | None = None, roster: Sequence[str] | None = None
) -> list[Pairing]:
    """Every student's jobs (:func:`pair`), by login. The students are ``folder``'s entries (each looked at
    with ``lstat``: a real folder is a student's; a link, FIFO or device named like one is reported as
    not-a-file and never followed) and the logins of ``roster`` (one with no folder has every test
    missing). Never a student: dot folders, mmd's own ``slurm/`` (unless the roster names it), and plain
    files. Raises UnreadableError."""
    from ..slurm import SCRIPTS_DIR

    named = set(roster or ())
    try:
        entries = {e.name: e.stat(follow_symlinks=False).st_mode for e in os.scandir(folder)}
    except OSError as exc:
        raise UnreadableError(f"cannot read {folder}: {exc.strerror}") from None
    # a plain file in a class's folder (a roster, notes) is no student's; anything else named like one is
    students = {
        name: mode
        for name, mode in entries.items()
        if not name.startswith(".") and not stat.S_ISREG(mode) and (name != SCRIPTS_DIR or name in named)
    }
    refs = dict(_names(reference, OUTPUT_SUFFIX if against == "expected" else INPUT_SUFFIX))
    clock = _clock(folder, before)
    found = {login: _found(folder / login, clock) for login, mode in students.items() if stat.S_ISDIR(mode)}
    sha256s = _sha256s(refs, [f for mine in found.values() for f in mine], against)
    jobs: list[Pairing] = []
    for login in sorted(set(students) | named):
        mode = students.get(login)
        if login in found:
            mine = pair(found[login], refs, sha256s, before)
        else:  # no folder: every test missing, after the entry that stands in its place
            if mode is not None:
                path = folder / login
                why = Aside(Status.NOT_A_FILE, textcore.not_regular(path, mode).reason)
                mine = [Pairing(login, path, None, aside=why)]
            else:
                mine = []
            why = Aside(Status.MISSING, f"no folder {login}")
            mine += [Pairing(name, None, ref, aside=why) for name, ref in sorted(refs.items())]
        jobs += [dataclasses.replace(job, student=login) for job in mine]
    return jobs


def read_roster(path: Path) -> list[str]:
    """A class's logins from ``path``, one a line (blank lines and ``#`` comments skipped). Raises
    UsageError for a line that is not a login (it names a folder: never ``..`` or a path)."""
    from ..submitters import is_login

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"--roster {shown(str(path))}: cannot read it ({getattr(exc, 'strerror', None) or exc})"
        ) from None
    logins: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        login = line.split("#", 1)[0].strip()
        if not login:
            continue
        if not is_login(login):
            raise UsageError(f"--roster {shown(str(path))}: line {number}: {shown(repr(login))} is not a login")
        if login not in logins:
            logins.append(login)
    return logins
