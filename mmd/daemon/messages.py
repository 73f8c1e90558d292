"""The daemon's messages: typed values between the observer, the scheduler, the workers and the server.

Three streams, each a small closed set of frozen dataclasses (the receiver
dispatches on the type, never on a string):

* :data:`Hint`: what the observer, the signal handlers and the local socket tell the main loop;
* :data:`Order`: what the main process tells a worker process (over its pipe);
* :data:`Event`: what a worker process tells the main process back.

Between processes only paths, names and small records travel (pickled),
never matrix data: a worker reads its input and writes its output itself.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..errors import MmdError
from ..fileops import FileOps
from ..hooks import JobEnd
from ..record import Tally
from ..spool import Candidate, Claim

# -- hints: observer and signals -> main loop ---------------------------------------


@dataclass(frozen=True)
class Arrived:
    """``name`` appeared in the inbox; ``complete``: closed after writing or renamed in (else: watch until quiet)."""

    name: str
    complete: bool


@dataclass(frozen=True)
class Writing:
    """``name`` in the inbox was written to and is not closed yet: not complete until its close or a rename."""

    name: str


@dataclass(frozen=True, eq=False)
class Asked:
    """A request on the local socket (:mod:`.local`) from the user ``uid`` (the kernel's word, not the
    request's); the main loop sets ``reply``'s result to the answer."""

    op: str
    uid: int
    request: dict[str, Any]
    reply: concurrent.futures.Future[dict[str, Any]]


@dataclass(frozen=True)
class InboxChanged:
    """The inbox folder itself was deleted (or may have been made again)."""


@dataclass(frozen=True)
class Overflowed:
    """The kernel's queue of inbox events overflowed: events were lost, the inbox is scanned at once."""


@dataclass(frozen=True)
class StopRequested:
    """SIGTERM or SIGINT: finish the jobs in hand, take no new one, exit 0."""

    signal: str


@dataclass(frozen=True)
class ReloadRequested:
    """SIGHUP: read the settings again."""


Hint = Arrived | Writing | Asked | InboxChanged | Overflowed | StopRequested | ReloadRequested

# -- orders: main process -> worker ---------------------------------------------------


@dataclass(frozen=True)
class RunOrder:
    """Claim inbox ``name`` under ``job_id`` (chosen by the main process, so it is in hand before the claim) and
    run it; ``seq`` numbers the orders of one worker."""

    seq: int
    name: str
    job_id: str
    #: The file the scheduler was offered under ``name`` (its inode, size and owner): a claim that finds another
    #: file there runs it only where it is as small as the one offered, else gives it back (:class:`NotRun`).
    seen: Candidate | None = None


@dataclass(frozen=True)
class Resume:
    """Run (or only archive) a job already claimed in ``.work``: left by an earlier daemon, held, or the
    batch-mates of a worker that died."""

    seq: int
    claim: Claim


@dataclass(frozen=True)
class Configure:
    """New settings (SIGHUP); ``reopen``: close the backends so that the next job opens them anew."""

    settings: Settings
    reopen: bool


@dataclass(frozen=True)
class InboxRemade:
    """The inbox was deleted and made again: the spool's folders (``.work``, ``.done`` ...) are to be made anew."""


@dataclass(frozen=True)
class Quit:
    """Finish what is in hand, close the backends and exit."""


Order = RunOrder | Resume | Configure | InboxRemade | Quit

# -- events: worker -> main process ---------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The worker's backend is open: ``backend`` and ``device`` (its name) for the status display;
    ``fallback``: why it is not the one asked for (``auto`` without a usable GPU), which the daemon says
    once for all its workers."""

    backend: str
    device: str | None
    fallback: str | None = None


@dataclass(frozen=True)
class StartFailed:
    """The worker could not open its backend (the daemon cannot serve)."""

    error: MmdError


@dataclass(frozen=True)
class Ended:
    """Order ``seq``'s job has its fate committed and archived (or archiving failed and it is left)."""

    seq: int
    end: JobEnd
    #: The state file's line for this job (job, file, status, output, sidecar, overall_ms, device_index, finished).
    entry: dict[str, object]
    #: What the metrics and the fair share count of it (None: it has no record).
    tally: Tally | None
    #: (device, bytes of GPU memory in use) where the worker has a GPU backend open.
    memory_used: tuple[int, int] | None


@dataclass(frozen=True)
class NotRun:
    """Order ``seq`` was not run: its file was gone (``reason`` empty), new jobs were held back (it stays in
    the inbox), its claim failed (``broken``: retried at the next rescan, not before), or its claim found
    another file than the one offered, larger than a small job (``claimed``: it stays claimed in ``.work``,
    no start counted, to be given again by its real size and owner)."""

    seq: int
    name: str
    broken: bool = False
    reason: str = ""
    claimed: Claim | None = None


@dataclass(frozen=True)
class Kept:
    """Order ``seq``'s job stays claimed in ``.work``: the outbox refused what it had to write (held), or its
    archive failed (left). The main process takes it back after a pause; ``committed``: the outbox took its
    sidecar (only the archive failed), which ends a run of outbox failures."""

    seq: int
    claim: Claim
    reason: str
    committed: bool


Event = Ready | StartFailed | Ended | NotRun | Kept


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process is started with (pickled once, at its start)."""

    index: int
    device: int
    settings: Settings
    #: The daemon's pid: reservations are written in its name, so that its sweeps know them as its own.
    owner_pid: int
    host_id: str | None
    #: How many workers the daemon runs (logs name the device where there are several).
    workers: int
    #: The spool's file operations (the tests inject faults through them).
    ops: FileOps
    #: Called first in the worker process (a top-level function, pickled by name): the tests install their
    #: fakes and faults inside workers through it.
    setup: Callable[[], None] | None = None
    #: The lock the workers of this device take in turn to open their backends (a multiprocessing Lock; None:
    #: no turns). CUDA contexts made at once on one GPU are made one after another by the driver, each waiting
    #: for all: in turns, the first worker is ready as soon as a lone one would be.
    opening: Any = None
