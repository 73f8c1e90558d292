"""Options shared by several sub-commands, turning them into settings, and the exit statuses."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import config
from ..config import BACKENDS, JOB_FLAGS, MEMORY_MODES
from ..errors import ExitStatus

#: The exit statuses, by their meaning (mmd.errors.ExitStatus).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONFIG = ExitStatus.OK, ExitStatus.FAILED, ExitStatus.USAGE, ExitStatus.CONFIG


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """--config, --backend, --kernel, --tile, --memory, --device, -v."""
    parser.add_argument("--config", type=Path, help="config file (default: $MMD_CONFIG or config/mmd.yaml)")
    parser.add_argument("--backend", choices=BACKENDS, help="where to multiply (default: auto)")
    parser.add_argument("--kernel", help="kernel name (see `mmd kernels`)")
    parser.add_argument("--tile", type=int, help="tile size T: T×T threads per block")
    parser.add_argument("--memory", choices=MEMORY_MODES, help="device memory mode")
    parser.add_argument("--device", type=int, help="CUDA device ordinal")
    add_verbose(parser)


def add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="log each job's progress on stderr")


def job_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The job settings given as flags (None: not given)."""
    return {name: getattr(args, name, None) for name in JOB_FLAGS}


def settings_from(args: argparse.Namespace, quiet: bool = False, **extra: Any) -> config.Settings:
    """Settings with defaults < config file < environment < these flags (the job flags and ``extra``).

    One-shot commands (``quiet``) log errors only unless ``-v`` is given:
    their result, or their one-line refusal, is what they print, not a log.
    """
    settings = config.load(getattr(args, "config", None), {**job_flags(args), **extra})
    configure_logs(settings, quiet and not getattr(args, "verbose", False))
    return settings


def configure_logs(settings: config.Settings, quiet: bool) -> None:
    from .. import logs  # structlog: once a command runs

    logs.configure(settings.log_format, "error" if quiet else settings.log_level)
