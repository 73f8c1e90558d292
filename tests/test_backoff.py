"""mmd.daemon.backoff: a pause that doubles with each failure in a row, up to a bound."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mmd.daemon.backoff import FD_PAUSE_MAX_S, FD_PAUSE_S, Backoff
from mmd.daemon.tunables import MAX_PAUSE


def test_the_outbox_pause_doubles_until_a_success_and_is_over_when_its_time_has_passed():
    pause = Backoff(MAX_PAUSE)
    assert not pause.paused(0.0) and not pause.over(0.0)
    assert [pause.fail(10.0 * i, 5.0) for i in range(8)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert pause.paused(75.0) and not pause.over(75.0)
    assert pause.over(370.0) and not pause.paused(370.0)
    pause.clear()
    assert not pause.over(370.0)
    pause.passed()
    assert pause.fail(400.0, 5.0) == 5.0, "a success ends the row"


def test_descriptor_pauses_start_a_new_row_once_the_last_failure_is_long_past():
    fds = Backoff(FD_PAUSE_MAX_S, row_s=2 * FD_PAUSE_MAX_S)
    assert [fds.fail(t, FD_PAUSE_S) for t in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)] == [0.5, 1, 2, 4, 8, 8]
    assert fds.fail(5.0 + 2 * FD_PAUSE_MAX_S - 0.1, FD_PAUSE_S) == 8, "soon after: the row goes on"
    assert fds.fail(100.0, FD_PAUSE_S) == FD_PAUSE_S


@given(st.lists(st.floats(min_value=0.0, max_value=1e4), max_size=30), st.floats(min_value=0.01, max_value=100.0))
def test_a_pause_never_exceeds_its_bound_nor_shrinks_within_a_row(gaps, first):
    pause, now, before = Backoff(MAX_PAUSE), 0.0, 0.0
    for gap in gaps:
        now += gap
        seconds = pause.fail(now, first)
        assert min(first, MAX_PAUSE) <= seconds <= MAX_PAUSE and seconds >= before
        assert pause.paused(now) and pause.until == now + seconds
        before = seconds
