"""The claim: an inbox file taken into ``.work``, the :class:`Claim` record, and the jobs this process has in hand.

A claim is one ``rename`` into ``.work``: of two claimers exactly one wins,
the other gets FileNotFoundError, which is harmless. The claimed file keeps its
name (the sidecar and logs say ``m.txt``) inside a folder named for the job
(``.work/<job>.<v>``, :func:`~mmd.spool.names.work_folder_name`). The output
name is chosen before the claim and recorded in that folder's name (``<v>``),
so after a kill -9 the job resumes into the same output name
(:meth:`Claims.resumable`), and a sidecar carrying the job id proves that the
job finished and only its archive is left to do (:func:`finished`).

A job claimed and neither archived nor failed stays in ``.work``: a job
this process left there (held, or its archive failed) is taken back after a
pause (:meth:`Claims.take_back`). Nothing is ever put back into the inbox.
Which jobs are in hand, and which were left, is :class:`InHand`'s to say; a
reservation sweep never takes an in-hand job's reservation for stale.

The claim reserves its output version (and :meth:`Claims.take_back` drops the
reservation of a job gone from ``.work``) through the two functions it is
given, :meth:`mmd.spool.reservations.Reservations.reserve` and ``.release``:
reservations build on claims, not the other way round.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import SpoolError
from ..job import new_id
from ..jobname import stem_of
from ..record.reader import load_dict
from ..submitters import login_of
from .names import (
    OUTPUT_SUFFIX,
    WORK_DIR,
    claim_path,
    entry_problem,
    names_of,
    output_path,
    parse_work_folder,
    safe_name,
    shown,
    work_folder_name,
    writable_problem,
)
from .scanning import Candidate
from .shared import Shared, entries, strerror
from .spares import Spares


@dataclass(frozen=True)
class Claim:
    """A claimed job: its file sits at ``path`` (``.work/<job>.<v>/<name>``) until it is archived."""

    job_id: str
    name: str
    version: int
    path: Path
    output: Path
    #: ``time.perf_counter()`` at the claim (the job's ``overall`` starts here).
    started: float
    regular: bool = True
    resumed: bool = False
    #: Names in the outbox that pushed the output to a later version.
    collided: list[str] = field(default_factory=list)
    #: The inbox name when the claim had to rename it (see :func:`~mmd.spool.names.safe_name`).
    original: str | None = None
    #: Why the claimed entry must not be read (a link, a hard link, not a file); None: read it.
    problem: str | None = None
    #: ``outbox/.<stem>[.<v>].claim``: the output version this job holds until its sidecar is committed.
    reservation: Path | None = None
    #: Why no reservation could be made (the outbox refused it): the job is held, not run. None: not refused.
    unreserved: str | None = None
    #: Taken back by the daemon that left it in ``.work`` (held, or its archive failed), not resumed at a start.
    again: bool = False
    #: The claimed entry's size in bytes when it was claimed or taken back (None: not known).
    size: int | None = None
    #: The claimed entry's owner (uid): the job's submitter (None: not known).
    owner: int | None = None
    #: The claimed entry's inode (None: not known).
    ino: int | None = None

    @property
    def stem(self) -> str:
        return stem_of(self.name)

    @property
    def submitter(self) -> str | None:
        """Who dropped the file: its owner's login (None where the owner is not known)."""
        return None if self.owner is None else login_of(self.owner)

    def collision(self) -> dict[str, Any] | None:
        """The sidecar's ``collision`` entry, when the output had to be versioned."""
        if not self.version:
            return None
        return {"wanted": f"{self.stem}{OUTPUT_SUFFIX}", "existing": list(self.collided), "used": self.output.name}


def finished(claim: Claim) -> tuple[bool, Path] | None:
    """(ok, sidecar) when this job's own sidecar is already committed, else None.

    A sidecar is this job's when it carries the job id; it is committed
    last, so its presence means only the archive was left to do.
    """
    _output, timing, error = names_of(claim.output)
    for ok, path in ((True, timing), (False, error)):
        try:
            found = load_dict(path)
        except Exception:  # missing, unreadable or not YAML: not this job's
            continue
        if found.get("job") == claim.job_id:
            return ok, path
    return None


