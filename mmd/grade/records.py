"""What grading decides, as data: each case of a kernel, each kernel of a student, and a student's part.

A student's part (:class:`StudentGrade`) is plain data both ways (:meth:`StudentGrade.as_dict`,
:meth:`StudentGrade.from_dict`): a Slurm task writes its student's part as JSON and ``mmd grade --gather``
reads it back. Names are kept as they are here; every report escapes them as it shows them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ..check.lateness import Arrival, Source, parse_time, shown_time
from ..check.results import FAILED, Status

#: The format of a part written by a Slurm task; another is not read.
PART_FORMAT = 1


@dataclass(frozen=True)
class Case:
    """One case of one kernel: a test input at a tile (``test``), or a timed shape at a tile (``timed``)."""

    kind: str  # "test" or "timed"
    #: The test's name (its input's stem), or ``MxKxN`` for a timed case.
    name: str
    shape: tuple[int, int, int]
    tile: int
    status: Status
    reason: str = ""  # one line, empty when ok (a tile refused before launch says so here, and is ok)
    detail: str = ""  # the check's own summary line
    max_error: float | None = None
    #: Each timed launch's CUDA kernel time and its five phases' total ('cuda'), in ms (a timed case's).
    kernel_ms: tuple[float, ...] = ()
    cuda_ms: tuple[float, ...] = ()
    seconds: float = 0.0
    #: Where the test's reference lies (its input, or its expected output), as given.
    reference: str | None = None
    #: A timed case's kernel median noise (half its 95% confidence interval, over it), the GPU's median SM
    #: clock and whether it throttled, the most processes seen on the GPU, the windows it took (a window during
    #: which another process used the GPU runs again) and whether the last was disturbed too (None: unknown).
    noise: float | None = None
    sm_clock_mhz: float | None = None
    throttled: bool | None = None
    gpu_processes: int | None = None
    windows: int = 0
    disturbed: bool = False

    @property
    def label(self) -> str:
        """The case's name in reports: ``square32@tile=8``, or ``timed 4096x4096x4096@tile=32``."""
        what = self.name if self.kind == "test" else f"timed {self.name}"
        return f"{what}@tile={self.tile}"

    @property
    def kernel_median(self) -> float | None:
        return statistics.median(self.kernel_ms) if self.kernel_ms else None

    @property
    def cuda_median(self) -> float | None:
        return statistics.median(self.cuda_ms) if self.cuda_ms else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "shape": list(self.shape),
            "tile": self.tile,
            "status": self.status.value,
            "reason": self.reason,
            "detail": self.detail,
            "max_error": self.max_error,
            "kernel_ms": list(self.kernel_ms),
            "cuda_ms": list(self.cuda_ms),
            "kernel_median_ms": self.kernel_median,
            "cuda_median_ms": self.cuda_median,
            "seconds": round(self.seconds, 6),
            "reference": self.reference,
            "noise": self.noise,
            "sm_clock_mhz": self.sm_clock_mhz,
            "throttled": self.throttled,
            "gpu_processes": self.gpu_processes,
            "windows": self.windows,
            "disturbed": self.disturbed,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Case:
        m, k, n = (int(x) for x in d["shape"])
        return cls(
            kind=str(d["kind"]),
            name=str(d["name"]),
            shape=(m, k, n),
            tile=int(d["tile"]),
            status=Status(d["status"]),
            reason=str(d["reason"]),
            detail=str(d["detail"]),
            max_error=None if d["max_error"] is None else float(d["max_error"]),
            kernel_ms=tuple(float(x) for x in d["kernel_ms"]),
            cuda_ms=tuple(float(x) for x in d["cuda_ms"]),
            seconds=float(d["seconds"]),
            reference=None if d["reference"] is None else str(d["reference"]),
            noise=None if d["noise"] is None else float(d["noise"]),
            sm_clock_mhz=None if d["sm_clock_mhz"] is None else float(d["sm_clock_mhz"]),
            throttled=None if d["throttled"] is None else bool(d["throttled"]),
            gpu_processes=None if d["gpu_processes"] is None else int(d["gpu_processes"]),
            windows=int(d["windows"]),
            disturbed=bool(d["disturbed"]),
        )


def arrival_dict(arrival: Arrival | None) -> dict[str, Any] | None:
    if arrival is None:
        return None
    at = None if arrival.at is None else shown_time(arrival.at)
    return {"at": at, "by": arrival.source.value, "why": arrival.why}


