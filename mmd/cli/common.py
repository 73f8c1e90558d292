"""Options shared by several sub-commands, and turning them into settings."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import config, logs


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """--config, --backend, --kernel, --tile, --memory: flags override the config file."""
    parser.add_argument("--config", type=Path, help="config file (default: $MMD_CONFIG or config/mmd.yaml)")
    parser.add_argument("--backend", choices=config.CHOICES["backend"], help="where to multiply (default: auto)")
    parser.add_argument("--kernel", help="kernel name (see `mmd kernels`)")
    parser.add_argument("--tile", type=int, help="tile size T: T×T threads per block")
    parser.add_argument("--memory", choices=config.CHOICES["memory"], help="device memory mode")
    parser.add_argument("--device", type=int, help="CUDA device ordinal")


def settings_from(args: argparse.Namespace, **extra: object) -> config.Settings:
    """Settings with defaults < config file < environment < these flags."""
    flags = {
        name: getattr(args, name, None) for name in ("backend", "kernel", "tile", "memory", "device")
    }
    flags.update(extra)
    settings = config.load(getattr(args, "config", None), flags)
    logs.configure(settings.log_format, settings.log_level)
    return settings
