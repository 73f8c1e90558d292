"""The one job driver: read → parse → multiply → emit → commit output, then sidecar.

`mmd run`, the daemon's workers and the benchmark's ``--through-files`` mode
call :func:`run_job` with a :class:`~mmd.job.Job`; none of them has its own
copy of these steps. The job boundary is here: every :class:`MmdError`
becomes a refusal (:mod:`.refusal`), written as ``<stem>.error.yaml`` beside
the output path, and nothing is written to the output path itself.

A job whose kernel is a file (:attr:`Job.kernel_file`) runs on a
:class:`~mmd.backends.kernelfile.KernelFileBackend` made for it here (by
:func:`kernel_file_backend`, or a caller's :data:`KernelFileFor`), whatever way
it came in: its kernel runs in a process of its own, never on the caller's
backend (a daemon worker's CUDA context serves other users' jobs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import record, textformat
from ..atomic import Staged, StreamHash
from ..backends.base import CUDA_PHASES, Backend, Product
from ..config import Settings, kernel_cache_dir
from ..errors import MmdError
from ..fileops import OPS, FileOps
from ..job import Job
from ..logs import get_logger
from ..record import FileFacts, Record, Requested, Shape, TimingRecord
from ..record.writer import dumps
from .phases import PhaseHook, ignore_phase
from .reading import Room, check_header, check_output_size, limits_for, read_header, read_input
from .refusal import Refusal, commit
from .textpaths import choose

if TYPE_CHECKING:
    from ..backends.kernelfile import KernelFileBackend
    from ..kernelfile.launch import LaunchProcess

#: Opens (or hands out an open) backend for a job's settings; BackendUnavailable when it cannot.
BackendFor = Callable[[Settings], Backend]
#: Makes the backend of a kernel file's job (its path, the job's settings): :func:`kernel_file_backend`, or one
#: that hands it a launch process started beforehand (``mmd run``'s :class:`mmd.oneshot.OneShot`). The job
#: closes it.
KernelFileFor = Callable[[Path, Settings], Backend]


@dataclass
class JobResult:
    """What a job did: ``record`` is exactly what its sidecar says."""

    job: Job
    record: Record
    #: The sidecar's path (timing or error).
    sidecar: Path
    error: MmdError | None = None
    #: Why the error sidecar could not be written (None: it was, or the job succeeded).
    sidecar_failed: str | None = None
    product: Product | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output(self) -> Path | None:
        return self.job.output if self.ok else None


def _logger(job: Job) -> Any:
    """The job's logger, its id and file bound."""
    return get_logger(job=job.id, file=job.input.name)


