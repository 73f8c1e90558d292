"""The job: one input file, the settings it runs with, and where its results go.

Every way in builds its jobs here, with :func:`describe`: `mmd run`, the
daemon's workers, Slurm array tasks (which run `mmd run`) and the benchmark's
``--through-files`` mode. A job's settings are layered, lowest first:

    built-in defaults < config file < MMD_* environment < the file name's settings < command-line flags

(:mod:`mmd.config` makes the first three; ``mmd serve``'s flags belong to
the service and sit with them, so a file's name settings override them).
A flag that contradicts a name setting is refused with a message naming
both. Whatever the file name gets wrong is not raised: it becomes the job's
:attr:`Job.refusal`, which the pipeline turns into an error sidecar like any
other refused input, so every way in refuses a job the same way.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import jobname
from .backends.base import MultiplyRequest
from .config import COMMAND_LINE, Settings
from .errors import JobNameError, MmdError
from .kernelchoice import SUFFIX
from .record import Context


@dataclass(frozen=True)
class Job:
    """One validated, immutable job description."""

    #: 12 hex digits, in the sidecar and every log line of the job.
    id: str
    #: The file to read.
    input: Path
    #: Where the output goes; the sidecars are its siblings.
    output: Path
    #: The effective settings: defaults < config < environment < name < flags.
    settings: Settings
    #: What the file name set (kernel, tile, backend, memory), as the sidecar records it.
    name_settings: Mapping[str, Any] = field(default_factory=dict)
    #: ``time.perf_counter()`` when the job began (the daemon's claim): ``overall`` counts from here.
    started: float = field(default_factory=time.perf_counter)
    #: ``time.time()`` when its input arrived, the sidecar's ``turnaround_ms`` counts from here: the daemon's
    #: first sight of the file, or the job's start where no ``started`` is given (``mmd run``); None: not known.
    arrived: float | None = None
    #: How the job came in (the daemon's facts), recorded in its sidecar.
    context: Context = field(default_factory=Context)
    #: Why the job is refused before its input is read (a bad name, a conflicting flag, a link ...).
    refusal: MmdError | None = None
    #: The kernel file the job runs, in a process of its own (``mmd run --kernel-file``, or a kernel folder's file
    #: its name picked); None: ``settings.kernel``, one of mmd's own.
    kernel_file: Path | None = None

    @property
    def request(self) -> MultiplyRequest:
        """What the backend is asked to run."""
        s = self.settings
        return MultiplyRequest(kernel=s.kernel, tile=s.tile, memory=s.memory, text_path=s.text_path)


def new_id() -> str:
    """A fresh job id: 12 hex digits (48 random bits; a uuid4 would be made only to be cut to them)."""
    return os.urandom(6).hex()


def own_kernels(base: Settings, submitter: str | None, pinned: Path | None = None) -> jobname.OwnKernels | None:
    """The kernels ``submitter`` handed in, where the service lets students' kernels run (``student_kernels``;
    class mode); None: no one's. ``pinned``: a version of one of them (``.v/<version>/NAME.cu``) picked when the
    job was queued: ``NAME`` picks it, whatever was handed in since."""
    if not (base.student_kernels and base.class_mode and base.state_dir is not None and submitter):
        return None
    # imported here: a kernel file's reading (its lexer, its sandbox) is class mode's, not every job's start
    from .kernelfile.store import KernelStore

    store = KernelStore.of(base.state_dir)

    def pick(name: str) -> Path | None:
        if pinned is not None and pinned.name == name + SUFFIX and pinned.is_file():
            return pinned
        return store.pick(submitter, name)

    return pick


def describe(
    input: Path,
    output: Path,
    base: Settings,
    *,
    flags: Mapping[str, Any] | None = None,
    name: str | None = None,
    job_id: str | None = None,
    started: float | None = None,
    arrived: float | None = None,
    context: Context | None = None,
    refusal: MmdError | None = None,
    kernel_file: Path | None = None,
    pinned: Path | None = None,
) -> Job:
    """The job for ``input``, its settings resolved from ``base``, the name's settings and ``flags``.

    ``name`` is the file name the settings are read from (default: the
    input's; the daemon passes the name the file was dropped under).
    ``flags`` are command-line settings for this one job (None values: not
    given). ``refusal``: a reason the caller already has to refuse the job.
    ``kernel_file``: the kernel file the command line gives (``--kernel-file``);
    a name's ``kernel=NAME`` picks one from ``base.kernel_folders``, or the submitter's own handed-in kernel
    (``pinned``: the version picked when the job was queued; :func:`own_kernels`).
    Never raises for what the name says: see :attr:`Job.refusal`.
    """
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    settings, overrides = base, {}
    try:
        parsed = jobname.parse(
            name if name is not None else input.name,
            base.kernel_folders,
            own_kernels(base, context.submitter if context else None, pinned),
        )
        overrides = parsed.overrides
        _check_conflicts(jobname.settings_of(overrides), given)
        if kernel_file is not None and "kernel" in overrides:
            raise JobNameError(
                f"the file name sets kernel={overrides['kernel']} but the command line gives --kernel-file "
                f"{kernel_file.name}; drop one",
                {"key": "kernel", "name_value": overrides["kernel"], "kernel_file": kernel_file.name},
            )
        jobname.check_allowed(overrides, base)
        kernel_file = kernel_file or parsed.kernel_file
        # a kernel folder's file is the job's own kernel_file, not the kernel setting (mmd's own kernels only)
        applied = {k: v for k, v in overrides.items() if k != "kernel" or parsed.kernel_file is None}
        if applied:
            settings = settings.with_values(jobname.settings_of(applied), "file name")
        if given:
            settings = settings.with_values(given, COMMAND_LINE)
    except MmdError as exc:
        refusal = refusal or exc
    context = context or Context()
    if overrides:
        context = dataclasses.replace(context, name_settings=dict(overrides))
    return Job(
        id=job_id or new_id(),
        input=input,
        output=output,
        settings=settings,
        name_settings=dict(overrides),
        started=time.perf_counter() if started is None else started,
        arrived=time.time() if arrived is None and started is None else arrived,
        context=context,
        refusal=refusal,
        kernel_file=kernel_file,
    )


def _check_conflicts(overrides: Mapping[str, Any], flags: Mapping[str, Any]) -> None:
    """A flag may repeat a name setting, never contradict it."""
    for key, value in overrides.items():
        if key in flags and flags[key] != value:
            raise JobNameError(
                f"the file name sets {key}={value} but the command line gives --{key} {flags[key]}; drop one",
                {"key": key, "name_value": value, "flag_value": flags[key]},
            )
