"""The main process's side of the worker processes: start, order, read, stop, replace.

Workers start as :mod:`mmd.spawning` says (a fork server that has imported
the pipeline once, so a replacement starts in a fraction of a fresh
interpreter's time); each opens its own CUDA context, and the main process
opens none (it would hold GPU memory the workers need).

Each worker has one duplex pipe (orders out, events back, pickled
:mod:`.messages`) and one :class:`~.control.Control` (what it runs now, in
shared memory). Orders given and not yet answered are kept here, by their
sequence number, so that when a worker dies its jobs are known.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait
from typing import Any

from .. import spawning
from ..record import now_iso
from ..spool import shown
from . import worker
from .control import Control, Running
from .messages import (
    Ended,
    Event,
    Kept,
    NotRun,
    Order,
    Quit,
    Ready,
    Resume,
    RunOrder,
    StartFailed,
    WorkerSpec,
)
from .scheduler import Load
from .tunables import HEARTBEAT, STOP_GRACE_S

#: What the main process does with a worker's event (and the order it answers, or None).
OnEvent = Callable[["WorkerHandle", Event, RunOrder | Resume | None], None]

#: How long a stop waits for a worker's control block (held by the worker for a few writes at a job's start
#: and end; a worker killed while it held it never gives it back).
FREEZE_S = 1.0


class WorkerHandle:
    """One worker process, as the main process holds it."""

    def __init__(self, ctx: Any, spec: WorkerSpec, lock_fds: list[int]) -> None:
        self.spec = spec
        self.control = Control.new(ctx)
        self.conn, child = ctx.Pipe(duplex=True)
        held = [Inherited(fd) for fd in lock_fds]
        self.process = ctx.Process(
            target=worker.serve, args=(child, self.control, spec, held), name=f"mmd-worker-{spec.index}", daemon=True
        )
        self._child: Connection | None = child
        #: Orders sent and not yet answered, in the order sent.
        self.in_hand: dict[int, RunOrder | Resume] = {}
        #: Of those, how many are small (a big one in hand means no more are given).
        self.small: set[int] = set()
        #: Who submitted each job in hand, as the scheduler knew it when it gave the job (a login; None: not
        #: known): a status shows a submitter's jobs without looking at their files.
        self.submitters: dict[int, str | None] = {}
        self.ready: Ready | None = None
        self.failed: StartFailed | None = None
        self._seq = 0

    @property
    def index(self) -> int:
        return self.spec.index

    @property
    def device(self) -> int:
        return self.spec.device

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self) -> None:
        self.process.start()
        assert self._child is not None
        self._child.close()  # the worker's end: ours closed, so that its death reads as EOF here
        self._child = None

    def alive(self) -> bool:
        return self.process.is_alive()

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def send(self, order: Order) -> None:
        """Send an order (a job's is kept in hand until it is answered); a dead worker's pipe is not an error
        here: its death is found by :meth:`alive`."""
        if isinstance(order, (RunOrder, Resume)):
            self.in_hand[order.seq] = order
        with contextlib.suppress(OSError, EOFError):
            self.conn.send(order)

    def events(self) -> list[tuple[Event, RunOrder | Resume | None]]:
        """Every event waiting in the pipe (none when it is empty or closed), each with the order it answers
        (which is no longer in hand), or None."""
        received: list[Event] = []
        try:
            while self.conn.poll():
                event: Event = self.conn.recv()
                received.append(event)
        except (EOFError, OSError):
            pass
        out: list[tuple[Event, RunOrder | Resume | None]] = []
        for event in received:
            order: RunOrder | Resume | None = None
            if isinstance(event, (Ended, NotRun, Kept)):
                order = self.in_hand.pop(event.seq, None)
                self.small.discard(event.seq)
                self.submitters.pop(event.seq, None)
            elif isinstance(event, Ready):
                self.ready = event
            elif isinstance(event, StartFailed):
                self.failed = event
            out.append((event, order))
        return out

    def quit(self) -> None:
        self.send(Quit())

    def stop(self, grace: float) -> None:
        """End the process now: SIGTERM, then SIGKILL after ``grace`` seconds; waits until it is gone."""
        if self.process.pid is None:
            return
        if self.process.is_alive():
            _signal(self.process.pid, signal.SIGTERM)
            self.process.join(grace)
        if self.process.is_alive():
            _signal(self.process.pid, signal.SIGKILL)
        self.process.join()

    def stop_job(self, seq: int, grace: float) -> Running | None:
        """End the process for its job ``seq`` (as :meth:`stop` does) if it runs that job now; else do nothing
        and return None. The check and the signal are made with its control block frozen (the worker
        cannot move on in between), so the signal never lands on another job."""
        with self.control.frozen(FREEZE_S) as running:
            if running is None or running.seq != seq or self.process.pid is None:
                return None
            _signal(self.process.pid, signal.SIGTERM)  # default action: the worker dies without running on
        self.stop(grace)
        return running

    def join(self, timeout: float | None = None) -> None:
        self.process.join(timeout)

    def close(self) -> None:
        self.conn.close()
        if self.process.pid is not None and not self.process.is_alive():
            self.process.close()


class Inherited:
    """An open file a worker is given (the daemon's lock): the same open file, so the lock it holds lasts until
    the daemon and every worker have closed it (multiprocessing passes the descriptor across)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _inherit, (reduction.DupFd(self.fd),)


def _inherit(dup: Any) -> Inherited:
    return Inherited(dup.detach())


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class WorkerPool:
    """The daemon's workers together: started, given jobs, read and stopped as one.

    What to do about what a worker says or suffers (a job ended, a worker
    dead or past its limit) is the daemon's policy (:mod:`.server`); the pool
    is the mechanism. ``spec_for(index, device, count)`` makes a worker's
    start-up facts, ``lock_fds()`` the daemon's lock files each worker keeps.
    """

    def __init__(
        self, ctx: Any, spec_for: Callable[[int, int, int], WorkerSpec], lock_fds: Callable[[], list[int]]
    ) -> None:
        self.ctx = ctx
        self.spec_for = spec_for
        self.lock_fds = lock_fds
        self.handles: list[WorkerHandle] = []
        self._shown: dict[int, dict[str, Any] | None] = {}  # each worker's job in hand, as last shown
        self._opening: dict[int, Any] = {}  # each device's lock its workers open their backends under

    def start(self, devices: list[int]) -> None:
        """One worker per entry of ``devices`` (its device); the workers of a device open their backends in turn,
        the first started first."""
        self.handles = [self._handle(i, device, len(devices)) for i, device in enumerate(devices)]

    def _handle(self, index: int, device: int, count: int) -> WorkerHandle:
        opening = self._opening.setdefault(device, self.ctx.Lock())
        with spawning.starting():
            handle = WorkerHandle(self.ctx, replace(self.spec_for(index, device, count), opening=opening),
                                  self.lock_fds())  # fmt: skip
            handle.start()
        return handle

    def replace(self, index: int) -> WorkerHandle:
        """A fresh worker in the place of worker ``index`` (which is gone)."""
        old = self.handles[index]
        self.handles[index] = self._handle(old.index, old.device, len(self.handles))
        return self.handles[index]

    def __iter__(self) -> Iterator[WorkerHandle]:
        return iter(list(self.handles))

    def __len__(self) -> int:
        return len(self.handles)

    def loads(self) -> list[Load]:
        """The scheduler's view of the workers that take jobs now: the ready ones. Whether each is alive is not
        asked here (two system calls a worker, on every arrival's way to its order): one found dead by the
        server's check, which follows the orders, gives back what it was given, to go to another."""
        loads = []
        for w in self.handles:
            if w.ready is not None:
                loads.append(Load(w.index, len(w.in_hand), all_small=len(w.small) == len(w.in_hand)))
        return loads

    def give(self, index: int, order: RunOrder | Resume, small: bool, submitter: str | None) -> None:
        w = self.handles[index]
        w.send(order)
        w.submitters[order.seq] = submitter
        if small:
            w.small.add(order.seq)

    def events(
        self, ready: Collection[object] | None = None
    ) -> Iterator[tuple[WorkerHandle, Event, RunOrder | Resume | None]]:
        """Every event waiting from every worker (``ready``: from those whose pipe is in it, what ``wait``
        found readable), each with its worker and the order it answers."""
        for w in list(self.handles):
            if ready is None or w.conn in ready:
                for event, order in w.events():
                    yield w, event, order

    def conns(self) -> list[Connection]:
        return [w.conn for w in self.handles]

    def waits(self, now: float, supervise_s: float) -> list[float]:
        """How long the main loop may sleep for the workers' sake: the nearest limit of a job in hand, and
        ``supervise_s`` while a worker has jobs (its next may start with a limit of its own)."""
        out = []
        for w in self.handles:
            running = w.control.running()
            if running is not None:
                out.append(running.started + running.limit_s - now + 0.001)
            if w.in_hand:
                out.append(supervise_s)
        return out

    def hold_new(self, hold: bool) -> None:
        """Tell every worker not to claim the names it was given (a pause, a stop), or to claim them again."""
        for w in self.handles:
            w.control.hold_new = hold

    def broadcast(self, order: Order) -> None:
        for w in self.handles:
            w.send(order)

    def kill_all(self) -> int:
        """SIGKILL every worker at once (a second SIGTERM); returns how many had a job in hand."""
        busy = sum(1 for w in self.handles if w.control.running() is not None)
        for w in self.handles:
            if w.pid is not None:
                _signal(w.pid, signal.SIGKILL)
        return busy

    def health(self, now: float, stuck_after: float) -> tuple[bool, str]:
        if not self.handles:
            return False, "no worker is running"
        for w in self.handles:
            if w.ready is None:
                continue  # starting
            beat = w.control.last_beat
            if w.control.running() is None and beat and now - beat > stuck_after:
                return False, f"worker {w.index} (device {w.device}) has not turned for {now - beat:.0f} s"
        return True, ""

    def current(self) -> list[tuple[int, dict[str, Any] | None]]:
        """The workers whose job in hand changed since the last call: (index, the job as the state file
        shows it, or None when idle)."""
        changed = []
        for w in self.handles:
            running = w.control.running()
            order = w.in_hand.get(running.seq) if running is not None else None
            current = shown_as = None
            if order is not None and running is not None:
                name = order.name if isinstance(order, RunOrder) else order.claim.name
                job = order.job_id if isinstance(order, RunOrder) else order.claim.job_id
                current = {"job": job, "file": shown(name), "since": running.started, "phase": running.phase}
                shown_as = {**current, "since": now_iso(time.time() - (time.monotonic() - running.started))}
            if self._shown.get(w.index) != current:
                self._shown[w.index] = current
                changed.append((w.index, shown_as))
        return changed

    def stop(self, on_event: OnEvent, wait_s: float) -> None:
        """The jobs in hand finish (names given and not claimed stay in the inbox), then each worker quits;
        ``on_event`` is told what they say meanwhile. Waits at most ``wait_s`` for a worker that neither
        runs nor answers."""
        self.hold_new(True)
        deadline = None
        while any(w.in_hand and w.alive() for w in self.handles):
            ready = wait([w.conn for w in self.handles if w.alive()], timeout=HEARTBEAT)
            for w, event, order in self.events():
                on_event(w, event, order)
            if not ready and deadline is None and all(w.control.running() is None for w in self.handles):
                deadline = time.monotonic() + wait_s  # nothing runs and nothing answers: do not wait for ever
            if deadline is not None and time.monotonic() > deadline:
                break
        for w in self.handles:
            w.quit()
        for w in self.handles:
            w.join(wait_s)
            if w.alive():
                w.stop(STOP_GRACE_S)
            for event, order in w.events():
                on_event(w, event, order)
            w.close()
