"""Submitting a written script: one ``sbatch`` array per ``MaxArraySize`` tasks, each recorded in
``<script>.jobs``.

A folder larger than the cluster's ``MaxArraySize`` becomes several arrays of the
same script, each given its offset into the manifest as the script's argument.
When the arrays are throttled (``%N``) each waits for the one before
(``--dependency=afterany``), so that N holds over the whole folder.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import OutputError
from .folder import Written
from .script import ArrayOptions, SubmitError, array_spec

#: Slurm's default MaxArraySize is 1001 (task ids 0..1000); larger arrays are refused by sbatch.
DEFAULT_MAX_ARRAY_SIZE = 1001


def run_tool(argv: list[str], what: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``argv`` run (its first word found on PATH, SubmitError naming ``what`` to do where it is not), its output
    captured; SubmitError when it does not answer within ``timeout`` seconds."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise SubmitError(f"{argv[0]} not found on PATH: {what}")
    try:
        return subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{argv[0]} did not answer within {timeout:g} s") from None


def max_array_size(scontrol: str = "scontrol") -> int:
    """The cluster's ``MaxArraySize`` (``scontrol show config``); Slurm's default where it cannot be read."""
    try:
        done = run_tool([scontrol, "show", "config"], "", timeout=30)
    except SubmitError:
        return DEFAULT_MAX_ARRAY_SIZE
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", done.stdout, re.MULTILINE)
    return int(match.group(1)) if match else DEFAULT_MAX_ARRAY_SIZE


@dataclass(frozen=True)
class Array:
    """One submitted array: its job id and its slice of the manifest."""

    job: str
    offset: int
    count: int


def chunks(n: int, max_size: int) -> list[tuple[int, int]]:
    """``(offset, count)`` of each array when ``n`` tasks must fit arrays of task ids ``0..max_size-1``."""
    if max_size < 1:
        raise SubmitError(f"MaxArraySize {max_size}: Slurm allows no array here")
    return [(start, min(max_size, n - start)) for start in range(0, n, max_size)]


def sbatch_argv(script: Path, n: int, offset: int, count: int, options: ArrayOptions, after: str | None) -> list[str]:
    """The sbatch command line of one array; the script's own #SBATCH --array covers a folder in one array."""
    if (offset, count) == (0, n) and after is None:
        return ["--parsable", str(script)]
    argv = ["--parsable", f"--array={array_spec(count, options.max_parallel)}"]
    if after is not None:
        argv.append(f"--dependency=afterany:{after}")
    return [*argv, str(script), str(offset)]


def submit(written: Written, max_size: int, sbatch: str = "sbatch") -> list[Array]:
    """Submit the written script as one array per ``max_size`` tasks; record them in ``<script>.jobs``.

    Throttled arrays run one after another, so that ``%N`` holds over the whole folder. When sbatch
    refuses the first array (no controller, a partition the cluster lacks), nothing was submitted and
    what :func:`write` made is removed; once an array is in, its files stay: its tasks read them."""
    plan = written.plan
    script, n = plan.script, len(plan.tasks)
    how = f"run this on a Slurm login node, or leave out --submit and run `sbatch {shlex.quote(str(script))}` there"
    arrays: list[Array] = []
    for offset, count in chunks(n, max_size):
        after = arrays[-1].job if arrays and plan.options.max_parallel else None
        done = run_tool([sbatch, *sbatch_argv(script, n, offset, count, plan.options, after)], how)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            submitted = f" (arrays {', '.join(a.job for a in arrays)} of {script} were submitted)" if arrays else ""
            if not arrays:
                written.remove()
            raise SubmitError(f"sbatch refused the script: {last}{submitted}")
        arrays.append(Array(done.stdout.strip().split(";")[0], offset, count))
        try:
            with open(jobs_path(script), "a") as f:
                f.write(f"{arrays[-1].job} {offset} {count}\n")
        except OSError as exc:
            raise OutputError(f"cannot write {jobs_path(script)}: {exc.strerror}") from None
    return arrays


def jobs_path(script: Path) -> Path:
    """``<script>.jobs``: the arrays a submission became, ``JOBID OFFSET COUNT`` per line."""
    return script.with_name(script.name + ".jobs")
