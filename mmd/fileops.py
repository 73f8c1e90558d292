"""The file operations of the spool and of the commits, as one injectable object.

:class:`mmd.spool.Spool` and :func:`mmd.atomic.write_atomic` do every
rename, link, unlink, mkdir, exclusive open, write and fsync that moves a job
through :class:`FileOps`, the way watchdog's polling snapshot takes its
``stat`` and ``listdir``: the daemon uses :data:`OPS` (the ``os`` functions
themselves), and the tests pass a subclass that fails chosen operations with
chosen errnos (``tests/test_spool_faults.py``), so that every step's handling
of EROFS, ENOSPC, EACCES, EPERM and EIO is tested without a broken disk.

Each method looks its ``os`` function up when it is called, so a test that
patches ``os.write`` still sees its patch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

# syncfs(2) is not in the os module; one libc call does what fsyncing every dirty file of a
# filesystem would (group commit: mmd.atomic.publish).
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_syncfs = getattr(_libc, "syncfs", None)
#: Whether this system has syncfs(2) (Linux); elsewhere a group commit fsyncs each file.
HAS_SYNCFS = _syncfs is not None
# sync_file_range(2), Linux's, starts a file's writeback without waiting for it.
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
_SYNC_FILE_RANGE_WRITE = 2

#: Flags of a new file that must not exist yet and is never opened through a link planted at its name.
EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
#: Flags of an existing file of mmd's own written anew from its start, never through a link. Not O_TRUNC:
#: emptying a file frees its blocks, which is costly on a disk mounted with ``discard`` (docs/daemon.md, "What
#: limits what"); the writer cuts the file to what it wrote instead (:meth:`FileOps.truncate`), which frees nothing.
REWRITE = os.O_WRONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


class FileOps:
    """The operations, as ``os`` does them; override some to inject faults."""

    def open_exclusive(self, path: Path, mode: int = 0o644) -> int:
        """A new file at ``path`` opened for writing (FileExistsError when the name is taken)."""
        return os.open(path, EXCLUSIVE, mode)

    def open_rewrite(self, path: Path) -> int:
        """An existing file at ``path`` (never through a link) opened for writing from its start, not emptied."""
        return os.open(path, REWRITE)

    def truncate(self, fd: int, length: int) -> None:
        """Cut the file open at ``fd`` to ``length`` bytes."""
        os.ftruncate(fd, length)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def start_writeback(self, fd: int) -> None:
        """Start writing the file open at ``fd`` back to its disk, without waiting (where the system can; its
        fsync, later, waits for it and says whether it failed)."""
        if _sync_file_range is not None:
            _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def link(self, src: Path, dst: Path) -> None:
        """A second name ``dst`` for ``src`` (a symbolic link at ``src`` is linked itself, never followed)."""
        os.link(src, dst, follow_symlinks=False)

    def unlink(self, path: Path) -> None:
        os.unlink(path)

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)

    def lstat(self, path: Path) -> os.stat_result:
        return os.lstat(path)

    def scandir(self, path: Path) -> AbstractContextManager[Iterator[os.DirEntry[str]]]:
        """The entries of folder ``path``, as ``os.scandir`` gives them (close it: a ``with`` block)."""
        return os.scandir(path)

    def syncfs(self, folder: Path) -> None:
        """Write back and wait for every dirty page of the filesystem ``folder`` is on (OSError: a write failed)."""
        if _syncfs is None:
            raise OSError(errno.ENOSYS, "syncfs is not available here")
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if _syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(folder))
        finally:
            os.close(fd)


#: The names of :class:`FileOps`' operations (what a fault can be injected into).
OPERATIONS: tuple[str, ...] = (
    "open_exclusive",
    "open_rewrite",
    "write",
    "truncate",
    "fsync",
    "close",
    "rename",
    "replace",
    "link",
    "unlink",
    "mkdir",
    "rmdir",
    "lstat",
    "scandir",
    "syncfs",
)

#: The operations of the real filesystem.
OPS = FileOps()


def write_all(ops: FileOps, fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` (any contiguous buffer: a numpy array's too) to ``fd`` (``os.write`` may write less
    than it is given)."""
    view = memoryview(data).cast("B")  # os.write counts bytes: slice by bytes, whatever the items are
    while view:
        view = view[ops.write(fd, view) :]
