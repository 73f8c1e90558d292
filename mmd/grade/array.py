"""``mmd grade --slurm DIR``: a Slurm array of one task per student, through :mod:`mmd.slurm`; and
``mmd grade --gather DIR``, which reads the parts the tasks wrote and reports the class as ``mmd grade`` does.

``DIR`` is a new folder, made for one grading::

    grade.json              what is graded: KERNELS, TESTS, --store, the deadline, the plan
    grade.sbatch            the script (mmd.slurm's): task i runs `mmd grade ... -o PART -- FOLDER`
    grade.sbatch.manifest   each student's folder, one absolute path per line
    grade.sbatch.outputs    each student's part, DIR/parts/NNNN.json, same line
    grade.sbatch.jobs       after --submit: the arrays, as mmd submit writes them
    logs/                   the tasks' logs
    parts/                  the parts, one per student, named by place (a name is anyone's)

A student's folder whose path holds a line break cannot be a manifest line: it is left out of the array and
said so (grade it without --slurm). A task writes its part only once its student is graded; ``--gather``
reports a student whose part is missing or unreadable as not graded, naming the log to read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import slurm
from ..atomic import write_atomic
from ..check.lateness import parse_time, shown_time
from ..errors import UsageError
from ..textcore import printable
from .grader import GradePlan
from .records import StudentGrade

#: The folder's record of what is graded.
REQUEST_NAME = "grade.json"
SCRIPT_NAME = "grade.sbatch"
PARTS_DIR = "parts"


@dataclass(frozen=True)
class Request:
    """What one grading grades: the class's kernels, the tests, how arrivals are judged, and the plan."""

    kernels: Path
    tests: Path
    store: bool
    deadline: datetime | None
    plan: GradePlan

    def as_dict(self) -> dict[str, Any]:
        p = self.plan
        return {
            "kernels": str(self.kernels),
            "tests": str(self.tests),
            "store": self.store,
            "deadline": None if self.deadline is None else shown_time(self.deadline),
            "plan": p.as_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Request:
        plan = GradePlan.from_dict(d["plan"])
        deadline = None if d["deadline"] is None else parse_time(d["deadline"])
        return cls(Path(d["kernels"]), Path(d["tests"]), bool(d["store"]), deadline, plan)

    def task_arguments(self) -> tuple[str, ...]:
        """``mmd grade``'s options for one student's task (before ``-o PART -- FOLDER``)."""
        p = self.plan
        args = ["grade", "--tests", str(self.tests)]
        args += ["--tiles", *map(str, p.tiles), "--sizes", *map(str, p.sizes), "--repeats", str(p.repeats)]
        args += ["--noise", f"{100 * p.noise:g}", "--max-repeats", str(p.max_repeats)]
        if self.store:
            args.append("--store")
        if self.deadline is not None:
            args += ["--deadline", shown_time(self.deadline)]
        return tuple(args)


def write(
    request: Request, folders: list[tuple[str, Path]], folder: Path, options: slurm.ArrayOptions
) -> tuple[slurm.Written, list[str]]:
    """Write the array for ``folders`` (each student's name and folder) into the new ``folder``; returns what
    was written and the students left out (their folder's path holds a line break). UsageError where
    ``folder`` exists."""
    left_out = [name for name, path in folders if "\n" in str(path) or "\r" in str(path)]
    kept = [path for name, path in folders if name not in left_out]
    if not kept:
        raise UsageError("no student's folder to grade")
    folder = Path(os.path.abspath(folder))
    try:
        folder.mkdir(parents=False)
    except FileExistsError:
        raise UsageError(f"--slurm {printable(str(folder))}: exists; give a new folder") from None
    except OSError as exc:
        raise UsageError(f"--slurm {printable(str(folder))}: cannot be made: {exc.strerror}") from None
    parts = folder / PARTS_DIR
    tasks = [slurm.Task(Path(os.path.abspath(path)), parts / f"{i:04d}.json") for i, path in enumerate(kept)]
    options = replace(options, command=request.task_arguments())
    plan = slurm.ArrayPlan(tasks, parts, folder / SCRIPT_NAME, options)
    written = slurm.write(plan)
    write_atomic(folder / REQUEST_NAME, [(json.dumps(request.as_dict(), indent=2) + "\n").encode()], durable=False)
    return written, left_out


def gather(folder: Path) -> tuple[Request, list[StudentGrade]]:
    """What ``folder`` (an ``mmd grade --slurm`` folder) graded, and each student's part; a student whose
    part is missing or unreadable is not graded, with why. UsageError where it is no such folder."""
    try:
        request = Request.from_dict(json.loads((folder / REQUEST_NAME).read_text(encoding="utf-8")))
        plan = slurm.ArrayPlan([], folder / PARTS_DIR, folder / SCRIPT_NAME, slurm.ArrayOptions())
        manifest = plan.manifest.read_bytes().splitlines()
        outputs = plan.outputs.read_bytes().splitlines()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not mmd grade's"
        raise UsageError(f"--gather {printable(str(folder))}: not an mmd grade --slurm folder ({why})") from None
    students = []
    for raw_folder, raw_part in zip(manifest, outputs, strict=False):
        name = Path(os.fsdecode(raw_folder)).name
        part = Path(os.fsdecode(raw_part))
        try:
            students.append(StudentGrade.from_dict(json.loads(part.read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError, TypeError):
            why = f"its task wrote no part {part.name} (see {plan.logs})"
            students.append(StudentGrade(name, problem=why, unreadable=True))
    return request, students
