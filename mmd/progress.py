"""Progress on a terminal: rich's bar, the CLI's one progress library (``mmd bench``, ``mmd check``,
``mmd run`` of a large input, ``mmd gen`` of a large size, ``mmd kernels --build``).

A bar is drawn only where the stream is a terminal: a script, a pipe or a
log file gets no control sequences and no extra lines. It is kept to the
terminal's width and is transient: it leaves nothing behind once it stops.
rich is imported only when a bar is drawn.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TextIO


def on_terminal(stream: TextIO | None = None, *, quiet: bool = False) -> bool:
    """Whether a bar is drawn on ``stream`` (stderr by default): it is a terminal and not ``--quiet``."""
    return not quiet and (stream if stream is not None else sys.stderr).isatty()


def bar(*columns: Any, stream: TextIO | None = None, width: int | None = None) -> Any:
    """A started-on-enter ``rich.progress.Progress`` on ``stream`` (stderr by default), transient, of
    ``columns`` (rich's default when none); ``width``: the terminal's columns where the stream cannot say."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(file=stream if stream is not None else sys.stderr, force_terminal=True, width=width)
    return Progress(*columns, console=console, transient=True)


#: A phase's bar at 80 columns: its title (the rest cut off) and bar leave the phase's name and a detail
#: ("emit and write: 119 MB") room.
TITLE_WIDTH = 24
BAR_WIDTH = 16


def _cut(title: str) -> str:
    """``title`` within :data:`TITLE_WIDTH`, an ellipsis where it was cut."""
    return title if len(title) <= TITLE_WIDTH else title[: TITLE_WIDTH - 1] + "…"


def _counting(title: str, total: int, stream: TextIO | None, width: int | None) -> tuple[Any, Any]:
    """A started bar of ``title`` that counts to ``total`` and shows its task's description; and that task."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    columns = (TextColumn(title), BarColumn(BAR_WIDTH), MofNCompleteColumn(), TimeElapsedColumn())
    started = bar(*columns, TextColumn("{task.description}"), stream=stream, width=width)
    started.start()
    return started, started.add_task("", total=total)


class Count:
    """Things done one by one, out of ``total``, on a terminal: a bar of ``title`` that counts them and names
    the last one done. With ``shown`` False every call does nothing. :meth:`advance` may be called from
    several threads (rich's progress holds a lock)."""

    def __init__(
        self, title: str, total: int, *, shown: bool, stream: TextIO | None = None, width: int | None = None
    ) -> None:
        self.title = _cut(title)
        self.total = total
        self.shown = shown
        self.stream = stream
        self.width = width
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Count:
        if self.shown:
            self._bar, self._task = _counting(self.title, self.total, self.stream, self.width)
        return self

    def advance(self, done: str = "") -> None:
        """One more is done (``done`` names it)."""
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=done, refresh=True)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class Steps:
    """A command's phases on a terminal: one bar that advances at each phase and names the one in hand.

    ``steps``: each phase's name and what the bar calls it. With ``shown``
    False (not a terminal, ``--quiet``, a small job) every call does nothing.
    """

    def __init__(
        self,
        title: str,
        steps: Mapping[str, str],
        *,
        shown: bool,
        stream: TextIO | None = None,
        width: int | None = None,
    ) -> None:
        self.title = _cut(title)
        self.steps = tuple(steps)
        self.labels = dict(steps)
        self.shown = shown
        self.stream = stream
        self.width = width
        self._bar: Any = None
        self._task: Any = None
        self._step = ""

    def __enter__(self) -> Steps:
        if self.shown:
            self._bar, self._task = _counting(self.title, len(self.steps), self.stream, self.width)
        return self

    def step(self, name: str) -> None:
        """Phase ``name`` begins: the phases before it are done."""
        if name not in self.steps:
            return  # a phase this display does not count (the caller's own, or a backend's)
        self._step = self.labels[name]
        if self._bar is not None:
            # drawn now, not at the bar's next refresh: a phase may end before it
            self._bar.update(self._task, completed=self.steps.index(name), description=self._step, refresh=True)

    def note(self, text: str) -> None:
        """A detail of the phase in hand (bytes written so far ...)."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self._step}: {text}")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=len(self.steps))
            self._bar.stop()
            self._bar = None
