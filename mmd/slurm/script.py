"""The array's script: what a submission asks of Slurm (its #SBATCH options, checked), what each task
runs, and the script's text, with the manifest and outputs lists it reads.

Everything in the script that comes from a user is quoted with
:func:`shlex.quote`. ``#SBATCH`` lines are not read by a shell but by sbatch,
so their values are checked against a safe character set instead (Slurm
reads ``%`` in ``--output`` as a pattern, and its own quoting is not shell
quoting). Pure: nothing here reads or writes a file.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..config import Settings
from ..errors import MmdError, UsageError
from ..kernelchoice import KernelChoice

#: The submitting shell's variables a task gets (``#SBATCH --export``): PATH to find mmd,
#: HOME and XDG_* for its config and kernel cache, the locale and time zone for its messages
#: and sidecar times, TMPDIR. Nothing else: not the shell's ``MMD_*`` settings (the script
#: exports the batch's own), nor anything secret. Slurm adds its ``SLURM_*`` variables and
#: the GPU it gave (``CUDA_VISIBLE_DEVICES``), and, as sbatch does for any list, the
#: user's login environment on the node (``SLURM_GET_USER_ENV``).
PASSED_ENV = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")

#: Characters allowed in --job-name, --partition, --account, --qos, --gres values.
_WORD_RE = re.compile(r"[A-Za-z0-9_.,:+=-]+")
_WORD_FORM = "use only letters, digits and _ . , : + = -"


@dataclass(frozen=True)
class PassedOption:
    """An sbatch option that ``mmd submit`` passes through under its own name, onto an #SBATCH line.

    sbatch, not a shell, reads that line, and judges the value's meaning; ``value`` only keeps
    out what would change the line's reading (blanks, quotes, ``#``)."""

    name: str  # sbatch's long option without its dashes, and mmd submit's
    metavar: str
    help: str
    value: re.Pattern[str]
    form: str  # what ``value`` accepts, said to whoever gave another

    @property
    def dest(self) -> str:
        """The option's attribute on argparse's namespace."""
        return self.name.replace("-", "_")


#: The sbatch options a site may require that ``mmd submit`` passes through, in the script's order.
PASSED_OPTIONS: tuple[PassedOption, ...] = (
    PassedOption(
        "time",
        "HH:MM:SS",
        "time limit of each task",
        # Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
        re.compile(r"[0-9]+(:[0-9]{1,2}){0,2}|[0-9]+-[0-9]{1,2}(:[0-9]{1,2}){0,2}"),
        "give MM, HH:MM:SS or D-HH:MM:SS",
    ),
    PassedOption("partition", "NAME", "Slurm partition", _WORD_RE, _WORD_FORM),
    PassedOption("account", "NAME", "Slurm account", _WORD_RE, _WORD_FORM),
    PassedOption("qos", "NAME", "Slurm quality of service", _WORD_RE, _WORD_FORM),
    PassedOption(
        "mem",
        "SIZE",
        "memory of each task's node, e.g. 16G or 500M (a number alone is megabytes)",
        re.compile(r"[0-9]+[KMGTkmgt]?"),
        "give a whole number with an optional K, M, G or T",
    ),
    PassedOption(
        "cpus-per-task", "N", "CPU cores of each task", re.compile(r"[1-9][0-9]*"), "give a whole number, at least 1"
    ),
    PassedOption(
        "constraint",
        "FEATURES",
        "node features each task needs, as sbatch reads them, e.g. a100 or 'a100|h100'",
        re.compile(r"[A-Za-z0-9_.,:+=&|*!()\[\]-]+"),
        "use only letters, digits, _ . , : + = - and Slurm's operators & | * ! ( ) [ ]",
    ),
)
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
class ArrayOptions:
    """The #SBATCH options and what each task runs."""

    job_name: str = "mmd"
    gres: str | None = "gpu:1"  # None: request no GPU (CPU partitions, or a cluster without gres)
    #: What the site requires, as (PassedOption's name, value): passed to sbatch as they are.
    passed: tuple[tuple[str, str], ...] = ()
    max_parallel: int | None = None  # the array's %throttle
    #: Settings every task runs with, as (setting, value): exported as ``MMD_<SETTING>`` so that
    #: each task is the job the daemon would make of the same file, whose name settings override them.
    settings: tuple[tuple[str, str], ...] = ()
    #: The config file every task reads (``MMD_CONFIG``); None: the tasks' own.
    config: Path | None = None
    #: How a compute node starts mmd: the installed ``mmd`` on the node's PATH unless told
    #: otherwise (never the submitting user's venv, which nodes may not see).
    mmd: tuple[str, ...] = ("mmd",)
    #: ``--gpus=N`` instead of ``--gres`` (clusters that schedule GPUs with --gpus); None: use gres.
    gpus: int | None = None
    #: The kernel file every task runs (``mmd run --kernel-file``): copied beside the script, and the copy run.
    kernel_file: Path | None = None
    #: What each task runs after ``mmd``, given ``-o OUTPUT -- INPUT`` (a manifest line and an outputs line):
    #: ``mmd run`` by default; ``mmd grade`` names its own (mmd.grade.array: a student's folder, their part).
    command: tuple[str, ...] = ("run",)


