"""A job's end in the inbox: its claimed file archived to ``.done`` or ``.failed``, and the commit temporaries swept.

:meth:`Archive.archive` moves a finished job's file out of ``.work`` (never
over an older one of that name), drops its output reservation and makes its
emptied folder the next claim's spare. :meth:`Archive.sweep_temporaries`
removes, at start, the commit temporaries (``.<name>.<pid>.tmp``) of
processes that are gone, and :meth:`Archive.sweep_uploads` the uploads
(``.part``, ``.tmp``, ``~``) nobody has touched for long. Whether a job finished, so that only its archive is
left to do, is :func:`mmd.spool.claims.finished`'s to say.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from pathlib import Path

from ..errors import SpoolError
from .claims import Claim, Claims, InHand, spare_folder_pid
from .common import Shared, entries, strerror
from .names import IGNORED_SUFFIXES, MAX_NAME_BYTES, safe_name, shown, state_name
from .reservations import Reservations, pid_alive

# write_atomic's temporaries: .<name>.<pid>.tmp (.<name>.<host>.<pid>.tmp on a shared inbox)
_TMP_RE = re.compile(r"\..+\.(?P<pid>[0-9]+)\.tmp")


class Archive:
    """Archiving one spool's jobs, and its housekeeping."""

    def __init__(self, shared: Shared, hand: InHand, claims: Claims, reservations: Reservations) -> None:
        self.shared = shared
        self.hand = hand
        self.claims = claims
        self.reservations = reservations

    def archive(self, claim: Claim, ok: bool) -> Path:
        """Move the claimed file to ``.done`` (ok) or ``.failed``; never over an older one.

        Raises SpoolError when it cannot: the file is then still in
        ``.work`` (the caller leaves it there for :meth:`mmd.spool.Spool.take_back`).
        """
        shared = self.shared
        try:
            folder = shared.folder(shared.done if ok else shared.failed)
        except (OSError, SpoolError) as exc:
            why = exc.reason if isinstance(exc, SpoolError) else strerror(exc)
            raise SpoolError(f"cannot archive {shown(claim.name)}: {why}") from None
        stem, dot, suffix = safe_name(claim.name).rpartition(".")
        other = f"{stem}.{claim.job_id}.{suffix}" if dot and stem else f"{safe_name(claim.name)}.{claim.job_id}"
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
        self.reservations.release(claim)
        self.hand.forget(claim.job_id)
        self.claims.release_folder(claim.path.parent)
        return target

    def sweep_temporaries(self) -> list[Path]:
        """Remove commit temporaries (``.<name>.<pid>.tmp``), spare reservations (``.work/..spare<k>.claim.<pid>.tmp``)
        and spare job folders (``.work/.spare.<pid>.<k>``) of processes that are gone.

        In the outbox and this host's ``.work`` (mmd's alone) every such name; in the folder of the state
        file (the state_dir, else the inbox, which users write) only its own. On a shared inbox only this host's
        (``.<name>.<host>.<pid>.tmp``, and this host's state file): a pid
        says nothing about another machine's processes.
        """
        shared = self.shared
        removed = []
        host_id = shared.host_id
        own = re.compile(r"\..+\." + re.escape(host_id) + r"\.(?P<pid>[0-9]+)\.tmp") if host_id else _TMP_RE
        state = state_name(host_id)
        for folder in (*shared.output_folders(), shared.work, shared.private):
            for path in entries(folder):
                match = (_TMP_RE if folder == shared.private else own).fullmatch(path.name)
                if folder == shared.private and not path.name.startswith(f".{state}."):
                    continue
                if match and int(match["pid"]) != os.getpid() and not pid_alive(int(match["pid"])):
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
        stay. Judged by mtime: a committed file is never written again (an
        archived input keeps its submitter's mtime: the age of the drop).
        """
        now = time.time() if now is None else now
        shared = self.shared
        removed = []
        archives = (shared.done, shared.failed)
        for folder in (*shared.output_folders(), *archives):
            for path in entries(folder):
                if path.name.startswith("."):
                    continue
                try:
                    info = os.lstat(path)
                    ours = folder in archives or info.st_uid == os.geteuid()
                    if stat.S_ISREG(info.st_mode) and ours and now - info.st_mtime > max_age_s:
                        shared.ops.unlink(path)
                        removed.append(path)
                except OSError:
                    continue
        return removed

    def sweep_uploads(self, max_age_s: float, now: float | None = None) -> list[Path]:
        """Remove the inbox's unfinished uploads (a name ending ``.part``, ``.tmp`` or ``~``, hidden or not)
        whose mtime is older than ``max_age_s``; returns those removed.

        Such a file is never a job: it is an upload that died, or a name
        someone created to block a classmate's ``scp`` to it (the sticky
        inbox stops the classmate from removing it; mmd owns the folder and
        may). Only regular files go; mmd's own temporaries are seconds old.
        """
        now = time.time() if now is None else now
        removed = []
        for path in entries(self.shared.inbox):
            if not path.name.endswith(IGNORED_SUFFIXES):
                continue
            try:
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode) and now - info.st_mtime > max_age_s:
                    self.shared.ops.unlink(path)
                    removed.append(path)
            except OSError:
                continue
        return removed


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are two names of one file."""
    try:
        return os.path.samestat(os.lstat(a), os.lstat(b))
    except OSError:
        return False
