"""The spool protocol: which inbox names are jobs, claim, output names, archive, holds, recovery.

Layout (the dot folders are created on demand)::

    inbox/m.txt                       a job waiting
    inbox/.work/<job>.<v>/m.txt       claimed: job id and output version in the folder name
    inbox/.work/<job>.<v>/.mmd-attempts.json  its starts and holds (see :meth:`Spool.attempt`, :meth:`Spool.hold`)
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
(:meth:`Spool.take_back`). Nothing is ever put back into the inbox.

:class:`Spool` is the one way in: a facade over one module per concept,

* :mod:`.names`: the layout's names, which names are jobs, output names (pure);
* :mod:`.scanning`: what waits in the inbox, and when a file is complete (pure);
* :mod:`.claims`: the claim and the :class:`Claim` record, the jobs in hand, taking jobs from ``.work``;
* :mod:`.reservations`: the outbox reservations of output versions, and their sweep;
* :mod:`.attempts`: a claimed job's starts and holds (:class:`Attempts`), the held jobs;
* :mod:`.archive`: archiving a job to ``.done``/``.failed``, sweeping dead processes' temporaries;
* :mod:`.ledger`: class mode's count of what the service keeps for each submitter, and when it archived inputs;
* :mod:`.dropbox`: what lies in the inbox that is not a job (set aside, or removed), the record of arrivals;
* :mod:`.common`: what the parts share (the folders, the file operations, the lock, the owner pid).

Every file operation that moves a job goes through a :class:`~mmd.fileops.FileOps`
(the daemon's is ``os`` itself; the tests inject faults). :mod:`.names` and
:mod:`.scanning` are pure: :class:`Readiness` and :func:`scan` take their
clock and ``scandir`` as parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from ..fileops import OPS, FileOps
from ..submitters import login_of
from .archive import Archive
from .attempts import AttemptLog, Attempts, HeldJob, held_jobs, read_attempts
from .claims import Claim, Claims, InHand, finished, owned_by
from .common import Shared, entries
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
from .scanning import Arrival, Arrivals, Candidate, Readiness, Survey, scan, stat_entry, survey

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
    "Arrival",
    "Arrivals",
    "Attempts",
    "Candidate",
    "Claim",
    "HeldJob",
    "Readiness",
    "Spool",
    "Survey",
    "Usage",
    "claim_path",
    "entries",
    "entry_problem",
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
    "scan",
    "shown",
    "state_name",
    "survey",
    "work_folder_name",
]


class Spool:
    """An inbox and an outbox, and the moves between them.

    ``ops`` does every file operation that moves a job (the tests inject
    faults through it). A Spool is shared by the daemon's threads: it keeps
    which jobs this process has in hand and which it left in ``.work`` to take
    back, under a lock. ``owner_pid`` (default: this process's) is the pid
    written into the outbox reservations and taken by
    :meth:`sweep_reservations` for "this daemon": a worker process writes
    them in its daemon's name, so that the daemon's sweep treats them as its
    own (:meth:`expect`).

    Each method is one part's (see the package's modules); the Spool only
    wires them together.
    """

    def __init__(
        self,
        inbox: Path,
        outbox: Path,
        host_id: str | None = None,
        ops: FileOps = OPS,
        owner_pid: int | None = None,
        state_dir: Path | None = None,
        class_mode: bool = False,
        graders: Sequence[int] = (),
    ) -> None:
        self._shared = Shared(inbox, outbox, host_id, ops, owner_pid, state_dir, class_mode, graders)
        self._hand = InHand(self._shared.lock)
        self._reservations = Reservations(self._shared, self._hand)
        self._claims = Claims(self._shared, self._hand, self._reservations.reserve, self._reservations.release)
        self._attempts = AttemptLog(self._shared, self._hand)
        #: Class mode (a state_dir is then set): what each submitter keeps, counted as it comes and goes, and the GPU
        #: time their own kernels used.
        self.ledger = Ledger(self._shared) if class_mode and state_dir is not None else None
        self._archive = Archive(self._shared, self._hand, self._claims, self._reservations, self.ledger)
        self._dropbox = DropBox(self._shared, self._hand, self._reservations.reserve)

    # -- folders --
    @property
    def inbox(self) -> Path:
        return self._shared.inbox

    @property
    def outbox(self) -> Path:
        return self._shared.outbox

    @property
    def class_mode(self) -> bool:
        return self._shared.class_mode

    def output_folder(self, owner: int | None) -> Path:
        """Where the outputs of an input ``owner`` dropped go (class mode: ``outbox/<login>``)."""
        return self._shared.output_folder(owner)

    @property
    def private(self) -> Path:
        """The daemon's own folder (lock, state file, ``.work``, ``.done``, ``.failed``): state_dir, else the inbox."""
        return self._shared.private

    @property
    def host_id(self) -> str | None:
        """Set on a shared inbox: this host claims into and resumes from ``.work/<host_id>`` only."""
        return self._shared.host_id

    @property
    def ops(self) -> FileOps:
        return self._shared.ops

    @property
    def owner_pid(self) -> int:
        """The pid written into this spool's reservations (and the attempts' temporaries)."""
        return self._shared.owner_pid

    @property
    def work_root(self) -> Path:
        return self._shared.work_root

    @property
    def work(self) -> Path:
        """``inbox/.work``, or ``inbox/.work/<host_id>`` on a shared inbox."""
        return self._shared.work

    @property
    def done(self) -> Path:
        return self._shared.done

    @property
    def failed(self) -> Path:
        return self._shared.failed

    def forget_folders(self) -> None:
        """Make and check every folder again at next use (the inbox was deleted and recreated)."""
        self._shared.forget_folders()

    def prepare(self) -> None:
        """Create the inbox and the outbox if missing and check the dot folders users could plant."""
        self._shared.prepare()

    def set_aside_shared_outputs(self) -> list[str]:
        """Class mode: the outbox's own outputs (from before it) moved out of the class's reach."""
        return self._shared.set_aside_shared_outputs()

    def adopt_inbox_folders(self) -> list[str]:
        """With a state_dir: move the jobs an earlier daemon kept in the inbox's dot folders into it."""
        return self._shared.adopt_inbox_folders()

    # -- scanning --
    def scan(self) -> list[Candidate]:
        """Job files waiting in the inbox, oldest first."""
        return scan(self.inbox, self._shared.ops.scandir)

    def survey(self) -> Survey:
        """One listing of the inbox: its job files (oldest first), the folders under job names (in class mode
        every folder: one in a drop box lets its owner rename a classmate's file copied into it into the inbox,
        a job in the classmate's name), the uploads. Not every folder without class mode: a personal inbox's
        owner is its only user, and a folder there holds only files its owner may move in anyway."""
        return survey(self.inbox, self._shared.ops.scandir, every_folder=self._shared.class_mode)

    def stat(self, name: str) -> Candidate | None:
        """The inbox entry ``name`` if it is still there and not a folder."""
        return stat_entry(self.inbox, name)

    # -- the drop box: what is not a job --
    def read_arrivals(self) -> dict[str, Arrival]:
        """When an earlier daemon first saw what waited in the inbox to be judged (empty: no record)."""
        return self._dropbox.read_arrivals()

    def write_arrivals(self, record: dict[str, Arrival]) -> None:
        """Keep ``record`` (name -> (inode, first seen)) for the next daemon, atomically; OutputError on failure."""
        self._dropbox.write_arrivals(record)

    def set_aside(self, cand: Candidate, job_id: str) -> Claim | None:
        """Move inbox entry ``cand`` (not a job) out of its name's way, as job ``job_id`` refused unrun, its
        error sidecar's name reserved; None when it is gone or another's. SpoolError when it cannot move."""
        return self._dropbox.set_aside(cand, job_id)

    def remove_upload(self, cand: Candidate) -> bool:
        """Remove upload ``cand`` (``*.part``, ``*.tmp``, ``*~``) if it is still the file seen."""
        return self._dropbox.remove_upload(cand)

    # -- claims and the jobs in hand --
    def claim(self, name: str, job_id: str | None = None) -> Claim | None:
        """Claim inbox file ``name`` (as job ``job_id``, default a new id) into ``.work``; None if it is gone."""
        return self._claims.claim(name, job_id)

    def resumable(self) -> list[Claim]:
        """Jobs left in ``.work`` by an earlier daemon, oldest first, now in hand; empty job folders are removed."""
        return self._claims.resumable()

    def in_work(self) -> list[Claim]:
        """The jobs in this host's ``.work``, oldest first, as they are: neither taken in hand nor tidied."""
        return self._claims.in_work()

    def leave(self, claim: Claim) -> None:
        """Leave ``claim`` in ``.work`` (held, or its archive failed) for :meth:`take_back`; its reservation stays."""
        self._hand.leave(claim)

    def take_back(self) -> list[Claim]:
        """The jobs this process left in ``.work``, in hand again, to run (or archive) once more."""
        return self._claims.take_back()

    @property
    def left(self) -> int:
        """How many jobs this process left in ``.work`` to take back."""
        return self._hand.left

    def expect(self, job_id: str) -> None:
        """Count ``job_id`` in hand here before another process claims with it: its reservation is never stale.

        For a job another process claims in this one's name (``owner_pid``):
        a sweep of this spool then never takes its reservation for stale.
        Undone by :meth:`forget` (or by the job's archive here).
        """
        self._hand.expect(job_id)

    def forget(self, job_id: str) -> None:
        """``job_id`` is no longer in hand here, nor left to take back."""
        self._hand.forget(job_id)

    # -- reservations --
    def reserve(self, stem: str, job_id: str) -> tuple[int, list[str], Path]:
        """Reserve the first free output version of ``stem``: (version, names in the way, reservation)."""
        return self._reservations.reserve(stem, job_id)

    def settle(self, claim: Claim) -> Claim:
        """A job from ``.work`` holding its output version again (or the next free one, when another job has it)."""
        return self._reservations.settle(claim)

    def release(self, claim: Claim) -> None:
        """Drop ``claim``'s output reservation (its sidecar is committed); one that cannot be removed is swept later."""
        self._reservations.release(claim)

    def drop_spares(self) -> None:
        """Remove this process's spare reservations and job folders (kept to be used again while it serves)."""
        self._reservations.drop_spares()
        self._claims.drop_spares()

    def sweep_reservations(self, claims: Iterable[Claim] | None = None) -> list[Path]:
        """Remove reservations left by dead daemons of this host; returns those removed.

        ``claims``: the jobs in this host's ``.work`` (by default ``.work`` is
        listed). The rule: :meth:`mmd.spool.reservations.Reservations.sweep`.
        """
        return self._reservations.sweep(self._claims.in_work() if claims is None else claims)

    # -- attempts and holds --
    def attempts(self, claim: Claim) -> Attempts:
        """``claim``'s record of starts and holds (all zero before the first)."""
        return self._attempts.attempts(claim)

    def attempt(self, claim: Claim) -> int:
        """Record one more start of ``claim``'s job, durably, before it runs; returns its unfinished starts."""
        return self._attempts.attempt(claim)

    def hold(self, claim: Claim, reason: str, *, output_failed: bool = False) -> Attempts:
        """Keep ``claim`` in ``.work``, its reservation kept, to be taken back after a pause; record why."""
        return self._attempts.hold(claim, reason, output_failed=output_failed)

    def excuse(self, claim: Claim) -> Attempts:
        """Record that ``claim``'s last start ended through no fault of its own (not counted as a crash)."""
        return self._attempts.excuse(claim)

    def discard_outputs(self, claim: Claim) -> list[str]:
        """Remove what ``claim``'s job committed to the outbox before it is held; the names that could not be."""
        return self._attempts.discard_outputs(claim)

    # -- finished jobs and the archive --
    def finished(self, claim: Claim) -> tuple[bool, Path] | None:
        """(ok, sidecar) when this job's own sidecar is already committed, else None."""
        return finished(claim)

    def owned_by(self, claim: Claim, path: Path) -> bool:
        """Whether the sidecar at ``path`` was written by ``claim``'s job (it carries the job id)."""
        return owned_by(claim, path)

    def archive(self, claim: Claim, ok: bool, keep: int | None = None) -> Path:
        """Move the claimed file to ``.done`` (ok) or ``.failed``; never over an older one. ``keep``: a refused
        input is kept up to that many bytes (class mode; :func:`mmd.spool.archive.refused_keep`)."""
        return self._archive.archive(claim, ok, keep)

    # -- what each submitter keeps (class mode) --
    def usage(self, owner: int) -> Usage | None:
        """What the service keeps for ``owner`` (a uid): outputs, sidecars, archived inputs (None: not counted,
        outside class mode)."""
        return None if self.ledger is None else self.ledger.usage(login_of(owner))

    def recount(self) -> dict[str, Usage]:
        """Count what each submitter keeps anew from the folders (at the start, before any worker runs)."""
        return {} if self.ledger is None else self.ledger.recount()

    def remove_output(self, owner: int, base: str) -> list[str]:
        """Remove ``owner``'s output ``base`` (``base.out`` and its sidecars) and the input kept of its job;
        what went (``mmd rm``)."""
        return self._archive.remove_output(self._shared.output_folder(owner), base, owner)

    # -- housekeeping --
    def sweep_old(self, max_age_s: float) -> list[Path]:
        """Remove outputs, sidecars and archived inputs older than ``max_age_s`` (retention)."""
        return self._archive.sweep_old(max_age_s)

    def sweep_temporaries(self) -> list[Path]:
        """Remove commit temporaries (``.<name>.<pid>.tmp``) of processes that are gone."""
        return self._archive.sweep_temporaries()
