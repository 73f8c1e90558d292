"""``mmd submit --slurm DIR``: a folder of job files as one Slurm job array (see docs/cluster.md)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .common import options_later

if TYPE_CHECKING:
    from .. import slurm


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "submit",
        help="write (and submit) a Slurm job array: one `mmd run` per file of a folder",
        description=(
            "Write an sbatch --array script whose task i runs `mmd run` on the i-th job file of DIR "
            "(the inbox's rules: hidden, *.tmp, *.part, *~ and sub-folders are not jobs), writing "
            "OUTBOX/<stem>.out and its sidecar. With --submit, run sbatch and print the job id."
        ),
    )
    options_later(p, _add_options)
    p.set_defaults(func=run)


def _add_options(p: argparse.ArgumentParser) -> None:
    from .. import config

    p.add_argument("--slurm", type=Path, required=True, metavar="DIR", help="the folder of job files")
    p.add_argument("--outbox", type=Path, default=Path("outbox"), help="where results go (default: %(default)s)")
    p.add_argument("--config", type=Path, help="config file every task reads (default: the tasks' own)")
    p.add_argument(
        "--backend",
        choices=config.CHOICES["backend"],
        default="cuda",
        help="backend of every task (default: %(default)s, so a node without a usable GPU fails loudly); "
        "like --kernel, --tile and --memory it is the batch's default, which a file's name settings override",
    )
    p.add_argument("--kernel", help="kernel name (see `mmd kernels`)")
    p.add_argument("--tile", type=int, help="tile size T")
    p.add_argument("--memory", choices=config.CHOICES["memory"], help="device memory mode")
    p.add_argument("--job-name", default="mmd", help="Slurm job name (default: %(default)s)")
    p.add_argument("--partition", help="Slurm partition")
    p.add_argument("--account", help="Slurm account")
    p.add_argument("--time", metavar="HH:MM:SS", help="time limit of each task")
    p.add_argument("--max-parallel", type=int, metavar="N", help="at most N tasks at once (the array's %%N)")
    p.add_argument(
        "--gres", default="gpu:1", help="generic resources per task (default: %(default)s; 'none' asks for no GPU)"
    )
    p.add_argument("--mmd", metavar="CMD", help="how a node starts mmd (default: this Python, -m mmd: %(default)s)")
    p.add_argument(
        "--script-out",
        type=Path,
        metavar="FILE",
        help="the script's path; manifest, outputs list and logs/ go beside it "
        "(default: OUTBOX/slurm/<timestamp>/job.sbatch)",
    )
    p.add_argument("--submit", action="store_true", help="run sbatch on the script and print the job id")


def _options(args: argparse.Namespace) -> slurm.ArrayOptions:
    from .. import slurm  # only for this command

    settings = [("backend", args.backend)]
    for key in ("kernel", "tile", "memory"):
        value = getattr(args, key)
        if value is not None:
            settings.append((key, str(value)))
    extra = {}
    if args.mmd:
        extra["mmd"] = tuple(shlex.split(args.mmd))
    return slurm.ArrayOptions(
        job_name=args.job_name,
        gres=None if args.gres in ("", "none") else args.gres,
        time=args.time,
        partition=args.partition,
        account=args.account,
        max_parallel=args.max_parallel,
        settings=tuple(settings),
        config=args.config.resolve() if args.config is not None else None,
        **extra,
    )


def run(args: argparse.Namespace) -> int:
    from .. import slurm  # only for this command

    plan, listing = slurm.make_plan(args.slurm, args.outbox, _options(args), args.script_out)
    for name, why in listing.skipped.items():
        print(f"mmd submit: skipped {name!r}: {why}", file=sys.stderr)
    n = len(plan.tasks)
    if n > slurm.DEFAULT_MAX_ARRAY_SIZE:
        print(
            f"mmd submit: {n} tasks; Slurm's default MaxArraySize is {slurm.DEFAULT_MAX_ARRAY_SIZE} "
            "(`scontrol show config | grep MaxArraySize`); split the folder if sbatch refuses",
            file=sys.stderr,
        )
    script = slurm.write(plan)
    print(f"{script}  ({n} task{'s' if n != 1 else ''}; results in {plan.outbox}, logs in {plan.logs})")
    if not args.submit:
        print(f"submit with: sbatch {shlex.quote(str(script))}")
        return 0
    job = slurm.submit(script)
    print(f"submitted job array {job}: squeue -j {job}; sacct -j {job}")
    return 0
