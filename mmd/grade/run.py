"""``mmd grade``'s driver: a class graded here (or one student, a Slurm task's part), or gathered from parts,
then reported as ``mmd check`` reports (the table, JSON, JUnit) and as the class page."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..atomic import write_atomic
from ..bench.clock import Nvml
from ..check import reports as check_reports
from ..check.results import shown, tally_line
from ..config import Settings
from ..textcore import printable
from . import grader, handins, reports, testset
from .array import Request
from .grader import Grading, Phases, probe
from .records import KernelGrade, StudentGrade
from .service import Held, alone


@dataclass(frozen=True)
class Outputs:
    """Where the reports go (None: not written)."""

    json: Path | None = None
    junit: Path | None = None
    page: Path | None = None
    quiet: bool = False


def check_outputs(outputs: Outputs) -> None:
    """UsageError where a report cannot be written, before anything is graded."""
    for path, flag in ((outputs.json, "--json"), (outputs.junit, "--junit")):
        if path is not None:
            check_reports.check_report_path(path, flag)


def _say(quiet: bool) -> Callable[[str, KernelGrade], None]:
    def told(student: str, grade: KernelGrade) -> None:
        if not quiet:
            word = {None: "not run", True: "right", False: "WRONG"}[grade.correct]
            late = ", late" if grade.late else ""
            print(f"mmd grade: {shown(student)}/{shown(grade.kernel)}: {word}{late}", file=sys.stderr)

    return told


Window = Callable[[], AbstractContextManager[Held]]


def _grading(request: Request, settings: Settings, quiet: bool, window: Window = alone) -> tuple[Grading, str]:
    tests, unusable = testset.load(request.tests)
    for u in unusable:
        print(f"mmd grade: not a test: {printable(u.reason)}", file=sys.stderr)
    device, limits = probe(settings)  # no GPU: refused here, before any kernel is marked for it
    clock = Nvml.find(settings.device, limits.pci_bus_id)
    return Grading(tests, request.plan, settings, limits.arch, request.deadline, _say(quiet), clock, window), device


def grade_class(request: Request, settings: Settings, outputs: Outputs, workers: int, window: Window = alone) -> int:
    """Every student of ``request.kernels`` graded here (phase 1 with ``workers`` kernels at once; each timed
    case in a ``window``: the class's service's with ``--service``), then reported."""
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    start = time.perf_counter()
    folders, skipped = handins.class_folders(request.kernels)
    grading, device = _grading(request, settings, outputs.quiet, window)
    tz = None if request.deadline is None else request.deadline.tzinfo
    graded = [handins.student(path, request.store, tz) for _, path in folders]
    students, phases = grader.grade_class(graded, grading, device, workers)
    students += [StudentGrade(name, problem=why) for name, why in skipped]
    return report(request, students, device, [t.name for t in grading.tests], outputs, time.perf_counter() - start,
                  started, phases)  # fmt: skip


def grade_part(request: Request, folder: Path, part: Path, settings: Settings) -> int:
    """One student's folder graded and their part written to ``part`` (a Slurm task's work)."""
    grading, device = _grading(request, settings, True)
    tz = None if request.deadline is None else request.deadline.tzinfo
    (graded,), _ = grader.grade_class([handins.student(folder, request.store, tz)], grading, device,
                                      grader.default_workers())  # fmt: skip
    write_atomic(part, [(json.dumps(graded.as_dict(), indent=2, allow_nan=False) + "\n").encode("utf-8")])
    kernels = ", ".join(f"{shown(k.kernel)} {'right' if k.correct else 'not right'}" for k in graded.kernels)
    print(f"mmd grade: {shown(graded.student)}: {kernels or graded.problem or 'no kernel file'} -> {part}")
    return 0


def report(
    request: Request, students: Sequence[StudentGrade], device: str, tests: Sequence[str], outputs: Outputs,
    seconds: float, started: str, phases: Phases | None = None,
) -> int:  # fmt: skip
    """The table, JSON, JUnit and page of a class's grades (and where its time went: ``phases``, where graded
    here); the exit status (mmd check's)."""
    run = reports.run_of(students, request.kernels, request.tests, request.deadline, seconds, started)
    print(check_reports.table(run.results))
    print()
    print(reports.timing_table(students, request.plan))
    print()
    for line in run.student_summaries():
        print(line)
    checked, tally = tally_line(run.results, run.counts)
    where = printable(str(request.tests))
    print(f"{checked} cases of {len(students)} students graded against {where}: {tally} ({seconds:.2f} s on "
          f"{shown(device)})")  # fmt: skip
    if phases is not None:
        print(phases.line())
    grade = reports.grade_dict(students, request.plan, tests, device)
    if outputs.json is not None:
        reports.write_json(run, grade, outputs.json)
    if outputs.junit is not None:
        check_reports.write_junit(run, outputs.junit)
    if outputs.page is not None:
        from ..report.page import write_class

        title = f"mmd grade: {request.kernels.name or request.kernels}"
        write_class(reports.class_results(title, students, request.plan), outputs.page)
        print(f"class page: {printable(str(outputs.page / 'index.html'))}")
    return run.exit_status
