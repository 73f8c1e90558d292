"""The spool protocol: which inbox names are jobs, claim, output names, archive, holds, recovery.

Layout (the dot folders are created on demand)::

    inbox/m.txt                       a job waiting
    inbox/.work/<job>.<v>/m.txt       claimed: job id and output version in the folder name
    inbox/.work/<job>.<v>/.mmd-attempts.json  its starts and holds (:class:`AttemptLog`)
    inbox/.work/<host>/<job>.<v>/m.txt  the same on a shared inbox: each host claims into its own folder
    inbox/.done/m.txt                 finished with an output
    inbox/.failed/m.txt               refused (the error sidecar says why); also what was set aside
    inbox/.mmd-arrivals.json          when the daemon first saw what waits in the inbox to be judged
    inbox/.mmd.lock, .mmd-state.json  the daemon's lock and state (see mmd.daemon)
    outbox/.m.claim                   the output version reserved at the claim (``<job> <host> <pid>``)
    outbox/m.out + m.timing.yaml      the result; the sidecar is committed last
    outbox/m.error.yaml               a refusal

With ``state_dir`` set (a box that others write the inbox of), the daemon's
own names (``.work``, ``.done``, ``.failed``, the lock and the state file)
are in that private folder instead of the inbox, and nothing a user creates
in the inbox under those names means anything to mmd.

A job's fate is one of three, whatever fails: its output and sidecar
(archived to ``.done``); its error sidecar (archived to ``.failed``); or it
is kept: in the inbox when it could not be claimed, else claimed in
``.work`` (*held* when the outbox refused what it had to write, or left when
its archive failed) and taken back by the daemon after a pause
(:meth:`Claims.take_back`). Nothing is ever put back into the inbox.

:class:`Spool` is the one way in: it makes one part per concept over one :class:`Shared`, and callers use
the parts (``spool.claims.claim(name)``, ``spool.attempts.hold(claim, why)``); one module per concept,

* :mod:`.names`: the layout's names, which names are jobs, output names (pure);
* :mod:`.scanning`: what waits in the inbox (:class:`Scanner`), and when a file is complete (pure);
* :mod:`.claims`: the claim and the :class:`Claim` record, the jobs in hand (:class:`InHand`), taking jobs from
  ``.work`` (:class:`Claims`);
* :mod:`.reservations`: the outbox reservations of output versions, and their sweep (:class:`Reservations`);
* :mod:`.spares`: the released reservations and emptied job folders a process keeps instead of freeing them, and
  why (:class:`Spares`);
* :mod:`.attempts`: a claimed job's starts and holds (:class:`AttemptLog`, :class:`Attempts`), the held jobs;
* :mod:`.archive`: archiving a job to ``.done``/``.failed``, removing outputs, retention, sweeping dead
  processes' temporaries (:class:`Archive`);
* :mod:`.ledger`: class mode's count of what the service keeps for each submitter, and when it archived inputs
  (:class:`Ledger`);
* :mod:`.dropbox`: what lies in the inbox that is not a job (set aside, or removed), the record of arrivals
  (:class:`DropBox`);
* :mod:`.shared`: what the parts share (:class:`Shared`: the folders, the file operations, the lock, the owner
  pid).

Every file operation that moves a job goes through a :class:`~mmd.fileops.FileOps`
(the daemon's is ``os`` itself; the tests inject faults). :mod:`.names` and
:mod:`.scanning` are pure: :class:`Readiness` and :class:`Scanner` take their
clock and ``scandir`` as parameters.
"""

from __future__ import annotations

from .archive import Archive
from .attempts import AttemptLog, Attempts, HeldJob, held_jobs, read_attempts
from .claims import Claim, Claims, InHand, finished, owned_by
from .dropbox import DropBox
from .ledger import Ledger, Usage
from .names import (
    ATTEMPTS_NAME,
    CLAIM_SUFFIX,
    DONE_DIR,
    FAILED_DIR,
    IGNORED_PREFIXES,
    IGNORED_SUFFIXES,
    LOCK_NAME,
    MAX_NAME_BYTES,
    MAX_VERSIONS,
    OUTPUT_SUFFIX,
    SPARE_DIR,
    STATE_NAME,
    WORK_DIR,
    claim_path,
    entry_problem,
    host_lock_name,
    is_job_name,
    names_of,
    output_path,
    parse_work_folder,
    resolve_output,
    safe_name,
    shown,
    state_name,
    work_folder_name,
    writable_problem,
)
from .reservations import EMPTY_RESERVATION_GRACE_S, Reservations, pid_alive, read_reservation
from .scanning import Arrival, Arrivals, Candidate, Readiness, Scanner, Survey
from .shared import Shared, entries
from .spares import Spares

