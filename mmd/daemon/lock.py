"""The lock: one daemon per inbox (or one per host on a shared inbox)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Any

from ..errors import SpoolError
from ..spool import LOCK_NAME, host_lock_name, pid_alive

#: How long a daemon starting waits for a lock whose recorded daemon is dead (its workers are ending).
DEAD_HOLDER_WAIT_S = 10.0


class SpoolLock:
    """``.mmd.lock`` held with ``flock`` for the daemon's life; it holds the daemon's pid.

    It is in the daemon's private folder (``folder``: its state_dir, else
    its inbox), with the per-host locks below.

    On a shared inbox (``host_id`` given) the inbox lock is held shared, so
    daemons of several hosts serve it together while a daemon without
    ``shared_inbox`` (which wants it exclusive) and they refuse each other;
    one daemon per host is then ensured by ``inbox/.mmd.<host_id>.lock``,
    held exclusive and holding ``<host_id> <pid>``.
    """

    def __init__(self, folder: Path, host_id: str | None = None) -> None:
        self.path = Path(folder) / LOCK_NAME
        self.host_id = host_id
        self.host_path = Path(folder) / host_lock_name(host_id) if host_id else None
        self._fd: int | None = None
        self._host_fd: int | None = None

    def acquire(self, wait_for_dead: float = DEAD_HOLDER_WAIT_S) -> None:
        """Take the lock or raise SpoolError naming the daemon that has it.

        The daemon's workers hold its lock too (they are given its open file),
        so it is free only once the daemon and every worker of it are gone. A
        lock whose recorded daemon is dead is waited for up to
        ``wait_for_dead`` seconds: the workers of a daemon killed a moment ago
        are being ended (they die with it).
        """
        inbox = self.path.parent
        fd = _open_lock(self.path)
        try:
            _flock_waiting(fd, fcntl.LOCK_SH if self.host_path else fcntl.LOCK_EX, wait_for_dead)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            who = f"pid {pid}" if pid else "another process"
            if self.host_path is not None:
                raise SpoolError(
                    f"another mmd daemon ({who}) already serves {inbox} without shared_inbox; "
                    "stop it or give it shared_inbox: true"
                ) from None
            if pid is None and _host_locks_held(inbox):
                raise SpoolError(
                    f"mmd daemons with shared_inbox already serve {inbox} (see mmd status); "
                    "set shared_inbox: true to join them"
                ) from None
            raise SpoolError(f"another mmd daemon ({who}) already serves {inbox}") from None
        if self.host_path is None:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._fd = fd
            return
        try:
            host_fd = _open_lock(self.host_path)
        except OSError:
            os.close(fd)
            raise
        try:
            _flock_waiting(host_fd, fcntl.LOCK_EX, wait_for_dead)
        except BlockingIOError:
            pid = _read_pid(host_fd)
            os.close(host_fd)
            os.close(fd)
            who = f"pid {pid}" if pid else "another process"
            raise SpoolError(f"another mmd daemon ({who}) already serves {inbox} as host {self.host_id}") from None
        os.ftruncate(host_fd, 0)
        os.pwrite(host_fd, f"{self.host_id} {os.getpid()}\n".encode(), 0)
        self._fd, self._host_fd = fd, host_fd

    def fds(self) -> list[int]:
        """The open lock files (a worker process is given them, so that the lock lasts as long as it does)."""
        return [fd for fd in (self._fd, self._host_fd) if fd is not None]

    def release(self) -> None:
        if self._host_fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._host_fd, 0)
            os.close(self._host_fd)
            self._host_fd = None
        if self._fd is not None:
            if self.host_path is None:  # the shared inbox lock's file is not this daemon's to clear
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _flock_waiting(fd: int, mode: int, wait_for_dead: float) -> None:
    """flock ``fd``; while it is held and the pid it records is dead, try again for up to ``wait_for_dead`` s."""
    deadline = time.monotonic() + wait_for_dead
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pid = _read_pid(fd)
            if pid is None or pid_alive(pid) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _open_lock(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o644)


def _read_pid(fd: int) -> int | None:
    """The pid in a lock file: ``<pid>`` or ``<host_id> <pid>``."""
    try:
        text = os.pread(fd, 128, 0).decode("ascii", "replace").split()
    except OSError:
        return None
    return int(text[-1]) if text and text[-1].isdigit() else None


def _held(path: Path) -> tuple[bool, str]:
    """Whether the lock file at ``path`` is held (flock), and what it holds."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False, ""
    try:
        text = os.pread(fd, 128, 0).decode("ascii", "replace").strip()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True, text
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False, text
    finally:
        os.close(fd)


def _host_locks_held(inbox: Path) -> bool:
    return any(_held(path)[0] for path in Path(inbox).glob(".mmd.*.lock"))


def lock_holder(folder: Path) -> int | None:
    """The pid of the (non-shared) daemon whose lock is in ``folder`` (its state_dir, else its inbox), or None
    when its lock is free or only shared."""
    try:
        fd = os.open(Path(folder) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or -1  # held, pid not yet written
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def host_daemons(folder: Path, own_host: str | None = None) -> list[dict[str, Any]]:
    """The daemons of a shared inbox: one entry per ``.mmd.<host>.lock``.

    ``held`` is the flock (cluster-wide on NFS by default); a pid is checked
    only for ``own_host``, since a pid means nothing on another machine.
    """
    out = []
    for path in sorted(Path(folder).glob(".mmd.*.lock")):
        host = path.name[len(".mmd.") : -len(".lock")]
        held, text = _held(path)
        parts = text.split()
        pid = int(parts[-1]) if parts and parts[-1].isdigit() else None
        alive = None
        if host == own_host and pid is not None:
            alive = pid_alive(pid)
        serving = held and alive is not False
        out.append({"host": host, "pid": pid if held else None, "serving": serving, "own": host == own_host})
    return out
