"""``mmd cancel JOB|FILE``: stop one of your jobs, queued or running (the daemon's control socket)."""

from __future__ import annotations

import argparse
import re
import sys

from ..errors import ExitStatus
from .options import NotServing, add_config_option, ask_daemon, load_settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cancel",
        help="cancel one of your jobs, queued or running",
        description="Cancel one of your jobs: a queued file is taken out of the inbox unrun; a running job is "
        "stopped and gets an error sidecar of kind cancelled. Asks the daemon over its control_socket, which "
        "answers each user about their own jobs only. Exit status: 0 cancelled, 1 refused (not yours, "
        "finished already), 3 no daemon answers, 78 no control_socket is set.",
    )
    add_config_option(p, service=True)
    p.add_argument("job", metavar="JOB|FILE", help="a job id (12 hex digits, from mmd status) or a file's name")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    key = "job" if re.fullmatch(r"[0-9a-f]{12}", args.job) else "file"
    try:
        answer = ask_daemon(settings, {"op": "cancel", key: args.job})
    except NotServing as exc:
        print(f"mmd cancel: {exc}", file=sys.stderr)
        return ExitStatus.NOT_SERVING
    if not answer.get("ok"):
        print(f"mmd cancel: {answer.get('error', 'refused')}", file=sys.stderr)
        return ExitStatus.FAILED
    job = f" (job {answer['job']})" if answer.get("job") else ""
    print(f"cancelled {answer['cancelled']}{job}, {answer['was']}")
    return ExitStatus.OK
