"""mmd.cuda.stream on the CPU: the phase timer (PhaseTimer) with stand-in CUDA events, and which build a launch takes
where a TMA build has a fallback (launch_build)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmd import kernels as registry
from mmd.cuda.memory import DeviceMatrix
from mmd.cuda.stream import PhaseTimer, launch_build


class Event:
    """A CUDA event: stamped by a shared clock when recorded; its elapsed time is read after the stream is."""

    made = 0

    def __init__(self) -> None:
        Event.made += 1
        self.stamp: float | None = None
        self.done = False
        self.stream: Stream | None = None

    def record(self, stream: Stream) -> Event:
        assert self.stream is None or self.done, "recorded again before the stream ran past it"
        stream.clock += 1.0
        self.stamp, self.done, self.stream = stream.clock, False, stream
        stream.recorded.append(self)
        return self

    def synchronize(self) -> None:
        """Waits for this event and, the stream being in order, for every event recorded before it."""
        assert self.stream is not None
        recorded = self.stream.recorded
        for event in recorded[: len(recorded) - recorded[::-1].index(self)]:
            event.done = True

    def time_till(self, end: Event) -> float:
        assert self.done and end.done, "read before the stream ran past it"
        assert self.stamp is not None and end.stamp is not None
        return end.stamp - self.stamp


class Stream:
    def __init__(self) -> None:
        self.clock = 0.0
        self.recorded: list[Event] = []


class Cuda:
    Event = Event


def job(timer: PhaseTimer, stream: Stream) -> dict[str, float]:
    """The backend's five phases, with one unrecorded step between h2d and kernel and a second h2d."""
    for name in ("malloc", "h2d", "kernel", "d2h", "h2d", "free"):
        with timer.phase(name):
            stream.clock += {"kernel": 10.0}.get(name, 2.0)
    return timer.elapsed_ms()


def test_phases_are_timed_as_before_and_their_events_are_made_once_per_session():
    Event.made = 0
    stream = Stream()
    spare: list[Any] = []
    first = job(PhaseTimer(Cuda, stream, spare), stream)
    assert Event.made == 12 and len(spare) == 12
    # each phase: its own time, plus the one clock tick its end event's recording takes
    assert first == {"malloc": 3.0, "h2d": 6.0, "kernel": 11.0, "d2h": 3.0, "free": 3.0}
    for _ in range(5):
        assert job(PhaseTimer(Cuda, stream, spare), stream) == first
    assert Event.made == 12 and len(spare) == 12


def test_phases_that_follow_share_their_boundary_events_and_time_the_same():
    Event.made = 0
    stream = Stream()
    spare: list[Any] = []
    apart = job(PhaseTimer(Cuda, stream, spare), stream)
    made = Event.made
    timer = PhaseTimer(Cuda, stream, spare)
    for name in ("malloc", "h2d", "kernel", "d2h", "h2d", "free"):
        with timer.phase(name, follows=name != "malloc"):
            stream.clock += {"kernel": 10.0}.get(name, 2.0)
    assert timer.elapsed_ms() == apart  # the event a phase no longer records was its own clock tick
    assert Event.made == made and len(spare) == 12  # 7 recorded, each given back once
    assert len(set(map(id, stream.recorded[-7:]))) == 7


def test_a_phase_after_a_failed_one_records_its_own_start():
    stream = Stream()
    timer = PhaseTimer(Cuda, stream, [])
    with timer.phase("malloc"):
        stream.clock += 2.0
    with pytest.raises(RuntimeError), timer.phase("h2d", follows=True):
        raise RuntimeError("cuMemcpy failed")
    with timer.phase("kernel", follows=True):
        stream.clock += 10.0
    assert timer.elapsed_ms() == {"malloc": 3.0, "kernel": 11.0}


def test_events_of_a_timer_not_read_are_not_reused():
    """A job that failed midway never reads its timer: its events may still be pending, so none is spare."""
    stream = Stream()
    spare: list[Any] = []
    timer = PhaseTimer(Cuda, stream, spare)
    with pytest.raises(RuntimeError), timer.phase("malloc"):
        raise RuntimeError("cuMemAlloc failed")
    with timer.phase("h2d"):
        pass
    assert spare == []
    other = PhaseTimer(Cuda, stream, spare)
    with other.phase("kernel"):
        pass
    assert set(map(id, stream.recorded[-2:])).isdisjoint(map(id, stream.recorded[:-2]))
    assert other.elapsed_ms() == {"kernel": 1.0} and len(spare) == 2


# -- which build Stream.multiply launches: the TMA build where the copy engine can read A and B ----------------


def _matrix(rows: int, cols: int, ld: int, ptr: int) -> DeviceMatrix:
    return DeviceMatrix("device", rows, cols, ld, ptr)


@given(
    a_off=st.integers(0, 15), b_off=st.integers(0, 15), a_pad=st.integers(0, 7), b_pad=st.integers(0, 7),
    k=st.integers(0, 70), n=st.integers(1, 70),
)  # fmt: skip
def test_the_tma_build_runs_exactly_where_both_operands_are_16_byte_aligned(
    a_off: int, b_off: int, a_pad: int, b_pad: int, k: int, n: int
) -> None:
    tma = registry.get("tc1").for_arch("sm_90")
    a = _matrix(33, k, k + a_pad, 0x7F0000000000 + 4 * a_off)
    b = _matrix(k, n, n + b_pad, 0x7F0000100000 + 4 * b_off)
    aligned = a_off % 4 == 0 and b_off % 4 == 0 and (k + a_pad) % 4 == 0 and (n + b_pad) % 4 == 0 and k >= 1
    chosen = launch_build(tma, a, b)
    assert chosen is (tma if aligned else tma.fallback)
    assert (chosen.tensor_maps is not None) == aligned


@pytest.mark.parametrize("kernel", ["tc1", "tc3", "fast", "tiled"])
def test_builds_without_tensor_maps_are_launched_as_they_are(kernel: str) -> None:
    spec = registry.get(kernel)
    assert launch_build(spec, _matrix(7, 5, 5, 4), _matrix(5, 3, 3, 4)) is spec
