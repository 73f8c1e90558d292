"""The main process's side of the worker processes: start, order, read, stop, replace.

Workers are started by ``forkserver`` (on Linux; ``spawn`` elsewhere): a
CUDA context does not survive ``fork``, so each worker opens its own, and
the main process opens none (it would hold GPU memory the workers need).
The fork server imports the pipeline once, so a replacement worker starts
in a fraction of the time a fresh interpreter would take.

Each worker has one duplex pipe (orders out, events back, pickled
:mod:`.messages`) and one :class:`~.control.Control` (what it runs now, in
shared memory). Orders given and not yet answered are kept here, by their
sequence number, so that when a worker dies its jobs are known.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

from . import worker
from .control import Control
from .messages import Ended, Event, Kept, NotRun, Order, Quit, Ready, Resume, Run, StartFailed, WorkerSpec

#: What the fork server imports once, so that every worker it forks has it already.
PRELOAD = ["mmd.daemon.worker", "mmd.pipeline", "mmd.backends.cpu", "numpy"]


def context() -> Any:
    """The multiprocessing context workers are started in (forkserver where there is one)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


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
        self.in_hand: dict[int, Run | Resume] = {}
        #: Of those, how many are small (a big one in hand means no more are given).
        self.small: set[int] = set()
        self.ready: Ready | None = None
        self.failed: StartFailed | None = None
        self._seq = 0
        self.started_at = time.monotonic()

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
        if isinstance(order, (Run, Resume)):
            self.in_hand[order.seq] = order
        with contextlib.suppress(OSError, EOFError):
            self.conn.send(order)

    def events(self) -> list[tuple[Event, Run | Resume | None]]:
        """Every event waiting in the pipe (none when it is empty or closed), each with the order it answers
        (which is no longer in hand), or None."""
        received: list[Event] = []
        try:
            while self.conn.poll():
                event: Event = self.conn.recv()
                received.append(event)
        except (EOFError, OSError):
            pass
        out: list[tuple[Event, Run | Resume | None]] = []
        for event in received:
            order = None
            if isinstance(event, (Ended, NotRun, Kept)):
                order = self.in_hand.pop(event.seq, None)
                self.small.discard(event.seq)
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
