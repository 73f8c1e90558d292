"""Slurm job arrays: a folder of job files becomes one ``sbatch --array`` script, one task per file.

What is written (by default in ``OUTBOX/slurm/<timestamp>/``)::

    job.sbatch            the script: #SBATCH options, then one `mmd run` per array task
    job.sbatch.manifest   the input files, one absolute path per line (task i reads line i+1)
    job.sbatch.outputs    the output each task writes, same line
    logs/<array>_<task>.log

Which files are jobs is the daemon's rule (:func:`mmd.spool.is_job_name`):
hidden names and ``*.tmp``, ``*.part``, ``*~`` are not; sub-folders are
ignored; what the daemon refuses unread (:func:`mmd.spool.entry_problem`:
links, non-regular files, files with several hard links) is skipped and
reported. Output names follow the daemon's too (:func:`mmd.spool.safe_name`,
:func:`mmd.spool.resolve_output`): ``m.txt`` →
``m.out``, or ``m.1.out`` when ``m.out`` (or its sidecars) exists or another
file of the submission already has that name. A name with a newline (or CR)
cannot be one manifest line, and a task cannot tell an empty line from a
missing one, so such names are refused.

Everything in the script that comes from a user is quoted with
:func:`shlex.quote`. ``#SBATCH`` lines are not read by a shell but by sbatch,
so their values are checked against a safe character set instead (Slurm
reads ``%`` in ``--output`` as a pattern, and its own quoting is not shell
quoting).

Pure apart from :func:`list_jobs` (reads the folder), :func:`write` and
:func:`submit` (runs ``sbatch``).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from .config import Settings
from .errors import MmdError, OutputError, UnreadableError, UsageError
from .jobname import stem_of
from .spool import entry_problem, is_job_name, names_of, output_path, resolve_output, safe_name

#: Slurm's default MaxArraySize is 1001 (task ids 0..1000); larger arrays are refused by sbatch.
DEFAULT_MAX_ARRAY_SIZE = 1001

#: Characters allowed in --job-name, --partition, --account, --gres values.
_WORD_RE = re.compile(r"[A-Za-z0-9_.,:+=-]+")
#: Slurm time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME_RE = re.compile(r"[0-9]+(:[0-9]{1,2}){0,2}|[0-9]+-[0-9]{1,2}(:[0-9]{1,2}){0,2}")
#: What a path on an #SBATCH line must not contain: sbatch's own quoting and its filename patterns.
_SBATCH_PATH_BAD = re.compile(r'[\s"\'\\%#]')


class SubmitError(MmdError):
    """A folder or option that cannot become a job array."""

    kind = "submit"


@dataclass(frozen=True)
class Task:
    """One array task: ``mmd run INPUT -o OUTPUT``."""

    input: Path
    output: Path


@dataclass(frozen=True)
class Listing:
    """The job files of a folder, and what was left out (name → reason)."""

    jobs: list[Path]
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ArrayOptions:
    """The #SBATCH options and what each task runs."""

    job_name: str = "mmd"
    gres: str | None = "gpu:1"  # None: request no GPU (CPU partitions, or a cluster without gres)
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    max_parallel: int | None = None  # the array's %throttle
    #: Settings every task runs with, as (setting, value): exported as ``MMD_<SETTING>`` so that
    #: each task is the job the daemon would make of the same file, whose name settings override them.
    settings: tuple[tuple[str, str], ...] = ()
    #: The config file every task reads (``MMD_CONFIG``); None: the tasks' own.
    config: Path | None = None
    #: How a compute node starts mmd; by default this very Python (a venv on the shared filesystem).
    mmd: tuple[str, ...] = (sys.executable, "-m", "mmd")


@dataclass(frozen=True)
class Plan:
    """A submission: its tasks and where its files go."""

    tasks: list[Task]
    outbox: Path
    script: Path
    options: ArrayOptions

    @property
    def manifest(self) -> Path:
        return self.script.with_name(self.script.name + ".manifest")

    @property
    def outputs(self) -> Path:
        return self.script.with_name(self.script.name + ".outputs")

    @property
    def logs(self) -> Path:
        return self.script.parent / "logs"


# ---------------------------------------------------------------------------
# the folder


