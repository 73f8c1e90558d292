"""``mmd check``: an output (or a folder of them) against inputs or expected outputs."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ExitStatus, MmdError, UsageError

if TYPE_CHECKING:
    from ..check.jobs import CheckProgress
    from ..check.results import Result

EPILOG = """\
one output:
  mmd check m.out --input m.txt        exact format, then values against a float64 product
  mmd check m.out expected.out         exact format, then values against another output (0.01)
a folder (x.txt or x.out in DIR pairs with x.out in OUTBOX):
  mmd check outbox --inputs tests/ --junit report.xml --json report.json
  mmd check handin --inputs tests/ --roster roster.txt   a folder per student
  mmd collect handin graded/ && mmd check graded --inputs tests/ --by-student --before 2025-03-14T23:59
                                       a hand-in copied at the deadline, judged by its arrival

--quick checks the product in O(n²) (Freivalds, Gaussian vectors): it refuses
whole wrong rows, columns, tiles and transposes, but not one value off by a
little; the full check sees every value. Its seed is fresh for every check
and shown with the results (a known seed can be forged against); --seed N
repeats a check. See docs/grading.md.

exit status:
  0  every check passed (extra outputs in a folder are listed, not failed)
  1  a check failed: wrong values or format, a missing output, a refused job,
     an output that is a link, folder, FIFO or device (never opened)
  2  usage, or a file that cannot be read (an output, input or expected
     output; an input or expected output that is not valid)
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="check outputs' format and values, one file or a folder",
        description=(
            "Check OUTPUT's exact format, then its values against EXPECTED or a float64 product of "
            "INPUT; or every output in the folder OUTPUT against a folder of inputs or expected outputs."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("output", type=Path, help="an output file, or a folder of them (an outbox)")
    p.add_argument("expected", type=Path, nargs="?", help="an expected output file")
    p.add_argument(
        "--input", "--inputs", dest="input", type=Path, help="the input file, or a folder of inputs (x.txt for x.out)"
    )
    p.add_argument(
        "--expected",
        dest="expected_opt",
        type=Path,
        metavar="EXPECTED",
        help="an expected output, or a folder of them (x.out for x.out)",
    )
    p.add_argument("--tol", type=float, help="absolute tolerance beyond print rounding (default: the fp32 model)")
    p.add_argument("--quick", action="store_true", help="randomized O(n²) product check (against inputs only)")
    p.add_argument(
        "--seed",
        type=int,
        help="seed of --quick's random vectors, to repeat a check (default: a fresh one, shown in the results)",
    )
    p.add_argument(
        "--before",
        metavar="TIME",
        help="a folder's deadline (ISO 8601; local time without an offset): grade only what arrived before it, "
        "by a time no student can set (mmd collect's record, else the files' ctime; never a sidecar's "
        "finished_at); the rest is listed as late",
    )
    p.add_argument(
        "--by-student",
        action="store_true",
        help="OUTPUT holds a folder per student (handin/<login>/, class mode's outbox/<login>/): grade each",
    )
    p.add_argument(
        "--roster",
        type=Path,
        metavar="FILE",
        help="the class's logins, one a line (# comments): a student with no folder is reported too "
        "(implies --by-student)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar (one is drawn on stderr on a terminal)")
    p.add_argument("--junit", type=Path, metavar="FILE", help="write the results as JUnit XML")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    p.add_argument("--jobs", type=int, metavar="N", help="outputs checked at once in a folder (default: one per core)")
    p.add_argument(
        "--reference",
        choices=("auto", "cpu", "gpu"),
        default="cpu",
        help="where the float64 product is made: numpy's BLAS (cpu), cuBLAS DGEMM (gpu), or the GPU when one is "
        "usable (auto); default: %(default)s. The GPU's start-up costs each command time, so it pays only at "
        "sizes where numpy's product takes longer than that start-up, which depends on the CPU (docs/grading.md "
        "has the figures)",
    )
    p.set_defaults(func=run)


def _usage(message: str) -> int:
    from ..textcore import printable  # a path given may hold any byte

    print(f"mmd check: {printable(message)} (see mmd check --help)", file=sys.stderr)
    return ExitStatus.USAGE


def run(args: argparse.Namespace) -> int:
    refs = [r for r in (args.expected, args.expected_opt, args.input) if r is not None]
    if len(refs) != 1:
        return _usage("give one of EXPECTED, --expected or --input")
    reference: Path = refs[0]
    against = "inputs" if args.input is not None else "expected"
    if args.quick and against != "inputs":
        return _usage("--quick checks against inputs: give --input")
    if args.jobs is not None and args.jobs < 1:
        return _usage("--jobs must be at least 1")
    from ..check import pairing, reports, results  # only for this command (numpy where a check needs it)

    try:
        for flag, path in (("--junit", args.junit), ("--json", args.json)):
            if path is not None:
                reports.check_report_path(path, flag)
        before = _deadline(args.before)
        args.roster_logins = None if args.roster is None else pairing.read_roster(args.roster)
    except UsageError as exc:
        return _usage(exc.reason)
    with contextlib.ExitStack() as stack:
        gemm = _device_reference(args.reference, stack) if against == "inputs" and not args.quick else None
        options = results.Options(against=against, tol=args.tol, quick=args.quick, gemm=gemm, before=before)
        if args.seed is not None:
            options = dataclasses.replace(options, seed=args.seed)
        return _check(args, reference, options)


def _deadline(text: str | None) -> datetime | None:
    """--before's time (UsageError where it is not ISO 8601)."""
    from ..check.lateness import parse_time

    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError:
        raise UsageError(
            f"--before {text}: not an ISO 8601 time (e.g. 2025-03-14T23:59 or 2025-03-14T22:59Z)"
        ) from None


def _device_reference(where: str, stack: contextlib.ExitStack) -> Callable[[Any, Any], Any] | None:
    """The GPU's float64 GEMM when asked for (and usable, for auto), else None: numpy's."""
    if where == "cpu":
        return None
    from ..backends.cuda import DeviceReference
    from ..errors import BackendUnavailable

    try:
        return stack.enter_context(DeviceReference())
    except BackendUnavailable as exc:
        if where == "gpu":
            raise UsageError(f"--reference gpu: {exc.reason}") from None
        return None


def _check(args: argparse.Namespace, reference: Path, options: Any) -> int:
    from ..check import jobs, reports

    folder = args.output.is_dir()
    try:
        if folder != reference.is_dir() and reference.exists() and args.output.exists():
            what = "a folder" if folder else "a file"
            return _usage(f"{args.output} is {what}: give {what} to check it against")
        if (args.by_student or args.roster is not None) and not folder:
            return _usage("--by-student checks a folder: give one with a folder per student")
        if folder:
            with _progress(args.quiet) as progress:
                if args.by_student or args.roster is not None:
                    roster = args.roster_logins
                    result = jobs.check_class(args.output, reference, options, roster, args.jobs, progress)
                else:
                    result = jobs.check_folder(args.output, reference, options, args.jobs, progress)
            print(reports.table(result.results))
            for line in result.student_summaries():
                print(line)
            print(result.summary())
        else:
            result = jobs.check_file(args.output, reference, options)
            _print_one(result.results[0])
        if args.junit is not None:
            reports.write_junit(result, args.junit)
        if args.json is not None:
            reports.write_json(result, args.json)
    except MmdError as exc:  # a folder or a report that cannot be read or written
        print(f"mmd check: {reports.shown(exc.reason)}", file=sys.stderr)
        return ExitStatus.USAGE
    return result.exit_status


@contextlib.contextmanager
def _progress(quiet: bool) -> Iterator[CheckProgress | None]:
    """A progress bar on stderr where it is a terminal (and not --quiet): nothing otherwise, so that a
    script or a pipe reads only the table."""
    from .. import progress

    if not progress.on_terminal(quiet=quiet):
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    columns = (TextColumn("checking"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with progress.bar(*columns) as bar:
        yield _Bar(bar)


class _Bar:
    """mmd.check.jobs.CheckProgress drawn by rich."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.task: Any = None

    def start(self, total: int) -> None:
        self.task = self.bar.add_task("check", total=total)

    def advance(self, result: Result) -> None:
        self.bar.advance(self.task)


def _print_one(r: Result) -> None:
    """One output: the line mmd check has always printed, or one line on stderr when it cannot check."""
    from ..check.results import Status
    from ..textcore import printable

    output = printable(str(r.output))
    if r.status is Status.ERROR:
        print(f"mmd check: {r.reason}", file=sys.stderr)
    elif r.status is Status.NOT_A_FILE:
        print(f"NOT A FILE: {r.reason}")
    elif r.status is Status.FORMAT:
        print(f"FORMAT: {output}: {r.reason}")
    elif r.detail:
        print(f"{output}: format ok; {r.detail}")
    else:
        print(f"{output}: format ok; MISMATCH: {r.reason}")
