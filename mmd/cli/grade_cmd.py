"""``mmd grade``: a class's kernel files graded as the course's instructor grades them (docs/grading.md)."""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, ExitStatus, UsageError
from .options import add_config_option, options_later

if TYPE_CHECKING:
    from ..grade.array import Request

EPILOG = """\
  mmd grade handin --tests tests/ --deadline 2025-03-14T23:59 --junit grades.xml --json grades.json --page page/
                                     handin/<student>/<kernel>.cu (and <kernel>.kernel.yaml)
  mmd grade /var/lib/mmd/kernels --store --tests tests/
                                     the service's store of handed-in kernels (state_dir/kernels)
  mmd grade handin --tests tests/ --slurm grading/ [--submit]
                                     a Slurm array of one task per student, each writing its part
  mmd grade --gather grading/ --junit grades.xml --page page/
                                     the parts, once the tasks are done, reported as above
  mmd grade /var/lib/mmd/kernels --store --tests tests/ --service
                                     on the class's box, its service serving students' jobs between the timed
                                     cases (a grader: graders_group)

Each kernel is compiled, run on every test of TESTS (x.txt, with x.out as its
expected output where there is one) at every tile of the course (4 to 64; a
tile no GPU launches is refused before launch, and recorded so), each product
judged as mmd check judges an output; then timed over the course's plan (each
size at tile 32, the largest at tiles 4 to 32), every timed launch on fresh
random inputs and its product checked, so that no kept or replayed product
passes. A hand-in is late by when the service received it (--store), or by its
files' ctime in a hand-in folder (not their mtime, which anyone can set).

exit status:
  0  every case of every kernel right
  1  a kernel refused, wrong, or not graded; no GPU; --service: the service refused a window
  2  usage, or a file that cannot be read
  3  --service: no daemon answers on the control_socket
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "grade",
        help="grade a class's kernel files: compile, check over the instructor's tests, time (no one can game it)",
        description=(
            "Grade every student's kernels in KERNELS (a folder per student, or the service's store with --store) "
            "against the inputs (and expected outputs) in TESTS, and time them over the course's plan; report as "
            "mmd check does (table, --json, --junit) and as the class page (--page)."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options_later(p, _add_options)
    p.set_defaults(func=run)


def _add_options(p: argparse.ArgumentParser) -> None:
    from .. import slurm
    from ..bench.plan import COURSE_SIZES, COURSE_TILES

    p.add_argument("kernels", type=Path, nargs="?", metavar="KERNELS", help="a folder of students' folders")
    p.add_argument("--tests", type=Path, metavar="TESTS", help="the instructor's inputs (x.txt) and expected outputs")
    p.add_argument("--store", action="store_true", help="KERNELS is the service's store (state_dir/kernels)")
    p.add_argument(
        "--deadline",
        metavar="TIME",
        help="ISO 8601 (local time without an offset): hand-ins that arrived later are graded and marked late",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON (mmd check's, and the grade)")
    p.add_argument("--junit", type=Path, metavar="FILE", help="write the results as JUnit XML")
    p.add_argument("--page", type=Path, metavar="DIR", help="write the class report page: DIR/index.html and a page "
                   "per student in DIR/students/")  # fmt: skip
    p.add_argument("--tiles", nargs="+", type=int, metavar="T", default=list(COURSE_TILES),
                   help="the tiles every test runs at (default: the course's, %(default)s)")  # fmt: skip
    p.add_argument("--sizes", nargs="*", type=int, metavar="N", default=list(COURSE_SIZES),
                   help="timed sizes: each at tile 32, the largest at tiles 4 to 32 (default: the course's, "
                   "%(default)s; none: no timing)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="timed launches at least per case, then more until the kernel median's noise is under "
                   "--noise or 0.2 s of kernel time is measured (default: 3)")  # fmt: skip
    p.add_argument("--noise", type=float, default=2.0, metavar="PCT",
                   help="the kernel median's noise (half its 95%% confidence interval) a case repeats to get "
                   "under (default: 2)")  # fmt: skip
    p.add_argument("--max-repeats", type=int, default=10, metavar="N",
                   help="timed launches at most per case (default: 10)")  # fmt: skip
    p.add_argument("--workers", type=int, metavar="N", help="kernels compiled and checked for correctness at once "
                   "(default: min(8, CPU cores)); the timed cases run one kernel at a time, whatever N is")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no line per kernel graded on stderr")
    add_config_option(p)
    p.add_argument("--service", action="store_true",
                   help="grade beside the class's service (its settings, /etc/mmd/mmd.yaml too): each timed case "
                   "in a window the service's GPU work waits out, its students' jobs served between windows; a "
                   "grader's (graders_group)")  # fmt: skip
    where = p.add_mutually_exclusive_group()
    where.add_argument("--slurm", type=Path, metavar="DIR",
                       help="write a Slurm array of one task per student into the new folder DIR")  # fmt: skip
    where.add_argument("--gather", type=Path, metavar="DIR", help="report the parts an --slurm DIR's tasks wrote")
    where.add_argument("-o", "--part", type=Path, metavar="FILE",
                       help="grade one student (KERNELS is their folder) and write their part to FILE: what an "
                       "--slurm task runs")  # fmt: skip
    p.add_argument("--submit", action="store_true", help="with --slurm: run sbatch on the script")
    p.add_argument("--job-name", default="mmd-grade", help="with --slurm: Slurm job name (default: %(default)s)")
    for option in slurm.PASSED_OPTIONS:
        p.add_argument(f"--{option.name}", metavar=option.metavar, help=f"with --slurm: {option.help}")
    p.add_argument("--max-parallel", type=int, metavar="N", help="with --slurm: at most N tasks at once")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gres", help="with --slurm: generic resources per task (default: gpu:1)")
    gpu.add_argument("--gpus", type=int, metavar="N", help="with --slurm: --gpus=N instead of --gres")
    p.add_argument("--mmd", default="mmd", metavar="CMD", help="with --slurm: how a node starts mmd (default: mmd)")
    p.add_argument("--max-array-size", type=int, metavar="N",
                   help="with --slurm: tasks per array (default: the cluster's MaxArraySize with "
                   "--submit)")  # fmt: skip


def _request(args: argparse.Namespace) -> Request:
    from ..check.lateness import parse_time
    from ..grade.array import Request
    from ..grade.grader import GradePlan

    if args.kernels is None or args.tests is None:
        raise UsageError("give KERNELS and --tests TESTS (or --gather DIR)")
    deadline = None
    if args.deadline is not None:
        try:
            deadline = parse_time(args.deadline)
        except ValueError:
            raise UsageError(f"--deadline {args.deadline!r}: not an ISO 8601 time (2025-03-14T23:59)") from None
    try:
        plan = GradePlan(tiles=tuple(args.tiles), sizes=tuple(args.sizes), repeats=args.repeats,
                         noise=args.noise / 100, max_repeats=args.max_repeats)  # fmt: skip
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return Request(args.kernels.absolute(), args.tests.absolute(), args.store, deadline, plan)


def run(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone

    from ..grade import run as grading

    outputs = grading.Outputs(args.json, args.junit, args.page, args.quiet)
    if args.gather is not None:
        from ..grade import array

        grading.check_outputs(outputs)
        request, students = array.gather(args.gather)
        device = next((s.device for s in students if s.device), "")
        tests = sorted({c.name for s in students for k in s.kernels for c in k.cases if c.kind == "test"})
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return grading.report(request, students, device, tests, outputs, sum(s.seconds for s in students), started)
    request = _request(args)
    if args.service and (args.slurm is not None or args.part is not None):
        raise UsageError("--service grades here, beside the class's service: not with --slurm or --part")
    if args.slurm is not None:
        return _slurm(args, request)
    from .options import load_settings

    settings = load_settings(args)  # with --service (args.service), as the service's commands read them
    if args.part is not None:
        return grading.grade_part(request, request.kernels, args.part, settings)
    grading.check_outputs(outputs)
    from ..grade.grader import default_workers

    workers = default_workers() if args.workers is None else args.workers
    if workers < 1:
        raise UsageError(f"--workers {workers}: give 1 or more")
    if not args.service:
        return grading.grade_class(request, settings, outputs, workers)
    from ..grade import service

    if settings.control_socket is None:
        raise ConfigError('--service: no control_socket is set: the service is asked over it (docs/operations.md, '
                          '"A class on one box")')  # fmt: skip
    windows = service.ServiceWindows(settings.control_socket, settings.device)
    try:
        windows.check()
    except (OSError, ValueError) as exc:
        print(f"mmd grade: no daemon answers on {settings.control_socket} ({exc})", file=sys.stderr)
        return ExitStatus.NOT_SERVING
    except service.Refused as exc:
        print(f"mmd grade: the service refused a window: {exc}", file=sys.stderr)
        return ExitStatus.FAILED
    return grading.grade_class(request, settings, outputs, workers, windows)


def _slurm(args: argparse.Namespace, request: Request) -> int:
    from .. import slurm
    from ..grade import array, handins

    gres = None if args.gpus is not None or args.gres in ("", "none") else (args.gres or "gpu:1")
    options = slurm.ArrayOptions(
        job_name=args.job_name,
        gres=gres,
        gpus=args.gpus,
        mmd=tuple(shlex.split(args.mmd)),
        passed=tuple((o.name, value) for o in slurm.PASSED_OPTIONS if (value := getattr(args, o.dest)) is not None),
        max_parallel=args.max_parallel,
        config=args.config.resolve() if args.config is not None else None,
    )
    slurm.check_options(options)
    if args.submit and shutil.which("sbatch") is None:
        raise slurm.SubmitError("sbatch not found on PATH: run this on a Slurm login node, or leave out --submit")
    folders, skipped = handins.class_folders(request.kernels)
    for name, why in skipped:
        print(f"mmd grade: not a student: {name!r}: {why}", file=sys.stderr)
    written, left_out = array.write(request, folders, args.slurm, options)
    for name in left_out:
        print(f"mmd grade: left out {name!r}: a name with a line break cannot be a manifest line; grade that "
              "student without --slurm", file=sys.stderr)  # fmt: skip
    plan = written.plan
    n = len(plan.tasks)
    max_size = args.max_array_size or (slurm.max_array_size() if args.submit else slurm.DEFAULT_MAX_ARRAY_SIZE)
    print(f"{plan.script}  ({n} task{'s' if n != 1 else ''}, one per student; parts in {plan.outbox})")
    if not args.submit:
        for offset, count in slurm.chunks(n, max_size):
            print(
                f"submit with: sbatch {shlex.join(slurm.sbatch_argv(plan.script, n, offset, count, options, None)[1:])}"
            )
    else:
        arrays = slurm.submit(written, max_size)
        print(f"submitted job array(s) {', '.join(a.job for a in arrays)}")
    print(f"then: mmd grade --gather {shlex.quote(str(plan.script.parent))} [--json F] [--junit F] [--page DIR]")
    return 0
