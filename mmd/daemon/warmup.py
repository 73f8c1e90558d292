"""A worker's warm-up: what its first big job would pay for, made ready within ``warm_up_mib`` while no order
waits.

What a warm-up makes (the page-locked buffers of the largest square job whose buffers fit ``warm_up_mib``,
the text kernels, small jobs' device memory kept from job to job) is the backend's
(:meth:`~mmd.backends.base.Backend.prepare`); when it is made is the worker's, and this module's rule: never
before an order that waits. A worker that has just opened its backend says Ready and waits
:data:`ORDER_WAIT_S` for an order, since the main process answers a Ready with the jobs waiting at once: a
fresh daemon's first job goes to the first worker ready and runs before that worker's warm-up, while the
others warm up. Otherwise a worker warms up as soon as no order waits: after its first jobs (a backlog's
stall it once, between two groups), and after its backend was opened anew (a CUDA error, new settings),
never on a job's path.
"""

from __future__ import annotations

from ..backends import BackendPool
from ..config import Settings
from ..errors import MmdError
from ..logs import get_logger
from .control import Control

#: How long a worker that has just said Ready waits for an order before it warms up (seconds): the main process
#: answers a Ready with its orders within milliseconds; the rest is for a machine under load.
ORDER_WAIT_S = 0.25


class WarmUp:
    """Whether a worker's backend still wants its warm-up (:attr:`due`), and the warm-up itself (:meth:`run`)."""

    def __init__(self, backends: BackendPool, control: Control) -> None:
        self.backends = backends
        self.control = control
        #: The backend in use has not been warmed up: at the worker's start, and after it was closed.
        self.due = False

    def run(self, settings: Settings) -> None:
        """Warm up ``settings``' backend (opened here if it is not open) when due; a failure only costs the
        first job its buffers. The worker's loop does not turn meanwhile, and is not judged stuck for it."""
        if not self.due:
            return
        self.due = False
        log = get_logger()
        self.control.off_loop()
        try:
            backend = self.backends.get(settings)
            held = backend.prepare(settings.warm_up_mib << 20)
        except MmdError as exc:
            log.warning("warm-up failed; the first job pays for its buffers", reason=exc.reason)
            return
        if held:
            log.info("warmed up", pinned_mib=round(held / (1 << 20), 1))
