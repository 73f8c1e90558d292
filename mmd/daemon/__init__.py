"""The daemon (`mmd serve`): watch the inbox, take complete files, run them, archive.

One concept per module:

* :mod:`.server`: :class:`Daemon`, the main thread's schedule, signals and notify;
* :mod:`.observer`: filesystem events become hints;
* :mod:`.worker`: one thread per device owns its backend and runs jobs through
  :func:`mmd.pipeline.run_job`;
* :mod:`.lock`: one daemon per inbox (one per host on a shared inbox);
* :mod:`.state`: the state file behind `mmd status`;
* :mod:`.common`: tunables and hint kinds.

The names below are the package's public face; import them from here.
"""

from .common import HEARTBEAT, MAX_OUTPUT_ATTEMPTS, MAX_PAUSE, RECENT_JOBS, STOP, STUCK_AFTER, UMASK_BITS
from .lock import SpoolLock, host_daemons, lock_holder
from .observer import _Hints, make_observer
from .server import Daemon
from .state import State, read_state, status_of
from .worker import Worker, write_refusal

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
    "_Hints",
    "host_daemons",
    "lock_holder",
    "make_observer",
    "read_state",
    "status_of",
    "write_refusal",
]
