"""The daemon (`mmd serve`): watch the inbox, hand complete files to worker processes, supervise them.

One concept per module:

* :mod:`.server`: :class:`Daemon`, the main process's loop: hints, orders and events;
* :mod:`.service`: what the daemon holds while it serves, each a context manager (lock, signals, systemd ...);
* :mod:`.intake`: inbox entries become jobs waiting in the scheduler (or are judged: set aside, removed);
* :mod:`.scheduler`: which job goes to which worker next (no threads, no files);
* :mod:`.supervisor`: a job past its time limit or cancelled ends with its worker; a dead worker's jobs go on;
* :mod:`.ends`: a job's end booked (state file, metrics, fair share, hooks), and a claimed job refused;
* :mod:`.upkeep`: the main loop's chores (held jobs taken back, sweeps, the metrics file);
* :mod:`.backoff`: pauses that double with each failure in a row;
* :mod:`.inbox`: the inbox folder, watched, and followed when it is made again;
* :mod:`.messages`: the typed hints, orders and events between the parts;
* :mod:`.pool`: the main process's side of the worker processes (:class:`~.pool.WorkerPool`);
* :mod:`.worker`: a worker process, and its :class:`~.worker.Runner`, which claims, runs
  (:func:`mmd.pipeline.run_job`) and archives each job, and commits small ones in groups;
* :mod:`.control`: a worker's job in hand, in shared memory, for its supervisor;
* :mod:`.local` and :mod:`.desk`: the control socket, and what its askers are answered (their own jobs);
* :mod:`.handins`: the kernels students hand in, taken off the main loop;
* :mod:`.mailbox`: hints from threads and signal handlers, readable as a descriptor;
* :mod:`.observer`: filesystem events become hints;
* :mod:`.lock`: one daemon per inbox (one per host on a shared inbox);
* :mod:`.state`: the state file behind `mmd status`;
* :mod:`.tunables`: tunables.

The names below are the package's public face; import them from here.
"""

from .control import Control
from .lock import SpoolLock, host_daemons, lock_holder
from .observer import Hints, InboxWatch, hint_of, make_observer
from .scheduler import Item, Load, Scheduler
from .server import Daemon
from .state import State, read_state, status_of
from .tunables import HEARTBEAT, MAX_OUTPUT_ATTEMPTS, MAX_PAUSE, RECENT_JOBS, STUCK_AFTER, UMASK_BITS
from .worker import Reporter, Runner

__all__ = [
    "HEARTBEAT",
    "MAX_OUTPUT_ATTEMPTS",
    "MAX_PAUSE",
    "RECENT_JOBS",
    "STUCK_AFTER",
    "UMASK_BITS",
    "Control",
    "Daemon",
    "Hints",
    "InboxWatch",
    "Item",
    "Load",
    "Reporter",
    "Runner",
    "Scheduler",
    "SpoolLock",
    "State",
    "host_daemons",
    "lock_holder",
    "hint_of",
    "make_observer",
    "read_state",
    "status_of",
]
