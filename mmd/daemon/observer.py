"""The observer: filesystem events become hints (events are hints, never the truth).

On Linux the inbox's inotify descriptor is read by the main loop itself: it
waits on it together with its mailbox and the workers' pipes, so a file
renamed into the inbox reaches the scheduler with no hand-off between
threads. The kernel is asked for just what marks an arrival. watchdog's
polling observer (a thread of its own, which posts its hints to the
mailbox) is used where inotify cannot be. The periodic rescan
(``rescan_seconds``) finds whatever the events miss; an inotify queue
overflow asks for one at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from inotify_simple import INotify, flags, parse_events
from watchdog.events import (
    DirDeletedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

from ..errors import SpoolError
from ..spool import is_job_name
from .messages import Arrived, Hint, InboxChanged, Overflowed, Writing

#: Event kinds the polling handler is given (created, moved; closed never comes).
_EVENTS: list[type[FileSystemEvent]] = [
    FileClosedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    DirDeletedEvent,
]


class Watcher(Protocol):
    """What watches the inbox, for the main loop: stopped and joined when the daemon stops or the inbox is made
    again."""

    def waitables(self) -> list[Any]:
        """What the main loop waits on for this watcher's events (none: it posts them to the mailbox)."""
        ...

    def take(self) -> list[Hint]:
        """The hints that arrived since the last call, without waiting (called when one of :meth:`waitables` is
        readable)."""
        ...

    def stop(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


#: What the inbox's watch asks the kernel for: writes, close-after-write, renames in and the inbox's deletion.
#: IN_MOVED_FROM is not asked for: every claim is a rename out of the inbox.
WATCH_MASK = flags.MODIFY | flags.CLOSE_WRITE | flags.MOVED_TO | flags.DELETE_SELF | flags.ONLYDIR | flags.DONT_FOLLOW
_GONE = flags.DELETE_SELF | flags.UNMOUNT | flags.IGNORED
_COMPLETE = flags.CLOSE_WRITE | flags.MOVED_TO
#: One read's worth of events (the kernel returns whole events only; what does not fit is read next turn).
_READ_SIZE = 64 * 1024


def hint_of(mask: int, name: str) -> Hint | None:
    """The hint one inotify event of the inbox's watch gives (None: nothing to do).

    A file closed after writing or renamed in is complete; a write
    (IN_MODIFY) marks a file as being written: a writer that pauses with the
    file open (scp over a slow link) is then waited for until its close, not
    taken by a rescan that finds it quiet for a moment. The inbox deleted or
    unmounted (the watch then ends: IN_IGNORED) is :class:`InboxChanged`.
    """
    if mask & flags.Q_OVERFLOW:
        return Overflowed()
    if mask & _GONE:
        return InboxChanged()
    if mask & flags.ISDIR or not name or not is_job_name(name):
        return None
    if mask & _COMPLETE:
        return Arrived(name, True)  # a rename is atomic, a close after writing ends the write
    if mask & flags.MODIFY:
        return Writing(name)
    return None


class InboxWatch:
    """An inotify watch on the inbox whose descriptor the main loop waits on and reads (``inotify_simple``: a
    descriptor and a parser, no thread of its own, which is what lets the loop skip a hand-off)."""

    def __init__(self, inbox: Path) -> None:
        self._fd = INotify(nonblocking=True)
        try:
            self._fd.add_watch(inbox, WATCH_MASK)
        except BaseException:
            self._fd.close()
            raise

    def waitables(self) -> list[Any]:
        return [self._fd]

    def take(self) -> list[Hint]:
        if self._fd.closed:
            return []
        try:  # read at once (the descriptor does not block), not after asking how much is there
            data = os.read(self._fd.fileno(), _READ_SIZE)
        except BlockingIOError:
            return []
        hints = []
        for event in parse_events(data):
            hint = hint_of(event.mask, event.name)
            if hint is not None:
                hints.append(hint)
        return hints

    def stop(self) -> None:
        self._fd.close()

    def join(self, timeout: float | None = None) -> None:
        pass  # nothing runs on its own


class Polling:
    """watchdog's polling observer, whose thread posts its hints to the mailbox."""

    def __init__(self, inbox: Path, hints: Callable[[Hint], None], poll_seconds: float) -> None:
        from watchdog.observers.polling import PollingObserver

        self._observer = PollingObserver(timeout=poll_seconds)
        self._observer.schedule(Hints(inbox, hints), str(inbox), event_filter=_EVENTS)
        self._observer.start()

    def waitables(self) -> list[Any]:
        return []

    def take(self) -> list[Hint]:
        return []

    def stop(self) -> None:
        self._observer.stop()

    def join(self, timeout: float | None = None) -> None:
        self._observer.join(timeout)


def make_observer(
    kind: str, inbox: Path, hints: Callable[[Hint], None], poll_seconds: float, log: Any
) -> tuple[Watcher, str]:
    """Start watching ``inbox``; returns (the watcher, the kind actually used).

    ``auto`` uses inotify and falls back to polling where inotify cannot be set
    up (no inotify, out of instances or watches); ``inotify`` fails instead.
    ``hints`` is given each hint; the inbox itself deleted becomes :class:`InboxChanged`.
    """
    if kind in ("auto", "inotify"):
        try:
            return InboxWatch(inbox), "inotify"
        except (OSError, AttributeError) as exc:  # AttributeError: a C library without inotify_init1 (not Linux)
            if kind == "inotify":
                raise SpoolError(f"inotify is not available here ({exc}); use observer: polling") from None
            log.warning("inotify is not available; falling back to polling", reason=str(exc))
    return Polling(inbox, hints, poll_seconds), "polling"


class Hints(FileSystemEventHandler):
    """Polling's events on files directly in the inbox become hints for the main loop.

    Polling sees no close: a file it finds created or changed is watched until quiet.
    """

    def __init__(self, inbox: Path, hints: Callable[[Hint], None]) -> None:
        super().__init__()
        self.inbox = os.path.abspath(inbox)
        self.hints = hints

    def _name(self, path: bytes | str) -> str | None:
        """The job name ``path`` has in the inbox (None: not directly in the inbox, or not a job's name)."""
        text = os.fsdecode(path)
        if not text:
            return None
        folder, name = os.path.split(os.path.abspath(text))
        return name if folder == self.inbox and is_job_name(name) else None

    def _put(self, complete: bool, path: bytes | str) -> None:
        name = self._name(path)
        if name is not None:
            self.hints(Arrived(name, complete))

    def dispatch(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            if event.event_type == "deleted" and os.path.abspath(os.fsdecode(event.src_path)) == self.inbox:
                self.hints(InboxChanged())
            return
        kind = event.event_type
        if kind == "closed":
            self._put(True, event.src_path)
        elif kind == "moved":
            self._put(True, event.dest_path)  # a rename is atomic: the file is whole
        elif kind == "created":
            self._put(False, event.src_path)
