"""Spares: the released reservations and emptied job folders a process keeps in ``.work`` to use again.

Each job makes two entries that it could free when it ends: its outbox
reservation and its ``.work`` folder. A process keeps them instead, up to
:data:`SPARES` of each. A released reservation is renamed to a spare in this
host's ``.work`` (a commit temporary's name, out of the sight of the outbox's
readers) and written anew as a later job's reservation before it is linked
into place (:meth:`Spares.reservation`); an emptied job folder is renamed to
``.work/.spare.<pid>.<k>`` and then to a later claim's folder
(:meth:`Spares.take_folder`). A process drops its spares when it stops
serving; a killed one's are swept with its temporaries
(:meth:`mmd.spool.archive.Archive.sweep_temporaries`).

Why: on ext4 without a journal (the project's VM) each new inode steps over
every inode freed in the last several seconds (``find_inode_bit`` →
``recently_deleted``), so an entry freed per job made every job's new files
cost more the faster jobs came; and a freed block costs a discard there
(``discard`` mount), so a spare is written over from its start and then cut
to its new text, never emptied first. Without either kind of spare a burst
of small jobs there is slower than the daemon's targets allow: docs/daemon.md
("No file freed per job") gives the measurements and their log.

Where ``.work`` is on another filesystem than an output folder (a rename
cannot cross), that folder's released reservations are removed, not kept.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..atomic import temporary_name
from ..errors import SpoolError
from ..fileops import write_all
from .names import CLAIM_SUFFIX, SPARE_DIR
from .shared import Shared

#: Spares of each kind a process keeps: a group commit's worth (:data:`mmd.daemon.tunables.MAX_GROUP`), whose
#: jobs are all claimed before the first is archived, and release theirs one after another.
SPARES = 16


def spare_folder_pid(name: str) -> int | None:
    """The pid in a process's spare folder's name (``.spare.<pid>.<k>``); None for any other name."""
    head, _, k = name.rpartition(".")
    spare, _, pid = head.partition(f"{SPARE_DIR}.")
    return int(pid) if not spare and pid.isdigit() and k.isdigit() else None


class Spares:
    """This process's spare reservations and job folders in ``.work`` (see the module)."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._files: list[Path] = []
        self._file_names: list[Path] = []
        self._folders: list[Path] = []
        self._folder_names: list[Path] = []
        self._near_work: dict[Path, bool] = {}  # output folder → whether it is on .work's filesystem

    # -- released reservations --
    def reservation(self, folder: Path, text: bytes) -> Path | None:
        """A spare reservation holding ``text`` now, to be linked into output folder ``folder``; None when there
        is none (or it cannot be written: the caller makes a new one, and reports what the outbox says)."""
        if not self._files or not self._near(folder):
            return None
        spare = self._files.pop()
        shared = self.shared
        try:
            fd = shared.ops.open_rewrite(spare)
        except OSError:
            shared.unlink_quietly(spare)
            return None
        try:
            write_all(shared.ops, fd, text)
            shared.ops.truncate(fd, len(text))  # what an earlier, longer text left past it (mostly nothing)
        except OSError:
            shared.close_quietly(fd)
            shared.unlink_quietly(spare)
            return None
        try:
            shared.ops.close(fd)
        except OSError:
            shared.unlink_quietly(spare)
            return None
        return spare

    def put_back(self, spare: Path) -> None:
        """Keep ``spare`` (from :meth:`reservation`, whose link found its name taken) for the next version tried."""
        self._files.append(spare)

    def keep_reservation(self, path: Path) -> bool:
        """Keep released reservation ``path`` as a spare; False when it is not kept (the caller removes it)."""
        if len(self._files) >= SPARES or not self._near(path.parent):
            return False
        if not self._file_names:  # this process's temporaries' names (swept once it is gone), of names no
            # reservation has (a job's stem is never hidden)
            self._file_names = [self.shared.work / temporary_name(f"..spare{k}{CLAIM_SUFFIX}") for k in range(SPARES)]
        return self._keep(path, self._files, self._file_names)

    def _near(self, folder: Path) -> bool:
        """Whether output folder ``folder`` is on the filesystem of this host's ``.work``, where the spares are."""
        near = self._near_work.get(folder)
        if near is None:
            shared = self.shared
            try:
                near = os.stat(folder).st_dev == os.stat(shared.folder(shared.work)).st_dev
            except (OSError, SpoolError):
                return False  # looked at again next time
            self._near_work[folder] = near
        return near

    # -- emptied job folders --
    def take_folder(self, folder: Path) -> bool:
        """A spare job folder renamed to ``folder``; False when there is none. OSError when the rename fails."""
        while self._folders:
            try:
                self.shared.ops.rename(self._folders.pop(), folder)
            except FileNotFoundError:
                continue  # swept meanwhile
            return True
        return False

    def keep_folder(self, folder: Path) -> bool:
        """Keep emptied job folder ``folder`` as a spare; False when it is not kept (the caller removes it)."""
        if len(self._folders) >= SPARES:
            return False
        if not self._folder_names:
            self._folder_names = [self.shared.work / f"{SPARE_DIR}.{os.getpid()}.{k}" for k in range(SPARES)]
        return self._keep(folder, self._folders, self._folder_names)

    def _keep(self, path: Path, kept: list[Path], names: list[Path]) -> bool:
        """``path`` renamed to the first of ``names`` not in ``kept``, and counted there; False when it fails."""
        taken = set(kept)
        spare = next(p for p in names if p not in taken)
        try:
            self.shared.ops.rename(path, spare)
        except OSError:
            return False
        kept.append(spare)
        return True

    def drop(self) -> None:
        """Remove this process's spares (it stops serving; a killed one's are swept with its temporaries)."""
        for spare in self._files:
            self.shared.unlink_quietly(spare)
        self._files.clear()
        for spare in self._folders:
            with contextlib.suppress(OSError):
                self.shared.ops.rmdir(spare)
        self._folders.clear()
