"""A one-shot job (`mmd run`): what it starts before numpy and the pipeline are imported, and the backends it runs on.

A process that runs one job pays once what a daemon's worker pays at its start: the CUDA driver and context,
and the page-locked memory the input is read into and the output downloaded into (docs/textpath.md, "A
one-shot job"); or, for a kernel file, its launch process's start (docs/kernels.md). :class:`OneShot` starts
that work at once, on a thread (:class:`~mmd.cuda.libcuda.ContextWarmer`) or in a child process
(:class:`~mmd.kernelfile.launch.LaunchProcess`), so that it runs beside the imports that follow; this module
imports neither numpy nor the pipeline before it (tests/test_oneshot.py holds it). Its :meth:`OneShot.run`
then hands :func:`~mmd.pipeline.run_job` the backends that work made ready.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .config import Settings, kernel_cache_dir
from .errors import BackendUnavailable, InputFormatError, UsageError
from .hostbuffers import INPUT_SLOT, kept_buffers

if TYPE_CHECKING:
    from .backends import BackendPool
    from .backends.base import Backend
    from .cuda.libcuda import ContextWarmer
    from .job import Job
    from .kernelfile.launch import LaunchProcess
    from .pipeline import JobResult, PhaseHook
    from .textcore import Header

#: C's and the text's buffers are made beside the start only where together they are at most this many times the
#: input's bytes. A square job's are at most about 3 times its input (values of 2 bytes, the fewest); a shape whose
#: output outgrows its input more (a tall A times a wide B, k small) has them made on its path, as a header that
#: promises more than the file holds does.
OUTPUT_BUFFERS_PER_INPUT_BYTE = 4


class OneShot:
    """The start of one job of ``src`` with the command line's ``settings``, made now: on a GPU its context and
    its page-locked buffers (:func:`host_buffers`), or ``kernel_file``'s launch process (with the input's memory
    made in it where the input will take the GPU text path).

    ``release``: close what was started when done (a caller's process: tests, scripts); False where the process
    ends with the job, which leaves the GPU's context and buffers to the process's end and the killed launch
    process to the system (``LaunchProcess(reap=False)``), so that the job does not wait out the driver's
    teardown.
    """

    def __init__(self, settings: Settings, src: Path, kernel_file: Path | None = None, *, release: bool = True) -> None:
        self.src = src
        self.kernel_file = kernel_file
        self.release = release
        self._warmer: ContextWarmer | None = None
        self._launch: LaunchProcess | None = None
        if kernel_file is not None:
            # its own process makes its context: this one makes none
            self._launch = _launch_process(settings, kernel_file, src, reap=release)
        elif settings.backend != "cpu":
            from .cuda.libcuda import ContextWarmer

            self._warmer = ContextWarmer(settings.device, host=host_buffers(src))

    def __enter__(self) -> OneShot:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def describe(self, output: Path, base: Settings, flags: Mapping[str, Any]) -> Job:
        """The job (:func:`mmd.job.describe`) of this input to ``output``, with ``base`` and the command line's
        ``flags``; UsageError, before it runs, where the cuda backend the command line or the config asks for
        cannot run here (no pycuda, no NVIDIA driver): theirs to change. A name that asks for it is the job's
        refusal instead, as in the daemon."""
        from .job import describe  # numpy: imported only now
        from .jobname import settings_of

        job = describe(self.src, output, base, flags=flags, kernel_file=self.kernel_file)
        if (
            job.kernel_file is None
            and job.refusal is None
            and job.settings.backend == "cuda"
            and "backend" not in settings_of(dict(job.name_settings))
        ):
            _cuda_runs_here()
        return job

    def run(self, job: Job, on_phase: PhaseHook) -> JobResult:
        """Run ``job`` through the pipeline on the backends this start made ready; its result as
        :func:`~mmd.pipeline.run_job` gives it."""
        from .backends import BackendPool  # numpy and the pipeline: imported only now
        from .pipeline import run_job

        pool = BackendPool()
        try:
            return run_job(
                job, lambda settings: self._backend(pool, settings), on_phase, kernel_file_for=self._kernel_file
            )
        finally:
            if self.release:
                pool.close()

    def close(self) -> None:
        """Give back what was started and not taken (with ``release``), and end the launch process (its job's
        backend closed it; one no job took is killed here)."""
        if self._warmer is not None and self.release:
            self._warmer.release()
        if self._launch is not None:
            self._launch.close()

    def _backend(self, pool: BackendPool, settings: Settings) -> Backend:
        """The pool's backend for ``settings``, given the page-locked memory made beside the start, each buffer as
        its slot's."""
        backend = pool.get(settings)
        made = self._warmer.take_host_memory() if self._warmer is not None else {}
        for slot, memory in made.items():
            backend.adopt_host(slot, memory)
        return backend

    def _kernel_file(self, path: Path, settings: Settings) -> Backend:
        """A kernel file's backend, on the launch process started beforehand where its device and kernel cache
        are the job's (a name's settings may have changed them)."""
        from .pipeline import kernel_file_backend

        launch = self._launch
        ours = launch is not None and (launch.device, launch.kernel_cache) == (
            settings.device,
            kernel_cache_dir(settings),
        )
        return kernel_file_backend(path, settings, launch if ours else None)


def host_buffers(src: Path) -> dict[str, int]:
    """The page-locked buffers, by slot, a job of ``src`` is given beside its start: the input's (the file's size),
    and C's and the text's of the product its header names (:func:`~mmd.hostbuffers.kept_buffers`), where the
    header can be read and the file bears it out: its values fit the file (two bytes each at least) and the two
    buffers are within :data:`OUTPUT_BUFFERS_PER_INPUT_BYTE` times its size. Else the input's alone: the pipeline
    reads the file, and says what is wrong with it, as it would have."""
    from .textcore import input_plausible  # numpy-free

    size = src.stat().st_size
    buffers = {INPUT_SLOT: size}
    header = _header(src)
    if header is None or not input_plausible(size, header.body_offset, header.m * header.k + header.k * header.n):
        return buffers
    output = kept_buffers(header.m, header.n)
    if sum(output.values()) <= OUTPUT_BUFFERS_PER_INPUT_BYTE * size:
        buffers.update(output)
    return buffers


def _header(src: Path) -> Header | None:
    """``src``'s header, where it is a regular file whose first bytes hold one; else None."""
    from .textcore import BOM, HEADER_WINDOW, parse_header  # numpy-free

    try:
        # not blocking: a pipe's open would wait for its writer (and its bytes are the job's: it is not read)
        fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        # a header it refuses: the pipeline reads it again and says why
        with contextlib.suppress(OSError, InputFormatError):
            return parse_header(os.pread(fd, HEADER_WINDOW + len(BOM), 0), info.st_size)
        return None
    finally:
        os.close(fd)


def _cuda_runs_here() -> None:
    """UsageError where the cuda backend cannot run: no pycuda, no NVIDIA driver."""
    from .cuda import driver

    try:
        driver.load()
    except BackendUnavailable as exc:
        raise UsageError(f"the cuda backend cannot run here: {exc.reason}") from None


def _launch_process(settings: Settings, kernel_file: Path, src: Path, *, reap: bool) -> LaunchProcess:
    """``kernel_file``'s launch process, started now, making the memory of ``src``'s bytes as it starts."""
    from .kernelfile.launch import LaunchProcess

    size = src.stat().st_size
    return LaunchProcess(settings.device, kernel_file.name, kernel_cache_dir(settings), reap=reap, host_bytes=size)
