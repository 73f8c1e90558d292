"""A class's grades as ``mmd check`` reports them (:mod:`mmd.check.reports`: the table, JSON and JUnit) and as
the class report page (:mod:`mmd.report.page`).

Each case is one of ``mmd check``'s results (:class:`mmd.check.results.Result`), named
``KERNEL:TEST@tile=T`` (``p1.cu:square32@tile=8``) or ``KERNEL:timed MxKxN@tile=T``, so that the JUnit has one
test case per student × kernel × test × tile and one per timed case, in a test suite per student. A late
hand-in's cases are graded as any and say so in their reason. The JSON is ``mmd check``'s with a ``grade``
object beside it: the plan, the GPU, and every student's part (:class:`~.records.StudentGrade`), times included.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..atomic import write_atomic
from ..check import reports
from ..check.results import CheckRun, Options, Result, Status, shown
from ..report.page import ClassResults, KernelResult, StudentResult
from .grader import GradePlan
from .records import CUBLAS, NAIVE, Case, KernelGrade, StudentGrade

#: The tile whose refusal the page's "tile 64" column tells.
TILE_64 = 64


def results_of(students: Sequence[StudentGrade], deadline: datetime | None) -> list[Result]:
    """Every case of every student as ``mmd check``'s results, in order."""
    out: list[Result] = []
    for s in students:
        if s.problem:
            status = Status.ERROR if s.unreadable else Status.NOT_A_FILE
            out.append(Result(s.student, status, None, None, reason=s.problem, student=s.student))
            continue
        for entry, why in s.skipped:
            not_graded = Status.EXTRA if why.startswith("not a kernel file") else Status.NOT_A_FILE
            out.append(Result(entry, not_graded, None, None, reason=f"{entry}: {why}", student=s.student))
        if not s.kernels:
            out.append(Result("(kernels)", Status.MISSING, None, None, reason="no kernel file", student=s.student))
        for k in s.kernels:
            out.extend(_case_result(s.student, k, c, deadline) for c in k.cases)
    return out


def _case_result(student: str, k: KernelGrade, c: Case, deadline: datetime | None) -> Result:
    reason = c.reason
    if k.late and deadline is not None and k.arrival is not None:
        late = f"late: {k.arrival.late_reason(deadline)}"
        reason = f"{reason}; {late}" if reason else late
    return Result(
        name=f"{k.kernel}:{c.label}",
        status=c.status,
        output=None,
        reference=None if c.reference is None else Path(c.reference),
        shape=(c.shape[0], c.shape[2]),
        max_error=c.max_error,
        reason=reason,
        detail=c.detail,
        seconds=c.seconds,
        student=student,
        arrival=k.arrival if deadline is not None else None,
        kernel=k.kernel,
        precision=k.precision,
    )


def run_of(
    students: Sequence[StudentGrade], kernels: Path, tests: Path, deadline: datetime | None, seconds: float,
    started_at: str,
) -> CheckRun:  # fmt: skip
    """The class's grades as one ``mmd check`` run of a class (a test suite per student)."""
    options = Options(against="inputs", before=deadline, seed=0)
    return CheckRun(
        kernels, tests, options, tuple(results_of(students, deadline)), seconds, started_at, by_student=True
    )


