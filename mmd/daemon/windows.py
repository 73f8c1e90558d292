"""Graders' timed windows (``mmd grade --service``): a device's workers take no new job while a grader times
kernels on it, and the window's time counts toward the grader's fair share.

A grader asks on the control socket (:mod:`.local`: ``{"op": "window", "device": D, "seconds": S}``, graders
only: root, the service's own user and ``graders_group``). The main loop then gives device ``D``'s workers no
new job; once every one of them is idle it grants the window, answering how many of the service's worker
processes hold a CUDA context on ``D`` (the grader counts them among the GPU's processes as the service's, not
as another's). The window lasts until the grader releases it (``{"op": "release"}`` on the same connection, or
the connection closing), or ``S`` seconds capped by ``grade_window_max_s``, whichever comes first; a release
answers whether it had expired first (the service's work may then have run during it: the grader runs it
again).

Students' jobs are served between windows: a window waits while any job waits that arrived before it was
asked, or whose submitter has used less than the grader lately (:meth:`Scheduler.waiting_before`), and the
time each window holds a device is charged to the grader's share as a job's time is to its submitter's. Jobs
dropped during a window wait for its end; jobs on other devices' workers run on.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..submitters import login_of
from .messages import Asked
from .pool import WorkerPool
from .scheduler import Load, Scheduler

#: The control socket's ops a window is asked for and released with.
WINDOW_OPS = ("window", "release")
#: How long a window's request waits to be granted before it is answered to ask again (its device's workers have
#: a long job in hand): the request never outlives the control socket's wait for an answer.
WAIT_S = 5.0

Reply = concurrent.futures.Future[dict[str, Any]]


@dataclass(eq=False)
class Window:
    """One grader's window: asked, granted, then released (or over, its time up, until it is released)."""

    token: str
    uid: int
    login: str
    device: int
    seconds: float
    mark: int  # the scheduler's arrivals when it was asked: the jobs that arrived before go first
    asked: float  # monotonic
    reply: Reply
    granted: float | None = None
    over: float | None = None  # ended by its time (the device serves jobs again), not yet released