def list_jobs(folder: Path) -> Listing:
    """The job files directly in ``folder``, sorted by name; the daemon's ignore rule applies."""
    folder = Path(folder)
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        raise UnreadableError(f"{folder}: no such folder") from None
    except NotADirectoryError:
        raise UnreadableError(f"{folder} is not a folder") from None
    except OSError as exc:
        raise UnreadableError(f"cannot read {folder}: {exc.strerror}") from None
    jobs: list[Path] = []
    skipped: dict[str, str] = {}
    for entry in entries:
        if not is_job_name(entry.name):
            continue  # hidden, or still being written: silently, as in the inbox
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            continue  # sub-folders are ignored, as in the inbox
        problem = entry_problem(info)  # the daemon's refusals: links, non-regular files, hard links
        if problem:
            skipped[entry.name] = problem
            continue
        if "\n" in entry.name or "\r" in entry.name:
            raise SubmitError(
                f"{entry.name!r} in {folder}: a name with a line break cannot be a manifest line; rename it"
            )
        jobs.append(Path(os.path.abspath(entry.path)))
    return Listing(jobs, skipped)


def plan_tasks(jobs: Sequence[Path], outbox: Path, exists=os.path.lexists) -> list[Task]:
    """One task per job, each with an output name no existing file and no other task has."""
    outbox = Path(os.path.abspath(outbox))
    planned: set[Path] = set()

    def taken(path: Path) -> bool:
        return path in planned or exists(path)

    tasks = []
    for job in jobs:
        if "\n" in str(job) or "\r" in str(job):
            raise SubmitError(f"{str(job)!r}: a path with a line break cannot be a manifest line")
        stem = stem_of(safe_name(job.name))  # the daemon's output name for the same file
        version, _collided = resolve_output(outbox, stem, exists=taken)
        out = output_path(outbox, stem, version)
        planned.update(names_of(out))
        tasks.append(Task(Path(job), out))
    return tasks


# ---------------------------------------------------------------------------
# the script


def _word(what: str, value: str) -> str:
    if not _WORD_RE.fullmatch(value):
        raise UsageError(f"{what} {value!r}: use only letters, digits and _ . , : + = -")
    return value


def check_options(options: ArrayOptions) -> None:
    """Refuse option values that cannot go on an #SBATCH line as they are, and settings mmd does not know."""
    try:
        Settings().with_values(dict(options.settings), "mmd submit")
    except MmdError as exc:
        raise UsageError(exc.reason) from None
    _word("--job-name", options.job_name)
    for what, value in (("--gres", options.gres), ("--partition", options.partition), ("--account", options.account)):
        if value is not None:
            _word(what, value)
    if options.time is not None and not _TIME_RE.fullmatch(options.time):
        raise UsageError(f"--time {options.time!r}: give MM, HH:MM:SS or D-HH:MM:SS")
    if options.max_parallel is not None and options.max_parallel < 1:
        raise UsageError(f"--max-parallel {options.max_parallel}: must be at least 1")
    if not options.mmd:
        raise UsageError("the command that starts mmd on a node is empty")


def array_spec(n: int, max_parallel: int | None = None) -> str:
    """``0-(n-1)`` with an optional ``%max_parallel`` throttle."""
    if n < 1:
        raise SubmitError("no job files to submit")
    spec = f"0-{n - 1}" if n > 1 else "0"
    return f"{spec}%{max_parallel}" if max_parallel else spec


def _sbatch_path(what: str, path: Path) -> str:
    text = str(path)
    if _SBATCH_PATH_BAD.search(text):
        raise UsageError(
            f"{what} {text!r} goes on an #SBATCH line, which cannot hold spaces, quotes, '#', '%' or '\\'; "
            "give --script-out in a plainer folder"
        )
    return text


