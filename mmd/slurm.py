"""Slurm job arrays: a folder of job files becomes one ``sbatch --array`` script, one task per file.

What is written (by default in ``OUTBOX/slurm/<timestamp>/``, a folder of its own for each
submission)::

    job.sbatch            the script: #SBATCH options, then one `mmd run` per array task
    job.sbatch.manifest   the input files, one absolute path per line (task i of the array
                          submitted with offset K reads line K+i+1)
    job.sbatch.outputs    the output each task writes, same line
    job.sbatch.jobs       after --submit: one line per array, "JOBID OFFSET COUNT"
    job.sbatch.kernel/    with --kernel-file: the kernel file's copy (and its NAME.kernel.yaml),
                          which every task runs (`mmd run --kernel-file`); made for this
                          submission alone, so a later one never changes what its tasks run
    logs/<array>_<task>.log

A folder larger than the cluster's ``MaxArraySize`` becomes several arrays of the
same script, each given its offset into the manifest as the script's argument.
When the arrays are throttled (``%N``) each waits for the one before
(``--dependency=afterany``), so that N holds over the whole folder.

A job file that an earlier submission into the same outbox finished (its output
and timing sidecar, or its error sidecar, are there and no older than the file)
is not submitted again (:func:`finished_before`); ``--redo`` submits it anyway,
under a new output name.

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

Pure apart from :func:`list_jobs` and :func:`finished_before` (read the
outbox), :func:`write`, and :func:`submit`, :func:`max_array_size` and
:func:`slurm_states` (run ``sbatch``, ``scontrol``, ``squeue``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import os
import re
import shlex
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import __version__
from .atomic import write_atomic
from .config import Settings
from .errors import MmdError, OutputError, UnreadableError, UsageError
from .jobname import stem_of
from .kernelchoice import KernelChoice
from .record import error_path, timing_path
from .spool import entry_problem, is_job_name, names_of, output_path, resolve_output, safe_name

#: Slurm's default MaxArraySize is 1001 (task ids 0..1000); larger arrays are refused by sbatch.
DEFAULT_MAX_ARRAY_SIZE = 1001

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
class Listing:
    """The job files of a folder, and what was left out (name → reason)."""

    jobs: list[Path]
    skipped: dict[str, str] = field(default_factory=dict)


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
class Plan:
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


def chunks(n: int, max_size: int) -> list[tuple[int, int]]:
    """``(offset, count)`` of each array when ``n`` tasks must fit arrays of task ids ``0..max_size-1``."""
    if max_size < 1:
        raise SubmitError(f"MaxArraySize {max_size}: Slurm allows no array here")
    return [(start, min(max_size, n - start)) for start in range(0, n, max_size)]


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


#: mmd's own folder in an outbox (never a student's: ``mmd check --by-student`` passes it over).
SCRIPTS_DIR = "slurm"


def default_script_path(outbox: Path, now: _dt.datetime | None = None) -> Path:
    """``OUTBOX/slurm/<YYYYmmdd-HHMMSS>/job.sbatch``."""
    now = now or _dt.datetime.now()
    return Path(os.path.abspath(outbox)) / SCRIPTS_DIR / now.strftime("%Y%m%d-%H%M%S") / "job.sbatch"


def finished_before(outbox: Path) -> dict[Path, Path]:
    """Input → what an earlier submission into ``outbox`` finished for it: its output, or its error sidecar
    where it was refused.

    Finished: its timing sidecar (committed after the output) or its error sidecar is
    there, and the input is no newer than that sidecar (a file changed since runs again).
    Read from the manifests and outputs lists under ``OUTBOX/slurm/``."""
    done: dict[Path, Path] = {}
    for manifest in sorted(Path(outbox).glob(f"{SCRIPTS_DIR}/*/*.manifest")):
        outputs = manifest.with_name(manifest.name[: -len(".manifest")] + ".outputs")
        try:
            pairs = zip(manifest.read_bytes().splitlines(), outputs.read_bytes().splitlines(), strict=False)
        except OSError:
            continue  # a submission being written, or not mmd's
        for raw_in, raw_out in pairs:
            job, out = Path(os.fsdecode(raw_in)), Path(os.fsdecode(raw_out))
            for sidecar, shown in ((timing_path(out), out), (error_path(out), error_path(out))):
                try:
                    if os.stat(job).st_mtime <= os.stat(sidecar).st_mtime:
                        done[job] = shown
                except OSError:
                    continue
    return done


def make_plan(
    folder: Path,
    outbox: Path,
    options: ArrayOptions,
    script: Path | None = None,
    done: Mapping[Path, Path] | None = None,
) -> tuple[Plan, Listing]:
    """List ``folder`` and plan one task per job file not in ``done``; nothing is written.

    The returned listing's ``skipped`` names the files left out, and why."""
    check_options(options)
    listing = list_jobs(folder)
    if not listing.jobs:
        raise SubmitError(f"no job files in {folder}")
    done = done or {}
    skipped = dict(listing.skipped)
    todo = []
    for job in listing.jobs:
        if job in done:
            skipped[job.name] = f"finished already by an earlier submission: {done[job]} (--redo runs it again)"
        else:
            todo.append(job)
    listing = Listing(todo, skipped)
    outbox = Path(os.path.abspath(outbox))
    own_folder = script is None
    script = Path(os.path.abspath(script)) if script else default_script_path(outbox)
    kernel = None
    if options.kernel_file is not None:  # a file mmd refuses is refused now, not in every task
        kernel = KernelChoice.of_file(Path(os.path.abspath(options.kernel_file)))
    plan = Plan(plan_tasks(todo, outbox), outbox, script, options, own_folder, kernel)
    if todo:
        render_script(plan)  # refuse bad paths before anything is written
    return plan, listing


