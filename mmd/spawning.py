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
from multiprocessing import forkserver
from typing import Any

#: What the fork server imports once, so that every worker it forks has it already.
PRELOAD = ["mmd.daemon.worker", "mmd.pipeline", "mmd.backends.cpu", "numpy"]


def context() -> Any:
    """The multiprocessing context workers are started in, its fork server (where there is one) started."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()  # a no-op once it runs
        return ctx
    return multiprocessing.get_context("spawn")
