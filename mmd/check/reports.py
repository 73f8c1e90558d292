"""``mmd check``'s reports: the table, JUnit XML (valid against the xunit2 schema) and JSON."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .lateness import shown_time
from .results import FAILED, SET_ASIDE, CheckRun, Result, Status, counts_of, exit_status_of, shown

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET


def check_report_path(path: Path, flag: str) -> None:
    """Raise UsageError where a report cannot be written at ``path`` (its folder is missing or not
    writable, or it names a folder): ``mmd check`` asks before any check starts, not after them all."""
    where = f"{flag} {shown(str(path))}"
    if path.is_dir():
        raise UsageError(f"{where}: is a folder; give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"{where}: the folder {shown(str(folder))} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: cannot write in {shown(str(folder))}")


def table(results: Sequence[Result]) -> str:
    """The results as a plain-text table: (student,) file, shape, status, (arrived,) max error, reason. The
    arrived column, where a deadline was judged, says when each answer arrived and what says so."""
    students = any(r.student is not None for r in results)
    arrivals = any(r.arrival is not None for r in results)
    head = ("file", "shape", "status", *(("arrived",) if arrivals else ()), "max error", "reason")
    rows = [(*(("student",) if students else ()), *head)]
    for r in results:
        shape = "-" if r.shape is None else f"{r.shape[0]}x{r.shape[1]}"
        err = "-" if r.max_error is None else f"{r.max_error:.4g}"
        who = (shown(r.student or ""),) if students else ()
        arrived = ("-" if r.arrival is None else r.arrival.shown(),) if arrivals else ()
        rows.append((*who, shown(r.file), shape, r.status.value, *arrived, err, shown(r.reason)))
    last = len(rows[0]) - 1  # the reason: not padded; the max error before it right-aligned
    widths = [max(len(row[i]) for row in rows) for i in range(last)]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if i == last - 1 else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row[:last], widths, strict=True))
        ]
        lines.append("  ".join([*cells, row[last]]).rstrip())
    return "\n".join(lines)


def junit_xml(run: CheckRun) -> ET.Element:
    """The run as JUnit XML: one testcase per test (failures; errors; a test's superseded and late files as
    skipped) in one testsuite, or in a class's run one testsuite per student. Extra files, which answer no
    test, are no test cases: each suite's ``extra`` property counts them (the table and the JSON name them)."""
    import xml.etree.ElementTree as ET

    # the schema pytest's junit_family=xunit2 targets (Jenkins' junit-10.xsd, tests/data): testsuites
    # has no skipped count; a timestamp without an offset (UTC) is what every JUnit reader takes
    totals = _junit_totals(_tests(run.results), run.seconds)
    root = ET.Element("testsuites", {"name": "mmd check", **{k: v for k, v in totals.items() if k != "skipped"}})
    if run.by_student:
        for login, results in run.students().items():
            seconds = sum(r.seconds for r in results)
            _junit_suite(root, run, f"mmd check {shown(login)}", results, seconds, [("student", shown(login))])
    else:
        _junit_suite(root, run, f"mmd check {shown(str(run.outbox))}", run.results, run.seconds, [])
    ET.indent(root)
    return root


def _tests(results: Sequence[Result]) -> list[Result]:
    """The results that answer a test (all but the extra files)."""
    return [r for r in results if r.status is not Status.EXTRA]


def _junit_totals(results: Sequence[Result], seconds: float) -> dict[str, str]:
    c = counts_of(results)
    return {
        "tests": str(len(results)),
        "failures": str(sum(c[s.value] for s in FAILED)),
        "errors": str(c["error"]),
        "skipped": str(sum(c[s.value] for s in SET_ASIDE)),
        "time": f"{seconds:.3f}",
    }


