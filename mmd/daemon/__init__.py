"""The daemon (`mmd serve`): watch the inbox, take complete files, run them, archive.

One concept per module:

* :mod:`.server`: :class:`Daemon`, the main thread's schedule, signals and notify;
* :mod:`.observer`: filesystem events become hints;
* :mod:`.worker`: one thread per device owns its backends and runs jobs through
  :func:`mmd.pipeline.run_job`, seeing the daemon only through a narrow :class:`~.worker.Host`;
* :mod:`.lock`: one daemon per inbox (one per host on a shared inbox);
* :mod:`.state`: the state file behind `mmd status`;
* :mod:`.common`: tunables and hint kinds.

The names below are the package's public face; import them from here.
"""

from .common import HEARTBEAT, MAX_OUTPUT_ATTEMPTS, MAX_PAUSE, RECENT_JOBS, STOP, STUCK_AFTER, UMASK_BITS
from .lock import SpoolLock, host_daemons, lock_holder
from .observer import Hints, make_observer
from .server import Daemon
from .state import State, read_state, status_of
from .worker import Host, Worker

__all__ = [
    "HEARTBEAT",
    "MAX_OUTPUT_ATTEMPTS",
    "MAX_PAUSE",
    "RECENT_JOBS",
    "STOP",
    "STUCK_AFTER",
    "UMASK_BITS",
    "Daemon",
    "SpoolLock",
    "State",
    "Worker",
    "Hints",
    "Host",
    "host_daemons",
    "lock_holder",
    "make_observer",
    "read_state",
    "status_of",
]
