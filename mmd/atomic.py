"""Atomic file commits: every file mmd writes for others to read goes through :class:`Staged` (a job's output
and sidecar, published together) or :func:`write_atomic` (one file), and a symbolic link it replaces through
:func:`link_atomic`.

A file is written in full under a hidden temporary name in its destination's
folder and then renamed onto its name, so a reader (a grader's diff, the
daemon's next scan, a student's browser) sees at every instant the old file
(or none) or the whole new one, never a part; a failure at any step removes
the temporary. The temporary's name is :func:`temporary_name`'s, the one
scheme: ``<name>[.<n>][.<host>].<pid>.tmp`` with a ``.`` in front unless
``<name>`` is hidden already, so that the inbox's scanner and most tools pass
it by, and a start-up sweep knows whose it is (:func:`temporary_pid`) and
removes it once that process is gone. Whether a commit is fsynced is the
caller's to say, per call (``durable``): outputs, sidecars and the records a
restart reads are; a status file, a report or a cache entry need not be.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import OutputError
from .fileops import HAS_SYNCFS, OPS, FileOps

#: The host id that commit temporaries carry (``.<name>.<host>.<pid>.tmp``); set by a
#: daemon on a shared inbox, so that each host sweeps only its own. None: ``.<name>.<pid>.tmp``.
_host: str | None = None
#: The longest file name (bytes) most filesystems take.
NAME_MAX = 255
#: A temporary's name, whatever its host: the pid of the process it is for is the number before ``.tmp``.
_TEMPORARY = re.compile(r"\..+\.(?P<pid>[0-9]+)\.tmp")
#: The temporaries this process has open now: a second commit of one name at once takes the next free one,
#: and a file of a name not in here is a leftover (a killed process's with this pid, or planted) to remove.
_in_use: set[Path] = set()
_in_use_lock = threading.Lock()


def set_host(host_id: str | None) -> None:
    """Tag this process's commit temporaries with ``host_id`` (None: no tag)."""
    global _host
    _host = host_id


def temporary_name(name: str, host: str | None = None, pid: int | None = None, serial: int = 0) -> str:
    """The hidden temporary a commit of ``name`` writes first: ``.<name>[.<serial>][.<host>].<pid>.tmp``, without
    the leading ``.`` where ``name`` is hidden already.

    ``serial`` tells apart commits of one name at once in one process (0:
    none). Where the name would not fit NAME_MAX (a long name plus a host
    id), the name part is 16 hex digits of its sha256 instead: still one
    temporary per name and process, and still matched by the sweep's pattern.
    """
    host = _host if host is None else host
    tag = ".".join(str(part) for part in (serial or None, host, os.getpid() if pid is None else pid) if part)
    hidden = name if name.startswith(".") else f".{name}"
    tmp = f"{hidden}.{tag}.tmp"
    if len(tmp.encode("utf-8", "surrogateescape")) > NAME_MAX:
        digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        tmp = f".{digest}.{tag}.tmp"
    return tmp


def temporary_pid(name: str, host: str | None = None) -> int | None:
    """The pid of the process whose temporary ``name`` is (:func:`temporary_name`'s); None for any other name,
    and with ``host``, for any other host's."""
    pattern = _TEMPORARY if host is None else re.compile(r"\..+\." + re.escape(host) + r"\.(?P<pid>[0-9]+)\.tmp")
    match = pattern.fullmatch(name)
    return int(match["pid"]) if match else None


def _take_temporary(path: Path, pid: int | None) -> Path:
    """The temporary for a commit of ``path`` now, marked in use by this process until :func:`_give_back`."""
    with _in_use_lock:
        serial = 0
        while (tmp := path.parent / temporary_name(path.name, pid=pid, serial=serial)) in _in_use:
            serial += 1
        _in_use.add(tmp)
    return tmp


def _give_back(tmp: Path) -> None:
    with _in_use_lock:
        _in_use.discard(tmp)


