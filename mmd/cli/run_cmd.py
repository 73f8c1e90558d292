"""``mmd run INPUT``: one job through the pipeline."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import UsageError
from .common import EXIT_FAILED, EXIT_OK, add_job_options, configure_logs, job_flags, options_later


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="multiply one input file",
        description="Run one job: INPUT → OUTPUT + sidecar. Settings in INPUT's name (NAME@kernel=aplus.txt) "
        "apply as they do in the daemon; a flag may repeat them, never contradict them. Exit status: 0 done, "
        "1 the job was refused (its error sidecar says why), 2 bad usage or an input that cannot be read.",
    )
    options_later(p, _options)
    p.set_defaults(func=run)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, help="matrix text file")
    p.add_argument("-o", "--output", type=Path, help="output path (default: <stem>.out beside INPUT)")
    add_job_options(p)


def _paths(args: argparse.Namespace) -> tuple[Path, Path]:
    """INPUT and OUTPUT, or UsageError: no error sidecar is written for a job that cannot even start."""
    src: Path = args.input
    if not os.path.lexists(src):
        raise UsageError(f"{src}: no such file")
    if os.path.isdir(src):
        raise UsageError(f"{src} is a folder; give a matrix file")
    output: Path = args.output or src.with_suffix(".out")
    if output.resolve() == src.resolve():
        given = "-o names" if args.output else f"the default output {output.name} is"
        raise UsageError(f"{given} the input {src} itself; choose another output path")
    if not output.parent.is_dir():
        raise UsageError(f"{output.parent} (the output's folder) does not exist")
    return src, output


def run(args: argparse.Namespace) -> int:
    from .. import config
    from ..backends import BackendPool  # numpy and the pipeline: only for this command
    from ..config import COMMAND_LINE
    from ..job import describe
    from ..pipeline import run_job
    from ..record import TimingRecord

    base = config.load(args.config)
    flags = job_flags(args)
    base.with_values({k: v for k, v in flags.items() if v is not None}, COMMAND_LINE)  # a bad flag: usage
    configure_logs(base, quiet=not args.verbose)
    src, output = _paths(args)
    job = describe(src, output, base, flags=flags)
    pool = BackendPool()
    try:
        result = run_job(job, pool.get)
    finally:
        pool.close()
    if not isinstance(result.record, TimingRecord):
        assert result.error is not None
        where = "not written" if result.sidecar_failed else str(result.sidecar)
        print(f"mmd run: {src}: {result.error.reason} (error sidecar: {where})", file=sys.stderr)
        return EXIT_FAILED
    rec = result.record
    t = rec.timings_ms
    tile = f" tile {rec.tile}" if rec.tile is not None else ""
    print(
        f"{output}  ({rec.shape.m}x{rec.shape.k}x{rec.shape.n}, {rec.backend} {rec.kernel}{tile}, "
        f"kernel {t.kernel:.3f} ms, overall {t.overall:.1f} ms)"
    )
    print(result.sidecar)
    return EXIT_OK
