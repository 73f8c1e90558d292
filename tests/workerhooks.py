"""Fakes and faults planted inside a daemon's worker processes.

Jobs run in worker processes, so a test's monkeypatch in its own process
never reaches them. A test gives the daemon a setup function instead:
``Daemon(settings, worker_setup=partial(hold_jobs_until, path))``; each
worker calls it first, in its own process (it is pickled by name, so it
must be a module-level function here, its arguments plain values). A test
that starts ``mmd serve`` as a process uses :func:`launcher`, a script that
does the same through the command line.

Hooks talk back through files (a worker cannot touch the test's objects).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from .conftest import ROOT


def _patch_run_job(wrap: Any) -> None:
    from mmd.daemon import worker

    worker.run_job = wrap(worker.run_job)


def hold_jobs_until(path: str, names: tuple[str, ...] = ()) -> None:
    """Jobs (those of ``names``, or all) wait until ``path`` exists before they run."""

    def wrap(real: Any) -> Any:
        def held(job: Any, *args: Any, **kw: Any) -> Any:
            if not names or job.input.name in names:
                while not os.path.exists(path):
                    time.sleep(0.01)
            return real(job, *args, **kw)

        return held

    _patch_run_job(wrap)


def raise_in_job(name: str, message: str = "simulated bug") -> None:
    """The job of input ``name`` raises a RuntimeError (a bug of mmd's) in its worker."""

    def wrap(real: Any) -> Any:
        def flaky(job: Any, *args: Any, **kw: Any) -> Any:
            if job.input.name == name:
                raise RuntimeError(message)
            return real(job, *args, **kw)

        return flaky

    _patch_run_job(wrap)


def log_jobs(path: str) -> None:
    """Each job appends ``<input name> <device index> <pid>`` to ``path`` as it starts."""

    def wrap(real: Any) -> Any:
        def logged(job: Any, *args: Any, **kw: Any) -> Any:
            with open(path, "a") as fh:
                fh.write(f"{job.input.name} {job.context.device_index} {os.getpid()}\n")
            return real(job, *args, **kw)

        return logged

    _patch_run_job(wrap)


def slow_start(marker: str, seconds: float) -> None:
    """Every worker but the first to start (the one that makes ``marker``) sleeps ``seconds`` before it opens
    its backend: the daemon serves on one worker while it waits for the others."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        time.sleep(seconds)


def slow_open(log: str, seconds: float) -> None:
    """Opening a backend takes ``seconds`` more (as a CUDA context's making does); each opening appends
    ``open <pid> <start> <end>`` (monotonic seconds) to ``log``."""
    from mmd import backends

    real = backends.open_backend

    def open_backend(*args: Any, **kw: Any) -> Any:
        start = time.monotonic()
        time.sleep(seconds)
        try:
            return real(*args, **kw)
        finally:
            with open(log, "a") as fh:
                fh.write(f"open {os.getpid()} {start} {time.monotonic()}\n")

    backends.open_backend = open_backend


def die_once(marker: str, name: str) -> None:
    """The job of input ``name`` kills its own worker (SIGKILL) as it starts, the first time (``marker`` is
    made then): a crash after the claim, before the job is told or done."""

    def wrap(real: Any) -> Any:
        def dying(job: Any, *args: Any, **kw: Any) -> Any:
            if job.input.name == name and not os.path.exists(marker):
                Path(marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)
            return real(job, *args, **kw)

        return dying

    _patch_run_job(wrap)


def meet(folder: str, count: int) -> None:
    """The first ``count`` jobs wait for each other (a barrier in files): only ``count`` workers running at
    once can pass it. Each leaves ``<folder>/<pid>`` behind."""

    def wrap(real: Any) -> Any:
        def met(job: Any, *args: Any, **kw: Any) -> Any:
            here = Path(folder)
            if len(list(here.iterdir())) < count:
                (here / str(os.getpid())).touch()
                deadline = time.monotonic() + 20
                while len(list(here.iterdir())) < count and time.monotonic() < deadline:
                    time.sleep(0.01)
            return real(job, *args, **kw)

        return met

    _patch_run_job(wrap)


def faulty_cpu() -> None:
    """The cpu backend hangs on 7×7 products (a kernel that never returns) and kills its own process on 6×6
    ones (a driver crash)."""
    from mmd.backends.cpu import CpuBackend

    real = CpuBackend.multiply

    def faulty(self: Any, a: Any, b: Any, request: Any) -> Any:
        if a.shape == (7, 7):
            threading.Event().wait()
        if a.shape == (6, 6):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, a, b, request)

    CpuBackend.multiply = faulty  # type: ignore[method-assign]


def fake_gpus(log: str, fault_shape: int | None = None, fail_at: str | None = None) -> None:
    """Every backend a worker opens is the CUDA backend on a fake GPU (tests/fakes.py); products whose A is
    ``fault_shape``² fault in the kernel; the session's step ``fail_at`` fails. Opening and closing a session,
    and its warm-up's keeping of device memory, append ``open|keep|close <device> <pid>`` to ``log``."""
    from mmd import backends

    from .fakes import FakeMemory, FakeSession, fake_gpu_opener

    def fault(a: Any, b: Any) -> bool:
        return fault_shape is not None and a.shape == (fault_shape, fault_shape)

    opener = fake_gpu_opener(fault=fault, fail_at=fail_at)

    def open_backend(name: str, device: int = 0, kernel_cache: Any = None) -> Any:
        with open(log, "a") as fh:
            fh.write(f"open {device} {os.getpid()}\n")
        return opener(name, device, kernel_cache)

    real_close = FakeSession.close

    def close(self: Any) -> None:
        with open(log, "a") as fh:
            fh.write(f"close {self.ordinal} {os.getpid()}\n")
        real_close(self)

    real_keep = FakeMemory.keep_device_memory

    def keep(self: Any, *args: Any, **kw: Any) -> None:
        with open(log, "a") as fh:
            fh.write(f"keep {self.session.ordinal} {os.getpid()}\n")
        real_keep(self, *args, **kw)

    FakeSession.close = close  # type: ignore[method-assign]
    FakeMemory.keep_device_memory = keep  # type: ignore[method-assign]
    backends.open_backend = open_backend


def enospc_on(outbox: str, pattern: str, hits: str, switch: str | None = None) -> None:
    """``os.write`` fails with ENOSPC on commit temporaries (``*.tmp``) in ``outbox`` whose name matches the
    regular expression ``pattern`` (searched), while the file ``switch`` exists (always when None): a full
    disk for those files only. Each refusal appends a line to ``hits``."""
    import errno
    import re

    real = os.write
    wanted = re.compile(pattern)
    folder = os.path.realpath(outbox)

    def write(fd: int, data: Any) -> int:
        if switch is None or os.path.exists(switch):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                target = ""
            name = os.path.basename(target)
            if os.path.dirname(target) == folder and name.endswith(".tmp") and wanted.search(name):
                with open(hits, "a") as fh:
                    fh.write(f"{name}\n")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    os.write = write


def jumpy_wall_clock(seconds: float = 3600.0) -> None:
    """The wall clock (``time.time``) jumps ``seconds`` back and forth on every read in the worker."""
    import itertools

    real = time.time
    flips = itertools.count()

    def jumpy() -> float:
        return real() + (seconds if next(flips) % 2 else -seconds)

    time.time = jumpy  # type: ignore[assignment]


def move_on_after_the_desk_looks(armed: str, go: str) -> None:
    """In the daemon's main process: once ``armed`` exists, the next time the desk has listed the jobs (a
    cancel's check), ``go`` is made and the main loop waits, before it goes on, until a worker that ran a job
    at the listing runs another one (its control block shows another order): the race between a cancel's
    check and its stop, made certain. Pair it with a worker hook that holds the checked job until ``go``."""
    from mmd.daemon import desk

    real = desk.Desk.jobs

    def running(self: Any) -> dict[int, int]:
        return {w.index: r.seq for w in self.workers.handles if (r := w.control.running()) is not None}

    def jobs(self: Any, *args: Any, **kw: Any) -> Any:
        found = real(self, *args, **kw)
        if os.path.exists(armed) and not os.path.exists(go):
            before = running(self)
            Path(go).touch()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if any(running(self).get(i) not in (None, seq) for i, seq in before.items()):
                    break
                time.sleep(0.002)
        return found

    desk.Desk.jobs = jobs  # type: ignore[method-assign]


def chain(*setups: Any) -> None:
    """Several setups in one worker, in the order given (each wraps what the ones before installed)."""
    for setup in setups:
        setup()


def launcher(setup: str, *argv: str, before: str | None = None) -> list[str]:
    """``python -c`` argv for ``mmd serve`` (or ``argv``) whose workers call ``setup`` first: ``setup`` is a
    Python expression for the function, evaluated after ``from tests import workerhooks`` and ``partial``;
    ``before``: an expression called in the daemon's own process before it starts (a hook of the main loop)."""
    script = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from functools import partial
from mmd.daemon import server
from mmd.cli import main
from tests import workerhooks
real = server.Daemon.__init__
def init(self, *args, **kw):
    real(self, *args, worker_setup={setup}, **kw)
server.Daemon.__init__ = init
{f"({before})()" if before else ""}
sys.exit(main(sys.argv[1:]))
"""
    import sys

    return [sys.executable, "-c", script, *(argv or ("serve",))]


__all__ = [
    "chain",
    "die_once",
    "enospc_on",
    "fake_gpus",
    "faulty_cpu",
    "hold_jobs_until",
    "jumpy_wall_clock",
    "launcher",
    "log_jobs",
    "meet",
    "move_on_after_the_desk_looks",
    "partial",
    "raise_in_job",
    "slow_open",
    "slow_start",
]


def count_listings(folder: str, log: str) -> None:
    """Each listing of ``folder`` in a worker (``os.scandir``, ``os.listdir``) appends a line to ``log``."""
    real_scandir, real_listdir = os.scandir, os.listdir

    def note(path: Any) -> None:
        if path is not None and os.fspath(path) == folder:
            with open(log, "a") as fh:
                fh.write(f"{os.getpid()}\n")

    def scandir(path: Any = ".") -> Any:
        note(path)
        return real_scandir(path)

    def listdir(path: Any = ".") -> Any:
        note(path)
        return real_listdir(path)

    os.scandir = scandir  # type: ignore[assignment]
    os.listdir = listdir  # type: ignore[assignment]
