"""How the daemon's worker processes start: forked by a fork server that imports the pipeline once.

A CUDA context does not survive ``fork``, so workers are never forked from the
daemon's main process: on Linux a fork server (``forkserver``) forks them,
elsewhere each is spawned. This module stands outside :mod:`mmd.daemon`
(whose import brings in the daemon, the watchdog and the pipeline) so that
``mmd serve`` can start the fork server first: its imports (most of a
worker's start) then run while the command imports the daemon and scans its
spool. The fork server starts before the daemon tightens its umask, so each
worker tightens its own (:func:`mmd.daemon.tunables.tighten_umask`).

What every child process of mmd shares (the workers, and a kernel file's compile and launch processes)
is here too: dying with its parent (:func:`die_with_parent`), and the words for how one ended
(:func:`exit_status`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import multiprocessing
import os
import signal
import subprocess
from collections.abc import Iterator
from multiprocessing import forkserver, spawn
from typing import Any

from .errors import WorkerStartError

#: prctl's option that sends this process a signal when its parent dies.
_PR_SET_PDEATHSIG = 1

#: What the fork server imports once, so that every worker it forks has it already.
PRELOAD = ["mmd.daemon.worker", "mmd.pipeline", "mmd.backends.cpu", "numpy"]


#: The interpreters found to run, each checked once a process (a daemon asks for its context more than once).
_RUNNABLE: set[str] = set()


def context() -> Any:
    """The multiprocessing context workers are started in, its fork server (where there is one) started.

    The interpreter the fork server and each worker run must be one this user can run: one it cannot is
    refused here, before anything starts."""
    interpreter = _interpreter()
    if interpreter not in _RUNNABLE:
        if not _runs(interpreter):
            raise _cannot_start(None)
        _RUNNABLE.add(interpreter)
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        with starting():
            forkserver.ensure_running()  # a no-op once it runs
        return ctx
    return multiprocessing.get_context("spawn")


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """Around whatever starts a worker (its shared state, its process).

    multiprocessing starts its helper processes (the fork server, the resource tracker) from the
    interpreter without waiting for them: one that dies at once (its libraries unreadable) shows only
    when they are next used, as a refused connection, a broken pipe, or a connection that ends before
    its answer (EOFError: the dying helper still held the socket it was handed).
    """
    try:
        yield
    except (OSError, EOFError) as exc:
        said = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise _cannot_start(f"the processes that start them do not answer ({said})") from None


@functools.cache
def _runs(interpreter: str) -> bool:
    """Whether ``interpreter`` starts (its libraries and standard library read) and ends well, run bare: the
    helpers multiprocessing starts from it are not waited for, and one that dies leaves its resources'
    clean-up to fail at exit."""
    try:
        ran = subprocess.run(
            [interpreter, "-I", "-S", "-c", ""],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ran.returncode == 0


def _interpreter() -> str:
    return os.fsdecode(spawn.get_executable())  # bytes once set_executable has set it


def _cannot_start(why: str | None) -> WorkerStartError:
    """``why``: what failed, where the interpreter itself may run (None: this user cannot run it at all)."""
    exe = _interpreter()
    real = os.path.realpath(exe)
    named = exe if real == exe else f"{exe} (that is {real})"
    said = (
        f"their interpreter {named} cannot be run by this user"
        if why is None
        else (f"{why}; their interpreter {named} must be one this user can run")
    )
    return WorkerStartError(
        f"workers cannot start: {said} (a service cannot run one under /home or /root: systemd/README.md)",
        {"interpreter": real},
    )


def die_with_parent(parent: int) -> None:
    """Be sent SIGKILL when ``parent``, the process that started this one, ends (Linux's PR_SET_PDEATHSIG);
    nothing where prctl is missing (not Linux)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent was gone before the call took effect
        os._exit(1)


def exit_status(returncode: int | None) -> str:
    """How a child process ended, in words: ``exit status 3``, ``SIGKILL`` (``not ended``: None)."""
    if returncode is None:
        return "not ended"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


@contextlib.contextmanager
def in_turn(lock: Any, timeout: float) -> Iterator[None]:
    """The block run holding ``lock`` (a multiprocessing Lock several processes take in turn; None: no turns),
    waited for at most ``timeout`` seconds: past it the block runs anyway (one that holds the lock too long
    holds no other back for longer)."""
    taken = lock is not None and lock.acquire(timeout=timeout)
    try:
        yield
    finally:
        if taken:
            lock.release()