def arrival_of(d: dict[str, Any] | None) -> Arrival | None:
    if d is None:
        return None
    return Arrival(Source(d["by"]), None if d["at"] is None else parse_time(d["at"]), str(d["why"]))


@dataclass(frozen=True)
class KernelGrade:
    """One kernel a student handed in, graded."""

    #: Its file's name (``p1.cu``): what reports call it.
    kernel: str
    sha256: str | None
    arrival: Arrival | None
    #: Arrived after the deadline (graded all the same).
    late: bool
    cases: tuple[Case, ...]
    #: Why none of it ran, where it did not (it could not be read, or did not compile): the compiler's first line.
    refused: str = ""
    precision: str = "fp32"

    @property
    def correct(self) -> bool | None:
        """Right in every case (None: refused before anything ran)."""
        if self.refused:
            return None
        return not any(c.status in FAILED or c.status is Status.ERROR for c in self.cases)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "sha256": self.sha256,
            "arrival": arrival_dict(self.arrival),
            "late": self.late,
            "refused": self.refused,
            "precision": self.precision,
            "correct": self.correct,
            "cases": [c.as_dict() for c in self.cases],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelGrade:
        return cls(
            kernel=str(d["kernel"]),
            sha256=None if d["sha256"] is None else str(d["sha256"]),
            arrival=arrival_of(d["arrival"]),
            late=bool(d["late"]),
            cases=tuple(Case.from_dict(c) for c in d["cases"]),
            refused=str(d["refused"]),
            precision=str(d["precision"]),
        )


#: The reference kernels' names, as mmd's registry and ``mmd bench`` name them: what the page's "× naive" and
#: "of cuBLAS" divide.
NAIVE, CUBLAS = "naive", "cublas"

#: A timed case's tile for a kernel that has none (cuBLAS): its time stands at every tile of its size.
NO_TILE = 0


@dataclass(frozen=True)
class Reference:
    """One of mmd's own kernels (:data:`NAIVE`, :data:`CUBLAS`) timed in the same session and on the same GPU as a
    student's kernels: what their times are ratios of."""

    kernel: str
    #: Its timed cases, as a student's kernel's (``kind`` "timed"; :data:`NO_TILE` where it has no tile).
    cases: tuple[Case, ...]

    def median_at(self, size: int, tile: int) -> float | None:
        """Its median kernel time (ms) at ``size`` and ``tile`` (a kernel without a tile: at ``size``)."""
        for c in self.cases:
            if c.kind == "timed" and c.shape[0] == size and c.tile in (tile, NO_TILE) and c.status is Status.OK:
                return c.kernel_median
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "cases": [c.as_dict() for c in self.cases]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Reference:
        return cls(kernel=str(d["kernel"]), cases=tuple(Case.from_dict(c) for c in d["cases"]))


@dataclass(frozen=True)
class StudentGrade:
    """A student's part: each of their kernels graded, and what could not be (their folder unreadable)."""

    student: str
    kernels: tuple[KernelGrade, ...] = ()
    #: Entries of their folder that are no kernel mmd grades, each with why (a link, a folder, a bad name).
    skipped: tuple[tuple[str, str], ...] = ()
    #: Why the student could not be graded at all (empty: they were) ...
    problem: str = ""
    #: ... and whether that is because their folder could not be read (else: it is a link, a file ...).
    unreadable: bool = False
    device: str = ""
    seconds: float = 0.0
    #: mmd's own kernels timed in the same session and on the same GPU (a Slurm task's own), where they were.
    references: tuple[Reference, ...] = ()

    def reference(self, kernel: str) -> Reference | None:
        return next((r for r in self.references if r.kernel == kernel), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": PART_FORMAT,
            "student": self.student,
            "problem": self.problem,
            "unreadable": self.unreadable,
            "device": self.device,
            "seconds": round(self.seconds, 6),
            "skipped": [list(s) for s in self.skipped],
            "kernels": [k.as_dict() for k in self.kernels],
            "references": [r.as_dict() for r in self.references],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StudentGrade:
        if d.get("format") != PART_FORMAT:
            raise ValueError(f"not a part of mmd grade's format {PART_FORMAT}")
        return cls(
            student=str(d["student"]),
            kernels=tuple(KernelGrade.from_dict(k) for k in d["kernels"]),
            skipped=tuple((str(a), str(b)) for a, b in d["skipped"]),
            problem=str(d["problem"]),
            unreadable=bool(d["unreadable"]),
            device=str(d["device"]),
            seconds=float(d["seconds"]),
            references=tuple(Reference.from_dict(r) for r in d.get("references", ())),
        )
