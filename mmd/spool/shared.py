"""What the spool's parts share: its folders, its file operations, its lock and the pid it writes as owner.

One :class:`Shared` is handed to :class:`mmd.spool.Spool`, which makes each
part over it (claims, reservations, attempts, archive ...); callers read the
folders from it (``spool.shared.inbox``). It makes and checks the
spool's dot folders on first use (:meth:`Shared.folder`, :meth:`Shared.prepare`)
and does the small file steps several parts need (a file committed
atomically, a quiet unlink) through ``ops``, the :class:`~mmd.fileops.FileOps`
every file operation that moves a job goes through (the tests inject faults
there).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from .. import acl, record
from ..atomic import write_atomic
from ..errors import OutputError, SpoolError
from ..fileops import OPS, FileOps
from ..submitters import login_of
from .names import DONE_DIR, FAILED_DIR, OUTPUT_SUFFIX, WORK_DIR

#: Class mode sets the outbox's own outputs (from before it) aside here, out of the class's reach.
BEFORE_CLASS_MODE = ".before-class-mode"
#: What an output or sidecar's name ends with.
OUTPUT_NAMES = (OUTPUT_SUFFIX, record.TIMING_SUFFIX, record.ERROR_SUFFIX)


class Shared:
    """An inbox and an outbox, their folders, the file operations, the lock, and the owner pid.

    ``host_id`` is set on a shared inbox: this host claims into and resumes
    from ``.work/<host_id>`` only. ``owner_pid`` is the pid written into the
    outbox reservations and taken by their sweep for "this daemon"
    (default: this process's). ``state_dir``: the daemon's private folder,
    where ``.work``, ``.done`` and ``.failed`` are (default: the inbox).
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
        self.inbox = Path(inbox)
        #: Inputs that others could change are refused (:func:`~.names.writable_problem`), and each submitter's
        #: outputs go to a folder of their own (:meth:`output_folder`).
        self.class_mode = class_mode
        #: Class mode: the groups (gids) that read every submitter's outputs besides the submitter.
        self.graders = tuple(graders)
        self.outbox = Path(outbox)
        #: Where the daemon's own folders are: ``state_dir``, else the inbox.
        self.private = Path(state_dir) if state_dir is not None else self.inbox
        #: Set on a shared inbox: this host claims into and resumes from ``.work/<host_id>`` only.
        self.host_id = host_id
        self.ops = ops
        self.owner_pid = os.getpid() if owner_pid is None else owner_pid
        self.work_root = self.private / WORK_DIR
        self.work = self.work_root / host_id if host_id else self.work_root
        self.done = self.private / DONE_DIR
        self.failed = self.private / FAILED_DIR
        #: Taken for the jobs in hand and for decisions that must see them unchanged (a sweep, a take-over).
        self.lock = threading.Lock()
        self._made: set[Path] = set()

    # -- folders --
    def folder(self, path: Path) -> Path:
        """``path``, made (and checked, for the inbox's dot folders) at its first use."""
        if path not in self._made:
            if path == self.work and path != self.work_root:  # .work/<host>: never makes the inbox either
                self.folder(self.work_root)
                self._mkdir(path)
                check_own_folder(path)
            elif path.parent == self.private:
                self._mkdir(path)  # never the inbox itself: if it was deleted, it stays so
                check_own_folder(path)
            else:
                path.mkdir(parents=True, exist_ok=True)
            self._made.add(path)
        return path

    def output_folder(self, owner: int | None) -> Path:
        """Where the outputs of an input dropped by ``owner`` (a uid) go: the outbox, or in class mode the
        owner's own ``outbox/<login>`` (made by :meth:`make_output_folder`)."""
        if not self.class_mode or owner is None:
            return self.outbox
        return self.outbox / login_of(owner)

    def make_output_folder(self, owner: int | None) -> Path:
        """:meth:`output_folder`, made at its first use: in class mode readable by ``owner`` and the graders
        only (an ACL, inherited by every file made in it). Raises SpoolError when it cannot be made so."""
        folder = self.output_folder(owner)
        if folder in self._made or owner is None or folder == self.outbox:
            return folder
        try:
            self._mkdir(folder)
            check_own_folder(folder)
            acl.share_folder(folder, [owner], self.graders)
        except OSError as exc:
            raise SpoolError(f"cannot make the output folder {folder.name}: {strerror(exc)}") from None
        self._made.add(folder)
        return folder

    def output_folders(self) -> list[Path]:
        """The outbox, and in class mode every submitter's folder in it (mmd's own, never a link)."""
        folders = [self.outbox]
        if self.class_mode:
            for entry in entries(self.outbox):
                with contextlib.suppress(OSError, SpoolError):
                    if not entry.name.startswith("."):
                        check_own_folder(entry)
                        folders.append(entry)
        return folders

    def forget_folder(self, path: Path) -> None:
        """Make and check ``path`` again at its next use (it was found missing)."""
        self._made.discard(path)

    def _mkdir(self, path: Path) -> None:
        with contextlib.suppress(FileExistsError):  # made earlier; check_own_folder says whether it is ours
            self.ops.mkdir(path)

    def forget_folders(self) -> None:
        """Make and check every folder again at next use (the inbox was deleted and recreated)."""
        self._made.clear()

    def prepare(self) -> None:
        """Create the inbox and the outbox if missing and check the dot folders users could plant.

        The inbox is writable by the users who drop files: a ``.work``,
        ``.done`` or ``.failed`` that is a link, or a folder someone else owns,
        would let them move or swap claimed files, so the daemon refuses to
        serve until it is removed. A world-writable outbox is refused too.
        """
        for folder in (self.inbox, self.outbox):
            try:
                self.folder(folder)
            except OSError as exc:
                raise SpoolError(f"cannot create {folder}: {exc.strerror or exc}") from None
        if self.private != self.inbox:
            self._prepare_private()
        for folder in (self.work_root, self.work, self.done, self.failed):
            if os.path.lexists(folder):
                check_own_folder(folder)
        if self.class_mode:
            self._prepare_class_inbox()
            acl.check_supported(self.outbox)
        mode = os.stat(self.outbox).st_mode
        if mode & stat.S_IWOTH:
            raise SpoolError(
                f"the outbox {self.outbox} is world-writable (mode {stat.S_IMODE(mode):o}): anyone could replace "
                f"results; chmod o-w it"
            )

    def _prepare_class_inbox(self) -> None:
        """A class's inbox is a drop box: its users may add files but not list it, and what one of them drops
        is readable by the service and no one else (a default ACL that this process sets, as its owner)."""
        acl.check_supported(self.inbox)
        mode = stat.S_IMODE(os.stat(self.inbox).st_mode)
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            raise SpoolError(
                f"class_mode: the inbox {self.inbox} (mode {mode:o}) lets the class list it, and so see each "
                f"other's file names; chmod g-r,o-rwx it (3730: drop, never list)"
            )
        try:
            acl.private_drops(self.inbox, os.geteuid())
        except OSError as exc:
            raise SpoolError(
                f"class_mode: cannot make the inbox's drops private ({strerror(exc)}): the inbox must belong "
                f"to the user mmd runs as"
            ) from None

    def _prepare_private(self) -> None:
        """Make the state folder (0700) when missing, and refuse one that others could reach or change.

        It holds the lock, the state file and every claimed job: a student
        who could write it could stop or freeze the service or swap another's
        job; one who could enter it could read everyone's inputs. It must be
        on the inbox's filesystem, since a claim is a rename.
        """
        folder = self.private
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise SpoolError(f"cannot create the state folder {folder}: {exc.strerror or exc}") from None
        check_own_folder(folder)
        info, inbox = os.lstat(folder), os.stat(self.inbox)
        mode = stat.S_IMODE(info.st_mode)
        if mode & (stat.S_IWGRP | stat.S_IWOTH | stat.S_IRWXO) or (mode & stat.S_IRWXG and info.st_gid == inbox.st_gid):
            raise SpoolError(
                f"the state folder {folder} (mode {mode:o}) is open to others or to the inbox's group: only mmd may "
                f"write it and no one who drops files may enter it; chmod 700 it"
            )
        if info.st_dev != inbox.st_dev:
            raise SpoolError(
                f"the state folder {folder} is not on the inbox's filesystem: a claim is a rename, which cannot "
                f"cross filesystems; put it beside the inbox"
            )

    def adopt_inbox_folders(self) -> list[str]:
        """Move what an earlier daemon kept in the inbox's ``.work``, ``.done`` and ``.failed`` into the state
        folder (the layout before ``state_dir`` was set): its held and claimed jobs resume from there.

        Only for a daemon that holds the lock, with no daemon of the old
        layout alive. Only mmd's own folders move (a link, or a folder a user
        planted, is left where it is: it means nothing now); an entry whose
        name is taken in the state folder stays behind. Returns what moved.
        """
        moved: list[str] = []
        if self.private == self.inbox:
            return moved
        for name in (WORK_DIR, DONE_DIR, FAILED_DIR):
            old, new = self.inbox / name, self.private / name
            try:
                check_own_folder(old)
            except (OSError, SpoolError):
                continue
            if not os.path.lexists(new):
                with contextlib.suppress(OSError):
                    self.ops.rename(old, new)
                    moved.append(name)
                continue
            for entry in entries(old):
                if not os.path.lexists(new / entry.name):
                    with contextlib.suppress(OSError):
                        self.ops.rename(entry, new / entry.name)
                        moved.append(f"{name}/{entry.name}")
        return moved

    def set_aside_shared_outputs(self) -> list[str]:
        """Class mode: move the outputs and sidecars lying in the outbox itself (written before class mode,
        readable by the whole class there) into ``outbox/.before-class-mode`` (0700: the service's and its
        admin's to sort out). Returns the names moved."""
        if not self.class_mode:
            return []
        aside = self.outbox / BEFORE_CLASS_MODE
        moved: list[str] = []
        for entry in entries(self.outbox):
            if entry.name.startswith(".") or not entry.name.endswith(OUTPUT_NAMES):
                continue
            with contextlib.suppress(OSError):
                info = os.lstat(entry)
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                    continue
                if not moved:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(aside, 0o700)
                    check_own_folder(aside)
                if not os.path.lexists(aside / entry.name):
                    self.ops.rename(entry, aside / entry.name)
                    moved.append(entry.name)
        return moved

    # -- small file steps, through ops --
    def commit(
        self, path: Path, data: bytes, *, durable: bool = False, mode: int = 0o644, pid: int | None = None
    ) -> None:
        """``path`` holding ``data``, committed by :func:`mmd.atomic.write_atomic` through ``ops`` (``durable``,
        ``mode``, ``pid``: as its); the OSError behind a failure is raised, for the spool's own messages."""
        try:
            write_atomic(path, [data], durable=durable, mode=mode, pid=pid, ops=self.ops)
        except OutputError as exc:
            if isinstance(exc.__cause__, OSError):
                raise exc.__cause__ from None
            raise

    def unlink_quietly(self, path: Path | None) -> None:
        """Remove ``path`` if there is one; a failure is ignored."""
        if path is not None:
            with contextlib.suppress(OSError):
                self.ops.unlink(path)

    def close_quietly(self, fd: int) -> None:
        """Close ``fd``; a failure is ignored."""
        with contextlib.suppress(OSError):
            self.ops.close(fd)


def strerror(exc: OSError) -> str:
    """An OSError's reason for a message: its ``strerror``, else the whole error."""
    return exc.strerror or str(exc)


def check_own_folder(path: Path) -> None:
    """Refuse a spool folder that is a link or that another user owns (planted in the inbox)."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise SpoolError(f"{path} is not a folder (a link or a file); remove it so that mmd can make its own")
    if info.st_uid != os.geteuid():
        raise SpoolError(f"{path} belongs to uid {info.st_uid}, not to mmd (uid {os.geteuid()}); remove it")


def entries(folder: Path) -> Iterator[Path]:
    """The entries of ``folder`` (none when it is missing), listed before the first is handed out."""
    try:
        with os.scandir(folder) as it:
            yield from (Path(e.path) for e in list(it))
    except FileNotFoundError:
        return