def render_script(plan: Plan) -> str:
    """The sbatch script's text."""
    o = plan.options
    check_options(o)
    n = len(plan.tasks)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={o.job_name}",
        f"#SBATCH --array={array_spec(n, o.max_parallel)}",
        f"#SBATCH --output={_sbatch_path('the log folder', plan.logs)}/%A_%a.log",
    ]
    if o.gres:
        lines.append(f"#SBATCH --gres={o.gres}")
    if o.time:
        lines.append(f"#SBATCH --time={o.time}")
    if o.partition:
        lines.append(f"#SBATCH --partition={o.partition}")
    if o.account:
        lines.append(f"#SBATCH --account={o.account}")
    run = shlex.join([*o.mmd, "run"])
    exports = [f"export MMD_{key.upper()}={shlex.quote(value)}" for key, value in o.settings]
    if o.config is not None:
        exports.append(f"export MMD_CONFIG={shlex.quote(str(o.config))}")
    lines += [
        f"# Written by mmd {__version__} (mmd submit): {n} job file(s), one array task each.",
        "# Task i runs `mmd run` on line i+1 of the manifest, writing the output on line i+1 of the outputs list.",
        "# Without Slurm, run one task by hand: SLURM_ARRAY_TASK_ID=0 bash THIS_SCRIPT",
        "set -euo pipefail",
        "# The batch's settings; a file's name settings (NAME@kernel=aplus.txt) override them, as in the daemon.",
        *exports,
        f"manifest={shlex.quote(str(plan.manifest))}",
        f"outputs={shlex.quote(str(plan.outputs))}",
        'task=${SLURM_ARRAY_TASK_ID:?"not a Slurm array task: set SLURM_ARRAY_TASK_ID"}',
        "line=$((task + 1))",
        'input=$(LC_ALL=C sed -n "${line}{p;q}" "$manifest")',
        'output=$(LC_ALL=C sed -n "${line}{p;q}" "$outputs")',
        "if [[ -z $input || -z $output ]]; then",
        '    echo "mmd task $task: no line $line in $manifest" >&2',
        "    exit 2",
        "fi",
        'echo "mmd task $task on $(hostname): $input -> $output" >&2',
        f'exec {run} -o "$output" -- "$input"',
        "",
    ]
    return "\n".join(lines)


def manifest_bytes(paths: Sequence[Path]) -> bytes:
    """One path per line, as the filesystem spells it (not re-encoded)."""
    out = []
    for path in paths:
        raw = os.fsencode(path)
        if b"\n" in raw or b"\r" in raw:
            raise SubmitError(f"{str(path)!r}: a path with a line break cannot be a manifest line")
        out.append(raw + b"\n")
    return b"".join(out)


#: mmd's own folder in an outbox (never a student's: ``mmd check --by-student`` passes it over).
SCRIPTS_DIR = "slurm"


def default_script_path(outbox: Path, now: _dt.datetime | None = None) -> Path:
    """``OUTBOX/slurm/<YYYYmmdd-HHMMSS>/job.sbatch``."""
    now = now or _dt.datetime.now()
    return Path(os.path.abspath(outbox)) / SCRIPTS_DIR / now.strftime("%Y%m%d-%H%M%S") / "job.sbatch"


def make_plan(folder: Path, outbox: Path, options: ArrayOptions, script: Path | None = None) -> tuple[Plan, Listing]:
    """List ``folder`` and plan one task per job file; nothing is written."""
    check_options(options)
    listing = list_jobs(folder)
    if not listing.jobs:
        raise SubmitError(f"no job files in {folder}")
    outbox = Path(os.path.abspath(outbox))
    tasks = plan_tasks(listing.jobs, outbox)
    script = Path(os.path.abspath(script)) if script else default_script_path(outbox)
    plan = Plan(tasks, outbox, script, options)
    render_script(plan)  # refuse bad paths before anything is written
    return plan, listing


def write(plan: Plan) -> Path:
    """Write the manifest, the outputs list and the script (executable); create outbox and logs.

    OutputError when one cannot be written (a file in the way, no permission)."""
    manifest, outputs = manifest_bytes([t.input for t in plan.tasks]), manifest_bytes([t.output for t in plan.tasks])
    script = render_script(plan)
    where = plan.outbox
    try:
        for where in (plan.outbox, plan.logs, plan.script.parent):
            where.mkdir(parents=True, exist_ok=True)
        for where, data in ((plan.manifest, manifest), (plan.outputs, outputs), (plan.script, script.encode())):
            where.write_bytes(data)
        plan.script.chmod(0o755)
    except OSError as exc:
        raise OutputError(f"cannot write {where}: {exc.strerror}") from None
    return plan.script


def submit(script: Path, sbatch: str = "sbatch") -> str:
    """Run ``sbatch --parsable SCRIPT``; returns the job id."""
    exe = shutil.which(sbatch)
    if exe is None:
        raise SubmitError(
            f"{sbatch} not found on PATH: run this on a Slurm login node, or leave out --submit "
            f"and run `sbatch {shlex.quote(str(script))}` there"
        )
    try:
        done = subprocess.run([exe, "--parsable", str(script)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise SubmitError("sbatch did not answer within 120 s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise SubmitError(f"sbatch refused the script: {last}")
    return done.stdout.strip().split(";")[0]
