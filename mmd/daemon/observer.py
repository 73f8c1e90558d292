"""The observer: filesystem events become hints (events are hints, never the truth).

Built from watchdog's public API only: an observer made with
``BaseObserver(emitter_class)`` and an inotify emitter whose
``get_event_mask_from_filter`` asks the kernel for just what marks an
arrival. The periodic rescan (``rescan_seconds``) finds whatever the events
miss, an inotify queue overflow included.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchdog.events import (
    DirDeletedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver

from ..errors import SpoolError
from ..spool import is_job_name
from .messages import Arrived, Hint, InboxChanged, Writing

#: Event kinds the handler is given (polling: created, moved, closed never comes; inotify: the arrivals mask).
_EVENTS: list[type[FileSystemEvent]] = [
    FileClosedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    DirDeletedEvent,
]


def _arrivals_observer(timeout: float) -> BaseObserver:
    """watchdog's inotify emitter, asking the kernel only for writes, close-after-write, moved-in and the inbox's
    deletion.

    A write (IN_MODIFY) marks a file as being written: a writer that pauses
    with the file open (scp over a slow link) is then waited for until its
    close, not taken by a rescan that finds it quiet for a moment.

    With a filter that admits moves, watchdog asks for IN_MOVED_FROM too and
    holds each one that no IN_MOVED_TO pairs (every claim renames a file out
    of the inbox) for half a second, and every later event waits behind it.
    Without IN_MOVED_FROM, an IN_MOVED_TO arrives on its own as a "created"
    event of a file renamed into the inbox, which is complete.
    """
    from watchdog.observers.inotify import InotifyEmitter
    from watchdog.observers.inotify_c import InotifyConstants as K

    class _ArrivalsEmitter(InotifyEmitter):
        def get_event_mask_from_filter(self) -> Any:
            return K.IN_DELETE_SELF | K.IN_MODIFY | K.IN_CLOSE_WRITE | K.IN_MOVED_TO

    return BaseObserver(_ArrivalsEmitter, timeout=timeout)


def make_observer(
    kind: str, inbox: Path, hints: Callable[[Hint], None], poll_seconds: float, log: Any
) -> tuple[BaseObserver, str]:
    """Start a watchdog observer on ``inbox``; returns (observer, the kind actually used).

    ``auto`` uses inotify and falls back to polling where inotify cannot be set
    up (no inotify, out of instances or watches); ``inotify`` fails instead.
    ``hints`` is given each hint; the inbox itself deleted becomes :class:`InboxChanged`.
    """
    if kind in ("auto", "inotify"):
        try:
            observer = _arrivals_observer(poll_seconds)
            observer.schedule(Hints(inbox, hints, created_is_move=True), str(inbox), event_filter=_EVENTS)
            observer.start()
            return observer, "inotify"
        except (OSError, ImportError) as exc:
            if kind == "inotify":
                raise SpoolError(f"inotify is not available here ({exc}); use observer: polling") from None
            log.warning("inotify is not available; falling back to polling", reason=str(exc))
    from watchdog.observers.polling import PollingObserver

    polling = PollingObserver(timeout=poll_seconds)
    polling.schedule(Hints(inbox, hints, created_is_move=False), str(inbox), event_filter=_EVENTS)
    polling.start()
    return polling, "polling"


class Hints(FileSystemEventHandler):
    """Events on files directly in the inbox become hints for the main loop."""

    def __init__(self, inbox: Path, hints: Callable[[Hint], None], created_is_move: bool) -> None:
        super().__init__()
        self.inbox = os.path.abspath(inbox)
        self.hints = hints
        #: On the arrivals emitter "created" is a file renamed in: complete. Polling: watch until quiet.
        self.created_complete = created_is_move

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
            self._put(self.created_complete, event.src_path)
        elif kind == "modified" and self.created_complete:  # inotify's writes (polling's "modified" is a stat)
            name = self._name(event.src_path)
            if name is not None:
                self.hints(Writing(name))
