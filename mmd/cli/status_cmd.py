"""``mmd status``: is a daemon serving the inbox, what is it doing, what did it do last."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ExitStatus, UsageError
from . import paths
from .options import NotServing, add_config_option, ask_daemon, load_settings

if TYPE_CHECKING:
    from ..config import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="show the daemon serving the inbox",
        description="Show whether a daemon serves the inbox, what it is doing and what it did last. A user who "
        "cannot read the daemon's state_dir (a class's student) asks its control_socket instead and is shown "
        "their own jobs (each queued one with its place in the queue, each running one with how long it has run) "
        "and the kernels they handed in; a grader is shown the counts (--json lists every job). Exit status: 0 a "
        "daemon serves the inbox, 3 none does, 1 the daemon refused the request (too many of yours at once), 2 bad "
        "usage or an inbox that is missing or not a folder.",
    )
    add_config_option(p, service=True)
    p.add_argument("--inbox", type=Path, help="inbox folder (default: from the config, else inbox)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.add_argument(
        "--metrics", action="store_true", help="print the daemon's Prometheus metrics (the metrics_file it writes)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import config  # only for this command

    settings = load_settings(args, inbox=args.inbox)
    if args.metrics:
        return print_metrics(settings)
    if settings.control_socket is not None and not os.access(settings.private_dir, os.R_OK | os.X_OK):
        try:
            answer = ask_daemon(settings, {"op": "status"})
        except NotServing as exc:
            print(f"mmd status: {exc}", file=sys.stderr)
            return ExitStatus.NOT_SERVING
        if not answer.get("ok"):  # too many of the user's own requests at once, or a daemon too busy to answer
            print(f"mmd status: {answer.get('error', 'refused')}", file=sys.stderr)
            return ExitStatus.FAILED
        print(json.dumps(answer, indent=1) if args.json else render_mine(answer))
        return ExitStatus.OK
    from ..daemon import status_of  # only for this command

    paths.folder(settings.inbox, "the inbox")
    status = status_of(settings.inbox, config.host_id_of(settings), settings.state_dir)
    if args.json:
        print(json.dumps(status, indent=1))
    else:
        print(render(status))
    return ExitStatus.OK if status["serving"] else ExitStatus.NOT_SERVING


def print_metrics(settings: Settings) -> int:
    """Print the metrics file: the config's ``metrics_file``, else the one the inbox's daemon names in its state."""
    from ..daemon.state import read_state  # only for this command

    path = settings.metrics_file
    if path is None:
        state = read_state(settings.private_dir) or {}
        path = Path(state["metrics_file"]) if state.get("metrics_file") else None
    if path is None:
        raise UsageError(
            f"no metrics_file: neither the config nor a daemon's state in {settings.private_dir} names one; give "
            "the daemon's config (--config FILE or MMD_METRICS_FILE) or --inbox of a daemon that writes metrics "
            "(docs/operations.md)"
        )
    try:
        sys.stdout.write(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror} (is the daemon running?)") from None
    return ExitStatus.OK


def render_mine(answer: dict[str, Any]) -> str:
    """The control socket's answer as a few lines for a terminal: a student's own jobs (each queued one with its
    place, each running one with how long it has run) and kernels; for a grader, who is answered every job, the
    counts only (``--json`` lists the jobs)."""
    jobs = answer.get("jobs", [])
    if answer.get("everyone"):
        states = Counter(job["state"] for job in jobs)
        return (f"mmd serves the class; you ({answer.get('you')}) see every job (mmd status --json lists them): "
                f"{states['running']} running, {states['starting']} handed to a worker, "
                f"{answer.get('queued_total', 0)} queued")  # fmt: skip
    lines = [f"mmd serves you ({answer.get('you')}): {len(jobs)} job(s) of yours, {answer.get('queued_total', 0)} "
             f"queued in all"]  # fmt: skip
    for job in jobs:
        ident = f" (job {job['job']})" if job.get("job") else ""
        if job["state"] == "running":
            phase = f", in {job['phase']}" if job.get("phase") else ""
            where = f"running for {job.get('running_s', 0):.1f} s{phase}"
        elif job["state"] == "queued":
            before = job["position"] - 1
            ahead = "1 job starts" if before == 1 else f"{before} jobs start"
            where = f"place {job['position']} in the queue ({ahead} before it)"
        else:
            where = "handed to a worker"
        lines.append(f"  {job['state']:8} {job['file']}{ident}: {where}")
    kernels = answer.get("kernels") or []
    if kernels:
        listed = ", ".join(
            f"{k['name']} (version {k['version'][:8]}, handed in {k['handed_in'][:16].replace('T', ' ')})"
            for k in kernels
        )
        more = answer.get("kernels_total", len(kernels)) - len(kernels)
        lines.append(f"your kernels: {listed}" + (f" and {more} more" if more > 0 else ""))
    used, most = answer.get("kernel_gpu_s"), answer.get("kernel_gpu_limit_s")
    if used or most is not None:
        of = f" of the {most:g} s you may use (student_kernel_gpu_s)" if most is not None else ""
        lines.append(f"your kernels have used {used or 0:.1f} s of GPU time{of}")
    return "\n".join(lines)


def render(status: dict[str, Any]) -> str:
    """The status as a few lines for a terminal."""
    state = status.get("state") or {}
    lines = []
    if status["serving"]:
        lines.append(
            f"serving {status['inbox']}: pid {status['pid']}, since {state.get('started', '?')}, "
            f"{state.get('observer', '?')} observer, backend {state.get('backend', '?')}"
        )
    else:
        last = f" (last daemon: pid {state['pid']}, {state.get('status')})" if state else ""
        lines.append(f"no daemon serves {status['inbox']}{last}")
    lines.append(
        f"waiting in the inbox: {status['waiting_in_inbox']}"
        + (f"; queued in the daemon: {state.get('queue', 0)}" if status["serving"] else "")
    )
    paused = state.get("paused") if status["serving"] else None
    if paused:
        lines.append(f"paused since {paused.get('since')} for {paused.get('seconds')} s: {paused.get('reason')}")
    held = status.get("held") or []
    if held:
        again = "tried again after each pause" if status["serving"] else "tried again when a daemon serves the inbox"
        lines.append(f"held in .work: {len(held)} (the outbox refused what they had to write; {again})")
        for job in held:
            host = f" on {job['host']}" if job.get("host") else ""
            lines.append(
                f"  {job['file']} (job {job['job']}{host}, held since {job['since']}, {job['holds']} times): "
                f"{job['reason']}"
            )
    if status["serving"] and state.get("backlog"):
        lines.append("queue full: more files wait in the inbox for the next rescan")
    workers = state.get("workers") or [] if status["serving"] else []
    if len(workers) > 1:
        for w in workers:
            job = w.get("current")
            doing = f"running {job['file']} (job {job['job']}, since {job['since']})" if job else "idle"
            if job and job.get("phase"):
                doing += f", in {job['phase']}"
            pid = f", pid {w['pid']}" if w.get("pid") else ""
            lines.append(
                f"  worker {w['index']}: device {w.get('device_index', w['index'])} ({w.get('device') or '?'}"
                f"{pid}): {doing}; {w.get('done', 0)} done"
            )
    else:
        current = state.get("current") if status["serving"] else None
        if current:
            lines.append(f"running: {current['file']} (job {current['job']}, since {current['since']})")
    done = state.get("done")
    if done:
        lines.append(f"done: {done['ok']} ok, {done['error']} refused")
    for host in status.get("hosts") or []:
        hstate = host.get("state") or {}
        done = hstate.get("done") or {}
        lines.append(
            f"host {host['host']}{' (this host)' if host['own'] else ''}: "
            f"{'serving, pid ' + str(host['pid']) if host['serving'] else 'not serving'}; "
            f"{done.get('ok', 0)} ok, {done.get('error', 0)} refused"
        )
    for job in state.get("recent", [])[:10]:
        took = f"{job['overall_ms']:.1f} ms" if job.get("overall_ms") is not None else ""
        lines.append(f"  {job['finished']}  {job['status']:5}  {job['file']}  -> {job.get('sidecar')}  {took}")
    return "\n".join(lines)