def _forget_in_child() -> None:
    """A forked child writes temporaries of its own pid, and may be forked while another thread held the lock."""
    global _in_use_lock
    _in_use_lock = threading.Lock()
    _in_use.clear()


os.register_at_fork(after_in_child=_forget_in_child)


@dataclass(frozen=True)
class Written:
    """What was committed: its path, size and sha256."""

    path: Path
    bytes: int
    sha256: str


class StreamHash:
    """sha256 of a stream of buffers, computed on a thread of its own while the caller goes on.

    hashlib drops the GIL on large buffers, so the hash of a big input runs
    beside its read, its parse and the GPU's work, and the hash of an output
    beside its write: :meth:`update` never waits (the buffers must stay
    unchanged until :meth:`hexdigest`). Small buffers are hashed inline: a
    thread handoff would cost more than it saves.
    """

    _INLINE_BYTES = 1 << 20

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._queue: queue.SimpleQueue[memoryview | None] | None = None
        self._thread: threading.Thread | None = None

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        if self._thread is None and view.nbytes < self._INLINE_BYTES:
            self._digest.update(view)
            return
        if self._thread is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name="mmd-sha256", daemon=True)
            self._thread.start()
        assert self._queue is not None
        self._queue.put(view)

    def _run(self) -> None:
        assert self._queue is not None
        while (view := self._queue.get()) is not None:
            self._digest.update(view)

    def hexdigest(self) -> str:
        """The digest of everything given (waits for the thread)."""
        if self._thread is not None and self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        return self._digest.hexdigest()


def fsync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable (some filesystems refuse to fsync a folder: then they are not)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on folders; the rename is still atomic
    finally:
        os.close(fd)


#: From this many files on, :func:`publish` syncs the filesystem once (``syncfs``) instead of
#: fsyncing each file: one sync of many small files costs far less than their fsyncs one by one,
#: and for two files the two ways cost the same (docs/daemon.md, "Group commit"). Fewer files (a lone
#: job's output and sidecar) are fsynced each, so that they never wait for other writers' dirty data.
SYNCFS_FROM_FILES = 3


@dataclass
class _File:
    fd: int | None  # open until synced (the fsync goes through the descriptor that wrote it)
    tmp: Path
    path: Path
    replace: bool
    synced: bool = False


#: A durable file's writeback is started each time this many bytes have been written to it, and at its end: the
#: disk writes a big output's first slices while the rest is copied in, and its fsync waits for the tail only
#: (docs/daemon.md, "A 4096 job").
WRITEBACK_SLICE = 8 << 20


