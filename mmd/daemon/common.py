"""What the daemon's parts share: tunables, hint kinds, timestamps."""

from __future__ import annotations

import datetime as _dt

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
#: This many stopped jobs still running in their threads (a hung kernel keeps its thread) make the daemon
#: unhealthy: the systemd watchdog then restarts it, which ends them.
MAX_ABANDONED = 3
#: While serving, the outbox is listed for stale reservations at most this often (seconds), at a
#: rescan: a listing of a big outbox is not free (about 0.1 s per 100,000 files).
RESERVATION_SWEEP_SECONDS = 60.0
#: Bits the daemon always masks from the files and folders it creates: no group or
#: world write, whatever umask it was started with (the unit sets 0027).
UMASK_BITS = 0o022

# Hint kinds (the first item of each tuple in the hint queue).
COMPLETE, SEEN, DONE, BROKEN, STOP, RELOAD, WAKE = "complete", "seen", "done", "broken", "stop", "reload", "wake"
RESCAN, INBOX, PAUSE = "rescan", "inbox", "pause"


def now_iso() -> str:
    """The wall-clock time as an ISO string (for people; durations use the monotonic clock)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
