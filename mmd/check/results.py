"""What ``mmd check`` decides, as data: the options of a check, a job (an output paired with its
reference), its result and a whole run's, and what each status means for the exit status.

Every text a result shows that a student chose (file names) or wrote (reasons quote their files) is
:func:`shown`: escaped so that it can neither move a terminal's cursor nor break XML 1.0 or UTF-8.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import textcore
from ..errors import ExitStatus
from .lateness import Arrival, shown_time
from .quick import caught_phrase, fresh_seed

if TYPE_CHECKING:
    from .product import Gemm

#: Every text a report shows (file names, which students choose; reasons, which quote their files):
#: escaped so that it can neither move a terminal's cursor nor break XML 1.0 or UTF-8.
shown = textcore.printable


def shown_path(path: Path | None) -> str | None:
    return None if path is None else shown(str(path))


INPUT_SUFFIX = ".txt"
OUTPUT_SUFFIX = ".out"


class Status(str, Enum):
    """What became of one job."""

    OK = "ok"
    MISMATCH = "mismatch"  # values outside the tolerance
    FORMAT = "format"  # the output is not in the exact format
    MISSING = "missing"  # no output and no error sidecar
    REFUSED = "refused"  # an error sidecar instead of an output
    EXTRA = "extra"  # an output or error sidecar with no input or expected output
    SUPERSEDED = "superseded"  # an output or error sidecar for a test that a newer one answers
    LATE = "late"  # not shown to have arrived before the deadline (--before), by a time the grader can trust
    NOT_A_FILE = "not-a-file"  # the output or error sidecar is a link, folder, FIFO or device: never opened
    ERROR = "error"  # could not be checked: a file cannot be read, or the reference is not valid


#: Statuses that fail a check (exit status 1).
FAILED = frozenset({Status.MISMATCH, Status.FORMAT, Status.MISSING, Status.REFUSED, Status.NOT_A_FILE})
#: Files listed but not checked: no job's answer (never a failure).
SET_ASIDE = (Status.EXTRA, Status.SUPERSEDED, Status.LATE)


@dataclass(frozen=True)
class Options:
    """How to check: against inputs (a float64 product) or expected outputs."""

    against: str = "inputs"  # "inputs" or "expected"
    tol: float | None = None
    quick: bool = False
    seed: int = field(default_factory=fresh_seed)  # --quick's: fresh unless one is asked for
    gemm: Gemm | None = None
    before: datetime | None = None  # a folder's deadline: only what arrived before it (mmd.check.lateness)


@dataclass(frozen=True)
class Aside:
    """A job decided by its pairing alone, never opened: superseded, late, or missing at a deadline."""

    status: Status
    reason: str


@dataclass(frozen=True)
class Pairing:
    """One pairing of an output with its reference, as found in the folders."""

    name: str
    output: Path | None  # None: no output
    reference: Path | None  # the input or expected output; None: an extra
    refusal: Path | None = None  # the error sidecar, where there is one
    aside: Aside | None = None  # decided by the pairing: nothing to check
    student: str | None = None  # whose folder it is in, checking a class (check_class)
    arrival: Arrival | None = None  # when its files arrived, judged for a deadline (None: none given)
    kernel: str | None = None  # the kernel that made the output, as its sidecar says
    precision: str | None = None  # a kernel file's arithmetic, as its sidecar says (None: the kernel's, by name)


@dataclass(frozen=True)
class Result:
    """The outcome of one job."""

    name: str
    status: Status
    output: Path | None
    reference: Path | None
    shape: tuple[int, int] | None = None
    max_error: float | None = None
    reason: str = ""  # one line, empty when ok
    detail: str = ""  # the value check's own summary line
    catches: float | None = None  # --quick: the rms a row or column must be off by to be caught surely
    line: int | None = None  # where the output's format fails
    column: int | None = None
    seconds: float = 0.0
    refusal: Path | None = None  # the error sidecar the job was paired with
    student: str | None = None  # whose, checking a class
    arrival: Arrival | None = None  # when its files arrived, and what says so (a deadline's check only)
    kernel: str | None = None  # the kernel that made the output, as its sidecar says (None: no sidecar)
    precision: str = "fp32"  # the arithmetic it was held to (mmd.kernels.PRECISIONS)

    @property
    def file(self) -> str:
        """The output's file name (what it would be, for a missing one)."""
        if self.output is not None:
            return self.output.name
        if self.refusal is not None and self.status in (Status.SUPERSEDED, Status.LATE):
            return self.refusal.name  # the row is about that file, not the job's
        return self.name + OUTPUT_SUFFIX

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON (non-finite errors become null; names and reasons :func:`shown`)."""
        err = self.max_error if self.max_error is not None and math.isfinite(self.max_error) else None
        return {
            "name": shown(self.name),
            "file": shown(self.file),
            "status": self.status.value,
            "output": shown_path(self.output),
            "reference": shown_path(self.reference),
            "shape": None if self.shape is None else list(self.shape),
            "max_error": err,
            "reason": shown(self.reason),
            "detail": shown(self.detail),
            "catches": self.catches,
            "line": self.line,
            "column": self.column,
            "seconds": round(self.seconds, 6),
            "kernel": None if self.kernel is None else shown(self.kernel),
            "precision": self.precision,
            "arrived_at": None if self.arrival is None or self.arrival.at is None else shown_time(self.arrival.at),
            "arrived_by": None if self.arrival is None else self.arrival.source.value,
        }


@dataclass(frozen=True)
class CheckRun:
    """Every result of one ``mmd check``."""

    outbox: Path
    reference: Path  # the folder (or file) checked against
    options: Options
    results: tuple[Result, ...]
    seconds: float
    started_at: str
    by_student: bool = False  # a class's folder (check_class): results grouped by student
    counts: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", counts_of(self.results))

    @property
    def exit_status(self) -> int:
        """2 if anything could not be checked, else 1 if anything failed, else 0."""
        return exit_status_of(self.counts)

    def summary(self) -> str:
        """One line: how many of each, and how long it took."""
        against = "expected outputs" if self.options.against == "expected" else "inputs"
        quick = f" (quick, seed {self.options.seed})" if self.options.quick else ""
        checked, tally = tally_line(self.results, self.counts)
        figures = [r.catches for r in self.results if r.catches is not None]
        caught = f"; each {caught_phrase(max(figures))}" if figures else ""
        return (
            f"{checked} jobs checked against the {against} in {self.reference}{quick}: {tally} ({self.seconds:.2f} s)"
            f"{caught}"
        )

    def students(self) -> dict[str, tuple[Result, ...]]:
        """Each student's results, in the table's order (a class's run; empty otherwise)."""
        groups: dict[str, list[Result]] = {}
        for r in self.results:
            if r.student is not None:
                groups.setdefault(r.student, []).append(r)
        return {login: tuple(results) for login, results in groups.items()}

    def student_summaries(self) -> list[str]:
        """A line per student, as :meth:`summary` counts them."""
        lines = []
        for login, results in self.students().items():
            checked, tally = tally_line(results, counts_of(results))
            lines.append(f"{shown(login)}: {checked} jobs checked: {tally}")
        return lines


def counts_of(results: Iterable[Result]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for r in results:
        counts[r.status.value] += 1
    return counts


def exit_status_of(counts: Mapping[str, int]) -> int:
    if counts[Status.ERROR.value]:
        return ExitStatus.USAGE
    return ExitStatus.FAILED if any(counts[s.value] for s in FAILED) else ExitStatus.OK


def tally_line(results: Sequence[Result], c: Mapping[str, int]) -> tuple[int, str]:
    """(jobs checked, "4 ok, 1 mismatch; 1 extra; 0 could not be checked")."""
    checked = len(results) - sum(c[s.value] for s in SET_ASIDE)
    parts = [f"{c[s.value]} {s.value}" for s in (Status.OK, *sorted(FAILED, key=_ORDER.index)) if c[s.value]]
    # superseded and late only where there are any: most folders have neither
    aside = "".join(f"; {c[s.value]} {s.value}" for s in (Status.SUPERSEDED, Status.LATE) if c[s.value])
    return checked, f"{', '.join(parts) or 'none'}; {c['extra']} extra{aside}; {c['error']} could not be checked"


_ORDER = list(Status)
