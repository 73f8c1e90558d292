"""A job's end in the inbox: its claimed file archived to ``.done`` or ``.failed``, and the commit temporaries swept.

:meth:`Archive.add` moves a finished job's file out of ``.work`` (never
over an older one of that name), drops its output reservation and makes its
emptied folder a spare for a later claim. :meth:`Archive.sweep_temporaries`
removes, at start, the commit temporaries (:func:`mmd.atomic.temporary_name`'s) of
processes that are gone. Whether a job finished, so that only its archive is
left to do, is :func:`mmd.spool.claims.finished`'s to say.

In class mode each archive is counted in the :class:`~.ledger.Ledger` (the
job's outputs, sidecars and archived input, toward its submitter), and so is
each removal (:meth:`Archive.remove_output`, retention); a refused input is
kept only up to ``archive_refused_bytes`` (:func:`refused_keep`): a head of it,
mmd's own file, ending with a note that says so and whose it was.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path

from ..atomic import temporary_pid
from ..errors import SpoolError
from ..record.reader import load_dict
from ..textcore import HEADER_WINDOW
from .claims import Claim, Claims, InHand
from .ledger import Ledger, Usage, usage_of
from .names import MAX_NAME_BYTES, OUTPUT_SUFFIX, archive_name, arrivals_name, names_of, shown, state_name
from .reservations import Reservations, pid_alive
from .shared import Shared, entries, strerror
from .spares import spare_folder_pid


class Archive:
    """Archiving one spool's jobs, and its housekeeping."""

    def __init__(
        self, shared: Shared, hand: InHand, claims: Claims, reservations: Reservations, ledger: Ledger | None = None
    ) -> None:
        self.shared = shared
        self.hand = hand
        self.claims = claims
        self.reservations = reservations
        #: Class mode: what each submitter keeps, counted as jobs are archived and their files removed.
        self.ledger = ledger

    def add(self, claim: Claim, ok: bool, keep: int | None = None) -> Path:
        """Move the claimed file to ``.done`` (ok) or ``.failed``; never over an older one. ``keep`` (class mode,
        a refused input): keep only that many of its first bytes (:meth:`_keep_head`).

        Raises SpoolError when it cannot: the file is then still in
        ``.work`` (the caller leaves it there for :meth:`.Claims.take_back`).
        """
        shared = self.shared
        try:
            folder = shared.folder(shared.done if ok else shared.failed)
        except (OSError, SpoolError) as exc:
            why = exc.reason if isinstance(exc, SpoolError) else strerror(exc)
            raise SpoolError(f"cannot archive {shown(claim.name)}: {why}") from None
        if keep is not None and not ok and shared.class_mode and claim.regular and (claim.size or 0) > keep:
            target = self._keep_head(claim, folder, keep)
        else:
            target = self._move(claim, folder)
        self.reservations.release(claim)
        self.hand.forget(claim.job_id)
        self.claims.release_folder(claim.path.parent)
        if self.ledger is not None and claim.submitter is not None:
            self.ledger.kept(claim.submitter, names_of(claim.output), target)
        return target

    def _move(self, claim: Claim, folder: Path) -> Path:
        """Move the claimed file into ``folder`` under its name, else its job's (:func:`~.names.archive_name`)."""
        shared = self.shared
        other = archive_name(claim.name, claim.job_id)
        names = [other] if len(os.fsencode(claim.name)) > MAX_NAME_BYTES else [claim.name, other]
        target = None
        for name in names:
            # link + unlink: a name another daemon archived meanwhile is never replaced
            try:
                shared.ops.link(claim.path, folder / name)
            except FileExistsError:
                if not _same_file(claim.path, folder / name):
                    continue
                # This job's own link from an archive whose unlink failed: finish that one.
            except OSError:
                # No hard links here, or refused (another user's file under fs.protected_hardlinks): rename.
                if os.path.lexists(folder / name):
                    continue
                try:
                    shared.ops.rename(claim.path, folder / name)
                except OSError as exc:
                    raise SpoolError(f"cannot archive {shown(claim.name)} to {folder}: {strerror(exc)}") from None
                target = folder / name
                break
            try:
                shared.ops.unlink(claim.path)
            except OSError as exc:
                # Two names now: drop the archived one, so that the job is archived once, later (where
                # that fails too, the next archive finds its own link and finishes it).
                shared.unlink_quietly(folder / name)
                raise SpoolError(f"cannot archive {shown(claim.name)}: {strerror(exc)}") from None
            target = folder / name
            break
        if target is None:
            raise SpoolError(f"cannot archive {shown(claim.name)} to {folder}: its names are taken")
        return target

    def _keep_head(self, claim: Claim, folder: Path, keep: int) -> Path:
        """Archive the first ``keep`` bytes of a refused input, and a note, as a file of mmd's under its job's
        name (:func:`~.names.archive_name`), then remove the input.

        The input is its dropper's, and mmd may only read it: the head is a
        new file (written under a temporary, renamed into place), which the
        note at its end says is a head and whose (the ledger counts it toward
        that submitter). An archive cut short finds its head already there
        (mmd's file under this job's own name) and only removes the input.
        """
        shared = self.shared
        target = folder / archive_name(claim.name, claim.job_id)
        try:
            info = shared.ops.lstat(target)
        except FileNotFoundError:
            info = None
        except OSError as exc:
            raise SpoolError(f"cannot archive {shown(claim.name)}: {strerror(exc)}") from None
        if info is not None and info.st_uid != os.geteuid():
            raise SpoolError(f"cannot archive {shown(claim.name)} to {folder}: its names are taken")
        try:
            if info is None:
                fd = os.open(claim.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    size = os.fstat(fd).st_size
                    head = os.pread(fd, keep, 0)
                finally:
                    os.close(fd)
                note = (f"\n# mmd: kept the first {len(head)} of this input's {size} bytes (archive_refused_bytes); "
                        f"submitted by {claim.submitter} (uid {claim.owner})\n").encode()  # fmt: skip
                shared.commit(target, head + note)
            shared.ops.unlink(claim.path)
        except OSError as exc:
            raise SpoolError(f"cannot archive {shown(claim.name)} to {folder}: {strerror(exc)}") from None
        return target

    def remove_output(self, owner: int, base: str) -> list[str]:
        """Remove ``base``'s output and sidecars from ``owner``'s output folder (``mmd rm``), and the input mmd
        kept of that job (named by its sidecar); uncount them. Returns what went: the names, and ``input NAME``
        for the input. Only regular files of mmd's (or, for the input, the owner's) go."""
        folder = self.shared.output_folder(owner)
        output = folder / (base + OUTPUT_SUFFIX)
        gone: list[str] = []
        gone_usage = Usage()
        kept = self._kept_input(output, owner)
        candidates = [(p, p.name, os.geteuid()) for p in names_of(output)]
        if kept is not None:
            candidates.append((kept, f"input {kept.name}", -1))
        for path, shown_as, uid in candidates:
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode) or (uid >= 0 and info.st_uid != uid):
                    continue
                self.shared.ops.unlink(path)
            except OSError:
                continue
            gone.append(shown_as)
            gone_usage += usage_of(info)
        if self.ledger is not None and gone:
            self.ledger.add(folder.name, -gone_usage)
        return gone

    def _kept_input(self, output: Path, owner: int) -> Path | None:
        """The archived input of the job whose output is ``output``: found from its sidecar (the job's id, its
        input's name and size), under its job's name, else its plain name if it is ``owner``'s and of that size."""
        for ok, sidecar in zip((True, False), names_of(output)[1:], strict=True):
            try:
                found = load_dict(sidecar)
                job, facts = found["job"], found["input"]
                name, size = facts["name"], facts.get("bytes")
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if not isinstance(job, str) or not isinstance(name, str) or "/" in name or name.startswith("."):
                return None
            folder = self.shared.done if ok else self.shared.failed
            plain, by_job = folder / name, folder / archive_name(name, job)
            with contextlib.suppress(OSError):
                info = os.lstat(by_job)
                if info.st_uid in (owner, os.geteuid()):
                    return by_job
            with contextlib.suppress(OSError):
                info = os.lstat(plain)
                if info.st_uid == owner and info.st_size == size:
                    return plain
            return None
        return None

    def sweep_temporaries(self) -> list[Path]:
        """Remove commit temporaries (:func:`mmd.atomic.temporary_name`'s, ``.<name>.<pid>.tmp``), spare
        reservations (``.work/..spare<k>.claim.<pid>.tmp``) and spare job folders (``.work/.spare.<pid>.<k>``) of
        processes that are gone.

        In the outbox, this host's ``.work`` and ``.failed`` (mmd's alone; there a refused input's head is
        written under such a name) every such name; in the folder of the state
        file (the state_dir, else the inbox, which users write) only the state file's and the arrivals record's.
        On a shared inbox only this host's (``.<name>.<host>.<pid>.tmp``, and this host's state file and
        record): a pid says nothing about another machine's processes.
        """
        shared = self.shared
        removed = []
        # The state file's and the record's temporaries, however many dots lead them (an older mmd's had two).
        own_files = tuple(
            f"{name.lstrip('.')}." for name in (state_name(shared.host_id), arrivals_name(shared.host_id))
        )
        for folder in (*shared.output_folders(), shared.work, shared.failed, shared.private):
            for path in entries(folder):
                if folder == shared.private and not path.name.lstrip(".").startswith(own_files):
                    continue
                pid = temporary_pid(path.name, None if folder == shared.private else shared.host_id)
                if pid is not None and pid != os.getpid() and not pid_alive(pid):
                    with contextlib.suppress(OSError):
                        path.unlink()
                        removed.append(path)
        for path in entries(shared.work):
            pid = spare_folder_pid(path.name)
            if pid is not None and pid != os.getpid() and not pid_alive(pid):
                with contextlib.suppress(OSError):
                    shared.ops.rmdir(path)  # an empty folder only
                    removed.append(path)
        return removed

    def sweep_old(self, max_age_s: float, now: float | None = None) -> list[Path]:
        """Remove what mmd wrote and archived that is older than ``max_age_s`` (``retention_days``): outputs
        and sidecars in every output folder, inputs in ``.done`` and ``.failed``; returns those removed.

        Only regular files whose names are not hidden (a reservation or a
        temporary is in use), and in the output folders only mmd's own; folders
        stay. Outputs and sidecars are judged by their mtime, mmd's clock: they
        are mmd's files, never written again, and no one else may touch them.
        An archived input is its dropper's file, whose owner can set its mtime:
        in class mode it is judged by when mmd archived it (the ledger's log of
        archived inputs, by the hour), and its removal uncounted; else by mtime.
        """
        now = time.time() if now is None else now
        shared = self.shared
        removed = []
        archives = (shared.done, shared.failed)
        for folder in (*shared.output_folders(), *(archives if self.ledger is None else ())):
            gone = Usage()
            for path in entries(folder):
                if path.name.startswith("."):
                    continue
                try:
                    info = os.lstat(path)
                    ours = folder in archives or info.st_uid == os.geteuid()
                    if stat.S_ISREG(info.st_mode) and ours and now - info.st_mtime > max_age_s:
                        shared.ops.unlink(path)
                        removed.append(path)
                        gone += usage_of(info)
                except OSError:
                    continue
            if self.ledger is not None and folder != shared.outbox:
                self.ledger.add(folder.name, -gone)
        if self.ledger is not None:
            removed.extend(self._sweep_archived(self.ledger, max_age_s, now))
        return removed

    def _sweep_archived(self, ledger: Ledger, max_age_s: float, now: float) -> list[Path]:
        """Remove the archived inputs of the ledger's logs that are older than ``max_age_s``, each only if it is
        still the file logged (its inode), then the logs themselves."""
        removed = []
        for log in ledger.due(max_age_s, now):
            for logged in ledger.read_log(log):
                try:
                    info = os.lstat(logged.path)
                    if info.st_ino != logged.ino or not stat.S_ISREG(info.st_mode):
                        continue
                    login = ledger.owner_of(logged.path, info)
                    self.shared.ops.unlink(logged.path)
                except OSError:
                    continue
                removed.append(logged.path)
                if login is not None:
                    ledger.add(login, -usage_of(info))
            with contextlib.suppress(OSError):
                os.unlink(log)
        return removed


def refused_keep(cap: int | None, unread: bool) -> int | None:
    """How much of a refused input is archived (None: all of it): ``archive_refused_bytes`` (``cap``), and of
    one refused before it was read (a header alone judged it: a file far larger than its values could take,
    say) no more than the window its header was looked for in."""
    if unread:
        return HEADER_WINDOW if cap is None else min(cap, HEADER_WINDOW)
    return cap


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are two names of one file."""
    try:
        return os.path.samestat(os.lstat(a), os.lstat(b))
    except OSError:
        return False