def took_seen(claim: Claim, seen: Candidate) -> bool:
    """Whether ``claim`` took the very file ``seen`` in the inbox (its inode, size and owner), not one renamed
    over its name since."""
    return (claim.ino, claim.size, claim.owner) == (seen.ino, seen.size, seen.owner)


def owned_by(claim: Claim, path: Path) -> bool:
    """Whether the sidecar at ``path`` was written by ``claim``'s job (it carries the job id)."""
    try:
        return load_dict(path).get("job") == claim.job_id
    except Exception:  # missing, unreadable or not YAML: not this job's
        return False


class InHand:
    """The job ids this process has in hand, and the jobs it left in ``.work`` to take back, under ``lock``.

    In hand: claimed, resumed or taken back (or expected: about to be
    claimed under that id by another process for this one), and not yet
    archived or left. Left: held, or their archive failed, for
    :meth:`Claims.take_back`. A reservation of a job in either is never stale.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        #: Job ids this process has in hand (claimed, resumed or taken back, and not yet archived or left).
        self._live: set[str] = set()
        #: Jobs this process left in .work (held, or their archive failed), for :meth:`Claims.take_back`.
        self._left: dict[str, Claim] = {}

    def expect(self, *job_ids: str) -> None:
        """Count ``job_ids`` in hand from now on."""
        with self.lock:
            self._live.update(job_ids)

    def forget(self, job_id: str) -> None:
        """``job_id`` is no longer in hand, nor left to take back."""
        with self.lock:
            self._live.discard(job_id)
            self._left.pop(job_id, None)

    def leave(self, claim: Claim) -> None:
        """``claim`` is no longer in hand but left in ``.work``, to be taken back (``again``)."""
        with self.lock:
            self._live.discard(claim.job_id)
            self._left[claim.job_id] = dataclasses.replace(claim, again=True)

    def take_left(self) -> list[Claim]:
        """The jobs left, no longer counted as left (:meth:`keep_left` one that cannot be taken back now)."""
        with self.lock:
            left = list(self._left.values())
            self._left.clear()
        return left

    def keep_left(self, claim: Claim) -> None:
        """Count ``claim`` (as it is) among the jobs left again."""
        with self.lock:
            self._left[claim.job_id] = claim

    def holds(self, job_id: str) -> bool:
        """Whether ``job_id`` is in hand or left (the caller holds :attr:`lock`)."""
        return job_id in self._live or job_id in self._left

    @property
    def left(self) -> int:
        """How many jobs were left in ``.work`` to take back."""
        with self.lock:
            return len(self._left)


class Reserve(Protocol):
    """Reserves the first free output version of a stem for a job: (version, names in the way, reservation);
    ``looked``: a version to try first (and the names in the way of earlier ones), without looking first."""

    def __call__(
        self, stem: str, job_id: str, owner: int | None = None, looked: tuple[int, list[str]] | None = None
    ) -> tuple[int, list[str], Path]: ...


#: Drops a claim's output reservation (when it is still the claim's).
Release = Callable[[Claim], None]


class Claims:
    """Taking jobs into ``.work`` and back from it: the claim, the jobs a start resumes, those taken back."""

    def __init__(self, shared: Shared, hand: InHand, reserve: Reserve, release: Release, spares: Spares) -> None:
        self.shared = shared
        self.hand = hand
        self.reserve = reserve
        self.release = release
        self.spares = spares
        #: Emptied job folders whose dot files could not all be removed: tried again at the next release.
        self._unemptied: list[Path] = []

    # -- claim --
    def claim(self, name: str, job_id: str | None = None) -> Claim | None:
        """Claim inbox file ``name`` by renaming it into ``.work``; None if it is gone.

        The output version is chosen first and recorded in the claimed name.
        The rename moves a symbolic link itself, never its target; the claim
        says whether the file is a regular one (others are refused unopened).
        The job gets ``job_id`` (default: a new one), in hand from this call on.

        Raises SpoolError when the claim fails: the file is then still in the
        inbox, or, when it was claimed but cannot be looked at, in ``.work``
        and left for :meth:`take_back`. A reservation the outbox refuses does
        not fail the claim: the claim says why (``unreserved``) and the job is
        held.
        """
        shared = self.shared
        safe = safe_name(name)
        stem = stem_of(safe)
        owner = None
        if shared.class_mode:  # the output folder is the owner's: looked at again once the file is ours
            try:
                owner = shared.ops.lstat(shared.inbox / name).st_uid
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise SpoolError(f"cannot claim {shown(name)}: {strerror(exc)}") from None
        # The plain output name is free for nearly every job: its folder is named for it, and the
        # reservation decides (a version taken moves the folder on, below).
        guess = 0
        collided: list[str] = []
        job_id = new_id() if job_id is None else job_id
        self.hand.expect(job_id)  # in hand before its reservation can exist: a sweep never takes it for stale
        try:
            folder = self._job_folder(work_folder_name(job_id, guess))
        except (OSError, SpoolError) as exc:
            self.hand.forget(job_id)
            why = exc.reason if isinstance(exc, SpoolError) else strerror(exc)
            raise SpoolError(f"cannot claim {shown(name)}: cannot make its folder in {WORK_DIR}: {why}") from None
        dst = folder / safe
        try:
            shared.ops.rename(shared.inbox / name, dst)
        except FileNotFoundError:
            self.release_folder(folder)
            self.hand.forget(job_id)
            return None  # someone else has it, or it was removed: harmless
        except OSError as exc:
            self.release_folder(folder)
            self.hand.forget(job_id)
            raise SpoolError(f"cannot claim {shown(name)}: {strerror(exc)}") from None
        except BaseException:
            self.release_folder(folder)
            self.hand.forget(job_id)
            raise
        started = time.perf_counter()
        # From here the file is in .work: whatever fails now keeps it there.
        # Only the claimer that won the rename reserves (a loser must not push the winner to m.1.out).
        if owner is not None:
            with contextlib.suppress(OSError):  # replaced by another's between the look and the rename
                owner = shared.ops.lstat(dst).st_uid
        version, reservation, unreserved = guess, None, None
        try:
            version, collided, reservation = self.reserve(stem, job_id, owner, (guess, collided))
        except SpoolError as exc:
            unreserved = exc.reason
        if version != guess:
            moved = shared.work / work_folder_name(job_id, version)
            try:
                shared.ops.rename(folder, moved)
                folder, dst = moved, moved / safe
            except OSError as exc:
                shared.unlink_quietly(reservation)
                version, reservation = guess, None
                unreserved = f"cannot rename its folder in {WORK_DIR}: {strerror(exc)}"
        claim = functools.partial(
            Claim,
            job_id,
            safe,
            version,
            dst,
            output_path(shared.output_folder(owner), stem, version),
            started,
            collided=collided,
            original=name if safe != name else None,
            reservation=reservation,
            unreserved=unreserved,
        )
        try:
            info = shared.ops.lstat(dst)
        except OSError as exc:
            self.hand.leave(claim())
            raise SpoolError(
                f"claimed {shown(name)} but cannot look at it: {strerror(exc)}; it stays in {WORK_DIR} and is "
                f"tried again after a pause"
            ) from None
        return claim(**self._looks(info))  # made once: a Claim made and then replaced costs twice

    def _looks(self, info: os.stat_result) -> dict[str, Any]:
        """What a claimed entry's ``lstat`` says of it: a regular file or not, why it must not be read, its
        size and owner (a :class:`Claim`'s fields)."""
        problem = entry_problem(info)
        if problem is None and self.shared.class_mode:
            problem = writable_problem(info)
        return {"regular": stat.S_ISREG(info.st_mode), "problem": problem, "size": info.st_size, "owner": info.st_uid,
                "ino": info.st_ino}  # fmt: skip

    def _looked_at(self, claim: Claim, info: os.stat_result, **changes: Any) -> Claim:
        """``claim`` with what its entry's ``lstat`` says (:meth:`_looks`)."""
        return dataclasses.replace(claim, **self._looks(info), **changes)

    def _job_folder(self, name: str) -> Path:
        """An empty ``.work/<name>``: a spare folder of this process's renamed (:class:`~.spares.Spares`), else
        a new one."""
        folder = self.shared.folder(self.shared.work) / name
        if not self.spares.take_folder(folder):
            self.shared.ops.mkdir(folder)
        return folder

    def release_folder(self, folder: Path) -> None:
        """Keep an emptied job folder as a spare of this process's (:class:`~.spares.Spares`), else remove it.

        mmd's own dot files in it (the attempts record, a killed write's
        temporary) are removed first. Where one cannot be, the folder stays as
        it is (no claim may take a folder holding another job's record) and is
        tried again at this process's next release. A folder that still holds
        anything else is left for the next start's recovery, never made a spare.
        """
        again, self._unemptied = self._unemptied, []
        for each in (folder, *again):
            self._release(each)

    def _release(self, folder: Path) -> None:
        """One folder of :meth:`release_folder`'s."""
        shared = self.shared
        try:
            with os.scandir(folder) as it:
                names = [e.name for e in it]
        except OSError:
            return
        for name in names:
            if not name.startswith("."):
                return
            try:
                shared.ops.unlink(folder / name)
            except OSError:
                self._unemptied.append(folder)
                return
        if not self.spares.keep_folder(folder):
            with contextlib.suppress(OSError):
                shared.ops.rmdir(folder)

    # -- jobs in .work --
    def resumable(self) -> list[Claim]:
        """Jobs left in ``.work`` by an earlier daemon, oldest first, now in hand; empty job folders are removed.

        Only for a daemon starting up with the inbox's lock: every job in its
        ``.work`` is then its own.
        """
        claims = self.in_work(tidy=True)
        self.hand.expect(*(c.job_id for c in claims))
        return claims

    def in_work(self, tidy: bool = False) -> list[Claim]:
        """The jobs in this host's ``.work``, oldest first (not taken in hand); ``tidy``: remove empty job folders."""
        shared = self.shared
        claims = []
        for folder in entries(shared.work):
            parsed = parse_work_folder(folder.name)
            if parsed is None or not folder.is_dir():
                continue  # not mmd's: left alone
            job_id, version = parsed
            files = [p for p in entries(folder) if not p.name.startswith(".")]
            if not files:  # killed between mkdir and rename, or after the archive
                if tidy:
                    self.release_folder(folder)
                continue
            for path in files:
                try:
                    info = path.lstat()
                except FileNotFoundError:
                    continue
                claims.append(
                    (
                        info.st_mtime_ns,
                        path.name,
                        self._looked_at(
                            Claim(
                                job_id,
                                path.name,
                                version,
                                path,
                                output_path(shared.output_folder(info.st_uid), stem_of(path.name), version),
                                time.perf_counter(),
                                resumed=True,
                                reservation=claim_path(shared.output_folder(info.st_uid), stem_of(path.name), version),
                            ),
                            info,
                        ),
                    )
                )
        claims.sort(key=lambda c: (c[0], c[1]))
        return [c for _, _, c in claims]

    def take_back(self) -> list[Claim]:
        """The jobs this process left in ``.work``, in hand again, to run (or archive) once more.

        A job whose file is gone from ``.work`` (removed by hand) is dropped
        with its reservation; one that cannot be looked at now is kept for
        the next call. Only what this process left is taken: a job in
        ``.work`` that another daemon has in hand is never touched.
        """
        back = []
        for claim in self.hand.take_left():
            try:
                info = self.shared.ops.lstat(claim.path)
            except FileNotFoundError:
                self.release(claim)
                continue
            except OSError:
                self.hand.keep_left(claim)
                continue
            self.hand.expect(claim.job_id)
            back.append(self._looked_at(claim, info, started=time.perf_counter()))
        return back
