"""The observer (mmd.daemon.observer): events on files directly in the inbox become hints; the rest is ignored."""

from __future__ import annotations

import threading

import pytest
from watchdog.events import DirDeletedEvent, FileClosedEvent, FileCreatedEvent, FileMovedEvent

from mmd.daemon.messages import Arrived, InboxChanged, Overflowed, Writing
from mmd.daemon.observer import Hints, InboxWatch, hint_of, make_observer
from mmd.logs import get_logger

from .conftest import wait_for


def drained(hints: list) -> list:
    out = list(hints)
    hints.clear()
    return out


def test_inotify_events_become_hints():
    from inotify_simple import flags as K

    events = [
        (K.CLOSE_WRITE, "a.txt"),
        (K.MOVED_TO, "b.txt"),  # renamed in: whole
        (K.MODIFY, "c.txt"),  # being written: taken at its close
        (K.CLOSE_WRITE, ".hidden"),  # not a job name
        (K.CLOSE_WRITE, "e.tmp"),
        (K.MOVED_TO | K.ISDIR, "sub"),  # a folder
        (K.CLOSE_NOWRITE, "f.txt"),  # not asked for: nothing
        (K.DELETE_SELF, ""),
        (K.IGNORED, ""),  # the watch ended (the inbox deleted or unmounted)
        (K.Q_OVERFLOW, ""),
    ]
    hints = [h for mask, name in events if (h := hint_of(mask, name)) is not None]
    assert hints == [Arrived("a.txt", True), Arrived("b.txt", True), Writing("c.txt"), InboxChanged(),
                     InboxChanged(), Overflowed()]  # fmt: skip


def test_the_inotify_watch_is_read_by_whoever_waits_on_it(tmp_path):
    """The main loop waits on the watch's descriptor and takes its hints itself: no thread runs for it."""
    from multiprocessing.connection import wait

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    threads = threading.active_count()
    watch = InboxWatch(inbox)
    try:
        assert threading.active_count() == threads
        assert watch.take() == [] and wait(watch.waitables(), timeout=0) == []
        (tmp_path / "m.src").write_text("1\n")
        (tmp_path / "m.src").rename(inbox / "m.txt")
        assert wait(watch.waitables(), timeout=5)
        assert watch.take() == [Arrived("m.txt", True)]
        assert watch.take() == []
        (inbox / "m.txt").unlink()
        inbox.rmdir()
        assert wait(watch.waitables(), timeout=5)
        assert InboxChanged() in watch.take()
    finally:
        watch.stop()
        watch.join(1)
    assert watch.take() == []  # stopped: nothing more, no error


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
            seen.update(hint.name for hint in drained(hints) + observer.take())  # polling posts, inotify is read
            return {"w.txt", "m.txt"} <= seen

        wait_for(both, 10, f"{kind} events")
    finally:
        observer.stop()
        observer.join(5)


def test_auto_falls_back_to_polling_where_the_c_library_has_no_inotify(tmp_path, monkeypatch):
    """Off Linux the C library has no inotify_init1 (ctypes raises AttributeError): auto polls, inotify says
    why it cannot."""
    from mmd.daemon import observer as obs
    from mmd.errors import SpoolError

    def no_inotify(*args, **kwargs):
        raise AttributeError("dlsym(RTLD_DEFAULT, inotify_init1): symbol not found")

    monkeypatch.setattr(obs, "INotify", no_inotify)
    watcher, used = make_observer("auto", tmp_path, [].append, 0.1, get_logger())
    try:
        assert used == "polling"
    finally:
        watcher.stop()
        watcher.join(5)
    with pytest.raises(SpoolError, match="inotify is not available here"):
        make_observer("inotify", tmp_path, [].append, 0.1, get_logger())
