"""A folder of job files as a submission: its jobs listed, one task each planned, and the
submission's files written (by default in ``OUTBOX/slurm/<timestamp>/``, a folder of its own).

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

A job file that an earlier submission into the same outbox finished (its output
and timing sidecar, or its error sidecar, are there and no older than the file)
is not submitted again (:func:`finished_before`); ``--redo`` submits it anyway,
under a new output name.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..atomic import write_atomic
from ..errors import OutputError, UnreadableError
from ..jobname import stem_of
from ..kernelchoice import KernelChoice
from ..record import error_path, timing_path
from ..spool import entry_problem, is_job_name, names_of, output_path, resolve_output, safe_name
from .script import ArrayOptions, ArrayPlan, SubmitError, Task, check_options, manifest_bytes, render_script


@dataclass(frozen=True)
class Listing:
    """The job files of a folder, and what was left out (name → reason)."""

    jobs: list[Path]
    skipped: dict[str, str] = field(default_factory=dict)


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
) -> tuple[ArrayPlan, Listing]:
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
    plan = ArrayPlan(plan_tasks(todo, outbox), outbox, script, options, own_folder, kernel)
    if todo:
        render_script(plan)  # refuse bad paths before anything is written
    return plan, listing


@dataclass(frozen=True)
class Written:
    """A plan as :func:`write` wrote it: its script where it went, and what the write made."""

    plan: ArrayPlan
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


def write(plan: ArrayPlan) -> Written:
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
    from ..kernelfile.reading import SIDECAR_SUFFIX

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