@dataclass(frozen=True)
class ArrayPlan:
    """A submission: its tasks and where its files go."""

    tasks: list[Task]
    outbox: Path
    script: Path
    options: ArrayOptions
    #: The script's folder is this submission's alone: :func:`write` creates it, or the next free
    #: name beside it (the default folder is named by the second, and submissions come faster).
    own_folder: bool = False
    #: ``options.kernel_file`` as mmd read it (its name and sha256), where there is one.
    kernel: KernelChoice | None = None

    @property
    def manifest(self) -> Path:
        return self.script.with_name(self.script.name + ".manifest")

    @property
    def outputs(self) -> Path:
        return self.script.with_name(self.script.name + ".outputs")

    @property
    def logs(self) -> Path:
        return self.script.parent / "logs"

    @property
    def kernel_folder(self) -> Path:
        """Where the kernel file's copy goes: ``<script>.kernel/``."""
        return self.script.with_name(self.script.name + ".kernel")

    @property
    def kernel_copy(self) -> Path | None:
        """The copy of the kernel file the tasks run (None: no kernel file)."""
        return None if self.kernel is None else self.kernel_folder / self.kernel.name


def _word(what: str, value: str) -> str:
    if not _WORD_RE.fullmatch(value):
        raise UsageError(f"{what} {value!r}: {_WORD_FORM}")
    return value


def check_options(options: ArrayOptions) -> None:
    """Refuse option values that cannot go on an #SBATCH line as they are, and settings mmd does not know."""
    try:
        Settings().with_values(dict(options.settings), "mmd submit")
    except MmdError as exc:
        raise UsageError(exc.reason) from None
    _word("--job-name", options.job_name)
    if options.gres is not None:
        _word("--gres", options.gres)
    known = {o.name: o for o in PASSED_OPTIONS}
    for name, value in options.passed:
        if name not in known:
            raise UsageError(f"{name!r} is not an sbatch option mmd submit passes: {', '.join(known)}")
        if not known[name].value.fullmatch(value):
            raise UsageError(f"--{name} {value!r}: {known[name].form}")
    if options.max_parallel is not None and options.max_parallel < 1:
        raise UsageError(f"--max-parallel {options.max_parallel}: must be at least 1")
    if not options.mmd:
        raise UsageError("the command that starts mmd on a node is empty")
    if options.gpus is not None and options.gpus < 0:
        raise UsageError(f"--gpus {options.gpus}: must be 0 or more")
    if options.gpus and options.gres:
        raise UsageError("--gpus and --gres both ask for GPUs: give one of them")
    if options.kernel_file is not None:
        settings = dict(options.settings)
        if "kernel" in settings:
            raise UsageError("give --kernel (one of mmd's own) or --kernel-file, not both")
        if settings.get("backend") == "cpu":
            raise UsageError("a kernel file runs on a GPU: drop --backend cpu")


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


def render_script(plan: ArrayPlan) -> str:
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
    lines.append(f"#SBATCH --export={','.join(PASSED_ENV)}")
    if o.gpus:
        lines.append(f"#SBATCH --gpus={o.gpus}")
    elif o.gres:
        lines.append(f"#SBATCH --gres={o.gres}")
    given = dict(o.passed)
    lines += [f"#SBATCH --{p.name}={given[p.name]}" for p in PASSED_OPTIONS if p.name in given]
    run = shlex.join([*o.mmd, *o.command])
    kernel: list[str] = []
    if plan.kernel is not None and plan.kernel_copy is not None:
        run += ' --kernel-file "$kernel_file"'
        kernel = [
            # repr: a name or path is the user's, and a line break in a comment would end it
            f"# Every task runs the kernel file {plan.kernel.name!r} (sha256 {plan.kernel.sha256}),",
            f"# copied from {str(plan.kernel.path)!r} for this submission alone:",
            f"kernel_file={shlex.quote(str(plan.kernel_copy))}",
        ]
    command = shlex.quote(o.mmd[0])
    exports = [f"export MMD_{key.upper()}={shlex.quote(value)}" for key, value in o.settings]
    if o.config is not None:
        exports.append(f"export MMD_CONFIG={shlex.quote(str(o.config))}")
    lines += [
        f"# Written by mmd {__version__} (mmd submit): {n} job file(s), one array task each.",
        f"# Task i runs `mmd {o.command[0]}` on line i+1 of the manifest, writing the output on line i+1 of the "
        "outputs list.",
        "# Its argument is the array's offset into the manifest (0 when not given): a folder larger",
        "# than MaxArraySize is submitted as several arrays of this script.",
        "# Without Slurm, run one task by hand: SLURM_ARRAY_TASK_ID=0 bash THIS_SCRIPT",
        "set -euo pipefail",
        "# Only the batch's settings: none from the submitting shell or the node's login environment.",
        'for var in $(compgen -e); do [[ $var == MMD_* ]] && unset "$var"; done',
        "# The batch's settings; a file's name settings (NAME@kernel=aplus.txt) override them, as in the daemon.",
        *exports,
        *kernel,
        f"manifest={shlex.quote(str(plan.manifest))}",
        f"outputs={shlex.quote(str(plan.outputs))}",
        'task=${SLURM_ARRAY_TASK_ID:?"not a Slurm array task: set SLURM_ARRAY_TASK_ID"}',
        "offset=${1:-0}",
        "line=$((offset + task + 1))",
        'input=$(LC_ALL=C sed -n "${line}{p;q}" "$manifest")',
        'output=$(LC_ALL=C sed -n "${line}{p;q}" "$outputs")',
        "if [[ -z $input || -z $output ]]; then",
        '    echo "mmd task $task: no line $line in $manifest" >&2',
        "    exit 2",
        "fi",
        f"if ! command -v {command} >/dev/null; then",
        # printf: the command (the user's text) is an argument, never part of the format or a shell word.
        "    printf 'mmd task %s: %s is not a command on %s (PATH=%s); install mmd there or give mmd submit --mmd\\n' "
        f'"$task" {shlex.quote(repr(o.mmd[0]))} "$(hostname)" "$PATH" >&2',
        "    exit 127",
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
