"""Structured logs with structlog: one event per line, JSON off a terminal, readable on one.

Per-job context (job id, file name) is bound on the logger in the thread that
runs the job; contextvars do not cross threads, so nothing relies on them.

structlog is imported, and set up as :func:`configure` said, when the first
line is logged: importing it (it imports rich for its tracebacks) costs about
as much as numpy's import, which a one-shot command that logs nothing would
pay for nothing (``python -X importtime -m mmd run IN``).

Under systemd (``JOURNAL_STREAM`` names the stream stderr is), each line
starts with its syslog priority, ``<3>`` for errors, ``<4>`` warnings,
``<6>`` info, ``<7>`` debug: journald strips the prefix and files the line at
that priority, so ``journalctl -p err -u mmd`` shows the errors. The
structured fields stay in the line.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any, TextIO

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
#: syslog priorities (sd-daemon(3)'s SD_ERR ... SD_DEBUG) by structlog level name.
PRIORITIES = {"critical": 2, "exception": 3, "error": 3, "warning": 4, "warn": 4, "info": 6, "debug": 7}


def journal_stream(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``stream`` is the journal: ``JOURNAL_STREAM`` (``<dev>:<inode>``) names its file descriptor."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    try:
        info = os.fstat(stream.fileno())
        return (info.st_dev, info.st_ino) == (int(dev), int(ino))
    except (ValueError, OSError, io.UnsupportedOperation):
        return False


def _with_priority(renderer: Any) -> Any:
    """Render the event, then put its syslog priority in front (``<6>{...}``)."""

    def render(logger: Any, method: str, event: dict[str, Any]) -> str:
        return f"<{PRIORITIES.get(method, 6)}>{renderer(logger, method, event)}"

    return render


class _StderrLogger:
    """Writes each line to whatever ``sys.stderr`` is at that moment (tests swap it)."""

    def msg(self, message: str) -> None:
        # One write per line: the daemon's processes share stderr, and print()'s separate write of the
        # newline (stderr is unbuffered under PYTHONUNBUFFERED) let another process's line in between.
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


#: What :func:`configure` was last asked, not applied yet (None: nothing pending).
_pending: tuple[str, str, TextIO | None, Mapping[str, str]] | None = None
_lock = threading.Lock()
#: The least level logged (:func:`configure`'s): a line below it imports nothing.
_least = logging.NOTSET


def configure(
    fmt: str = "auto", level: str = "info", stream: TextIO | None = None, environ: Mapping[str, str] | None = None
) -> None:
    """Set up structlog for the process (as the next line is logged): ``fmt`` is auto, json or console.

    Without ``stream`` lines go to the current ``sys.stderr``, looked up at
    each write. When that is the journal, lines carry their priority. The
    console's lines are coloured on a terminal, unless ``NO_COLOR`` is set
    and not empty (https://no-color.org).
    """
    global _pending, _least
    if level not in _LEVELS:
        raise ValueError(f"unknown log level {level!r}")
    with _lock:
        _pending = (fmt, level, stream, os.environ if environ is None else environ)
        _least = _LEVELS[level]


def _structlog() -> Any:
    """structlog, set up as :func:`configure` last said."""
    global _pending
    import structlog

    if _pending is not None:
        with _lock:
            if _pending is not None:
                _apply(structlog, *_pending)
                _pending = None
    return structlog


def ready() -> threading.Thread:
    """Import structlog and apply :func:`configure`'s settings on a thread of its own from now, rather than at the
    first line (which waits for that thread where it has not ended): for a process that will soon log a line
    that is waited for (the daemon's "serving", while its first worker starts)."""
    thread = threading.Thread(target=_structlog, name="mmd-logs-ready", daemon=True)
    thread.start()
    return thread


def _apply(structlog: Any, fmt: str, level: str, stream: TextIO | None, environ: Mapping[str, str]) -> None:
    out = stream or sys.stderr
    tty = out.isatty()
    if fmt == "auto":
        fmt = "console" if tty else "json"
    colors = tty and not environ.get("NO_COLOR")
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=colors)
    )
    if journal_stream(out, environ):
        renderer = _with_priority(renderer)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=(structlog.PrintLoggerFactory(file=stream) if stream else lambda *_: _StderrLogger()),
        cache_logger_on_first_use=False,
    )


class Logger:
    """mmd's logger: ``bound`` context on every line; structlog's logger is made at the first line."""

    __slots__ = ("_bound", "_made")

    def __init__(self, bound: dict[str, Any]) -> None:
        self._bound = bound
        self._made: Any = None

    def _logger(self) -> Any:
        structlog = _structlog()
        if self._made is None:
            self._made = structlog.get_logger("mmd").bind(**self._bound)
        return self._made

    def bind(self, **more: Any) -> Logger:
        return Logger({**self._bound, **more})

    def debug(self, event: str, **kw: Any) -> None:
        if _least <= logging.DEBUG:
            self._logger().debug(event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        if _least <= logging.INFO:
            self._logger().info(event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        if _least <= logging.WARNING:
            self._logger().warning(event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._logger().error(event, **kw)

    def exception(self, event: str, **kw: Any) -> None:
        self._logger().exception(event, **kw)


def get_logger(**bound: Any) -> Logger:
    """A logger with ``bound`` context on every line."""
    return Logger(bound)
