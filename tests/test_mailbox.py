"""The main loop's mailbox: hints readable as a descriptor, one wake-up per burst."""

from __future__ import annotations


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
