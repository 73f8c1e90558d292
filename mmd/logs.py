"""Structured logs with structlog: one event per line, JSON off a terminal, readable on one.

Per-job context (job id, file name) is bound on the logger in the thread that
runs the job; contextvars do not cross threads, so nothing relies on them.

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
from collections.abc import Mapping
from typing import Any, TextIO

import structlog

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


def configure(
    fmt: str = "auto", level: str = "info", stream: TextIO | None = None, environ: Mapping[str, str] | None = None
) -> None:
    """Set up structlog for the process: ``fmt`` is auto, json or console.

    Without ``stream`` lines go to the current ``sys.stderr``, looked up at
    each write. When that is the journal, lines carry their priority. The
    console's lines are coloured on a terminal, unless ``NO_COLOR`` is set
    and not empty (https://no-color.org).
    """
    environ = os.environ if environ is None else environ
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


def get_logger(**bound: Any) -> Any:
    """A logger with ``bound`` context on every line."""
    return structlog.get_logger("mmd").bind(**bound)
