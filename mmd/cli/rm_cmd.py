"""``mmd rm OUTPUT...``: remove your own outputs and their sidecars from a class's outbox."""

from __future__ import annotations

import argparse
import sys

from ..errors import ExitStatus
from .options import NotServing, add_config_option, ask_daemon, load_settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rm",
        help="remove your own outputs from a class's outbox",
        description="Remove outputs of yours (NAME.out, or either sidecar: the output, both sidecars and the "
        "input the service kept of that job go, and count no more toward your share of the disk) "
        "from your folder of a class's outbox, which only the service may write. Asks the daemon over its "
        "control_socket. Exit status: 0 removed, 1 one was refused (not yours, being written), 3 no daemon "
        "answers, 78 no control_socket is set.",
    )
    add_config_option(p, service=True)
    p.add_argument("names", nargs="+", metavar="OUTPUT", help="an output's or sidecar's name in your folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    status = ExitStatus.OK
    for name in args.names:
        try:
            answer = ask_daemon(settings, {"op": "rm", "name": name})
        except NotServing as exc:
            print(f"mmd rm: {exc}", file=sys.stderr)
            return ExitStatus.NOT_SERVING
        if answer.get("ok"):
            print(f"removed {', '.join(answer['removed'])}")
        else:
            print(f"mmd rm: {answer.get('error', 'refused')}", file=sys.stderr)
            status = ExitStatus.FAILED
    return status