class Staged:
    """A commit in two steps: :meth:`write` puts each file in its hidden temporary now; :func:`publish`
    makes them durable and renames them in the order written, later.

    One instance holds one job's files (its output, then its sidecar), so that
    they are published in order. Every file is synced by
    :func:`publish`, before any is renamed: each fsynced, its writeback started
    as it is written (every :data:`WRITEBACK_SLICE` bytes and at its end: so
    the disk writes a job's output while the rest of it is copied in and its
    sidecar is made, and the fsyncs wait for less), unless ``group``: then :func:`publish`
    publishes several commits at once with one sync for all of them (group
    commit). Any OSError leaves no temporary behind and is raised as
    OutputError, its OSError as its ``__cause__``. ``ops`` does the file
    operations (the tests inject faults through it).
    """

    def __init__(self, *, durable: bool = True, group: bool = False, ops: FileOps = OPS) -> None:
        self.durable = durable
        #: Whether the files wait for :func:`publish`'s one sync of a group (else each one's writeback is started
        #: as it is written, and publish fsyncs each).
        self.group = group
        self.ops = ops
        self._files: list[_File] = []

    def write(
        self, path: Path, chunks: Iterable[bytes], *, replace: bool = True, mode: int = 0o644, pid: int | None = None
    ) -> Written:
        """Write ``chunks`` to ``path``'s temporary; its size and sha256 (``replace``, ``mode``, ``pid``: as
        write_atomic's)."""
        hasher = StreamHash()
        size = 0
        ops = self.ops
        tmp = _take_temporary(path, pid)
        fd: int | None = None
        try:
            fd = _create_exclusive(tmp, ops, mode)
            progressive = self.durable and not self.group
            unstarted = 0  # bytes written since the writeback was last started
            for chunk in chunks:
                view = memoryview(chunk)
                hasher.update(view)
                while view:
                    done = ops.write(fd, view[: WRITEBACK_SLICE - unstarted] if progressive else view)
                    view = view[done:]
                    unstarted += done
                    if progressive and unstarted == WRITEBACK_SLICE:
                        ops.start_writeback(fd)
                        unstarted = 0
                size += len(chunk)
            if not self.durable:
                ops.close(fd)
                fd = None
            elif not self.group:
                ops.start_writeback(fd)
        except BaseException as exc:
            if fd is not None:
                with contextlib.suppress(OSError):
                    ops.close(fd)
            hasher.hexdigest()
            _unlink_quietly(tmp, ops)
            _give_back(tmp)
            if isinstance(exc, OSError):
                raise _output_error(path, exc) from exc
            raise
        self._files.append(_File(fd, tmp, path, replace))
        return Written(path=path, bytes=size, sha256=hasher.hexdigest())

    @property
    def paths(self) -> list[Path]:
        """The files written and not yet published, in order."""
        return [f.path for f in self._files]

    def discard(self) -> None:
        """Remove the temporaries not published (a job stopped, or one whose commit failed)."""
        for f in self._files:
            if f.fd is not None:
                with contextlib.suppress(OSError):
                    self.ops.close(f.fd)
            _unlink_quietly(f.tmp, self.ops)
            _give_back(f.tmp)
        self._files.clear()

    def publish(self) -> None:
        """Sync and rename this commit's files, then fsync their folder (OutputError: the files not renamed
        are removed; those renamed before the failure stay, as a crash would leave them)."""
        [error] = publish([self])
        if error is not None:
            raise error

    # -- the steps, for publish() --
    def _sync_each(self) -> None:
        """fsync each file through the descriptor that wrote it, then close it."""
        for f in self._files:
            if f.fd is None or f.synced:
                continue
            f.synced = True
            if self.durable:
                try:
                    self.ops.fsync(f.fd)
                except OSError as exc:
                    raise _output_error(f.path, exc) from exc  # discard() closes it
            fd, f.fd = f.fd, None
            try:
                self.ops.close(fd)
            except OSError as exc:
                raise _output_error(f.path, exc) from exc

    def _rename_all(self) -> set[Path]:
        """Rename every temporary onto its name, in order; the folders renamed into."""
        folders = set()
        while self._files:
            f = self._files[0]
            if f.replace:
                try:
                    self.ops.replace(f.tmp, f.path)
                except OSError as exc:
                    raise _output_error(f.path, exc) from exc
            else:
                self.ops.link(f.tmp, f.path)  # the caller's to judge: FileExistsError if the name was taken
                # Published: a temporary that cannot be removed now is only a second name of the file,
                # swept with this process's temporaries.
                with contextlib.suppress(OSError):
                    self.ops.unlink(f.tmp)
            self._files.pop(0)
            _give_back(f.tmp)
            folders.add(f.path.parent)
        return folders


