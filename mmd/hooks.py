"""Commands run when a job ends (``on_done``, ``on_error``): notify a person, copy a result, page someone.

A hook is an argv list run without a shell, so nothing in a file name can
become a command. It is told about the job in ``MMD_JOB_*`` variables (the
rest of the environment is the daemon's), runs at most ``hook_timeout_s``
(then it is killed), and its failure is logged, never the job's: hooks run
one at a time on a thread of their own, after the job is committed and
archived, so a slow hook delays no job.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import HOOK_VARIABLES
from .logs import get_logger


@dataclass(frozen=True)
class JobEnd:
    """What a hook is told about the job that ended."""

    job: str
    status: str  # ok | error
    input: str  # the name the file was dropped under, escaped (no control characters: mmd.spool.shown)
    output: Path | None  # the output file, when there is one
    sidecar: Path | None  # the timing or error sidecar, when it was written
    reason: str = ""  # why it was refused
    kernel: str = ""
    submitter: str = ""  # the input's owner (mmd.submitters.login_of)

    def environ(self) -> dict[str, str]:
        """The :data:`HOOK_VARIABLES`, in their order."""
        values = (
            self.job,
            self.status,
            self.input,
            str(self.output) if self.output is not None else "",
            str(self.sidecar) if self.sidecar is not None else "",
            self.reason,
            self.kernel,
            self.submitter,
        )
        return dict(zip(HOOK_VARIABLES, values, strict=True))


@dataclass(frozen=True)
class HookResult:
    """How a hook ended: its exit status, or why it did not finish."""

    argv: tuple[str, ...]
    returncode: int | None
    problem: str | None = None


def run_hook(argv: Sequence[str], end: JobEnd, timeout: float, environ: Mapping[str, str] | None = None) -> HookResult:
    """Run ``argv`` for ``end`` (no shell) and wait at most ``timeout`` seconds; never raises."""
    env = {**(os.environ if environ is None else environ), **end.environ()}
    log = get_logger(job=end.job, hook=argv[0])
    try:
        done = subprocess.run(
            list(argv), env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        log.error("hook killed after its time limit", timeout_s=timeout)
        return HookResult(tuple(argv), None, f"killed after {timeout:g} s")
    except OSError as exc:
        log.error("hook cannot be started", reason=exc.strerror or str(exc))
        return HookResult(tuple(argv), None, exc.strerror or str(exc))
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        log.error("hook failed", status=done.returncode, stderr=tail[0][:200])
    return HookResult(tuple(argv), done.returncode)


class Hooks:
    """The daemon's hook runner: one thread, jobs' ends in order."""

    def __init__(self, on_done: Sequence[str] | None, on_error: Sequence[str] | None, timeout: float) -> None:
        self.on_done = tuple(on_done) if on_done else None
        self.on_error = tuple(on_error) if on_error else None
        self.timeout = timeout
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def ended(self, end: JobEnd) -> concurrent.futures.Future[HookResult] | None:
        """Queue the hook for a job that ended; None when there is none for its status."""
        argv = self.on_done if end.status == "ok" else self.on_error
        if argv is None:
            return None
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mmd-hook")
        return self._pool.submit(run_hook, argv, end, self.timeout)

    def close(self) -> None:
        """Wait for the hooks in hand (each within its time limit)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
