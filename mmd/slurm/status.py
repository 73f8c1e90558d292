"""An array's outcome (``mmd submit --status JOBID``): each task as Slurm still knows it (``squeue``,
``scontrol``) and as mmd sees it (its output and sidecars).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UnreadableError, UsageError
from ..record import error_path, timing_path
from .folder import SCRIPTS_DIR
from .submission import Array, run_tool


@dataclass(frozen=True)
class TaskState:
    """What Slurm says of one task (``squeue -t all``), while it remembers the job."""

    state: str
    reason: str
    exit_code: int | None  # the task script's exit status; None while it runs or when killed


@dataclass(frozen=True)
class TaskOutcome:
    """One task, as Slurm and mmd see it."""

    index: int  # line of the manifest, from 0
    job: str  # JOBID_TASK, Slurm's name for it
    input: Path
    output: Path
    slurm: TaskState | None  # None: Slurm no longer knows it (no accounting, past MinJobAge)
    verdict: str  # ok | refused | missing

    @property
    def failed(self) -> bool:
        finished = self.slurm is None or self.slurm.state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
        return self.verdict != "ok" and finished


def find_submission(outbox: Path, job: str) -> tuple[Path, list[Array]]:
    """The script of the submission that array ``job`` belongs to, and all its arrays."""
    job = job.split("_")[0]
    for record in sorted(Path(outbox).glob(f"{SCRIPTS_DIR}/*/*.jobs")):
        try:
            lines = record.read_text().split()
        except OSError:
            continue
        arrays = [Array(lines[i], int(lines[i + 1]), int(lines[i + 2])) for i in range(0, len(lines) - 2, 3)]
        if any(a.job == job for a in arrays):
            return record.with_name(record.name[: -len(".jobs")]), arrays
    raise UsageError(
        f"job {job}: no submission of it in {outbox}/{SCRIPTS_DIR}/ (give the --outbox it was submitted with)"
    )


def parse_squeue(text: str) -> dict[tuple[str, int], TaskState]:
    """``squeue -h -r -t all -o '%F|%K|%T|%r'`` (plus the exit code as a last field) → (array job, task) → state.

    A pending array not yet split into tasks shows a range (``0-5%2``): every task of it is pending."""
    out: dict[tuple[str, int], TaskState] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 4:
            continue
        array, tasks, state, reason = fields[:4]
        code = fields[4].strip() if len(fields) > 4 else ""
        exit_code = int(code) >> 8 if code.isdigit() and state not in ("PENDING", "RUNNING") else None
        for part in tasks.split("%")[0].split(","):
            if not part or not part[0].isdigit():
                continue
            lo, _, hi = part.partition("-")
            for task in range(int(lo), int(hi or lo) + 1):
                out[(array, task)] = TaskState(state, reason, exit_code)
    return out


def slurm_states(
    jobs: Sequence[str], squeue: str = "squeue", scontrol: str = "scontrol"
) -> dict[tuple[str, int], TaskState]:
    """What Slurm still knows of these arrays' tasks (nothing once it forgot them: no sacct without slurmdbd)."""
    done = run_tool(
        [squeue, "-h", "-r", "-t", "all", "-j", ",".join(jobs), "-o", "%F|%K|%T|%r"], "run this where Slurm is"
    )
    states = parse_squeue(done.stdout) if done.returncode == 0 else {}
    # squeue's -o has no exit code; scontrol shows it per task (ExitCode=3:0), one array at a time.
    for job in jobs:
        shown = run_tool([scontrol, "-o", "show", "job", job], "run this where Slurm is")
        for line in shown.stdout.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            key = (fields.get("ArrayJobId", ""), fields.get("ArrayTaskId", ""))
            code = fields.get("ExitCode", "")
            if key[1].isdigit() and (key[0], int(key[1])) in states and ":" in code:
                old = states[(key[0], int(key[1]))]
                if old.state not in ("PENDING", "RUNNING"):
                    states[(key[0], int(key[1]))] = TaskState(old.state, old.reason, int(code.split(":")[0]))
    return states


def verdict(output: Path) -> str:
    """mmd's word on one task: ``ok`` (output and timing sidecar), ``refused`` (error sidecar) or ``missing``."""
    if os.path.lexists(timing_path(output)) and os.path.lexists(output):
        return "ok"
    if os.path.lexists(error_path(output)):
        return "refused"
    return "missing"


def outcomes(script: Path, arrays: Sequence[Array], states: Mapping[tuple[str, int], TaskState]) -> list[TaskOutcome]:
    """Every task of a submission: its input, output, Slurm's state and mmd's verdict."""
    manifest = script.with_name(script.name + ".manifest")
    outputs = script.with_name(script.name + ".outputs")
    try:
        inputs, outs = manifest.read_bytes().splitlines(), outputs.read_bytes().splitlines()
    except OSError as exc:
        raise UnreadableError(f"cannot read {exc.filename}: {exc.strerror}") from None
    result = []
    for a in arrays:
        for task in range(a.count):
            i = a.offset + task
            out = Path(os.fsdecode(outs[i]))
            result.append(
                TaskOutcome(
                    i, f"{a.job}_{task}", Path(os.fsdecode(inputs[i])), out, states.get((a.job, task)), verdict(out)
                )
            )
    return result
