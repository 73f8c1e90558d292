"""The daemon: watch the inbox, take complete files, run them one at a time, archive.

Threads:

* the **main thread** (:meth:`Daemon.serve`) owns the schedule: it reads
  *hints* (observer events, the worker's "done", signals) from one queue,
  decides when a file is complete (:class:`mmd.spool.Readiness`), rescans the
  inbox every ``rescan_seconds`` (events are only hints: inotify drops them on
  overflow), and hands complete names to the worker in arrival order;
* the **observer** (watchdog: inotify, or polling) turns filesystem events
  into hints;
* the **worker** owns the backend (opened, used and closed in that thread) and
  runs each job: claim → :func:`mmd.pipeline.run_job` → archive. A job never
  kills the daemon: anything a job raises becomes an error sidecar.

Signals are installed by :meth:`Daemon.serve`: SIGTERM/SIGINT let the job in
hand finish and exit 0 (a second one exits at once; the job left in ``.work``
resumes at the next start), SIGHUP reloads the settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import fcntl
import json
import os
import queue
import signal
import stat
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import atomic, jobname, sidecar
from .backends import open_backend, worker_devices
from .backends.base import Backend
from .config import Settings, host_id_of, kernel_cache_dir
from .errors import CudaError, MmdError, OutputError, SpoolError
from .logs import get_logger
from .notify import Notifier, WatchdogPinger
from .pipeline import Limits, commit_refusal, limits_for, request_for, run_job
from .spool import LOCK_NAME, Claim, Readiness, Spool, host_lock_name, is_job_name, pid_alive, shown, state_name

#: How many finished jobs the state file lists.
RECENT_JOBS = 20
#: The state file is rewritten at most this often (seconds) while jobs run.
STATE_EVERY = 0.25
#: Idle heartbeat of the worker and the main loop (seconds).
HEARTBEAT = 1.0
#: A loop that has not turned for this long is stuck (the watchdog stops pinging).
STUCK_AFTER = 30.0
#: After an output could not be committed (disk full, outbox unwritable) no new job is
#: taken for rescan_seconds, doubling with each failure in a row, up to this (seconds).
MAX_PAUSE = 300.0
#: A job whose output could not be committed this many times in a row is failed with the
#: reason (an output too big for the space left must not block the jobs behind it).
MAX_OUTPUT_ATTEMPTS = 3
#: Bits the daemon always masks from the files and folders it creates: no group or
#: world write, whatever umask it was started with (the unit sets 0027).
UMASK_BITS = 0o022

# Hint kinds (the first item of each tuple in the hint queue).
COMPLETE, SEEN, DONE, BROKEN, STOP, RELOAD, WAKE = "complete", "seen", "done", "broken", "stop", "reload", "wake"
RESCAN, INBOX, PAUSE = "rescan", "inbox", "pause"


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


# ---------------------------------------------------------------------------
# the lock: one daemon per inbox


class SpoolLock:
    """``inbox/.mmd.lock`` held with ``flock`` for the daemon's life; it holds the daemon's pid.

    On a shared inbox (``host_id`` given) the inbox lock is held shared, so
    daemons of several hosts serve it together while a daemon without
    ``shared_inbox`` (which wants it exclusive) and they refuse each other;
    one daemon per host is then ensured by ``inbox/.mmd.<host_id>.lock``,
    held exclusive and holding ``<host_id> <pid>``.
    """

    def __init__(self, inbox: Path, host_id: str | None = None) -> None:
        self.path = Path(inbox) / LOCK_NAME
        self.host_id = host_id
        self.host_path = Path(inbox) / host_lock_name(host_id) if host_id else None
        self._fd: int | None = None
        self._host_fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise SpoolError naming the daemon that has it."""
        inbox = self.path.parent
        fd = _open_lock(self.path)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.host_path else fcntl.LOCK_EX) | fcntl.LOCK_NB)
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
            fcntl.flock(host_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(host_fd)
            os.close(host_fd)
            os.close(fd)
            who = f"pid {pid}" if pid else "another process"
            raise SpoolError(f"another mmd daemon ({who}) already serves {inbox} as host {self.host_id}") from None
        os.ftruncate(host_fd, 0)
        os.pwrite(host_fd, f"{self.host_id} {os.getpid()}\n".encode(), 0)
        self._fd, self._host_fd = fd, host_fd

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


def lock_holder(inbox: Path) -> int | None:
    """The pid of the (non-shared) daemon serving ``inbox``, or None when its lock is free or only shared."""
    try:
        fd = os.open(Path(inbox) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
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


def host_daemons(inbox: Path, own_host: str | None = None) -> list[dict[str, Any]]:
    """The daemons of a shared inbox: one entry per ``.mmd.<host>.lock``.

    ``held`` is the flock (cluster-wide on NFS by default); a pid is checked
    only for ``own_host``, since a pid means nothing on another machine.
    """
    out = []
    for path in sorted(Path(inbox).glob(".mmd.*.lock")):
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


# ---------------------------------------------------------------------------
# the state file, for `mmd status`


class State:
    """What `mmd status` shows; written atomically to ``inbox/.mmd-state.json``, throttled.

    ``workers`` lists each worker (its device, backend and the job in hand);
    ``current`` is the job in hand of the first busy one.
    """

    def __init__(self, path: Path, **facts: Any) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {
            "pid": os.getpid(),
            "started": _now_iso(),
            **facts,
            "status": "starting",
            "queue": 0,
            "current": None,
            "workers": [],
            "done": {"ok": 0, "error": 0},
            "recent": [],
        }
        self._workers: dict[int, dict[str, Any]] = {}
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT_JOBS)
        self._dirty = True
        self._written = 0.0

    def update(self, **changes: Any) -> None:
        with self._lock:
            self._data.update(changes)
            self._dirty = True

    def worker(self, index: int, **changes: Any) -> None:
        """Update what worker ``index`` is doing (``current``: its job in hand, or None)."""
        with self._lock:
            entry = self._workers.setdefault(index, {"index": index, "current": None, "done": 0})
            entry.update(changes)
            self._dirty = True

    def finished(self, entry: dict[str, Any], worker: int | None = None) -> None:
        with self._lock:
            self._recent.appendleft(entry)
            self._data["done"]["ok" if entry["status"] == "ok" else "error"] += 1
            self._data["current"] = None
            if worker is not None:
                w = self._workers.setdefault(worker, {"index": worker, "current": None, "done": 0})
                w["current"] = None
                w["done"] += 1
            self._dirty = True

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            workers = [dict(self._workers[i]) for i in sorted(self._workers)]
            busy = [w["current"] for w in workers if w.get("current")]
            current = busy[0] if busy else self._data.get("current")
            return {
                **self._data,
                "current": current,
                "workers": workers,
                "recent": list(self._recent),
                "updated": _now_iso(),
            }

    def due_in(self) -> float | None:
        """Seconds until a pending write is allowed (None: nothing to write)."""
        if not self._dirty:
            return None
        return max(0.0, self._written + STATE_EVERY - time.monotonic())

    def write(self, force: bool = False) -> None:
        """Write the file if something changed and the throttle allows (or ``force``)."""
        if not force and (not self._dirty or time.monotonic() - self._written < STATE_EVERY):
            return
        snap = self.snapshot()
        self._dirty = False
        self._written = time.monotonic()
        try:
            _write_state(self.path, json.dumps(snap, indent=1).encode() + b"\n")
        except OSError as exc:
            get_logger().warning("cannot write the state file", reason=exc.strerror or str(exc))


def _write_state(path: Path, data: bytes) -> None:
    """Write the state file in the inbox, which users can write too.

    The temporary is created with ``O_EXCL | O_NOFOLLOW``: a link planted
    under its name is removed, never written through (write_atomic's
    ``O_TRUNC`` open would write into the link's target).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(tmp, flags, 0o644)
    except FileExistsError:
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def read_state(inbox: Path, host_id: str | None = None) -> dict[str, Any] | None:
    """The last state a daemon wrote for ``inbox`` (None when there is none); ``host_id``: a shared inbox's host."""
    try:
        return json.loads((Path(inbox) / state_name(host_id)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def status_of(inbox: Path, host_id: str | None = None) -> dict[str, Any]:
    """Whether a daemon serves ``inbox`` (lock held and its pid alive) and its last state.

    On a shared inbox every ``.mmd.<host>.lock`` is listed under ``hosts``
    with its state file; pids are checked only for ``host_id`` (this host).
    ``serving`` is true when any daemon serves it.
    """
    pid = lock_holder(inbox)
    single = pid is not None and (pid == -1 or pid_alive(pid))
    hosts = host_daemons(inbox, host_id)
    for entry in hosts:
        entry["state"] = read_state(inbox, entry["host"])
    state = read_state(inbox)
    if not single and hosts:
        own = [h for h in hosts if h["own"]] or [h for h in hosts if h["serving"]] or hosts
        state = own[0]["state"]
        pid = own[0]["pid"]
    serving = single or any(h["serving"] for h in hosts)
    waiting = sum(1 for _ in Spool(inbox, inbox).scan())
    return {
        "inbox": str(inbox),
        "serving": serving,
        "pid": pid if serving else None,
        "waiting_in_inbox": waiting,
        "state": state,
        "hosts": hosts,
    }


# ---------------------------------------------------------------------------
# the observer: filesystem events become hints


def make_observer(kind: str, inbox: Path, hints: queue.SimpleQueue, poll_seconds: float, log: Any):
    """Start a watchdog observer on ``inbox``; returns (observer, the kind actually used).

    ``auto`` uses inotify and falls back to polling where inotify cannot be set
    up (no inotify, out of instances or watches); ``inotify`` fails instead.
    An inotify queue overflow (events lost) becomes a RESCAN hint, the inbox
    itself deleted an INBOX hint.
    """
    if kind in ("auto", "inotify"):
        try:
            observer, created_is_move = _inotify_observer(lambda: hints.put((RESCAN, "inotify queue overflow")))
            observer.schedule(
                _Hints(inbox, hints, created_is_move),
                str(inbox),
                recursive=False,
                event_filter=_event_types(created_is_move),
            )
            observer.start()
            return observer, "inotify"
        except (OSError, ImportError) as exc:
            if kind == "inotify":
                raise SpoolError(f"inotify is not available here ({exc}); use observer: polling") from None
            log.warning("inotify is not available; falling back to polling", reason=str(exc))
    from watchdog.observers.polling import PollingObserver

    observer = PollingObserver(timeout=poll_seconds)
    observer.schedule(_Hints(inbox, hints, False), str(inbox), recursive=False, event_filter=_event_types(False))
    observer.start()
    return observer, "polling"


def _event_types(created_is_move: bool) -> list[type]:
    from watchdog.events import DirDeletedEvent, FileClosedEvent, FileCreatedEvent, FileMovedEvent

    return [FileClosedEvent, FileCreatedEvent, FileMovedEvent, DirDeletedEvent]


def _inotify_observer(on_overflow: Callable[[], None] | None = None):
    """watchdog's inotify observer, asking the kernel only for close-after-write and moved-in.

    watchdog holds each unpaired IN_MOVED_FROM for half a second to pair it with
    an IN_MOVED_TO, and every later event waits behind it; each claim is such a
    rename out of the inbox. Watching IN_CLOSE_WRITE | IN_MOVED_TO only avoids
    that, and then a "created" event can only be a file renamed into the inbox,
    which is complete. Where this watchdog has no mask hook, the plain observer
    is used and "created" means "watch until quiet".
    """
    from watchdog.observers.inotify import InotifyEmitter, InotifyObserver

    observer = InotifyObserver()
    hook = hasattr(InotifyEmitter, "get_event_mask_from_filter") and getattr(observer, "_emitter_class", None)
    if hook is not InotifyEmitter:
        return observer, False
    from watchdog.observers.inotify_c import InotifyConstants as K

    class _ArrivalsEmitter(InotifyEmitter):
        def get_event_mask_from_filter(self):  # type: ignore[override]
            return K.IN_DELETE_SELF | K.IN_CLOSE_WRITE | K.IN_MOVED_TO

        def on_thread_start(self) -> None:
            super().on_thread_start()
            # watchdog drops its pending events on IN_Q_OVERFLOW and only logs it; the
            # daemon must rescan at once. Where this watchdog has no such hook, the
            # periodic rescan still finds every file, rescan_seconds later.
            group = getattr(self, "_inotify", None)
            if on_overflow is not None and hasattr(group, "on_queue_overflow"):
                inner = group.on_queue_overflow

                def overflowed() -> None:
                    inner()
                    on_overflow()

                group.on_queue_overflow = overflowed

    observer._emitter_class = _ArrivalsEmitter
    return observer, True


class _Hints:
    """A watchdog handler: events on files directly in the inbox become hints."""

    def __init__(self, inbox: Path, hints: queue.SimpleQueue, created_is_move: bool) -> None:
        self.inbox = os.path.abspath(inbox)
        self.hints = hints
        self.created_kind = COMPLETE if created_is_move else SEEN

    def _put(self, kind: str, path: Any) -> None:
        path = os.fsdecode(path)
        if not path:
            return
        folder, name = os.path.split(os.path.abspath(path))
        if folder == self.inbox and is_job_name(name):
            self.hints.put((kind, name))

    def dispatch(self, event: Any) -> None:
        if event.is_directory:
            if event.event_type == "deleted" and os.path.abspath(os.fsdecode(event.src_path)) == self.inbox:
                self.hints.put((INBOX, "deleted"))
            return
        kind = event.event_type
        if kind == "closed":
            self._put(COMPLETE, event.src_path)
        elif kind == "moved":
            self._put(COMPLETE, event.dest_path)  # a rename is atomic: the file is whole
        elif kind == "created":
            self._put(self.created_kind, event.src_path)


# ---------------------------------------------------------------------------
# the worker: one thread that owns the backend and runs jobs in order


class Worker(threading.Thread):
    """Claims, runs and archives jobs one at a time on one device; its backend lives and dies in this thread.

    ``mmd serve`` starts one worker per device (``devices``); all of them take
    jobs from the daemon's one queue in arrival order, so the next idle
    worker takes the next job.
    """

    def __init__(self, daemon: Daemon, index: int = 0, device: int = 0) -> None:
        super().__init__(name=f"mmd-worker-{index}", daemon=True)
        self.d = daemon
        self.index = index
        self.device = device
        self.jobs: queue.Queue[Any] = daemon.jobs
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.reopen = threading.Event()
        self.failed: MmdError | None = None
        self.busy_since: float | None = None
        self.beat = time.monotonic()
        self._backends: dict[str, Backend] = {}

    # -- backends (only ever touched in this thread) --
    def _backend(self, name: str) -> Backend:
        want = self.d.settings.backend if name == "auto" else name
        if want in self._backends:
            return self._backends[want]
        for backend in self._backends.values():
            if backend.name == want:
                return backend
        backend, note = open_backend(want, self.device, kernel_cache=kernel_cache_dir(self.d.settings))
        if note:
            get_logger().warning("backend fallback", note=note, device_index=self.device)
        self._backends[want] = backend
        return backend

    def _close_backends(self) -> None:
        for backend in self._backends.values():
            try:
                backend.close()
            except Exception as exc:  # closing must not hide the reason we are stopping
                get_logger().warning("backend close failed", error=repr(exc), device_index=self.device)
        self._backends.clear()

    def drop_backends(self) -> None:
        """Forget backends so the next job opens them with new settings (after a reload)."""
        self.reopen.set()

    def _state(self, **changes: Any) -> None:
        self.d.state.worker(self.index, **changes)

    # -- the loop --
    def run(self) -> None:
        try:
            try:
                backend = self._backend(self.d.settings.backend)
                self._state(device_index=self.device, backend=backend.name, device=_device_name(backend))
            except MmdError as exc:
                self.failed = exc
                return
            finally:
                self.ready.set()
            while not self.stop_event.is_set():
                self.beat = time.monotonic()
                try:
                    kind, item = self.jobs.get(timeout=HEARTBEAT)
                except queue.Empty:
                    continue
                if self.stop_event.is_set() or kind == "stop":
                    break
                if self.reopen.is_set():
                    self.reopen.clear()
                    self._close_backends()
                self.busy_since = time.monotonic()
                try:
                    self.process(kind, item)
                except Exception as exc:  # last line: the worker thread must outlive any job
                    get_logger().exception("job escaped the job boundary", error=repr(exc))
                finally:
                    self.busy_since = None
                    self._state(current=None)
                    self.d.hints.put((DONE, item if kind == "name" else item.name))
        finally:
            self._close_backends()

    def submit(self, kind: str, item: Any) -> None:
        """Queue a job: ``("name", inbox name)`` or ``("resume", Claim)`` (on the queue all workers share)."""
        self.jobs.put((kind, item))

    def process(self, kind: str, item: Any) -> None:
        """One job, start to archive; nothing it raises escapes."""
        spool = self.d.spool
        log = get_logger(file=shown(item if kind == "name" else item.name))
        claim: Claim | None = None
        if kind == "name" and self.d.paused():
            return  # outbox trouble: the file stays in the inbox until the pause ends
        try:
            try:
                if not os.path.isdir(spool.outbox):  # deleted under us: make it again
                    spool.outbox.mkdir(parents=True, exist_ok=True)
                claim = spool.claim(item) if kind == "name" else item
            except OSError as exc:
                raise SpoolError(f"cannot claim {item}: {exc.strerror or exc}") from None
            if claim is None:
                log.debug("already taken")  # claimed by someone else or removed: harmless
                return
            log = log.bind(job=claim.job_id, file=shown(claim.name))
            if len(self.d.workers) > 1:
                log = log.bind(device_index=self.device)
            if claim.original is not None:
                log.info("claimed under a safe name", original=shown(claim.original))
            self._state(current={"job": claim.job_id, "file": shown(claim.name), "since": _now_iso()})
            self._run(claim, log, item if kind == "name" else claim.name)
        except SpoolError as exc:
            if claim is None:  # the file stays in the inbox; it is tried again at a later rescan
                log.error("cannot claim", reason=exc.reason)
                self.d.hints.put((BROKEN, item))
            else:
                log.error("spool error", reason=exc.reason)
        except Exception as exc:  # the job boundary: a job never kills the daemon
            log.exception("internal error in job", error=repr(exc))
            if claim is not None:
                self._refuse(claim, _internal(exc), {}, log)

    def _run(self, claim: Claim, log: Any, inbox_name: str) -> None:
        spool, settings = self.d.spool, self.d.settings
        extra: dict[str, Any] = {}
        if claim.original is not None:
            extra["original_name"] = shown(claim.original)
        if claim.collision():
            extra["collision"] = claim.collision()
        if claim.resumed:
            extra["resumed"] = True
            finished = spool.finished(claim)
            if finished is not None:
                ok, path = finished
                spool.archive(claim, ok)
                log.info(
                    "resumed job was already finished; archived", sidecar=path.name, status="ok" if ok else "error"
                )
                self._record(claim, ok, path, None)
                return
            settled = spool.settle(claim)
            if settled.output != claim.output:
                log.warning("its output version was taken meanwhile; moved", output=settled.output.name)
            claim = settled
            log.info("resuming job left by an earlier daemon")
        extra["device_index"] = self.device
        if self.d.host_id is not None:
            extra["host"] = self.d.host_id
        if claim.problem is not None or not claim.regular:
            problem = claim.problem or "is not a regular file (a link, folder or device); mmd does not follow it"
            self._refuse(claim, SpoolError(f"{shown(claim.original or claim.name)} {problem}"), extra, log)
            return
        try:
            name = jobname.parse(claim.original or claim.name)
            if name.overrides:
                extra["name_settings"] = dict(name.overrides)
            o = name.overrides
            request = request_for(settings, **o)
            backend = self._backend(o.get("backend", settings.backend))
        except MmdError as exc:  # a bad name or an unavailable backend: refused like bad input
            self._refuse(claim, exc, extra, log)
            return
        result = run_job(
            claim.path,
            claim.output,
            request,
            backend,
            limits=self.d.limits,
            started=claim.started,
            job_id=claim.job_id,
            extra=extra or None,
            durable=self.d.durable,
        )
        if isinstance(result.error, CudaError):
            # A fault inside a kernel (an illegal address) leaves the CUDA context unusable:
            # drop this worker's backends; the next job opens a fresh context.
            log.warning("CUDA error: reopening the backend for the next job", reason=result.error.reason)
            self._close_backends()
        tries = self.d.output_attempt(inbox_name)
        if not result.ok and isinstance(result.error, OutputError):
            if tries < MAX_OUTPUT_ATTEMPTS:
                self._retry_later(claim, result.error, log, tries)
                return
            log.error("output not committed after %d attempts; job failed" % tries, reason=result.error.reason)
        else:
            self.d.output_committed()
        if not result.ok and result.record.get("error", {}).get("sidecar_failed"):
            log.error("no error sidecar could be written; the input is kept in .failed")
        spool.archive(claim, result.ok)
        self._record(claim, result.ok, result.sidecar, result.record)

    def _retry_later(self, claim: Claim, exc: OutputError, log: Any, tries: int) -> None:
        """The outbox refused the result (disk full, quota, permissions): not the input's fault.

        This job's own output and error sidecar are removed (nothing
        half-done stays visible), the input goes back into the inbox, and the
        daemon takes no new job for a pause that doubles with each failure
        in a row; the next rescan after it tries again.
        """
        for path in (claim.output, sidecar.error_path(claim.output), sidecar.timing_path(claim.output)):
            if path == claim.output or self.d.spool.owned_by(claim, path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        failures = self.d.output_failed()
        pause = min(self.d.settings.rescan_seconds * 2 ** (failures - 1), MAX_PAUSE)
        try:
            back = self.d.spool.give_back(claim)
            where = f"back in the inbox as {shown(back.name)}"
            self.d.remember_attempts(back.name, tries)
        except SpoolError as err:
            log.error("cannot give the job back; it stays in .work until the next start", reason=err.reason)
            where = "kept in .work"
        log.error("output not committed; retrying later", reason=exc.reason, input=where, pause_s=pause, attempt=tries)
        self.d._paused_until = time.monotonic() + pause  # before the next queued name is looked at
        self.d.hints.put((PAUSE, exc.reason, pause))

    def _refuse(self, claim: Claim, exc: MmdError, extra: dict[str, Any], log: Any) -> None:
        """Refuse a job that never reached run_job (bad name, not a file, internal error)."""
        path = write_refusal(claim, exc, extra, self.d.durable)
        log.warning("job refused", status="error", kind=exc.kind, reason=exc.reason)
        try:
            self.d.spool.archive(claim, False)
        except MmdError as arch:
            log.error("cannot archive", reason=arch.reason)
        self._record(claim, False, path, None)

    def _record(self, claim: Claim, ok: bool, path: Path | None, record: dict[str, Any] | None) -> None:
        overall = ((record or {}).get("timings_ms") or {}).get("overall")
        self.d.state.finished(
            {
                "job": claim.job_id,
                "file": claim.name,
                "status": "ok" if ok else "error",
                "output": claim.output.name if ok else None,
                "sidecar": path.name if path else None,
                "overall_ms": overall,
                "device_index": self.device,
                "finished": _now_iso(),
            },
            worker=self.index,
        )


def _device_name(backend: Backend) -> str | None:
    name = getattr(backend, "device_name", None)
    try:
        return name() if callable(name) else None
    except Exception:  # a name is only for the status display
        return None


def _internal(exc: BaseException) -> MmdError:
    err = MmdError(f"internal error in mmd: {type(exc).__name__}: {exc}", {"exception": type(exc).__name__})
    err.kind = "internal"  # type: ignore[misc]
    return err


def write_refusal(claim: Claim, exc: MmdError, extra: dict[str, Any], durable: bool) -> Path | None:
    """The error sidecar for a job refused before :func:`run_job`; None if it could not be written."""
    try:
        size: int | None = os.lstat(claim.path).st_size
    except OSError:
        size = None
    record, path = commit_refusal(
        exc,
        job_id=claim.job_id,
        input_info={"name": shown(claim.name), "bytes": size},
        output_path=claim.output,
        timings={"overall": (time.perf_counter() - claim.started) * 1e3},
        extra=extra,
        durable=durable,
        log=get_logger(job=claim.job_id, file=shown(claim.name)),
    )
    return None if "sidecar_failed" in record["error"] else path


# ---------------------------------------------------------------------------
# the daemon


class Daemon:
    """Serve one inbox: ``Daemon(settings).serve()``; ``serve(once=True)`` drains it and returns."""

    def __init__(self, settings: Settings, reload: Callable[[], Settings] | None = None) -> None:
        self.settings = settings
        self._reload = reload
        #: This host's id on a shared inbox (None: the daemon has the inbox to itself).
        self.host_id = host_id_of(settings) if settings.shared_inbox else None
        self.spool = Spool(settings.inbox, settings.outbox, self.host_id)
        self.hints: queue.SimpleQueue = queue.SimpleQueue()
        self.state = State(
            self.spool.inbox / state_name(self.host_id),
            inbox=str(settings.inbox.resolve()),
            outbox=str(settings.outbox.resolve()),
            backend=settings.backend,
            **({"host": self.host_id} if self.host_id else {}),
        )
        self.log = get_logger()
        #: The jobs queue every worker takes from, in arrival order: ("name", inbox name) or ("resume", Claim).
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.workers: list[Worker] = []
        self._outputs_lock = threading.Lock()
        #: Outputs that could not be committed in a row (the pause doubles with each).
        self._output_failures = 0
        #: Inbox name → attempts whose output could not be committed (given back to retry).
        self._attempts: dict[str, int] = {}
        self._queued: set[str] = set()  # names handed to the worker and not yet done
        self._again: set[str] = set()  # completed again while queued: look once more when done
        self._readiness = Readiness(settings.quiet_seconds)
        self._stop_requests = 0
        self._beat = time.monotonic()
        self._backlog = False  # names left in the inbox because the queue was full
        self._broken: set[str] = set()  # names whose claim failed (retried at each rescan when serving)
        self._paused_until = 0.0  # monotonic: no new job before (the outbox refused a result)
        self._rescan_now = False
        self._once_failed: str | None = None  # with --once: why the drain stopped early
        self._lock: SpoolLock | None = None
        self._observer: Any = None
        self._inbox_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the inbox being served
        self._inbox_gone = False

    # -- derived settings --
    @property
    def limits(self) -> Limits:
        return limits_for(self.settings)

    @property
    def durable(self) -> bool:
        """fsync outputs and sidecars before they count as committed."""
        return self.settings.durable

    @property
    def worker(self) -> Worker | None:
        """The first worker (for callers that knew only one)."""
        return self.workers[0] if self.workers else None

    # -- outbox trouble, shared by the workers --
    def output_attempt(self, name: str) -> int:
        """This try's number for inbox file ``name`` (1 unless it was given back after outbox trouble)."""
        with self._outputs_lock:
            return self._attempts.pop(name, 0) + 1

    def remember_attempts(self, name: str, tries: int) -> None:
        with self._outputs_lock:
            if len(self._attempts) > 10_000:  # names given back and then removed by hand
                self._attempts.clear()
            self._attempts[name] = tries

    def output_committed(self) -> None:
        with self._outputs_lock:
            self._output_failures = 0

    def output_failed(self) -> int:
        """Count an output the outbox refused; returns how many in a row."""
        with self._outputs_lock:
            self._output_failures += 1
            return self._output_failures

    # -- signals --
    def _on_stop_signal(self, signum: int, _frame: Any) -> None:
        self._stop_requests += 1
        if self._stop_requests >= 2:
            job = self.state.snapshot().get("current")
            os.write(
                2,
                (
                    f"mmd serve: second {signal.Signals(signum).name}: stopping at once"
                    f"{'; ' + job['file'] + ' stays in .work and resumes at the next start' if job else ''}\n"
                ).encode(),
            )
            os._exit(1)
        self.hints.put((STOP, signal.Signals(signum).name))

    def _on_hup(self, _signum: int, _frame: Any) -> None:
        self.hints.put((RELOAD, None))

    def _install_signals(self) -> dict[int, Any]:
        old = {}
        for sig, handler in (
            (signal.SIGTERM, self._on_stop_signal),
            (signal.SIGINT, self._on_stop_signal),
            (signal.SIGHUP, self._on_hup),
        ):
            old[sig] = signal.signal(sig, handler)
        return old

    # -- health, for the systemd watchdog --
    def health(self) -> tuple[bool, str]:
        now = time.monotonic()
        if not self.workers:
            return False, "the worker thread is not running"
        for w in self.workers:
            if not w.is_alive():
                return False, f"the worker thread of device {w.device} is not running"
            if w.busy_since is None and now - w.beat > STUCK_AFTER:
                return False, f"the worker of device {w.device} has not turned for {now - w.beat:.0f} s"
        if now - self._beat > STUCK_AFTER:
            return False, f"the main loop has not turned for {now - self._beat:.0f} s"
        return True, ""

    def paused(self) -> bool:
        """Whether new jobs wait (the outbox refused a result a moment ago)."""
        return time.monotonic() < self._paused_until

    # -- scheduling --
    def _offer(self, name: str, complete: bool) -> None:
        """A hint that ``name`` may be a job; queue it when it is complete."""
        if name in self._queued:
            if complete:
                self._again.add(name)
            return
        if not complete:
            cand = self.spool.stat(name)
            if cand is None:
                self._readiness.forget(name)
                return
            if not self._readiness.observe(name, cand.size, cand.mtime_ns):
                return
        self._readiness.forget(name)
        if self.paused():
            return  # it stays in the inbox; the rescan after the pause takes it
        if len(self._queued) >= self.settings.max_queue:
            if not self._backlog:
                self.log.warning(
                    "queue full; later files wait in the inbox for a rescan", max_queue=self.settings.max_queue
                )
                self.state.update(backlog=True)
            self._backlog = True
            return
        self._queued.add(name)
        self.jobs.put(("name", name))
        self.state.update(queue=self.jobs.qsize())

    def _rescan(self) -> int:
        """Offer every waiting file; returns how many job files wait (not counting broken ones)."""
        found = [c for c in self.spool.scan() if c.name not in self._broken]
        for cand in found:
            if cand.name not in self._queued and self._readiness.observe(cand.name, cand.size, cand.mtime_ns):
                self._offer(cand.name, complete=True)
        known = {c.name for c in found}
        for name in self._readiness.pending:
            if name not in known:
                self._readiness.forget(name)
        return len(found)

    def _recheck_pending(self) -> None:
        for name in self._readiness.pending:
            self._offer(name, complete=False)

    def _handle(self, hint: tuple[Any, ...]) -> None:
        kind = hint[0]
        if kind == COMPLETE:
            self._offer(hint[1], complete=True)
        elif kind == SEEN:
            self._offer(hint[1], complete=False)
        elif kind == DONE:
            name = hint[1]
            self._queued.discard(name)
            self.state.update(queue=self.jobs.qsize())
            if name in self._again:
                self._again.discard(name)
                self._offer(name, complete=True)
        elif kind == BROKEN:
            self._broken.add(hint[1])
        elif kind == STOP:
            self.log.info("stopping after the job in hand", signal=hint[1])
        elif kind == RELOAD:
            self._reload_settings()
        elif kind == RESCAN:
            self.log.warning("rescanning the inbox", reason=hint[1])
            self._rescan_now = True
        elif kind == INBOX:
            self._check_inbox()
        elif kind == PAUSE:
            _, reason, seconds = hint
            self._paused_until = time.monotonic() + seconds
            self.state.update(paused={"reason": reason, "seconds": seconds, "since": _now_iso()})
            self._once_failed = reason

    def _check_inbox(self) -> None:
        """Follow the inbox being deleted (wait) and recreated (serve the new folder)."""
        try:
            info = os.stat(self.spool.inbox)
            ident: tuple[int, int] | None = (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None
        except OSError:
            ident = None
        if ident == self._inbox_id:
            return
        if ident is None:
            if not self._inbox_gone:
                self.log.error("the inbox is gone; waiting for it to be made again", inbox=str(self.spool.inbox))
                self.state.update(status="inbox missing")
            self._inbox_gone = True
            return
        self.log.warning("the inbox was made again; serving the new folder", inbox=str(self.spool.inbox))
        self._inbox_gone = False
        self._inbox_id = ident
        self.spool.forget_folders()
        self.spool.prepare()
        if self._lock is not None:
            self._lock.release()
            self._lock.acquire()  # SpoolError if another daemon took the new inbox meanwhile
        if self._observer is not None:
            self._observer.stop()
            with contextlib.suppress(RuntimeError):
                self._observer.join(timeout=5)
            self._observer, _kind = make_observer(
                self.settings.observer, self.spool.inbox, self.hints, self.settings.poll_seconds, self.log
            )
        self._broken.clear()
        self._rescan_now = True
        self.state.update(status="serving")

    def _reload_settings(self) -> None:
        if self._reload is None:
            self.log.warning("SIGHUP: nothing to reload from")
            return
        try:
            new = self._reload()
        except MmdError as exc:
            self.log.error("SIGHUP: config not reloaded", reason=exc.reason)
            return
        if (new.inbox, new.outbox) != (self.settings.inbox, self.settings.outbox):
            self.log.warning(
                "SIGHUP: inbox/outbox changes need a restart; keeping the old ones",
                inbox=str(self.settings.inbox),
                outbox=str(self.settings.outbox),
            )
            new = new.replace(inbox=self.settings.inbox, outbox=self.settings.outbox)
        if (new.devices, new.shared_inbox, new.host_id) != (
            self.settings.devices,
            self.settings.shared_inbox,
            self.settings.host_id,
        ):
            self.log.warning("SIGHUP: devices, shared_inbox and host_id changes need a restart; keeping the old ones")
            new = dataclasses.replace(
                new,
                devices=self.settings.devices,
                shared_inbox=self.settings.shared_inbox,
                host_id=self.settings.host_id,
            )
        backend_changed = (new.backend, new.kernel_cache) != (self.settings.backend, self.settings.kernel_cache)
        self.settings = new
        self._readiness.quiet = new.quiet_seconds
        if backend_changed:
            for w in self.workers:
                w.drop_backends()
        self.state.update(backend=new.backend)
        self.log.info("SIGHUP: settings reloaded", sources=list(new.sources))

    # -- the loop --
    def serve(self, once: bool = False) -> int:
        """Serve until SIGTERM/SIGINT (exit 0), or with ``once`` until the inbox is drained."""
        old_umask = os.umask(UMASK_BITS)
        os.umask(old_umask | UMASK_BITS)
        lock = self._lock = SpoolLock(self.spool.inbox, self.host_id)
        try:
            self.spool.prepare()
            lock.acquire()
        except BaseException:
            os.umask(old_umask)
            raise
        info = os.stat(self.spool.inbox)
        self._inbox_id = (info.st_dev, info.st_ino)
        old_signals = self._install_signals()
        atomic.set_host(self.host_id)
        notifier = Notifier()
        pinger: WatchdogPinger | None = None
        try:
            for path in self.spool.sweep_temporaries():
                self.log.info("removed a temporary left by a killed process", path=str(path))
            devices = worker_devices(self.settings.backend, self.settings.devices)
            self.workers = [Worker(self, i, device) for i, device in enumerate(devices)]
            for w in self.workers:
                w.start()
            for w in self.workers:
                w.ready.wait()
            for w in self.workers:
                if w.failed is not None:
                    raise w.failed
            resumed = self.spool.resumable()
            for path in self.spool.sweep_reservations({c.job_id for c in resumed}):
                self.log.info("removed an output reservation left by a killed process", path=str(path))
            for claim in resumed:
                self._queued.add(claim.name)
                self.jobs.put(("resume", claim))
            kind = "once"
            if not once:
                self._observer, kind = make_observer(
                    self.settings.observer, self.spool.inbox, self.hints, self.settings.poll_seconds, self.log
                )
            self.state.update(status="serving", observer=kind)
            waiting = self._rescan()
            self.log.info(
                "serving",
                inbox=str(self.spool.inbox),
                outbox=str(self.spool.outbox),
                observer=kind,
                backend=self.settings.backend,
                devices=devices,
                waiting=waiting,
                resumed=len(resumed),
                **({"host": self.host_id} if self.host_id else {}),
            )
            notifier.ready(f"serving {self.spool.inbox}")
            pinger = WatchdogPinger.start_for(notifier, self.health)
            return self._loop(once)
        finally:
            self.state.update(status="stopping")
            notifier.stopping("finishing the job in hand")
            observer = self._observer
            if observer is not None:
                observer.stop()
            running = [w for w in self.workers if w.is_alive()]
            for w in running:
                w.stop_event.set()
            for _ in running:
                self.jobs.put(("stop", None))
            for w in running:
                w.join()
            if pinger is not None:
                pinger.stop()
            self.state.update(status="stopped", queue=0, current=None)
            self.state.write(force=True)
            if observer is not None:
                with contextlib.suppress(RuntimeError):
                    observer.join(timeout=5)
            self._lock.release()
            atomic.set_host(None)
            os.umask(old_umask)
            for sig, handler in old_signals.items():
                signal.signal(sig, handler)
            notifier.close()
            self.log.info("stopped", done=self.state.snapshot()["done"])

    def _loop(self, once: bool) -> int:
        next_rescan = time.monotonic() + (
            min(self.settings.quiet_seconds / 2, 0.1) if once else self.settings.rescan_seconds
        )
        while True:
            self._beat = time.monotonic()
            waits = [next_rescan - self._beat, HEARTBEAT]
            if self.paused():
                waits.append(self._paused_until - self._beat)
            for due in (self._readiness.due_in(), self.state.due_in()):
                if due is not None:
                    waits.append(due)
            try:
                hint = self.hints.get(timeout=max(0.0, min(waits)))
            except queue.Empty:
                hint = (WAKE,)
            while True:
                self._handle(hint)
                if hint[0] == STOP:
                    return 0
                try:
                    hint = self.hints.get_nowait()
                except queue.Empty:
                    break
            if once and self._once_failed is not None:
                self.log.error("stopping: a result could not be committed", reason=self._once_failed)
                return 1
            self._check_inbox()
            now = time.monotonic()
            due = self._readiness.due_in()
            if due is not None and due <= 0:
                self._recheck_pending()
            if self._paused_until and now >= self._paused_until:
                self._paused_until = 0.0
                self.state.update(paused=None)
                self._rescan_now = True
            # A full queue is refilled by a rescan once it has drained to half (not after
            # every job: each rescan lists the whole inbox).
            refill = self._backlog and len(self._queued) <= self.settings.max_queue // 2
            if now >= next_rescan or refill or self._rescan_now:
                self._backlog = self._rescan_now = False
                self.state.update(backlog=False)
                if not once:
                    self._broken.clear()
                found = self._rescan()
                next_rescan = now + (
                    min(self.settings.quiet_seconds / 2, 0.1) if once else self.settings.rescan_seconds
                )
                if once and not self._queued and not found:
                    return 0
            self.state.write()
            if any(not w.is_alive() for w in self.workers):
                raise SpoolError("a worker thread stopped unexpectedly")
