"""``mmd grade --service``: each timed case's window asked of the class's service, whose other GPU work waits it
out, and students' jobs served between windows (docs/grading.md, "On the class's service").

The grading runs in the grader's own processes as it does alone; only its timed windows are the service's
(:mod:`mmd.daemon.windows`): the service gives the device's workers no new job from the grant until the grader
releases the window, or its time (``grade_window_max_s``) is up.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..daemon.local import ask_window, release_window

#: What a window is asked for: as long as the service allows (it caps it at ``grade_window_max_s``); a case
#: releases its window as soon as its launches are done.
ASK_S = 60.0


@dataclass
class Held:
    """A timed case's window as it was held: how many of the GPU's processes are the service's own (its workers'
    CUDA contexts: no other's use), and whether it was held to its release (else the service's work may have run
    in it, and the case runs again)."""

    own_processes: int = 0
    kept: bool = True


def alone() -> contextlib.AbstractContextManager[Held]:
    """A window with no service to ask: the grading's own processes are all the GPU should list."""
    return contextlib.nullcontext(Held())


class Refused(Exception):
    """The service refused a window (not a grader, no worker on the device): its reason."""


class ServiceWindows:
    """Windows on ``device`` asked of the daemon listening on ``path``: ``with windows() as held: ...``."""

    def __init__(self, path: Path, device: int) -> None:
        self.path = path
        self.device = device

    def check(self) -> None:
        """One window asked and released before any grading: Refused where the service refuses it, OSError where no
        daemon answers (ValueError: an answer that is no JSON)."""
        sock, answer = self._asked()
        if sock is None:
            raise Refused(str(answer.get("error", "refused")))
        release_window(sock)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[Held]:
        """A window held while the block runs. A service gone or refusing now (its grading began with a window
        granted) yields one not kept: the case is disturbed, as it is by any work the grading cannot rule out."""
        sock: socket.socket | None = None
        answer: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            sock, answer = self._asked()
        if sock is None:
            yield Held(kept=False)
            return
        held = Held(int(answer.get("gpu_processes", 0)))
        try:
            yield held
        finally:
            released = release_window(sock)
            held.kept = released is not None and released.get("expired") is False

    def _asked(self) -> tuple[socket.socket | None, dict[str, Any]]:
        """A window granted, asked again while the service says to (its device's workers were busy)."""
        while True:
            sock, answer = ask_window(self.path, self.device, ASK_S)
            if sock is not None or answer.get("again") is not True:
                return sock, answer
