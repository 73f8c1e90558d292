"""The main loop's side of graders' windows (mmd/daemon/windows.py), pure: the time is given, the workers stand-ins.

tests/test_grade_service.py holds the same rules in a real daemon over its real socket.
"""

from __future__ import annotations

import concurrent.futures
import os
from dataclasses import dataclass, field
from typing import Any

from mmd.config import Settings
from mmd.daemon.messages import Asked, Ready
from mmd.daemon.scheduler import Load, Scheduler
from mmd.daemon.windows import WAIT_S, Windows
from mmd.submitters import login_of

ME = os.geteuid()


@dataclass
class _Control:
    last_beat: float = 1.0


@dataclass
class _Worker:
    """A worker as the windows read it: its device, whether it is ready (and its backend), its jobs in hand."""

    index: int
    device: int
    ready: Ready | None = field(default_factory=lambda: Ready("cuda", "GPU"))
    in_hand: dict[int, Any] = field(default_factory=dict)
    control: _Control = field(default_factory=_Control)


@dataclass
class _Pool:
    handles: list[_Worker]


class _Log:
    def debug(self, *args: Any, **kw: Any) -> None:
        pass


def windows(*devices: int, grader: bool = True, **settings: Any) -> tuple[Windows, Scheduler, _Pool]:
    scheduler = Scheduler(100)
    pool = _Pool([_Worker(i, d) for i, d in enumerate(devices)])
    made = Windows(scheduler, pool, lambda uid: grader, lambda: Settings(**settings), _Log())
    return made, scheduler, pool


def ask(w: Windows, now: float, token: str = "t1", device: int = 0, seconds: float = 60.0) -> Asked:
    asked = Asked("window", ME, {"op": "window", "device": device, "seconds": seconds, "window": token},
                  concurrent.futures.Future())  # fmt: skip
    w.asked(asked, now)
    return asked


def release(w: Windows, now: float, token: str = "t1") -> dict[str, Any]:
    asked = Asked("release", ME, {"op": "release", "window": token}, concurrent.futures.Future())
    w.asked(asked, now)
    return asked.reply.result(timeout=0)


def loads(pool: _Pool) -> list[Load]:
    return [Load(h.index, len(h.in_hand)) for h in pool.handles]


def test_a_window_is_granted_once_its_devices_workers_are_idle_and_holds_them_until_released() -> None:
    w, _, pool = windows(0, 0, 1)
    pool.handles[1].in_hand[1] = "a job"
    asked = ask(w, 0.0)
    w.tend(0.1)
    assert not asked.reply.done()
    assert [load.worker for load in w.free(loads(pool), 0.1)] == [2]  # device 0's workers drain, device 1 serves
    pool.handles[1].in_hand.clear()
    pool.handles[0].control.last_beat = 0.0  # off its loop: warming up
    w.tend(0.2)
    assert not asked.reply.done()
    pool.handles[0].control.last_beat = 0.3
    w.tend(0.3)
    assert asked.reply.result(timeout=0) == {"ok": True, "granted": True, "device": 0, "seconds": 2.0,
                                             "gpu_processes": 2}  # fmt: skip
    assert [load.worker for load in w.free(loads(pool), 0.5)] == [2]
    assert release(w, 1.3) == {"ok": True, "released": True, "expired": False, "held_s": 1.0}
    assert [load.worker for load in w.free(loads(pool), 1.3)] == [0, 1, 2]


def test_a_window_ends_at_its_time_and_its_late_release_says_so() -> None:
    w, scheduler, pool = windows(0, grade_window_max_s=0.5)
    ask(w, 0.0, seconds=60.0)
    w.tend(0.0)
    assert w.due_in(0.1) == 0.4
    w.tend(0.5)
    assert w.free(loads(pool), 0.5) == loads(pool)
    assert scheduler.usage.of(login_of(ME), 0.5) == 0.5  # the grader's share
    assert release(w, 3.0) == {"ok": True, "released": True, "expired": True, "held_s": 0.5}
    assert release(w, 3.0)["ok"] is False  # nothing left of it


def test_a_window_not_granted_in_time_is_answered_to_ask_again() -> None:
    w, _, pool = windows(0)
    pool.handles[0].in_hand[1] = "a long job"
    asked = ask(w, 0.0)
    w.tend(WAIT_S)
    answer = asked.reply.result(timeout=0)
    assert answer["ok"] is False and answer["again"] is True
    assert w.free(loads(pool), WAIT_S) == loads(pool)


def test_jobs_queued_before_a_window_or_of_those_who_used_less_go_first() -> None:
    w, scheduler, pool = windows(0)
    scheduler.charge("alice", 10.0, 0.0)
    scheduler.offer("early.txt", 10, "alice")
    asked = ask(w, 0.0)
    w.tend(0.0)
    assert not asked.reply.done() and w.free(loads(pool), 0.0) == loads(pool)  # hers arrived first
    ((_, early),) = scheduler.assign(loads(pool))
    scheduler.ended(early.job_id)  # it ran and ended
    scheduler.offer("late.txt", 10, "alice")  # after the window was asked, and she has used more than the grader
    assert w.free(loads(pool), 0.0) == []
    w.tend(0.0)
    assert asked.reply.result(timeout=0)["granted"] is True
    scheduler.charge(login_of(ME), 20.0, 0.0)
    release(w, 0.0)
    scheduler.offer("bob.txt", 10, "bob")
    ask(w, 0.0, "t2")
    assert w.free(loads(pool), 0.0) == loads(pool)  # bob has used less than the grader now


def test_only_a_grader_gets_a_window_and_only_on_a_device_the_service_serves() -> None:
    w, _, _ = windows(0, grader=False)
    assert "graders" in ask(w, 0.0).reply.result(timeout=0)["error"]
    w, _, _ = windows(0, 0)
    assert "workers: 0" in ask(w, 0.0, device=1).reply.result(timeout=0)["error"]
    assert "seconds" in ask(w, 0.0, seconds=0).reply.result(timeout=0)["error"]