__all__ = [
    "ATTEMPTS_NAME",
    "CLAIM_SUFFIX",
    "DONE_DIR",
    "EMPTY_RESERVATION_GRACE_S",
    "FAILED_DIR",
    "IGNORED_PREFIXES",
    "IGNORED_SUFFIXES",
    "LOCK_NAME",
    "MAX_NAME_BYTES",
    "MAX_VERSIONS",
    "OUTPUT_SUFFIX",
    "SPARE_DIR",
    "STATE_NAME",
    "WORK_DIR",
    "Archive",
    "Arrival",
    "Arrivals",
    "AttemptLog",
    "Attempts",
    "Candidate",
    "Claim",
    "Claims",
    "DropBox",
    "HeldJob",
    "InHand",
    "Ledger",
    "Readiness",
    "Reservations",
    "Scanner",
    "Shared",
    "Spares",
    "Spool",
    "Survey",
    "Usage",
    "claim_path",
    "entries",
    "entry_problem",
    "finished",
    "owned_by",
    "writable_problem",
    "held_jobs",
    "host_lock_name",
    "is_job_name",
    "names_of",
    "output_path",
    "parse_work_folder",
    "pid_alive",
    "read_attempts",
    "read_reservation",
    "resolve_output",
    "safe_name",
    "shown",
    "state_name",
    "work_folder_name",
]


class Spool:
    """An inbox and an outbox, and the moves between them: the spool's parts, made over one :class:`Shared`.

    Callers use the parts; each verb is one part's, in its own module:

    * :attr:`shared` (:class:`Shared`): the folders, made and checked; the file operations (``ops``: the tests
      inject faults through it); the pid written into the reservations (``owner_pid``);
    * :attr:`scanner` (:class:`Scanner`): what lies in the inbox;
    * :attr:`in_hand` (:class:`InHand`): the jobs this process has in hand, and those it left in ``.work`` to
      take back;
    * :attr:`claims` (:class:`Claims`): the claim, the jobs a start resumes, those taken back, what is in ``.work``;
    * :attr:`reservations` (:class:`Reservations`): the outbox's reserved output versions, and their sweep;
    * :attr:`spares` (:class:`Spares`): the released reservations and emptied job folders this process keeps to
      use again (``spool.spares.drop()`` when it stops serving);
    * :attr:`attempts` (:class:`AttemptLog`): a claimed job's starts and holds;
    * :attr:`archive` (:class:`Archive`): archiving a job, removing outputs, retention, the temporaries' sweep;
    * :attr:`dropbox` (:class:`DropBox`): what lies in the inbox that is not a job, and the record of arrivals;
    * :attr:`ledger` (:class:`Ledger`, class mode only): what each submitter keeps, and their kernels' GPU time.

    A Spool is shared by the daemon's threads: its parts keep which jobs this
    process has in hand under the shared lock. A worker process's spool
    writes reservations in its daemon's name (``owner_pid``), so that the
    daemon's sweep treats them as its own (:meth:`InHand.expect`).
    """

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.scanner = Scanner(shared.inbox, shared.ops.scandir, every_folder=shared.class_mode)
        self.in_hand = InHand(shared.lock)
        self.spares = Spares(shared)
        self.reservations = Reservations(shared, self.in_hand, self.spares)
        self.claims = Claims(shared, self.in_hand, self.reservations.reserve, self.reservations.release, self.spares)
        self.attempts = AttemptLog(shared, self.in_hand)
        #: Class mode with a state folder (where its records are kept, out of the class's reach); else None.
        self.ledger = Ledger(shared) if shared.class_mode and shared.private != shared.inbox else None
        self.archive = Archive(shared, self.in_hand, self.claims, self.reservations, self.ledger)
        self.dropbox = DropBox(shared, self.in_hand, self.reservations.reserve)
