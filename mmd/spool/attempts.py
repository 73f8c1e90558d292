"""A claimed job's starts and holds: the record beside it in ``.work``, the hold, and the held jobs `mmd status` shows.

Outbox trouble (a reservation, an output or a sidecar it cannot write) is
not the input's fault: the job is *held*. What it committed is removed
(:meth:`AttemptLog.discard_outputs`), it stays claimed in ``.work`` with its
reservation, left for :meth:`.Claims.take_back`, and the hold and its
reason are recorded beside it (:data:`~mmd.spool.names.ATTEMPTS_NAME`,
:class:`Attempts`), with every start after the first
(:meth:`AttemptLog.record_start`): what the daemon's limits on crashing and on
failing jobs count. A start cut short when the job's worker was ended for
another job is excused (:meth:`AttemptLog.excuse`): not the job's fault.
:func:`held_jobs` reads the records back for `mmd status`, with no daemon
needed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from .. import record
from ..errors import SpoolError
from .claims import Claim, InHand, owned_by
from .names import ATTEMPTS_NAME, SPARE_DIR, WORK_DIR, names_of, parse_work_folder, shown
from .reservations import read_reservation
from .shared import Shared, entries, strerror


@dataclass(frozen=True)
class Attempts:
    """A claimed job's starts and holds, kept beside it in ``.work`` (:data:`~mmd.spool.names.ATTEMPTS_NAME`).

    Written atomically and fsynced at each change, so the counts survive a
    kill -9 and a power loss; the file lives in the job's folder, so it moves
    with the job (a resumed or re-versioned job keeps it) and goes with its
    archive.
    """

    #: :meth:`AttemptLog.record_start` calls: how often the job was started (or resumed).
    starts: int = 0
    #: Of those starts, how many ended cleanly: in a hold, or excused (its worker was ended for another job).
    settled: int = 0
    #: How often the job was held (the outbox refused what it had to write).
    holds: int = 0
    #: Of the holds, those where the job's own output could not be committed.
    output_failures: int = 0
    #: The last hold's reason.
    reason: str | None = None
    #: When it was first held (ISO time).
    held_since: str | None = None

    @property
    def unfinished(self) -> int:
        """Starts that did not end cleanly (in a hold, or excused): the job crashed the process that ran it (or
        is running now)."""
        return self.starts - self.settled


@dataclass(frozen=True)
class HeldJob:
    """A job kept in ``.work`` because the outbox refused it, as `mmd status` shows it."""

    job: str
    file: str
    #: The host whose ``.work`` holds it (a shared inbox), else None.
    host: str | None
    reason: str
    since: str | None
    holds: int
    output_failures: int


class AttemptLog:
    """The starts and holds of one spool's claimed jobs."""

    def __init__(self, shared: Shared, hand: InHand) -> None:
        self.shared = shared
        self.hand = hand

    def read(self, claim: Claim) -> Attempts:
        """``claim``'s record of starts and holds (all zero before the first)."""
        return read_attempts(claim.path.parent / ATTEMPTS_NAME) or Attempts()

    def record_start(self, claim: Claim) -> int:
        """Record one more start of ``claim``'s job, durably, before it runs; returns its unfinished starts.

        The count returned is how many of the job's starts did not end
        cleanly, this one included: 1 on a first start, and one more for
        each process that died while running it (a start that ended in a
        hold is not counted again). A fresh claim's first start writes
        nothing (the claim records it); every later start is kept in the
        job's ``.work`` folder (:class:`Attempts`), written atomically and
        fsynced before this returns, so it survives kill -9 and goes with the
        job when it is resumed. Raises SpoolError when it cannot be written.
        """
        if not claim.resumed and not claim.again:
            return 1  # a fresh claim's folder holds no record (the spare is emptied): the claim is the first start
        now = self.read(claim)
        if now.starts == 0:
            if not claim.resumed:
                return 1  # the claim itself is the first start: small jobs pay no fsync for a record
            now = dataclasses.replace(now, starts=1)  # that first start, never written
        new = dataclasses.replace(now, starts=now.starts + 1)
        self._write_attempts(claim, new)
        return new.unfinished

    def hold(self, claim: Claim, reason: str, *, output_failed: bool = False) -> Attempts:
        """Keep ``claim`` in ``.work``, its reservation kept, to be taken back after a pause; record why.

        ``output_failed``: the job's own output could not be committed (what
        the daemon's limit on output attempts counts), as opposed to its
        reservation or a sidecar. The record (:class:`Attempts`) is written
        durably; the hold stands even when it cannot be (SpoolError is then
        raised after the hold is in place).
        """
        now = self.read(claim)
        starts = max(now.starts, 1)  # a first start is not written (see record_start)
        new = dataclasses.replace(
            now,
            starts=starts,
            settled=starts,
            holds=now.holds + 1,
            output_failures=now.output_failures + (1 if output_failed else 0),
            reason=reason,
            held_since=now.held_since or record.now_iso(),
        )
        self.hand.leave(claim)
        self._write_attempts(claim, new)
        return new

    def excuse(self, claim: Claim) -> Attempts:
        """Record that ``claim``'s last start ended through no fault of its own, durably: its worker was ended
        to stop another job (a cancel, a time limit) after this one had run, its group's commit pending. That
        start counts as settled, as a hold's does; the job's earlier crashes still count. Raises SpoolError
        when it cannot be written (the start then counts as a crash)."""
        now = self.read(claim)
        starts = max(now.starts, 1)  # a first start is not written (see record_start)
        new = dataclasses.replace(now, starts=starts, settled=min(starts, now.settled + 1))
        self._write_attempts(claim, new)
        return new

    def _write_attempts(self, claim: Claim, attempts: Attempts) -> None:
        """Commit ``attempts`` durably; its temporary carries the owner's pid, so that a worker killed while
        writing it leaves one the next worker of that daemon writes over."""
        data = json.dumps(dataclasses.asdict(attempts)).encode()
        try:
            self.shared.commit(claim.path.parent / ATTEMPTS_NAME, data, durable=True, pid=self.shared.owner_pid)
        except OSError as exc:
            why = strerror(exc)
            raise SpoolError(f"cannot record the attempts of {shown(claim.name)} in {WORK_DIR}: {why}") from None

    def discard_outputs(self, claim: Claim) -> list[str]:
        """Remove what ``claim``'s job committed to the outbox before it is held; the names that could not be.

        Its output, when it holds that version's reservation (else the
        output may be another job's by now), and those of its sidecars that
        carry its job id: nothing half done stays visible.
        """
        held = read_reservation(claim.reservation) if claim.reservation is not None else None
        ours = held is not None and held[0] == claim.job_id
        stuck = []
        for path in names_of(claim.output):
            if not (ours and path == claim.output) and not owned_by(claim, path):
                continue
            try:
                self.shared.ops.unlink(path)
            except FileNotFoundError:
                continue
            except OSError:
                stuck.append(path.name)
        return stuck


