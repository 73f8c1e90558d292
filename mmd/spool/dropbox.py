"""What lies in the drop box that is not a job: folders (under job names; in class mode any), unfinished files, uploads.

Each is judged by when the daemon first saw it (:class:`~.scanning.Arrivals`),
never by its mtime, which its owner sets. The daemon keeps those times in
its private folder (:meth:`DropBox.read_arrivals`, :meth:`DropBox.write_arrivals`),
so that a restart judges them as the daemon before it did. Past its bound,
a folder or an unfinished file is set aside (:meth:`DropBox.set_aside`) out
of its name's way, with an output name reserved for the error sidecar that
tells its owner why; an upload is removed (:meth:`DropBox.remove_upload`).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ..atomic import write_atomic
from ..errors import MmdError, SpoolError
from ..jobname import stem_of
from .claims import Claim, InHand
from .names import archive_name, arrivals_name, output_path, safe_name, shown
from .scanning import Arrival, Candidate
from .shared import Shared, strerror

#: The record's format; a record of another is not read (its entries are seen again from now).
_VERSION = 1


class DropBox:
    """One spool's drop box: what is set aside or removed there, and the record of first sightings."""

    def __init__(
        self, shared: Shared, hand: InHand, reserve: Callable[[str, str, int | None], tuple[int, list[str], Path]]
    ) -> None:
        self.shared = shared
        self.hand = hand
        self.reserve = reserve

    @property
    def arrivals_path(self) -> Path:
        """The record of first sightings: ``<state_dir>/.mmd-arrivals.json`` (:func:`~.names.arrivals_name`)."""
        return self.shared.private / arrivals_name(self.shared.host_id)

    def read_arrivals(self) -> dict[str, Arrival]:
        """The record an earlier daemon kept: name -> (inode, first seen). Empty where there is none, or where it
        is not mmd's own regular file (a link or another's, planted in an inbox without a state_dir) or not
        readable as one: its entries are then first seen now, which only gives them longer."""
        path = self.arrivals_path
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return {}
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                return {}
            try:
                data = json.loads(f.read())
                if data.get("version") != _VERSION:
                    return {}
                return {str(name): (None if ino is None else int(ino), float(t)) for name, ino, t in data["seen"]}
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                return {}

    def write_arrivals(self, record: dict[str, Arrival]) -> None:
        """Replace the record with ``record`` (atomically: a crash leaves the old one or the new one whole).
        Raises OutputError when it cannot be written."""
        seen = [[name, ino, t] for name, (ino, t) in sorted(record.items())]
        # Names that are not UTF-8 (Python's surrogate escapes) go as JSON's \udcXX escapes and come back so.
        data = json.dumps({"version": _VERSION, "seen": seen}, separators=(",", ":")).encode()
        write_atomic(self.arrivals_path, [data], ops=self.shared.ops)

    def set_aside(self, cand: Candidate, job_id: str) -> Claim | None:
        """Move inbox entry ``cand`` out of its name's way, as job ``job_id`` refused unrun: into ``.failed``
        (as ``<stem>.<job>.<suffix>``), out of everyone's reach. The returned claim is where it lies now, with
        its error sidecar's output name reserved in its owner's folder (``unreserved``: why not). None when
        the entry under that name is gone or another than ``cand`` (judged again as a new arrival).

        A folder that mmd may not write (a student's own, as mmd runs with no capabilities) cannot move to
        another folder (the kernel lets only its writers change its ``..``): it is renamed in the inbox,
        hidden, under a random tag in place of the job id (``.<stem>.<tag>.<suffix>``: unlisted in a class's
        drop box, and not to be guessed from the error sidecar, which its owner reads and which names the job:
        a teammate's file in a team folder stays out of its owner's reach). Raises SpoolError when it cannot
        be moved at all.
        """
        shared = self.shared
        src = shared.inbox / cand.name
        try:
            info = shared.ops.lstat(src)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SpoolError(f"cannot set {shown(cand.name)} aside: {strerror(exc)}") from None
        if info.st_ino != cand.ino or info.st_uid != cand.owner:
            return None
        aside = archive_name(cand.name, job_id)
        self.hand.expect(job_id)  # its reservation, until its sidecar is written, is never stale
        try:
            failed = shared.folder(shared.failed)
            try:
                where = failed / aside
                shared.ops.rename(src, where)
            except PermissionError:
                if not stat.S_ISDIR(info.st_mode):
                    raise
                where = shared.inbox / f".{archive_name(cand.name, os.urandom(8).hex())}"
                shared.ops.rename(src, where)
        except FileNotFoundError:
            self.hand.forget(job_id)
            return None
        except (OSError, SpoolError) as exc:
            self.hand.forget(job_id)
            why = exc.reason if isinstance(exc, MmdError) else strerror(exc)
            raise SpoolError(f"cannot set {shown(cand.name)} aside: {why}") from None
        safe = safe_name(cand.name)
        stem = stem_of(safe.lstrip(".")) or stem_of(safe)  # .team's note: team.error.yaml, never a hidden one
        version, reservation, unreserved = 0, None, None
        collided: list[str] = []
        try:
            version, collided, reservation = self.reserve(stem, job_id, info.st_uid)
        except SpoolError as exc:
            unreserved = exc.reason
        return Claim(
            job_id,
            safe,
            version,
            where,
            output_path(shared.output_folder(info.st_uid), stem, version),
            time.perf_counter(),
            regular=stat.S_ISREG(info.st_mode),
            collided=collided,
            original=cand.name if safe != cand.name else None,
            reservation=reservation,
            unreserved=unreserved,
            size=info.st_size,
            owner=info.st_uid,
            ino=info.st_ino,
        )

    def remove_upload(self, cand: Candidate) -> bool:
        """Remove upload ``cand`` (a regular file named ``*.part``, ``*.tmp`` or ``*~``) if it is still the one
        seen: an upload that died, or a name taken to block a classmate's upload (the sticky inbox stops the
        classmate from removing it; mmd owns the folder and may)."""
        path = self.shared.inbox / cand.name
        with contextlib.suppress(OSError):
            info = self.shared.ops.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_ino == cand.ino:
                self.shared.ops.unlink(path)
                return True
        return False
