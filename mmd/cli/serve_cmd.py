"""``mmd serve``: the daemon: watch the inbox, write results to the outbox."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from .options import add_job_options, options_later, settings_from

if TYPE_CHECKING:
    from .. import config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="watch the inbox and process every file dropped there",
        description="Serve the inbox: each complete file becomes a job whose output and sidecar go to the outbox. "
        "The job flags set the service's defaults; a file's name settings (NAME@kernel=aplus.txt) override them. "
        "SIGTERM/SIGINT finish the job in hand and exit; SIGHUP reloads the config. Exit status: 0 stopped, "
        "1 failed, 2 bad usage, 78 bad configuration (docs/operations.md).",
    )
    options_later(p, _options)
    p.set_defaults(func=run)


def _options(p: argparse.ArgumentParser) -> None:
    from .. import config

    add_job_options(p)
    p.add_argument("--inbox", type=Path, help="folder to watch (default: inbox)")
    p.add_argument("--outbox", type=Path, help="folder for outputs and sidecars (default: outbox)")
    p.add_argument(
        "--observer",
        choices=config.CHOICES["observer"],
        help="how to watch: inotify, polling (network filesystems) or auto",
    )
    p.add_argument("--once", action="store_true", help="process what is in the inbox, then exit")
    p.add_argument(
        "--create",
        action="store_const",
        const=True,
        help="make the inbox and outbox if they are missing (default: refuse to start: a typo is not a new folder)",
    )


def _settings(args: argparse.Namespace) -> config.Settings:
    return settings_from(args, inbox=args.inbox, outbox=args.outbox, observer=args.observer, create_folders=args.create)


def run(args: argparse.Namespace) -> int:
    # the workers' fork server, started first thing (mmd.cli), imports the pipeline while this process reads its
    # settings and imports the daemon
    settings = _settings(args)
    from ..daemon import Daemon  # the watchdog, metrics and workers: only for this command

    return Daemon(settings, reload=lambda: _settings(args)).serve(once=args.once)
