"""Outbox reservations: the output version a claimed job holds until its sidecar is committed.

A reservation is ``outbox/.<stem>[.<v>].claim`` holding ``<job> <host>
<pid>`` (the pid is the spool's owner, the daemon's by default). It is made
at the claim (:meth:`Reservations.reserve`), taken again by a job resumed or
taken back from ``.work`` (:meth:`Reservations.settle`), dropped once the
job's sidecar is committed (:meth:`Reservations.release`), and the ones
whose daemon is gone are swept at start (:meth:`Reservations.sweep`).
While it exists no other job writes that version, so a job's output name
stays its own across a kill -9 and a hold.

A released reservation is kept as a spare of this process and written anew
for a later job (:class:`~mmd.spool.spares.Spares`, which says why).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from ..atomic import write_atomic
from ..errors import OutputError, SpoolError
from ..fileops import write_all
from .claims import Claim, InHand, owned_by
from .names import CLAIM_SUFFIX, WORK_DIR, claim_path, names_of, output_path, resolve_output, work_folder_name
from .shared import Shared, entries, strerror
from .spares import Spares

#: mmd writes a reservation in full before it takes its name, so an empty one is only what an older mmd
#: (or a filesystem without hard links) leaves when killed between creating and writing it. Such a
#: reservation that no job of this host maps to is stale once it is this old (seconds): its content
#: cannot say whose it is, and a live writer fills it right after it creates it.
EMPTY_RESERVATION_GRACE_S = 60.0
#: What ``link`` says on a filesystem without hard links (the reservation is then created in place).
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS})


#: More than a reservation holds (``<job> <host> <pid>``; a host id is a short name).
_RESERVATION_MAX = 512


def read_reservation(path: Path) -> tuple[str, str, int] | None:
    """(job id, host, pid) from a reservation file; None when missing or not mmd's (never through a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        job, host, pid = os.read(fd, _RESERVATION_MAX).decode("ascii").split()
        return job, host, int(pid)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (one we may not signal still counts; a zombie, dead and not
    yet reaped by its parent, does not: a killed daemon's workers are zombies until their new parent reaps
    them, which some init processes never do)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True  # no /proc here: it exists, so it counts
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