def read_attempts(path: Path) -> Attempts | None:
    """The :class:`Attempts` record at ``path``; None when there is none (or it is not mmd's)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    known = {f.name for f in dataclasses.fields(Attempts)}
    try:
        return Attempts(**{k: v for k, v in data.items() if k in known})
    except TypeError:
        return None


def held_jobs(private: Path) -> list[HeldJob]:
    """Jobs held in ``private/.work`` (the state_dir, else the inbox; every host's on a shared inbox), oldest
    hold first, for `mmd status`."""
    work = Path(private) / WORK_DIR
    folders: list[tuple[Path, str | None]] = []
    for entry in entries(work):
        if parse_work_folder(entry.name) is not None:
            folders.append((entry, None))
        elif not entry.name.startswith(SPARE_DIR) and entry.is_dir() and not entry.is_symlink():
            folders.extend((sub, entry.name) for sub in entries(entry) if parse_work_folder(sub.name) is not None)
    found = []
    for folder, host in folders:
        attempts = read_attempts(folder / ATTEMPTS_NAME)
        if attempts is None or not attempts.holds:
            continue
        files = [p.name for p in entries(folder) if not p.name.startswith(".")]
        parsed = parse_work_folder(folder.name)
        if not files or parsed is None:
            continue
        found.append(
            HeldJob(
                parsed[0],
                shown(files[0]),
                host,
                attempts.reason or "",
                attempts.held_since,
                attempts.holds,
                attempts.output_failures,
            )
        )
    found.sort(key=lambda h: (h.since or "", h.file))
    return found
