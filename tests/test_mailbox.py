"""The main loop's mailbox: hints readable as a descriptor, one wake-up per burst."""

from __future__ import annotations

import os


def test_the_mailbox_wakes_once_for_a_burst_and_again_after_each_take():
    import select

    from mmd.daemon.mailbox import Mailbox
    from mmd.daemon.messages import Arrived

    box = Mailbox()
    try:
        for i in range(100):
            box.post(Arrived(f"n{i}", True))
        assert select.select([box], [], [], 0)[0], "readable while hints wait"
        assert [h.name for h in box.take()] == [f"n{i}" for i in range(100)]
        assert not select.select([box], [], [], 0)[0] and box.take() == []
        box.post(Arrived("late", True))
        assert select.select([box], [], [], 0)[0], "a hint after a take wakes the loop again"
        assert [h.name for h in box.take()] == ["late"]
    finally:
        box.close()


def test_the_loops_wait_follows_its_objects_as_they_change():
    """Objects stay registered between waits; a closed one replaced by a new one (a worker's pipe, the
    inbox's watch made again, which may get the same descriptor number) is waited on instead."""
    from multiprocessing import Pipe

    from mmd.daemon.mailbox import Mailbox, Waits
    from mmd.daemon.messages import Arrived

    waits = Waits()
    box = Mailbox()
    a_recv, a_send = Pipe(duplex=False)
    try:
        assert waits.wait([box, a_recv], 0) == []
        a_send.send("x")
        assert waits.wait([box, a_recv], 0) == [a_recv]
        a_recv.close()
        a_send.close()
        b_recv, b_send = Pipe(duplex=False)  # likely the closed pipe's descriptor numbers
        b_send.send("y")
        assert waits.wait([box, b_recv], 1) == [b_recv]
        assert b_recv.recv() == "y" and waits.wait([box, b_recv], 0) == []
        box.post(Arrived("n", True))
        assert waits.wait([box, b_recv], 1) == [box]
        b_recv.close()
        b_send.close()
    finally:
        box.close()
        waits.close()


def test_a_hint_posted_while_the_loop_drains_the_pipe_still_wakes_it_later(monkeypatch):
    """A thread (the polling observer, the local socket) may post while the loop's take drains the wake-up pipe.
    Whatever happens then, every later hint must make the mailbox readable: the loop reads it only when it is."""
    import select

    from mmd.daemon import mailbox as mb
    from mmd.daemon.messages import Arrived

    box = mb.Mailbox()
    real_read = os.read
    posted = []

    def read_with_a_post_beside(fd, n):
        if not posted:
            posted.append(True)
            box.post(Arrived("during", True))  # another thread's post, between the loop's steps
        return real_read(fd, n)

    try:
        box.post(Arrived("first", True))
        monkeypatch.setattr(mb.os, "read", read_with_a_post_beside)
        taken = [h.name for h in box.take()]
        monkeypatch.setattr(mb.os, "read", real_read)
        later = [] if "during" in taken else ["during"]
        box.post(Arrived("next", True))
        assert select.select([box], [], [], 0)[0], "a hint waits: the mailbox must be readable"
        assert [h.name for h in box.take()] == [*later, "next"]
    finally:
        box.close()