class Windows:
    """The windows asked for and held, on the main loop (no thread of its own, no clock: the time is given)."""

    def __init__(
        self,
        scheduler: Scheduler,
        workers: WorkerPool,
        grader: Callable[[int], bool],
        settings: Callable[[], Settings],
        log: Any,
    ) -> None:
        self.scheduler = scheduler
        self.workers = workers
        self.grader = grader
        self.settings = settings
        self.log = log
        self._asked: list[Window] = []  # not yet granted, in the order asked
        self._held: dict[str, Window] = {}  # granted (open, or over and not yet released), by token

    # -- asked on the control socket --
    def asked(self, hint: Asked, now: float) -> None:
        """A window's request (answered once granted) or its release (answered now)."""
        token = hint.request.get("window")
        if not isinstance(token, str):  # the socket names every window it carries; a request never does
            _answer(hint.reply, _no("a window is asked on a connection of its own"))
        elif hint.op == "release":
            _answer(hint.reply, self._release(token, now))
        else:
            refusal = self._refusal(hint)
            if refusal is not None:
                _answer(hint.reply, _no(refusal))
                return
            seconds = min(float(hint.request["seconds"]), self.settings().grade_window_max_s)
            self._asked.append(Window(token, hint.uid, login_of(hint.uid), hint.request["device"], seconds,
                                      self.scheduler.arrivals(), now, hint.reply))  # fmt: skip

    def _refusal(self, hint: Asked) -> str | None:
        if not self.grader(hint.uid):
            return "windows are for graders (graders_group), root and the service's own user"
        device, seconds = hint.request.get("device"), hint.request.get("seconds")
        devices = sorted({w.device for w in self.workers.handles})
        if not isinstance(device, int) or isinstance(device, bool) or device not in devices:
            return f"a window needs the device of one of the service's workers: {', '.join(map(str, devices))}"
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
            return "a window needs seconds, a positive number"
        return None

    def _release(self, token: str, now: float) -> dict[str, Any]:
        """End a window (granted or still asked for): its holder is done with it, or gone."""
        asked = next((w for w in self._asked if w.token == token), None)
        if asked is not None:
            self._asked.remove(asked)
            return {"ok": True, "released": True, "expired": False, "held_s": 0.0}
        window = self._held.pop(token, None)
        if window is None or window.granted is None:
            return _no("no window of yours is open here")
        expired = window.over is not None
        if not expired:
            self._end(window, now, "released")
        return {"ok": True, "released": True, "expired": expired,
                "held_s": round((window.over or now) - window.granted, 6)}  # fmt: skip

    def _end(self, window: Window, now: float, why: str) -> None:
        """The device serves jobs again (``why``: released, or its time up); the time it was held is the grader's."""
        assert window.granted is not None
        window.over = now
        self.scheduler.charge(window.login, now - window.granted, now)
        self.log.debug("grader's window over", grader=window.login, device_index=window.device, why=why,
                       held_s=round(now - window.granted, 6))  # fmt: skip

    # -- the main loop's turn --
    def free(self, loads: list[Load], now: float) -> list[Load]:
        """``loads`` less the workers of the devices held for a window: held while a window is open on one, and
        while one is asked for there with no job waiting that goes before it (its workers then drain)."""
        held = self._holding(now)
        if not held:
            return loads
        return [load for load in loads if self.workers.handles[load.worker].device not in held]

    def _holding(self, now: float) -> set[int]:
        held = {w.device for w in self._held.values() if w.over is None}
        for window in self._first_asked():
            if not self._behind(window, now):
                held.add(window.device)
        return held

    def _first_asked(self) -> list[Window]:
        """The first window asked for on each device (the others wait behind it)."""
        first: dict[int, Window] = {}
        for window in self._asked:
            first.setdefault(window.device, window)
        return list(first.values())

    def _behind(self, window: Window, now: float) -> bool:
        """Whether a waiting job goes before ``window`` (the grader's use, as the scheduler reckons it)."""
        return self.scheduler.waiting_before(window.mark, self.scheduler.usage.of(window.login, now), now)

    def tend(self, now: float) -> None:
        """Windows whose time is up ended; those asked too long ago answered to ask again; the first asked on a
        device granted once nothing goes before it and the device's workers are idle."""
        for window in self._held.values():
            if window.over is None and window.granted is not None and now >= window.granted + window.seconds:
                self._end(window, now, "time up")
        for window in [w for w in self._asked if now - w.asked >= WAIT_S or w.reply.done()]:
            self._asked.remove(window)
            _answer(window.reply, {"ok": False, "again": True,
                                   "error": f"device {window.device}'s workers are busy; ask again"})  # fmt: skip
        open_on = {w.device for w in self._held.values() if w.over is None}
        for window in self._first_asked():
            if window.device in open_on or self._behind(window, now) or not self._idle(window.device):
                continue
            self._asked.remove(window)
            window.granted = now
            self._held[window.token] = window
            processes = sum(1 for w in self.workers.handles if w.device == window.device and w.ready is not None
                            and w.ready.backend == "cuda")  # fmt: skip
            _answer(window.reply, {"ok": True, "granted": True, "device": window.device, "seconds": window.seconds,
                                   "gpu_processes": processes})  # fmt: skip
            self.log.debug("grader's window granted", grader=window.login, device_index=window.device,
                           seconds=window.seconds, waited_s=round(now - window.asked, 6))  # fmt: skip

    def _idle(self, device: int) -> bool:
        """Every worker of ``device`` is started, has no job in hand and is in its loop (not off it for its
        warm-up, which uses the GPU)."""
        return all(w.ready is not None and not w.in_hand and w.control.last_beat > 0
                   for w in self.workers.handles if w.device == device)  # fmt: skip

    def due_in(self, now: float) -> float | None:
        """Seconds until a window's time is up or a request has waited long enough (None: none is)."""
        dues = [w.granted + w.seconds - now for w in self._held.values() if w.over is None and w.granted is not None]
        dues += [w.asked + WAIT_S - now for w in self._asked]
        return max(0.0, min(dues)) if dues else None


def new_token() -> str:
    """A window's name on the main loop, given by the control socket (never the asker's)."""
    return uuid.uuid4().hex


def _answer(reply: Reply, answer: dict[str, Any]) -> None:
    if not reply.done():  # the asker may have given up waiting
        reply.set_result(answer)


def _no(reason: str) -> dict[str, Any]:
    return {"ok": False, "error": reason}
