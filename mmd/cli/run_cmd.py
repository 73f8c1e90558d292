"""``mmd run INPUT``: one job through the pipeline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import config
from ..backends import open_backend
from ..pipeline import limits_for, request_for, run_job
from .common import add_job_options, settings_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="multiply one input file", description="Run one job: INPUT → OUTPUT + sidecar.")
    p.add_argument("input", type=Path, help="matrix text file")
    p.add_argument("-o", "--output", type=Path, help="output path (default: <stem>.out beside INPUT)")
    add_job_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    output = args.output or args.input.with_suffix(".out")
    if output.resolve() == args.input.resolve():
        print(f"mmd run: the output would replace the input {args.input}; give -o", file=sys.stderr)
        return 2
    backend, note = open_backend(settings.backend, settings.device, config.kernel_cache_dir(settings))
    if note:
        print(f"mmd run: {note}", file=sys.stderr)
    try:
        result = run_job(
            args.input, output, request_for(settings), backend, limits=limits_for(settings), durable=settings.durable
        )
    finally:
        backend.close()
    if not result.ok:
        assert result.error is not None
        print(f"mmd run: {args.input}: {result.error.reason} (details: {result.sidecar})", file=sys.stderr)
        return 1
    rec = result.record
    t = rec["timings_ms"]
    tile = f" tile {rec['tile']}" if rec["tile"] is not None else ""
    print(
        f"{result.output}  ({rec['shape']['m']}x{rec['shape']['k']}x{rec['shape']['n']}, "
        f"{rec['backend']} {rec['kernel']}{tile}, kernel {t['kernel']:.3f} ms, overall {t['overall']:.1f} ms)"
    )
    print(f"{result.sidecar}")
    return 0
