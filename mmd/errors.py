"""mmd's one error hierarchy.

Every failure a user can cause or meet is an :class:`MmdError` subclass that
carries what they need to fix it. The job boundary (:func:`mmd.pipeline.run_job`)
turns these into refusals (an ``<stem>.error.yaml`` and a one-line message);
anything else that escapes is a bug in mmd, not in the input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class ExitStatus(IntEnum):
    """What a command's exit status means (the README's table): systemd and scripts act on these."""

    #: The job ran, the check passed, the daemon stopped when asked.
    OK = 0
    #: The job was refused (its error sidecar says why), or the check found a fault.
    FAILED = 1
    #: The command was misused, or a file it names cannot be read: fix the command line.
    USAGE = 2
    #: ``mmd status``: no daemon serves the inbox.
    NOT_SERVING = 3
    #: The configuration is invalid (sysexits' EX_CONFIG): restarting cannot help, the unit does not.
    CONFIG = 78
    #: Stopped by SIGINT (Ctrl-C) before it was done: 128 + the signal's number, as a shell reports it.
    INTERRUPTED = 130
    #: The standard output's reader stopped reading (``| head``): 128 + SIGPIPE's 13, as a shell reports it.
    PIPE_CLOSED = 141
    #: ``mmd run`` stopped by SIGTERM (scancel, a Slurm time limit): 128 + 15, as a shell reports it.
    TERMINATED = 143


@dataclass(eq=False)
class MmdError(Exception):
    """Base class: a failure with a one-line reason for the user."""

    reason: str
    #: Extra facts for the error sidecar (line, value, limits ...).
    details: dict[str, Any] = field(default_factory=dict)

    #: Short machine-readable kind, written to the error sidecar.
    kind = "error"

    def __post_init__(self) -> None:
        super().__init__(self.reason)

    def __str__(self) -> str:
        return self.reason

    def as_dict(self) -> dict[str, Any]:
        """The error as plain data for the error sidecar."""
        return {"kind": self.kind, "reason": self.reason, **self.details}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> MmdError:
        """The error :meth:`as_dict` described, as its own type (another process's, such as a kernel file's
        launch process): the class of its ``kind``, else a plain MmdError."""
        details = {key: value for key, value in data.items() if key not in ("kind", "reason")}
        kinds: dict[str, type[MmdError]] = {}
        todo: list[type[MmdError]] = [MmdError]
        while todo:
            cls = todo.pop()
            kinds.setdefault(cls.kind, cls)
            todo.extend(cls.__subclasses__())
        return kinds.get(str(data.get("kind")), MmdError)(str(data.get("reason", "failed")), details)


@dataclass(eq=False)
class InputFormatError(MmdError):
    """The input text is not a valid matrix file.

    ``line`` is 1-based; ``value`` is the offending token (shortened), when
    there is one.
    """

    line: int | None = None
    value: str | None = None

    kind = "input"

    def __post_init__(self) -> None:
        if self.line is not None:
            self.details.setdefault("line", self.line)
        if self.value is not None:
            self.details.setdefault("value", self.value)
        super().__post_init__()


class LimitError(MmdError):
    """A configured limit (memory, file size, queue) would be exceeded."""

    kind = "limit"


class ConfigError(MmdError):
    """A configuration file or environment variable is invalid."""

    kind = "config"


class MissingExtra(ConfigError):
    """A command needs an optional part of mmd that this install lacks (:func:`mmd.resources.install_hint` says how
    to add it)."""

    kind = "missing-extra"


class UsageError(ConfigError):
    """A command-line flag is invalid (exit status 2, like argparse's own refusals)."""

    kind = "usage"


class UnreadableError(UsageError):
    """A file a command was given cannot be read, or is not what it should be (an input, an expected output)."""

    kind = "unreadable"


class NotRegularFile(UnreadableError):
    """A file a student made is a symbolic link, a folder, a FIFO or a device: never opened (``mmd check``)."""

    kind = "not-a-file"


class ProductRangeError(MmdError):
    """The product holds a value that is not finite (an overflow's inf, or nan): printf writes no number
    for it, so the output format cannot carry it."""

    kind = "overflow"


class WorkerStartError(ConfigError):
    """The daemon's worker processes cannot start: the interpreter they run from cannot be run here (an install
    made from one this user cannot read). Restarting cannot help, so the unit does not."""

    kind = "worker-start"


class JobNameError(MmdError):
    """A per-job setting in a file name is unknown or not allowed."""

    kind = "jobname"


class BackendUnavailable(MmdError):
    """The requested backend cannot run here (no GPU, no pycuda ...)."""

    kind = "backend"


class KernelError(MmdError):
    """Unknown kernel, or a kernel/tile/memory combination that cannot run."""

    kind = "kernel"


class KernelFileError(KernelError):
    """A kernel file mmd will not compile or cannot run: an include it does not provide, no kernel or two,
    an unknown signature or declaration, a compile error or limit (``FILE:LINE: message`` where it has one)."""

    kind = "kernel-file"


class KernelLaunchError(KernelFileError):
    """A kernel file failed on the GPU, in the process it ran in: it faulted (``cuda_error`` names CUDA's error,
    CUDA_ERROR_ILLEGAL_ADDRESS and the like), ran past its launch's time limit, or its process died. That
    process and its context are gone; nothing else is affected."""

    kind = "kernel-launch"


class TileError(KernelError):
    """A tile size the device cannot launch (detected before launch)."""

    kind = "tile"


class CudaError(MmdError):
    """A CUDA failure during a job (out of memory, launch failure ...)."""

    kind = "cuda"


class SpoolError(MmdError):
    """A spool operation (claim, commit, archive) failed."""

    kind = "spool"


class OutputError(MmdError):
    """The output or its sidecar could not be written (disk full, permissions)."""

    kind = "output"


class JobTimeout(MmdError):
    """A job ran past its time limit (``job_timeout_s``) and was stopped."""

    kind = "timeout"


class JobCancelled(MmdError):
    """Its submitter (or an admin) cancelled the job (``mmd cancel``)."""

    kind = "cancelled"


class CrashedError(MmdError):
    """A job whose runs killed the daemon ``max_attempts`` times: it is not started again."""

    kind = "crashed"


class InternalError(MmdError):
    """A bug in mmd met while running a job: the job is refused with it, the daemon goes on."""

    kind = "internal"

    @classmethod
    def from_exception(cls, exc: BaseException) -> InternalError:
        return cls(f"internal error in mmd: {type(exc).__name__}: {exc}", {"exception": type(exc).__name__})
