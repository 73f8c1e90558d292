"""A one-shot job (`mmd run`): what it starts before numpy and the pipeline are imported, and the backends it runs on.

A process that runs one job pays once what a daemon's worker pays at its start: the CUDA driver and context,
and the page-locked memory the input is read into (docs/textpath.md, "A one-shot job"); or, for a kernel
file, its launch process's start (docs/kernels.md). :class:`OneShot` starts that work at once, on a thread
(:class:`~mmd.cuda.libcuda.ContextWarmer`) or in a child process (:class:`~mmd.kernelfile.launch.LaunchProcess`),
so that it runs beside the imports that follow; this module imports neither numpy nor the pipeline before it
(tests/test_oneshot.py holds it). Its :meth:`OneShot.run` then hands :func:`~mmd.pipeline.run_job` the
backends that work made ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .config import Settings, kernel_cache_dir
from .errors import BackendUnavailable, UsageError

if TYPE_CHECKING:
    from .backends import BackendPool
    from .backends.base import Backend
    from .cuda.libcuda import ContextWarmer
    from .job import Job
    from .kernelfile.launch import LaunchProcess
    from .pipeline import JobResult, PhaseHook


class OneShot:
    """The start of one job of ``src`` with the command line's ``settings``, made now: on a GPU its context and
    the input's page-locked memory, or ``kernel_file``'s launch process (with the input's memory made in it
    where the input will take the GPU text path).

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

            self._warmer = ContextWarmer(settings.device, host_bytes=src.stat().st_size)

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
        """The pool's backend for ``settings``, given the input's page-locked memory made beside the start."""
        from .backends.base import INPUT_SLOT

        backend = pool.get(settings)
        memory = self._warmer.take_host_memory() if self._warmer is not None else None
        if memory is not None:
            backend.adopt_host(INPUT_SLOT, memory)
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
