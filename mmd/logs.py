"""Structured logs with structlog: one event per line, JSON off a terminal, readable on one.

Per-job context (job id, file name) is bound on the logger in the thread that
runs the job; contextvars do not cross threads, so nothing relies on them.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class _StderrLogger:
    """Writes each line to whatever ``sys.stderr`` is at that moment (tests swap it)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def configure(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog for the process: ``fmt`` is auto, json or console.

    Without ``stream`` lines go to the current ``sys.stderr``, looked up at
    each write.
    """
    tty = (stream or sys.stderr).isatty()
    if fmt == "auto":
        fmt = "console" if tty else "json"
    renderer: Any = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=tty)
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
