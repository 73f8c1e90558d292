"""The daemon's start and teardown: each thing it holds while it serves is a context manager.

:meth:`~.server.Daemon.serve` enters them in turn on one
:class:`contextlib.ExitStack`, which undoes them in the reverse order
whatever ends the serving (a stop, ``--once`` drained, an error on the way
up). The order is the teardown's: the control socket and the observer
close first, then the jobs in hand finish while systemd's watchdog is
still pinged, then the state file says "stopped", and the lock goes last
but for the umask. What a daemon does to the spool once it holds the
lock, before it serves (:func:`take_over`), and what a reload may change
(:func:`reloaded`) are here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

from .. import atomic, inboxfs
from ..config import Settings
from ..errors import ConfigError
from ..hooks import Hooks
from ..metrics import Metrics
from ..notify import AlivePinger, HealthCheck, Notifier
from ..spool import Spool, Usage
from .lock import SpoolLock, lock_holder
from .messages import Hint, ReloadRequested, StopRequested
from .pool import OnEvent, WorkerPool
from .state import State
from .tunables import STUCK_AFTER, tighten_umask

#: Settings a reload (SIGHUP) does not change: they need a restart.
RESTART_ONLY = ("devices", "workers_per_device", "shared_inbox", "host_id", "max_queue", "state_dir", "class_mode",
                "graders_group", "control_socket")  # fmt: skip


@contextlib.contextmanager
def tightened_umask() -> Iterator[None]:
    """This process's umask tightened (:func:`~.tunables.tighten_umask`) while serving, given back after."""
    old = tighten_umask()
    try:
        yield
    finally:
        os.umask(old)


@contextlib.contextmanager
def locked(spool: Spool, lock: SpoolLock, create_folders: bool) -> Iterator[None]:
    """The spool's folders made (the inbox and outbox themselves only with ``create_folders``) and ``lock`` held."""
    if not create_folders:
        for what, folder in (("inbox", spool.shared.inbox), ("outbox", spool.shared.outbox)):
            if not folder.is_dir():
                raise ConfigError(
                    f"the {what} folder {str(folder)!r} does not exist; make it, fix the path, or give --create "
                    "(create_folders: true) to have mmd make it"
                )
    spool.shared.prepare()
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