@dataclass(frozen=True)
class Written:
    """A plan as :func:`write` wrote it: its script where it went, and what the write made."""

    plan: Plan
    folders: tuple[Path, ...]  # the folders it created, outermost first
    files: tuple[Path, ...]

    def remove(self) -> None:
        """Remove what the write made (a submission that never reached Slurm leaves nothing)."""
        for path in self.files:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        for folder in reversed(self.folders):
            with contextlib.suppress(OSError):  # not empty: someone else's files are in it now
                folder.rmdir()


def _make_folders(folder: Path, created: list[Path]) -> None:
    """``folder`` and its missing parents, each one created appended to ``created``."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue  # made meanwhile by another process: not ours to remove
        created.append(folder)


def _own_folder(first: Path, created: list[Path]) -> Path:
    """``first``, else ``first-001``, ``first-002`` ...: the first name no folder had, created.

    Created exclusively, so that two submissions never share one; zero-padded, so that the names
    sort in the order they were made."""
    folder, n = first, 0
    while True:
        try:
            folder.mkdir()
        except FileExistsError:
            n += 1
            folder = first.with_name(f"{first.name}-{n:03d}")
            continue
        created.append(folder)
        return folder


def write(plan: Plan) -> Written:
    """Write the manifest, the outputs list and the script (executable); create outbox and logs.

    OutputError when one cannot be written (a file in the way, no permission); what it made
    until then is removed."""
    folders: list[Path] = []
    files: list[Path] = []
    where = plan.outbox
    try:
        _make_folders(plan.outbox, folders)
        if plan.own_folder:
            where = plan.script.parent
            _make_folders(where.parent, folders)
            plan = replace(plan, script=_own_folder(where, folders) / plan.script.name)
        for where in (plan.script.parent, plan.logs):
            _make_folders(where, folders)
        manifest = manifest_bytes([t.input for t in plan.tasks])
        outputs = manifest_bytes([t.output for t in plan.tasks])
        script = render_script(plan)
        for where, data, mode in (
            (plan.manifest, manifest, 0o644),
            (plan.outputs, outputs, 0o644),
            (plan.script, script.encode(), 0o755),
        ):
            write_atomic(where, [data], durable=False, mode=mode)
            files.append(where)
        if plan.kernel is not None:
            where = plan.kernel_folder
            _copy_kernel(plan.kernel, where, folders, files)
    except OSError as exc:
        Written(plan, tuple(folders), tuple(files)).remove()
        raise OutputError(f"cannot write {where}: {exc.strerror}") from None
    except BaseException:  # interrupted, or a refusal: half a submission is none
        Written(plan, tuple(folders), tuple(files)).remove()
        raise
    return Written(plan, tuple(folders), tuple(files))


def _copy_kernel(kernel: KernelChoice, folder: Path, folders: list[Path], files: list[Path]) -> None:
    """``kernel``'s file (the bytes mmd read: OutputError where they changed since) and its ``NAME.kernel.yaml``,
    where it has one, into ``folder``, made now for them alone (OutputError where it exists: another submission's
    tasks may be reading theirs)."""
    from .kernelfile.reading import SIDECAR_SUFFIX

    assert kernel.path is not None
    try:
        folder.mkdir()
    except FileExistsError:
        raise OutputError(
            f"{folder} exists: another submission's kernel file, which its tasks may still run; give another "
            "--script-out"
        ) from None
    folders.append(folder)
    data = kernel.path.read_bytes()
    if hashlib.sha256(data).hexdigest() != kernel.sha256:
        raise OutputError(f"{kernel.path} changed while it was being submitted; submit again")
    declaration = kernel.path.with_name(kernel.path.name.rsplit(".", 1)[0] + SIDECAR_SUFFIX)
    copies = [(folder / kernel.name, data)]
    if declaration.is_file():
        copies.append((folder / declaration.name, declaration.read_bytes()))
    for where, content in copies:
        write_atomic(where, [content], durable=False)
        files.append(where)


def _run(argv: list[str], what: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
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
        done = _run([scontrol, "show", "config"], "", timeout=30)
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
        done = _run([sbatch, *sbatch_argv(script, n, offset, count, plan.options, after)], how)
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


# ---------------------------------------------------------------------------
# an array's outcome: `mmd submit --status JOBID`


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
    done = _run([squeue, "-h", "-r", "-t", "all", "-j", ",".join(jobs), "-o", "%F|%K|%T|%r"], "run this where Slurm is")
    states = parse_squeue(done.stdout) if done.returncode == 0 else {}
    # squeue's -o has no exit code; scontrol shows it per task (ExitCode=3:0), one array at a time.
    for job in jobs:
        shown = _run([scontrol, "-o", "show", "job", job], "run this where Slurm is")
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
