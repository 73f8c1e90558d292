"""The observer (mmd.daemon.observer): events on files directly in the inbox become hints; the rest is ignored."""

from __future__ import annotations

import os

import pytest
from watchdog.events import DirDeletedEvent, FileClosedEvent, FileCreatedEvent, FileMovedEvent

from mmd.daemon.messages import Arrived, InboxChanged, Overflowed, Writing
from mmd.daemon.observer import Arrivals, Hints, make_observer
from mmd.logs import get_logger

from .conftest import wait_for


def drained(hints: list) -> list:
    out = list(hints)
    hints.clear()
    return out


def _event(mask: int, name: str = ""):
    from watchdog.observers.inotify_c import InotifyEvent

    return InotifyEvent(1, mask, 0, os.fsencode(name))


def test_inotify_events_become_hints():
    from watchdog.observers.inotify_c import InotifyConstants as K

    hints: list = []
    arrivals = Arrivals(hints.append)
    arrivals.on_event(_event(K.IN_CLOSE_WRITE, "a.txt"))
    arrivals.on_event(_event(K.IN_MOVED_TO, "b.txt"))  # renamed in: whole
    arrivals.on_event(_event(K.IN_MODIFY, "c.txt"))  # being written: taken at its close
    arrivals.on_event(_event(K.IN_CLOSE_WRITE, ".hidden"))  # not a job name
    arrivals.on_event(_event(K.IN_CLOSE_WRITE, "e.tmp"))
    arrivals.on_event(_event(K.IN_MOVED_TO | K.IN_ISDIR, "sub"))  # a folder
    arrivals.on_event(_event(K.IN_DELETE_SELF))
    arrivals.on_queue_overflow()
    assert drained(hints) == [Arrived("a.txt", True), Arrived("b.txt", True), Writing("c.txt"), InboxChanged(),
                              Overflowed()]  # fmt: skip


def test_polling_events_become_hints(tmp_path):
    hints: list = []
    handler = Hints(tmp_path, hints.append)
    handler.dispatch(FileClosedEvent(str(tmp_path / "a.txt")))
    handler.dispatch(FileMovedEvent(str(tmp_path / "x.part"), str(tmp_path / "b.txt")))
    handler.dispatch(FileCreatedEvent(str(tmp_path / "c.txt")))
    handler.dispatch(FileClosedEvent(str(tmp_path / ".hidden")))  # not a job name
    handler.dispatch(FileClosedEvent(str(tmp_path / "sub" / "d.txt")))  # not directly in the inbox
    handler.dispatch(FileClosedEvent(str(tmp_path / "e.tmp")))
    handler.dispatch(DirDeletedEvent(str(tmp_path)))
    # polling sees no close: a file it finds created may still be written, and is watched until quiet
    assert drained(hints) == [Arrived("a.txt", True), Arrived("b.txt", True), Arrived("c.txt", False),
                              InboxChanged()]  # fmt: skip


@pytest.mark.parametrize("kind", ["inotify", "polling"])
def test_a_real_observer_reports_a_closed_file_and_a_rename_in(tmp_path, kind):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    hints: list = []
    observer, used = make_observer(kind, inbox, hints.append, 0.1, get_logger())
    try:
        assert used == kind
        (inbox / "w.txt").write_text("1\n2\n3\n")
        (tmp_path / "m.src").write_text("1\n2\n3\n")
        (tmp_path / "m.src").rename(inbox / "m.txt")
        seen: set = set()

        def both() -> bool:
            seen.update(hint.name for hint in drained(hints))
            return {"w.txt", "m.txt"} <= seen

        wait_for(both, 10, f"{kind} events")
    finally:
        observer.stop()
        observer.join(5)
