"""The observer: filesystem events become hints (events are hints, never the truth).

On Linux the inbox's inotify events are read by a thread of watchdog's own
(``InotifyFD``, constructed directly, with this module's callback): each
event becomes a hint on that thread, one hand-off from the kernel to the
daemon's mailbox. watchdog's observer and emitter (three threads and two
queues between the kernel and a handler, 0.2 ms more per arrival on the
project's VM) are used for polling only. The kernel is asked for just what
marks an arrival. The periodic rescan (``rescan_seconds``) finds whatever
the events miss; an inotify queue overflow asks for one at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

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

    def stop(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


class Arrivals:
    """The inbox's inotify events as hints, given on watchdog's ``InotifyFD`` thread (its ``WatchCallback``).

    The kernel is asked for writes, close-after-write, renames in and the
    inbox's deletion (:func:`watch_inbox`). A file closed after writing or
    renamed in is complete; a write (IN_MODIFY) marks a file as being
    written: a writer that pauses with the file open (scp over a slow link)
    is then waited for until its close, not taken by a rescan that finds it
    quiet for a moment. IN_MOVED_FROM is not asked for: every claim is a
    rename out of the inbox.
    """

    def __init__(self, hints: Callable[[Hint], None]) -> None:
        self.hints = hints

    def on_event(self, event: Any) -> None:
        if event.is_delete_self:
            self.hints(InboxChanged())
            return
        if event.is_directory or not event.name:
            return
        name = os.fsdecode(event.name)
        if not is_job_name(name):
            return
        if event.is_close_write or event.is_moved_to:
            self.hints(Arrived(name, True))  # a rename is atomic, a close after writing ends the write
        elif event.is_modify:
            self.hints(Writing(name))

    def on_watch_deleted(self, wd: Any) -> None:
        self.hints(InboxChanged())  # the inbox was deleted or its filesystem unmounted

    def on_queue_overflow(self) -> None:
        self.hints(Overflowed())


class InboxWatch:
    """An inotify watch on the inbox, read by a thread of watchdog's ``InotifyFD``: stop and join it."""

    def __init__(self, inbox: Path, hints: Callable[[Hint], None]) -> None:
        from watchdog.observers.inotify_c import CallbackId, InotifyConstants, InotifyFD, Mask

        k = InotifyConstants
        mask = k.IN_DELETE_SELF | k.IN_MODIFY | k.IN_CLOSE_WRITE | k.IN_MOVED_TO | k.IN_DONT_FOLLOW | k.IN_ONLYDIR
        self._fd = InotifyFD()  # a reader of its own, not watchdog's shared one
        try:
            self._fd.add_callback(os.fsencode(inbox), Mask(mask), Arrivals(hints), CallbackId(0))
        except BaseException:
            self._fd.close()
            raise
        self._fd.start()

    def stop(self) -> None:
        self._fd.stop()

    def join(self, timeout: float | None = None) -> None:
        self._fd.join(timeout)


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
            return InboxWatch(inbox, hints), "inotify"
        except (OSError, ImportError) as exc:
            if kind == "inotify":
                raise SpoolError(f"inotify is not available here ({exc}); use observer: polling") from None
            log.warning("inotify is not available; falling back to polling", reason=str(exc))
    from watchdog.observers.polling import PollingObserver

    polling = PollingObserver(timeout=poll_seconds)
    polling.schedule(Hints(inbox, hints), str(inbox), event_filter=_EVENTS)
    polling.start()
    return polling, "polling"


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