def _since(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


def _turnaround(job: Job) -> float | None:
    """Milliseconds since ``job``'s input arrived (wall clock: the daemon's main process saw it), to the µs."""
    return None if job.arrived is None else round((time.time() - job.arrived) * 1e3, 3)


def run_job(
    job: Job,
    backend_for: BackendFor,
    on_phase: PhaseHook = ignore_phase,
    *,
    ops: FileOps = OPS,
    staged: Staged | None = None,
    room: Room | None = None,
    kernel_file_for: KernelFileFor | None = None,
) -> JobResult:
    """Run ``job`` end to end and commit its output and sidecar; never raises MmdError.

    ``on_phase`` hears each phase the job enters (a worker shows it to its supervisor).
    ``ops`` does the commits' file operations (the daemon passes its spool's).
    ``staged``: write the output and sidecar (or the error sidecar) there and
    leave their publishing to the caller (a worker's group commit); the
    result then says what the job will be once published. ``room``: the
    most its output may take now (the daemon's quota and disk reserve). ``kernel_file_for``: makes a
    kernel file's backend (default :func:`kernel_file_backend`).
    """
    timings: dict[str, float] = {}
    facts = _Facts(job)
    own: Backend | None = None  # the kernel file's backend, made for this job alone
    try:
        if job.refusal is not None:
            raise job.refusal
        backend: Backend
        if job.kernel_file is not None:
            backend = own = (kernel_file_for or kernel_file_backend)(job.kernel_file, job.settings)
        else:
            backend = backend_for(job.settings)
        facts.backend = backend.name
        return _run(job, backend, timings, facts, on_phase, ops, staged, room)
    except MmdError as exc:
        return _refuse(job, exc, timings, facts, ops, staged)
    finally:
        if own is not None:
            own.close()  # its launch process: never left behind


def kernel_file_backend(path: Path, settings: Settings, process: LaunchProcess | None = None) -> KernelFileBackend:
    """The backend that runs ``path``'s kernel for jobs of ``settings``: their device, kernel cache and limits, each
    launch held to the smaller of ``kernel_file_launch_timeout_s`` and ``job_timeout_s`` (KernelFileError: the
    file is refused); ``process``: its launch process, started beforehand for these settings."""
    from ..backends.kernelfile import KernelFileBackend, KernelFileSettings  # the launch's modules: only for one

    return KernelFileBackend(
        path,
        KernelFileSettings(
            device=settings.device,
            kernel_cache=kernel_cache_dir(settings),
            launch_timeout_s=min(settings.kernel_file_launch_timeout_s, settings.job_timeout_s),
            max_dim=settings.max_dim,
            max_memory_bytes=limits_for(settings).max_memory_bytes,
        ),
        process,
    )


def refuse(
    job: Job,
    error: MmdError,
    timings: dict[str, float] | None = None,
    *,
    ops: FileOps = OPS,
    staged: Staged | None = None,
) -> JobResult:
    """Refuse ``job`` without running it (a bug of the daemon's around it, a time limit): its error sidecar."""
    return _refuse(job, error, dict(timings or {}), _Facts(job), ops, staged)


class _Facts:
    """What is known of a job so far, for its refusal."""

    def __init__(self, job: Job) -> None:
        self.input = FileFacts(job.input.name)
        self.shape: Shape | None = None
        self.backend: str | None = None
        kernel = job.kernel_file.name if job.kernel_file is not None else job.settings.kernel
        self.requested = Requested(kernel, job.settings.tile, job.settings.memory)
        self.hasher: StreamHash | None = None


def _run(
    job: Job,
    backend: Backend,
    timings: dict[str, float],
    facts: _Facts,
    on_phase: PhaseHook,
    ops: FileOps,
    staged: Staged | None,
    room: Room | None,
) -> JobResult:
    settings, request = job.settings, job.request
    limits = limits_for(settings) if room is None else dataclasses.replace(limits_for(settings), room=room)

    on_phase("read")
    t0 = time.perf_counter()
    # The header from the file's first bytes: a bad one, or a size it cannot match, is refused unread.
    head = read_header(job.input, limits)
    first = head.header
    facts.shape = Shape(first.m, first.k, first.n)
    check_header(first, head.size, limits)
    path = choose(backend, request, head.size)
    facts.hasher = hasher = StreamHash()
    data = read_input(job.input, limits, into=path.input_buffer(), hasher=hasher, head=head)
    timings["read"] = _since(t0)
    facts.input = FileFacts(job.input.name, bytes=len(data))

    on_phase("parse")
    t0 = time.perf_counter()
    if head.whole is not None and len(data) == head.size:
        header, shape = first, facts.shape  # the bytes the header was parsed and checked from: read once
    else:
        header = textformat.parse_header(data)
        facts.shape = shape = Shape(header.m, header.k, header.n)
        check_header(header, len(data), limits)
    header_ms = _since(t0)
    data_len = len(data)
    computed = path.compute(data, header, request, on_phase)
    del data
    product = computed.product
    timings.update(product.timings_ms)
    if all(p in product.timings_ms for p in CUDA_PHASES):
        timings["cuda"] = sum(product.timings_ms[p] for p in CUDA_PHASES)
    # The header judged the output at its least; the product known, it is judged at its real size.
    check_output_size(header, data_len, limits, computed.size)

    t0 = time.perf_counter()
    # Both files are published together (synced, then renamed in order, one fsync of the folder):
    # the output's writeback runs while its sidecar is made. A group's are synced with its group's.
    commit = staged if staged is not None else Staged(durable=settings.durable, ops=ops)
    # From the output's first byte to the publish, whatever stops the job (a fault, SIGTERM's SystemExit in mmd
    # run) takes the temporaries with it
    try:
        written = commit.write(job.output, computed.chunks)
        timings["write"] = _since(t0)
        timings["parse"] = header_ms + computed.stage_ms.get("parse", 0.0)
        timings["emit"] = computed.stage_ms.get("emit", 0.0)
        if computed.text.path == "host":  # the host path formats while it writes: the write is the rest
            timings["write"] -= timings["emit"]
        facts.input = FileFacts(job.input.name, bytes=facts.input.bytes, sha256=hasher.hexdigest())
        kernel_ms = product.timings_ms.get("kernel")
        m, k, n = header.m, header.k, header.n
        timings["overall"] = _since(job.started)
        rec = TimingRecord(
            job=job.id,
            input=facts.input,
            output=FileFacts(job.output.name, bytes=written.bytes, sha256=written.sha256),
            shape=shape,
            backend=backend.name,
            kernel=product.kernel,
            tile=product.tile,
            memory=product.memory,
            device=product.device,
            requested=facts.requested,
            timings_ms=record.timings(timings),
            text=computed.text,
            gflops=round(2.0 * m * k * n / (kernel_ms * 1e6), 3) if kernel_ms else None,
            notes=list(product.notes) or None,
            kernel_file=product.kernel_file,
            turnaround_ms=_turnaround(job),
            context=job.context,
            finished_at=record.now_iso(),
        )
        sidecar = record.timing_path(job.output)
        # The sidecar is committed last: its presence means the job is complete.
        commit.write(sidecar, [dumps(rec)])
        if staged is None:
            commit.publish()
    except BaseException:
        commit.discard()
        raise
    # Its logger is bound only now, the commit done: a lone job's sidecar does not wait for it.
    _logger(job).info(
        "job done",
        status="ok",
        shape=f"{m}x{k}x{n}",
        kernel=product.kernel,
        tile=product.tile,
        **{f"{key}_ms": round(v, 3) for key, v in timings.items()},
    )
    return JobResult(job, rec, sidecar, product=product)


def _refuse(
    job: Job,
    exc: MmdError,
    timings: dict[str, float],
    facts: _Facts,
    ops: FileOps,
    staged: Staged | None = None,
) -> JobResult:
    """Write the error sidecar for a refused job; the output path is left untouched."""
    if facts.hasher is not None:
        facts.input = FileFacts(job.input.name, bytes=facts.input.bytes, sha256=facts.hasher.hexdigest())
    elif facts.input.bytes is None:
        with contextlib.suppress(OSError):  # a job refused before it was read still says how big its file is
            facts.input = FileFacts(job.input.name, bytes=os.lstat(job.input).st_size)
    timings["overall"] = _since(job.started)
    refusal = Refusal(
        exc,
        job.id,
        facts.input,
        job.output,
        timings,
        shape=facts.shape,
        backend=facts.backend,
        requested=facts.requested,
        context=job.context,
        turnaround_ms=_turnaround(job),
    )
    done = commit(refusal, durable=job.settings.durable, ops=ops, staged=staged)
    _logger(job).warning("job refused", status="error", kind=exc.kind, reason=exc.reason)
    return JobResult(job, done.record, done.path, error=exc, sidecar_failed=done.failed)