class Reservations:
    """The outbox reservations of one spool's jobs."""

    def __init__(self, shared: Shared, hand: InHand, spares: Spares) -> None:
        self.shared = shared
        self.hand = hand
        self.spares = spares

    def reserve(
        self, stem: str, job_id: str, owner: int | None = None, looked: tuple[int, list[str]] | None = None
    ) -> tuple[int, list[str], Path]:
        """Reserve the first free output version of ``stem`` in the output folder of ``owner`` (the input's
        uid: class mode's own folder, else the outbox): (version, names in the way, reservation).

        The reservation ``outbox/.<stem>[.<v>].claim`` holds ``<job> <host>
        <pid>``; it is taken atomically (see :meth:`_create_reservation`), and
        when another job made it first, the next version is tried. After
        taking it the version's own names are looked at again: a job that held
        it a moment ago commits its output before it drops its reservation.
        ``looked``: a version to try first and the names in the way of earlier
        ones (the claim's guess, the plain name), taken without looking first
        (the look after taking it is what decides). Raises SpoolError when the
        outbox refuses it.
        """
        outbox = self.shared.make_output_folder(owner)
        start, collided = 0, []
        while True:
            if looked is not None:
                (version, more), looked = looked, None
            else:
                version, more = resolve_output(outbox, stem, start=start)
            collided.extend(more)
            path = claim_path(outbox, stem, version)
            if not self._create_reservation(path, job_id):
                collided.append(path.name)
                start = version + 1
                continue
            late = [p.name for p in names_of(output_path(outbox, stem, version)) if os.path.lexists(p)]
            if not late:
                return version, collided, path
            self.shared.unlink_quietly(path)
            collided.extend(late)
            start = version + 1

    def _reservation_text(self, job_id: str) -> bytes:
        return f"{job_id} {self.shared.host_id or '-'} {self.shared.owner_pid}\n".encode()

    def _create_reservation(self, path: Path, job_id: str) -> bool:
        """Take reservation ``path`` for ``job_id``; False when another job holds it.

        The reservation is written in full and then linked to its own name
        (``link`` fails when the name exists, as ``O_EXCL`` does), so no one
        ever sees it empty: a spare of this process's written anew, else a
        commit that never replaces (:func:`mmd.atomic.write_atomic`); a kill
        before the link leaves only a temporary, which the start-up sweep
        removes. Where the filesystem has no hard links it is created
        ``O_EXCL`` in place and written. A missing outbox is made again.
        """
        text = self._reservation_text(job_id)
        spare = self.spares.reservation(path.parent, text)
        try:
            if spare is not None:
                return self._link_spare(spare, path)
            self._commit_new(path, text)
        except FileExistsError:
            return False
        except OSError as exc:  # the link refused
            if exc.errno not in _NO_LINKS:
                raise SpoolError(f"cannot reserve {path.name} in the outbox: {strerror(exc)}") from None
            return self._create_in_place(path, text)
        return True

    def _commit_new(self, path: Path, text: bytes) -> None:
        """Reservation ``path`` holding ``text``, committed without ever replacing one: OSError when the link is
        refused (FileExistsError: it is taken), SpoolError when the outbox refuses the file."""
        shared = self.shared
        for again in (True, False):
            try:
                write_atomic(path, [text], durable=False, replace=False, ops=shared.ops)
                return
            except OutputError as exc:
                missing = isinstance(exc.__cause__, FileNotFoundError)  # the outbox was deleted under us
                if missing and again and path.parent == shared.outbox:
                    shared.outbox.mkdir(parents=True, exist_ok=True)
                    continue
                if missing:  # a submitter's folder: made again, with its ACL, next time
                    shared.forget_folder(path.parent)
                why = strerror(exc.__cause__) if isinstance(exc.__cause__, OSError) else exc.reason
                raise SpoolError(f"cannot reserve {path.name} in the outbox: {why}") from None

    def _link_spare(self, spare: Path, path: Path) -> bool:
        """Spare ``spare``, holding its reservation's text, linked to ``path``; False when ``path`` is taken
        (the spare is kept for the next version tried). OSError when the link fails otherwise."""
        try:
            self.shared.ops.link(spare, path)
        except FileExistsError:
            self.spares.put_back(spare)
            return False
        except OSError:
            self.shared.unlink_quietly(spare)
            raise
        self.shared.unlink_quietly(spare)  # a name only: the file lives on as the reservation
        return True

    def _create_in_place(self, path: Path, text: bytes) -> bool:
        """The reservation created ``O_EXCL`` and written (no hard links here); False when it exists."""
        shared = self.shared
        try:
            fd = shared.ops.open_exclusive(path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise SpoolError(f"cannot reserve {path.name} in the outbox: {strerror(exc)}") from None
        try:
            write_all(shared.ops, fd, text)
        except OSError as exc:
            shared.close_quietly(fd)
            shared.unlink_quietly(path)
            raise SpoolError(f"cannot reserve {path.name} in the outbox: {strerror(exc)}") from None
        shared.close_quietly(fd)
        return True

    def _take_empty(self, path: Path, job_id: str) -> bool:
        """Take reservation ``path`` for ``job_id`` if it is empty (a kill between its creation and its write)."""
        shared = self.shared
        try:
            info = shared.ops.lstat(path)
        except FileNotFoundError:
            return self._create_reservation(path, job_id)
        except OSError as exc:
            raise SpoolError(f"cannot reserve {path.name} in the outbox: {strerror(exc)}") from None
        if not stat.S_ISREG(info.st_mode) or info.st_size:
            return False  # another job's, or not mmd's
        try:
            shared.commit(path, self._reservation_text(job_id))
        except OSError as exc:
            raise SpoolError(f"cannot reserve {path.name} in the outbox: {strerror(exc)}") from None
        held = read_reservation(path)
        return held is not None and held[0] == job_id

    def settle(self, claim: Claim) -> Claim:
        """A job from ``.work`` holding its output version again; moved to the next free version if another job has it.

        A kill between the claim's rename and its reservation leaves a job
        without one, and a kill between creating the reservation and writing
        it leaves an empty one, which is this job's to take over; another
        daemon may meanwhile have reserved (or even finished) that version.
        The job takes its reservation again when it is free and no other job's
        sidecar sits there, else it reserves the next free version and its
        ``.work`` folder is renamed to match. When the outbox refuses, the
        claim comes back without a reservation and says why (``unreserved``).
        """
        shared = self.shared
        try:
            shared.make_output_folder(claim.owner)
        except SpoolError as exc:
            return dataclasses.replace(claim, reservation=None, unreserved=exc.reason)
        path = claim_path(claim.output.parent, claim.stem, claim.version)
        held = read_reservation(path)
        if held is not None and held[0] == claim.job_id:
            return dataclasses.replace(claim, reservation=path, unreserved=None)
        try:
            if held is None:
                with shared.lock:  # two jobs of this process that map to one empty reservation: one takes it
                    taken = self._take_empty(path, claim.job_id)
                if taken:
                    _out, timing, error = names_of(claim.output)
                    others = [p for p in (timing, error) if os.path.lexists(p) and not owned_by(claim, p)]
                    if not others:
                        return dataclasses.replace(claim, reservation=path, unreserved=None)
                    shared.unlink_quietly(path)
            version, collided, reservation = self.reserve(claim.stem, claim.job_id, claim.owner)
        except SpoolError as exc:
            return dataclasses.replace(claim, reservation=None, unreserved=exc.reason)
        if version == claim.version:
            return dataclasses.replace(claim, reservation=reservation, unreserved=None)
        moved = shared.work / work_folder_name(claim.job_id, version)
        try:
            shared.ops.rename(claim.path.parent, moved)
        except OSError as exc:
            shared.unlink_quietly(reservation)
            why = f"cannot rename its folder in {WORK_DIR}: {strerror(exc)}"
            return dataclasses.replace(claim, reservation=None, unreserved=why)
        return dataclasses.replace(
            claim,
            version=version,
            path=moved / claim.name,
            output=output_path(reservation.parent, claim.stem, version),
            collided=collided,
            reservation=reservation,
            unreserved=None,
        )

    def release(self, claim: Claim) -> None:
        """Drop ``claim``'s output reservation (its sidecar is committed); one that cannot be removed is swept later."""
        path = claim.reservation
        if path is None:
            return
        held = read_reservation(path)
        if held is not None and held[0] == claim.job_id:
            self._retire(path)

    def _retire(self, path: Path) -> None:
        """Drop the reservation at ``path``: kept as a spare of this process, else removed."""
        if not self.spares.keep_reservation(path):
            self.shared.unlink_quietly(path)

    def sweep(self, work: Iterable[Claim]) -> list[Path]:
        """Remove reservations left by dead daemons of this host; returns those removed.

        Staleness is judged by the owner, not by age (Postfix's rule for its
        queue files): a reservation names ``<job> <host> <pid>``, and it is
        stale when ``<host>`` is this host and its job is not in hand here nor
        in this host's ``.work`` (``work``: those jobs), unless ``<pid>`` is
        another process alive on this host (another daemon sharing the
        outbox); this spool's owner pid is "here". An empty reservation that a
        job in ``.work`` maps to is that job's to take over (:meth:`settle`);
        one no job maps to is stale after :data:`EMPTY_RESERVATION_GRACE_S`,
        and only without a shared inbox (there it could be any host's). Other
        hosts' reservations are theirs.
        """
        shared = self.shared
        work = list(work)
        in_work = {c.job_id for c in work}
        mapped = {claim_path(c.output.parent, c.stem, c.version) for c in work}
        me, pid = shared.host_id or "-", shared.owner_pid
        removed = []
        for path in (path for folder in shared.output_folders() for path in entries(folder)):
            if not path.name.startswith(".") or not path.name.endswith(CLAIM_SUFFIX):
                continue
            held = read_reservation(path)
            if held is None:
                if not self._stale_empty(path, mapped):
                    continue
            else:
                job, host, owner = held
                if host != me or job in in_work or (owner != pid and pid_alive(owner)):
                    continue
                with self.hand.lock:  # decided under the lock: a job claimed meanwhile is in hand before it reserves
                    if self.hand.holds(job):
                        continue
            try:
                shared.ops.unlink(path)
            except OSError:
                continue  # gone meanwhile, or the outbox refuses: tried again at the next sweep
            removed.append(path)
        return removed

    def _stale_empty(self, path: Path, mapped: set[Path]) -> bool:
        if self.shared.host_id is not None or path in mapped:
            return False
        try:
            info = self.shared.ops.lstat(path)
        except OSError:
            return False
        old = time.time() - info.st_mtime > EMPTY_RESERVATION_GRACE_S
        return stat.S_ISREG(info.st_mode) and info.st_size == 0 and info.st_uid == os.geteuid() and old
