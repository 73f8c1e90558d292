"""How the daemon's worker processes start: forked by a fork server that imports the pipeline once.

A CUDA context does not survive ``fork``, so workers are never forked from the
daemon's main process: on Linux a fork server (``forkserver``) forks them,
elsewhere each is spawned. This module stands outside :mod:`mmd.daemon`
(whose import brings in the daemon, the watchdog and the pipeline) so that
``mmd serve`` can start the fork server first: its imports (most of a
worker's start) then run while the command imports the daemon and scans its
spool. The fork server starts before the daemon tightens its umask, so each
worker tightens its own (:func:`mmd.daemon.common.tighten_umask`).
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import forkserver, spawn
from typing import Any

from .errors import WorkerStartError

#: What the fork server imports once, so that every worker it forks has it already.
PRELOAD = ["mmd.daemon.worker", "mmd.pipeline", "mmd.backends.cpu", "numpy"]


def context() -> Any:
    """The multiprocessing context workers are started in, its fork server (where there is one) started."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        try:
            forkserver.ensure_running()  # a no-op once it runs
        except OSError as exc:
            raise _cannot_start(exc) from None
        return ctx
    return multiprocessing.get_context("spawn")


def start(process: Any) -> None:
    """Start a worker process of :func:`context`'s.

    The fork server is a new interpreter, started without waiting for it: one that cannot run (a venv
    made from an interpreter this user cannot read) shows only here, as a refused connection.
    """
    try:
        process.start()
    except OSError as exc:
        raise _cannot_start(exc) from None


def _cannot_start(exc: OSError) -> WorkerStartError:
    exe = os.fsdecode(spawn.get_executable())  # bytes once set_executable has set it
    real = os.path.realpath(exe)
    named = exe if real == exe else f"{exe} (that is {real})"
    return WorkerStartError(
        f"workers cannot start: the process that starts them did not answer ({exc.strerror or exc}); it runs "
        f"{named}, which this user must be able to run (a service cannot run one under /home or /root: "
        "systemd/README.md)",
        {"interpreter": real},
    )
