"""The observer (mmd.daemon.observer): events on files directly in the inbox become hints; the rest is ignored."""

from __future__ import annotations

import pytest
from watchdog.events import DirDeletedEvent, FileClosedEvent, FileCreatedEvent, FileMovedEvent

from mmd.daemon.messages import Arrived, InboxChanged
from mmd.daemon.observer import Hints, make_observer
from mmd.logs import get_logger

from .conftest import wait_for


def drained(hints: list) -> list:
    out = list(hints)
    hints.clear()
    return out


def test_events_become_hints(tmp_path):
    hints: list = []
    handler = Hints(tmp_path, hints.append, created_is_move=True)
    handler.dispatch(FileClosedEvent(str(tmp_path / "a.txt")))
    handler.dispatch(FileMovedEvent(str(tmp_path / "x.part"), str(tmp_path / "b.txt")))
    handler.dispatch(FileCreatedEvent(str(tmp_path / "c.txt")))
    handler.dispatch(FileClosedEvent(str(tmp_path / ".hidden")))  # not a job name
    handler.dispatch(FileClosedEvent(str(tmp_path / "sub" / "d.txt")))  # not directly in the inbox
    handler.dispatch(FileClosedEvent(str(tmp_path / "e.tmp")))
    handler.dispatch(DirDeletedEvent(str(tmp_path)))
    assert drained(hints) == [Arrived("a.txt", True), Arrived("b.txt", True), Arrived("c.txt", True), InboxChanged()]
    polling = Hints(tmp_path, hints.append, created_is_move=False)
    polling.dispatch(FileCreatedEvent(str(tmp_path / "f.txt")))
    assert drained(hints) == [Arrived("f.txt", False)], "without the arrivals mask a created file may still be written"


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