def _junit_suite(
    root: ET.Element, run: CheckRun, name: str, results: Sequence[Result], seconds: float, extra: list[tuple[str, str]]
) -> None:
    import socket
    import xml.etree.ElementTree as ET

    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": name,
            **_junit_totals(_tests(results), seconds),
            "timestamp": run.started_at.removesuffix("+00:00"),
            "hostname": shown(socket.gethostname()),
        },
    )
    props = ET.SubElement(suite, "properties")
    o = run.options
    for key, value in (
        *extra,
        ("outbox", shown(str(run.outbox))),
        ("against", o.against),
        ("reference", shown(str(run.reference))),
        ("quick", "true" if o.quick else "false"),
        ("seed", str(o.seed)),
        ("tol", "model" if o.tol is None else f"{o.tol:g}"),
        ("extra", str(len(results) - len(_tests(results)))),
        *([("before", shown_time(o.before))] if o.before is not None else []),
    ):
        ET.SubElement(props, "property", {"name": key, "value": value})
    for r in _tests(results):
        # a test's superseded and late files are cases of their own: named by their file too
        case_name = shown(r.name) if r.status not in (Status.SUPERSEDED, Status.LATE) else shown(f"{r.name} ({r.file})")
        case = ET.SubElement(
            suite, "testcase", {"classname": "mmd.check", "name": case_name, "time": f"{r.seconds:.3f}"}
        )
        reason = shown(r.reason)
        if r.status in FAILED:
            node = ET.SubElement(case, "failure", {"type": r.status.value, "message": reason})
            node.text = shown(r.detail) or reason
        elif r.status is Status.ERROR:
            ET.SubElement(case, "error", {"type": r.status.value, "message": reason})
        elif r.status in SET_ASIDE:
            ET.SubElement(case, "skipped", {"type": r.status.value, "message": reason})
        # the files checked (testcase has no attribute for them), then the check's own summary line
        paths = [
            f"{what}: {shown(str(path))}" for what, path in (("output", r.output), ("reference", r.reference)) if path
        ]
        if r.kernel is not None:
            paths.append(f"kernel: {shown(r.kernel)} ({r.precision})")
        if r.arrival is not None:
            paths.append(f"arrived: {r.arrival.shown()}")
        ET.SubElement(case, "system-out").text = "\n".join([*paths, shown(r.detail)]).rstrip("\n")


def write_junit(run: CheckRun, path: Path) -> None:
    """Write :func:`junit_xml` to ``path`` (atomically)."""
    import xml.etree.ElementTree as ET

    from ..atomic import write_atomic

    body = ET.tostring(junit_xml(run), encoding="unicode")
    write_atomic(path, [b"<?xml version='1.0' encoding='utf-8'?>\n", body.encode("utf-8"), b"\n"], durable=False)


def run_dict(run: CheckRun) -> dict[str, Any]:
    """The run as plain data (what ``--json`` writes)."""
    o = run.options
    return {
        "outbox": shown(str(run.outbox)),
        "against": o.against,
        "reference": shown(str(run.reference)),
        "quick": o.quick,
        "seed": o.seed,
        "tol": o.tol,
        "before": None if o.before is None else shown_time(o.before),
        "started_at": run.started_at,
        "seconds": round(run.seconds, 6),
        "exit_status": run.exit_status,
        "counts": dict(run.counts),
        **(
            {"students": [_student_dict(login, results) for login, results in run.students().items()]}
            if run.by_student
            else {"results": [r.as_dict() for r in run.results]}
        ),
    }


def _student_dict(login: str, results: Sequence[Result]) -> dict[str, Any]:
    counts = counts_of(results)
    return {
        "student": shown(login),
        "exit_status": exit_status_of(counts),
        "counts": counts,
        "results": [r.as_dict() for r in results],
    }


def write_json(run: CheckRun, path: Path) -> None:
    """Write :func:`run_dict` to ``path`` as JSON (atomically)."""
    import json

    from ..atomic import write_atomic

    text = json.dumps(run_dict(run), indent=2, allow_nan=False) + "\n"
    write_atomic(path, [text.encode("utf-8")], durable=False)
