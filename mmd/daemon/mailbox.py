"""The main loop's mailbox: hints from other threads and signal handlers, and a descriptor that wakes its wait;
and the wait itself (:class:`Waits`).

The main loop waits on the workers' pipes and on this mailbox at once
(``multiprocessing.connection.wait``), so a hint must be readable as a
file descriptor too: :meth:`Mailbox.post` queues the hint and writes one
byte to a pipe (the self-pipe trick). Both are safe in a signal handler:
``SimpleQueue.put`` is reentrant and ``os.write`` async-signal-safe.
"""

from __future__ import annotations

import contextlib
import os
import queue
import selectors
from collections.abc import Sequence
from typing import Any

from .messages import Hint


class Mailbox:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Hint] = queue.SimpleQueue()
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        #: A wake-up byte is in the pipe (or about to be) that the loop has not taken yet: a burst of
        #: events costs one write and one wake-up, not one each.
        self._woken = False

    def post(self, hint: Hint) -> None:
        self._queue.put(hint)
        if self._woken:
            return
        self._woken = True
        with contextlib.suppress(BlockingIOError):  # full of wake-ups already: the loop wakes anyway
            os.write(self._write, b"\0")

    def fileno(self) -> int:
        """The descriptor that is readable while hints wait."""
        return self._read

    def take(self) -> list[Hint]:
        """Every hint waiting, oldest first (the wake-up bytes are drained too)."""
        try:
            while len(os.read(self._read, 4096)) == 4096:  # one byte per wake-up: mostly one read
                pass
        except BlockingIOError:
            pass
        # After the pipe is drained (a wake-up written during the drain would be drained with it, and the hint
        # behind the next one left without any) and before the queue is read: a hint posted from here on
        # wakes the loop again; one posted before is in the queue read below.
        self._woken = False
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


class Waits:
    """The main loop's wait for any of several readable objects (pipes, the mailbox, the inbox's watch).

    One selector, filled again only when the objects change (a worker replaced, the watch remade):
    ``multiprocessing.connection.wait`` makes and fills a new selector on every call, which is on the
    way from a file's arrival to its order. A poll selector, not epoll: it keeps no kernel state that
    a closed and reused descriptor could confuse.
    """

    def __init__(self) -> None:
        self._selector = selectors.PollSelector()
        self._objects: tuple[Any, ...] = ()
        self._fds: list[int] = []  # as registered: an object closed since cannot say its descriptor

    def wait(self, objects: Sequence[Any], timeout: float) -> list[Any]:
        """Those of ``objects`` (each with ``fileno()``) that are readable, waiting up to ``timeout`` seconds."""
        objects = tuple(objects)
        if objects != self._objects:
            fds = [obj.fileno() for obj in objects]  # first: a closed object raises with nothing changed
            for fd in self._fds:
                self._selector.unregister(fd)
            self._fds, self._objects = [], ()
            for fd, obj in zip(fds, objects, strict=True):
                self._selector.register(fd, selectors.EVENT_READ, obj)
                self._fds.append(fd)
            self._objects = objects
        return [key.data for key, _ in self._selector.select(timeout)]

    def close(self) -> None:
        self._selector.close()
