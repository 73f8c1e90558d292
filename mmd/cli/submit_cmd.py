"""``mmd submit --slurm DIR``: a folder of job files as one Slurm job array (see docs/cluster.md)."""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UnreadableError
from . import paths
from .options import options_later

if TYPE_CHECKING:
    from .. import slurm


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "submit",
        help="write (and submit) a Slurm job array: one `mmd run` per file of a folder",
        description=(
            "Write an sbatch --array script whose task i runs `mmd run` on the i-th job file of DIR "
            "(the inbox's rules: hidden, *.tmp, *.part, *~ and sub-folders are not jobs), writing "
            "OUTBOX/<stem>.out and its sidecar. With --submit, run sbatch and print the job id; "
            "with --status JOBID, show each task's Slurm state and mmd's verdict. "
            "Exit status of --status: 0 when no task failed (some may still be pending), 1 otherwise."
        ),
    )
    options_later(p, _add_options)
    p.set_defaults(func=run)


def _add_options(p: argparse.ArgumentParser) -> None:
    from .. import config, slurm

    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--slurm", type=Path, metavar="DIR", help="the folder of job files")
    what.add_argument(
        "--status", metavar="JOBID", help="a submitted array's outcome: per task, Slurm's state and mmd's verdict"
    )
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
    p.add_argument(
        "--kernel-file",
        type=Path,
        metavar="K.cu",
        help="every task runs the __global__ kernel of this .cu file (docs/kernels.md); it is copied beside the "
        "script, and the copy run",
    )
    p.add_argument("--tile", type=int, help="tile size T")
    p.add_argument("--memory", choices=config.CHOICES["memory"], help="device memory mode")
    p.add_argument("--job-name", default="mmd", help="Slurm job name (default: %(default)s)")
    for option in slurm.PASSED_OPTIONS:
        p.add_argument(f"--{option.name}", metavar=option.metavar, help=option.help)
    p.add_argument("--max-parallel", type=int, metavar="N", help="at most N tasks at once (the array's %%N)")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument(
        "--gres", help="generic resources per task (default: gpu:1; 'none' asks for no GPU, e.g. a CPU partition)"
    )
    gpu.add_argument("--gpus", type=int, metavar="N", help="ask for GPUs with --gpus=N instead of --gres")
    p.add_argument(
        "--mmd",
        default="mmd",
        metavar="CMD",
        help="how a node starts mmd, written into the script (default: %(default)s, on the nodes' PATH)",
    )
    p.add_argument(
        "--max-array-size",
        type=int,
        metavar="N",
        help="tasks per array (default: the cluster's MaxArraySize with --submit, else 1001)",
    )
    p.add_argument(
        "--redo", action="store_true", help="submit job files an earlier submission into OUTBOX finished, too"
    )
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
    gres = None if args.gpus is not None or args.gres in ("", "none") else (args.gres or "gpu:1")
    return slurm.ArrayOptions(
        job_name=args.job_name,
        gres=gres,
        gpus=args.gpus,
        mmd=tuple(shlex.split(args.mmd)),
        passed=tuple((o.name, value) for o in slurm.PASSED_OPTIONS if (value := getattr(args, o.dest)) is not None),
        max_parallel=args.max_parallel,
        settings=tuple(settings),
        config=args.config.resolve() if args.config is not None else None,
        kernel_file=args.kernel_file,
    )


def run(args: argparse.Namespace) -> int:
    from .. import slurm  # only for this command

    if args.status is not None:
        return _status(args)
    options = _options(args)
    if args.kernel_file is not None:
        try:
            paths.input_file(args.kernel_file)
        except UnreadableError as exc:
            raise UnreadableError(f"--kernel-file {exc.reason}") from None
    if args.submit and shutil.which("sbatch") is None:  # before anything is written
        raise slurm.SubmitError(
            "sbatch not found on PATH: run this on a Slurm login node, or leave out --submit and run the sbatch "
            "command it prints there"
        )
    done = {} if args.redo else slurm.finished_before(args.outbox)
    plan, listing = slurm.make_plan(args.slurm, args.outbox, options, args.script_out, done)
    for name, why in listing.skipped.items():
        print(f"mmd submit: skipped {name!r}: {why}", file=sys.stderr)
    n = len(plan.tasks)
    if n == 0:
        print(f"nothing to submit: every job file in {args.slurm} is finished (--redo runs them again)")
        return 0
    max_size = args.max_array_size or (slurm.max_array_size() if args.submit else slurm.DEFAULT_MAX_ARRAY_SIZE)
    written = slurm.write(plan)
    plan = written.plan  # its script in the folder made for it
    script = plan.script
    if shutil.which(options.mmd[0]) is None:  # a warning only: the nodes' PATH is what counts
        print(
            f"mmd submit: {options.mmd[0]!r} is not a command here; the nodes must have it (or give --mmd)",
            file=sys.stderr,
        )
    where = f"{script}  ({n} task{'s' if n != 1 else ''}; results in {plan.outbox}, logs in {plan.logs})"
    if not args.submit:
        print(where)
        for offset, count in slurm.chunks(n, max_size):
            argv = slurm.sbatch_argv(script, n, offset, count, plan.options, None)[1:]
            print(f"submit with: sbatch {shlex.join(argv)}")
        return 0
    arrays = slurm.submit(written, max_size)
    print(where)  # once it is there to stay: a refused submission leaves no script
    jobs = ", ".join(a.job for a in arrays)
    print(
        f"submitted job array{'s' if len(arrays) > 1 else ''} {jobs}: squeue -j {jobs.replace(', ', ',')}; "
        f"mmd submit --status {arrays[0].job} --outbox {shlex.quote(str(plan.outbox))}"
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    from .. import slurm
    from ..spool import shown

    script, arrays = slurm.find_submission(args.outbox, args.status)
    tasks = slurm.outcomes(script, arrays, slurm.slurm_states([a.job for a in arrays]))
    print(f"{script}: {len(tasks)} task{'s' if len(tasks) != 1 else ''} in array(s) {', '.join(a.job for a in arrays)}")
    for t in tasks:
        if t.slurm is None:
            state = "unknown to Slurm now (finished more than MinJobAge ago; no accounting)"
        else:
            code = "" if t.slurm.exit_code is None else f" exit {t.slurm.exit_code}"
            state = f"{t.slurm.state}{code}" + (f" ({t.slurm.reason})" if t.slurm.reason not in ("None", "") else "")
        print(f"{t.job}\t{state}\tmmd: {t.verdict}\t{shown(t.input.name)} -> {shown(t.output.name)}")
    missing = [t for t in tasks if t.verdict == "missing" and t.failed]
    failed = [t for t in tasks if t.failed]
    counts = {v: sum(t.verdict == v for t in tasks) for v in ("ok", "refused", "missing")}
    print(", ".join(f"{k} {v}" for k, v in counts.items()) + f"; failed {len(failed)}")
    for t in missing:
        print(f"missing output: {t.output}", file=sys.stderr)
    return 1 if failed else 0
