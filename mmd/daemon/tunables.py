"""What the daemon's parts share: tunables, and the umask rule."""

from __future__ import annotations

import os

#: How many finished jobs the state file lists.
RECENT_JOBS = 20
#: The state file is rewritten at most this often (seconds) while jobs run.
STATE_EVERY = 0.25
#: Idle heartbeat of the worker and the main loop (seconds).
HEARTBEAT = 1.0
#: A loop that has not turned for this long is stuck (the watchdog stops pinging).
STUCK_AFTER = 30.0
#: After an output could not be committed (disk full, outbox unwritable) no new job is
#: taken for rescan_seconds, doubling with each failure in a row, up to this (seconds).
MAX_PAUSE = 300.0
#: A job whose output could not be committed this many times (each time held and tried again) is
#: failed with the reason, if the outbox takes its error sidecar: an output too big for the space
#: left must not block the jobs behind it. One whose error sidecar cannot be written stays held.
MAX_OUTPUT_ATTEMPTS = 3
#: While serving, the outbox is listed for stale reservations at most this often (seconds), at a
#: rescan: a listing of a big outbox is not free (its time grows with the outbox's files).
RESERVATION_SWEEP_SECONDS = 60.0
#: How often the outbox and the archives are walked for what is older than ``retention_days``.
RETENTION_SWEEP_S = 3600.0
#: Bits the daemon always masks from the files and folders it creates: no group or
#: world write, whatever umask it was started with (the unit sets 0027).
UMASK_BITS = 0o022


def tighten_umask() -> int:
    """Add :data:`UMASK_BITS` to this process's umask (the main process's and each worker's: a worker
    inherits the fork server's, which may have started first); returns the umask it had."""
    old = os.umask(UMASK_BITS)
    os.umask(old | UMASK_BITS)
    return old


#: Inputs up to this size are small: a worker may be given several at once, and their commits may wait
#: for a group commit (a 32×32 job's input is about 6 KB, a 128×128 one's about 100 KB).
GROUP_INPUT_BYTES = 256 * 1024
#: At most this many small jobs are given to one worker at once, and wait for one group commit.
MAX_GROUP = 16
#: A worker stopped past its job's limit gets SIGTERM, then SIGKILL after this long (seconds).
STOP_GRACE_S = 1.0
#: While a worker has jobs in hand, the main loop looks at its control block at least this often
#: (seconds): a job's own limit is known only once it has started, and a job may start at any moment.
SUPERVISE_S = 0.05

#: How long a worker waits for its turn to open its backend (the workers of a device open theirs one at a time)
#: before it opens it anyway: a worker stuck opening its own holds no other back for longer.
OPEN_TURN_S = 30.0