class Signals:
    """The daemon's signal handlers while the context lasts (the ones before put back after): SIGTERM and SIGINT
    post :class:`~.messages.StopRequested` (the jobs in hand finish), a second one ends the workers and the
    process at once; SIGHUP posts :class:`~.messages.ReloadRequested`."""

    def __init__(self, post: Callable[[Hint], None], workers: WorkerPool) -> None:
        self.post = post
        self.workers = workers
        self._stops = 0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        for sig, handler in ((signal.SIGTERM, self._stop), (signal.SIGINT, self._stop), (signal.SIGHUP, self._hup)):
            self._old[sig] = signal.signal(sig, handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _stop(self, signum: int, _frame: Any) -> None:
        self._stops += 1
        if self._stops >= 2:
            busy = self.workers.kill_all()  # a worker must not go on with a job the next daemon resumes
            os.write(
                2,
                (
                    f"mmd serve: second {signal.Signals(signum).name}: stopping at once"
                    f"{f'; {busy} job(s) in hand stay in .work and resume at the next start' if busy else ''}\n"
                ).encode(),
            )
            os._exit(1)
        self.post(StopRequested(signal.Signals(signum).name))

    def _hup(self, _signum: int, _frame: Any) -> None:
        self.post(ReloadRequested())


@contextlib.contextmanager
def host_named(host_id: str | None) -> Iterator[None]:
    """``host_id`` in the names of this process's temporaries (a shared inbox's hosts share its folders)."""
    atomic.set_host(host_id)
    try:
        yield
    finally:
        atomic.set_host(None)


@contextlib.contextmanager
def books_closed(state: State, hooks: Hooks, metrics: Metrics, write_metrics: Callable[[bool], None],
                 log: Any) -> Iterator[None]:  # fmt: skip
    """On the way out: the state file says "stopped", the hooks and the metrics are closed (the metrics written
    last with ``write_metrics(True)``), and "stopped" is logged."""
    try:
        yield
    finally:
        state.update(status="stopped", queue=0, current=None)
        state.write(force=True)
        hooks.close()
        metrics.up.set(0)
        write_metrics(True)
        metrics.close()
        log.info("stopped", done=state.snapshot()["done"])


@contextlib.contextmanager
def draining(workers: WorkerPool, on_event: OnEvent, state: State, notifier: Notifier) -> Iterator[None]:
    """On the way out: the jobs in hand finish (the names given and not claimed stay in the inbox), ``on_event``
    told what the workers say meanwhile, then each worker quits."""
    try:
        yield
    finally:
        state.update(status="stopping")
        notifier.stopping("finishing the jobs in hand")
        workers.stop(on_event, STUCK_AFTER)


class AlivePings:
    """systemd's watchdog pings (:class:`~mmd.notify.AlivePinger`), from :meth:`start` (at READY=1) until the
    context's exit. Entered before the workers are, so that the pings go on while the jobs in hand finish."""

    def __init__(self, notifier: Notifier, healthy: HealthCheck) -> None:
        self.notifier = notifier
        self.healthy = healthy
        self._pinger: AlivePinger | None = None

    def start(self) -> None:
        self._pinger = AlivePinger.start_for(self.notifier, self.healthy)

    def __enter__(self) -> AlivePings:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pinger is not None:
            self._pinger.stop()


def take_over(spool: Spool, log: Any) -> None:
    """What a daemon does to the spool once it holds the lock, before it looks at any job: the temporaries of
    killed processes removed, the job folders of an inbox-only layout's daemon adopted, what each submitter keeps
    counted (class mode; then kept up to date), the inbox's filesystem looked at (class mode)."""
    for path in spool.archive.sweep_temporaries():
        log.info("removed a temporary left by a killed process", path=str(path))
    _adopt_inbox_folders(spool, log)
    kept = {} if spool.ledger is None else spool.ledger.recount()
    if kept:
        total = sum(kept.values(), Usage())
        log.info("counted what the service keeps for each submitter", submitters=len(kept), files=total.files,
                 bytes=total.bytes)  # fmt: skip
    _check_inbox_filesystem(spool, log)


def _adopt_inbox_folders(spool: Spool, log: Any) -> None:
    """With a state_dir: take over the jobs a daemon of the inbox-only layout kept in the inbox, and in class
    mode set aside the outputs it left in the outbox itself (once no such daemon runs: its lock is in the
    inbox)."""
    if spool.shared.private == spool.shared.inbox:
        return
    holder = lock_holder(spool.shared.inbox)
    if holder is not None:
        log.warning(
            "the inbox's own lock is held (a daemon without state_dir, or a user): its .work, .done and "
            ".failed are left where they are",
            pid=holder if holder > 0 else None,
        )
        return
    moved = spool.shared.adopt_inbox_folders()
    if moved:
        log.info("moved the inbox's job folders into the state folder", moved=moved)
    aside = spool.shared.set_aside_shared_outputs()
    if aside:
        log.warning("class mode: outputs from before it set aside, out of the class's reach",
                    folder=".before-class-mode", files=len(aside))  # fmt: skip


def _check_inbox_filesystem(spool: Spool, log: Any) -> None:
    """Class mode: warn when a file can reach the inbox by a rename from a folder where one student may move
    another's (a job in its owner's name; mmd.inboxfs). A warning only: the fix is the admin's (a mount)."""
    if not spool.shared.class_mode:
        return
    try:
        found = inboxfs.check(spool.shared.inbox)
    except OSError as exc:
        log.warning("cannot look at the inbox's filesystem", reason=exc.strerror or str(exc))
        return
    fields = {"filesystem": str(found.top), "entries": found.entries, "seconds": round(found.seconds, 3)}
    if found.safe:
        log.info(found.describe(), **fields)
    else:
        log.warning(found.describe(), open_folders=found.found, shown=[str(f) for f in found.shown],
                    covered=[str(p) for p in found.covered], partial=found.partial, **fields)  # fmt: skip


def reloaded(old: Settings, new: Settings, log: Any) -> Settings:
    """``new`` (read again for SIGHUP) as the daemon takes it: with ``old``'s inbox, outbox and
    :data:`RESTART_ONLY` settings, each change of those logged as needing a restart."""
    if (new.inbox, new.outbox) != (old.inbox, old.outbox):
        log.warning("SIGHUP: inbox/outbox changes need a restart; keeping the old ones", inbox=str(old.inbox),
                    outbox=str(old.outbox))  # fmt: skip
        new = new.replace(inbox=old.inbox, outbox=old.outbox)
    if any(getattr(new, k) != getattr(old, k) for k in RESTART_ONLY):
        log.warning(f"SIGHUP: {', '.join(RESTART_ONLY)} changes need a restart; keeping the old ones")
        new = dataclasses.replace(new, **{k: getattr(old, k) for k in RESTART_ONLY})
    return new
