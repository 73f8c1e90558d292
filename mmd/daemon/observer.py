"""The observer: filesystem events become hints (events are hints, never the truth)."""

from __future__ import annotations

import os
import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import SpoolError
from ..spool import is_job_name
from .common import COMPLETE, INBOX, RESCAN, SEEN


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