def publish(commits: Sequence[Staged]) -> list[OutputError | None]:
    """Publish several commits together (group commit): one sync, the renames, one fsync per folder.

    Returns, for each commit, None when it is published, else the error that
    kept it back (its temporaries are removed; a commit's files before the
    failing one stay published, as a crash would leave them). A failed sync
    fails every commit it covered. ``durable`` off: no sync at all.
    """
    result: list[OutputError | None] = [None] * len(commits)
    unsynced = [(c, f) for c in commits if c.durable for f in c._files if f.fd is not None and not f.synced]
    if len(unsynced) >= SYNCFS_FROM_FILES and HAS_SYNCFS:
        first, some = unsynced[0]
        try:
            first.ops.syncfs(some.path.parent)
        except OSError as exc:
            error = _output_error(some.path.parent, exc)
            error.__cause__ = exc
            for c in commits:
                c.discard()
            return [error] * len(commits)
        for c, f in unsynced:
            f.synced = True
            if f.fd is not None:
                fd, f.fd = f.fd, None
                with contextlib.suppress(OSError):  # synced already: a failed close loses nothing
                    c.ops.close(fd)
    folders: set[Path] = set()
    for i, c in enumerate(commits):
        try:
            c._sync_each()
            folders |= c._rename_all()
        except OutputError as exc:
            c.discard()
            result[i] = exc
        except BaseException:
            c.discard()
            raise
    if any(c.durable for c in commits):
        for folder in sorted(folders):
            fsync_folder(folder)
    return result


def _output_error(path: Path, exc: OSError) -> OutputError:
    return OutputError(f"cannot write {path}: {exc.strerror or exc}", {"path": str(path)})


def write_atomic(
    path: Path,
    chunks: Iterable[bytes],
    *,
    durable: bool = True,
    replace: bool = True,
    mode: int = 0o644,
    pid: int | None = None,
    ops: FileOps = OPS,
) -> Written:
    """Write ``chunks`` to ``path`` atomically and return its size and sha256.

    ``durable``: the file is fsynced before its rename and its folder after
    (what a restart reads: outputs, sidecars, the spool's records); without,
    nothing is synced (a status file, a report, a cache). With
    ``replace=False`` an existing ``path`` is never overwritten: the commit
    uses ``link`` + ``unlink``, and a refused link raises its own OSError,
    for the caller to take another way: FileExistsError for a name taken
    meanwhile (never replaced), EPERM, EOPNOTSUPP and the like for a
    filesystem without hard links. ``mode``: the new file's
    permission bits, less the umask, as ``open`` gives them (from its
    creation on: no reader ever sees more); an old file's are not kept.
    ``pid``: the process the temporary is named for (default this one's;
    the sweep removes it once that process is gone). Any OSError (disk
    full, permissions) leaves no partial file behind and is raised as
    OutputError, the OSError as its ``__cause__``. ``ops`` does the file
    operations (the tests inject faults through it).
    """
    staged = Staged(durable=durable, ops=ops)
    written = staged.write(path, chunks, replace=replace, mode=mode, pid=pid)
    staged.publish()
    return written


def link_atomic(path: Path, target: str, *, durable: bool = True, ops: FileOps = OPS) -> None:
    """Point the symbolic link ``path`` at ``target`` atomically: a link made under :func:`temporary_name`'s
    name and renamed onto ``path``, so that a reader follows the old link or the new one, never none.

    ``durable``: the folder is fsynced after the rename. Any OSError leaves no temporary behind and is raised
    as OutputError, the OSError as its ``__cause__``."""
    tmp = _take_temporary(path, None)
    try:
        try:
            os.symlink(target, tmp)
        except FileExistsError:  # a leftover of a crashed process with our pid
            ops.unlink(tmp)
            os.symlink(target, tmp)
        ops.replace(tmp, path)
    except OSError as exc:
        _unlink_quietly(tmp, ops)
        raise _output_error(path, exc) from exc
    finally:
        _give_back(tmp)
    if durable:
        fsync_folder(path.parent)


def _create_exclusive(tmp: Path, ops: FileOps, mode: int) -> int:
    """Open a new temporary file, never through a link planted at its name.

    A leftover of the same name (a crashed process with our pid: no commit
    of this process has it in use) is removed once and the open retried; a
    second collision is an error.
    """
    try:
        return ops.open_exclusive(tmp, mode)
    except FileExistsError:
        ops.unlink(tmp)  # removes a planted link itself, never its target
        return ops.open_exclusive(tmp, mode)


def _unlink_quietly(path: Path, ops: FileOps = OPS) -> None:
    with contextlib.suppress(OSError):
        ops.unlink(path)