def timing_table(students: Sequence[StudentGrade], plan: GradePlan) -> str:
    """Each kernel's median CUDA kernel time (ms) per timed case: a row per student and kernel."""
    timed = plan.timed()
    head = ["student", "kernel", "correct", "late", *(f"{s}@{t}" for s, t in timed)]
    rows = [head]
    for s in students:
        for k in s.kernels:
            by = {(c.shape[0], c.tile): c for c in k.cases if c.kind == "timed"}
            cells = []
            for key in timed:
                c = by.get(key)
                median = None if c is None else c.kernel_median
                cells.append("-" if median is None else f"{median:.3f}")
            rows.append([shown(s.student), shown(k.kernel), _correct_word(k), "late" if k.late else "", *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for r in rows:
        cells = [cell.rjust(w) if i >= 4 else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _correct_word(k: KernelGrade) -> str:
    return {None: "not run", True: "yes", False: "WRONG"}[k.correct]


def grade_dict(students: Sequence[StudentGrade], plan: GradePlan, tests: Sequence[str], device: str) -> dict[str, Any]:
    """The ``grade`` object of the JSON: the plan, the GPU, the tests and every student's part."""
    return {
        "device": device,
        "tests": list(tests),
        "plan": plan.as_dict(),
        "students": [s.as_dict() for s in students],
    }


def write_json(run: CheckRun, grade: dict[str, Any], path: Path) -> None:
    """``mmd check``'s JSON of ``run`` with ``grade`` beside it (atomically); every name escaped."""
    data = {**reports.run_dict(run), "grade": _shown(grade)}
    write_atomic(path, [(json.dumps(data, indent=2, allow_nan=False) + "\n").encode("utf-8")], durable=False)


def _shown(value: Any) -> Any:
    """Every text in ``value`` :func:`shown`, as mmd check's JSON shows names and reasons."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown(v) for v in value]
    return value


def class_results(title: str, students: Sequence[StudentGrade], plan: GradePlan) -> ClassResults:
    """What the class report page shows (:func:`mmd.report.page.write_class`): names and messages :func:`shown`,
    as every report shows them (the page escapes markup; this leaves no control character either)."""
    size = max(plan.sizes) if plan.sizes else 0
    return ClassResults(
        title,
        [StudentResult(shown(s.student), [_kernel_result(s, k, plan, size) for k in s.kernels]) for s in students],
        size=size,
        tile=plan.sizes_at_tile,
    )


def _kernel_result(s: StudentGrade, k: KernelGrade, plan: GradePlan, size: int) -> KernelResult:
    timed = [c for c in k.cases if c.kind == "timed" and c.kernel_median is not None]
    theirs = next((c.kernel_median for c in timed if c.shape[0] == size and c.tile == plan.sizes_at_tile), None)
    failed = next((c for c in k.cases if c.status is not Status.OK), None)
    message = k.refused or ("" if failed is None else f"{failed.label}: {failed.reason}")
    return KernelResult(
        kernel=shown(k.kernel),
        kind=shown(k.kernel.removesuffix(".cu")),
        correct=k.correct,
        message=shown(message),
        tile64=_tile64(k),
        by_tile_ms={c.tile: c.kernel_median for c in timed if c.shape[0] == size and c.kernel_median is not None},
        by_size_ms={
            c.shape[0]: c.kernel_median for c in timed if c.tile == plan.sizes_at_tile and c.kernel_median is not None
        },
        over_naive=_ratio(s, NAIVE, theirs, size, plan.sizes_at_tile),
        over_cublas=_ratio(s, CUBLAS, theirs, size, plan.sizes_at_tile),
        late=k.late,
    )


def _ratio(s: StudentGrade, reference: str, theirs: float | None, size: int, tile: int) -> float | None:
    """``reference``'s kernel time over ``theirs`` at the headline's size and tile, timed in the same session
    (above 1: theirs is faster); None where either time is not in the records (the page leaves it blank)."""
    kept = s.reference(reference)
    base = None if kept is None else kept.median_at(size, tile)
    if base is None or not theirs:
        return None
    return base / theirs


def _tile64(k: KernelGrade) -> str:
    """What tile 64 did in the tests: refused before launch, or ran (right or wrong)."""
    cases = [c for c in k.cases if c.kind == "test" and c.tile == TILE_64]
    if not cases or k.refused:
        return ""
    if all(c.reason.startswith("refused before launch") for c in cases):
        return "refused before launch"
    return "ran: right" if all(c.status is Status.OK for c in cases) else "ran: WRONG"
