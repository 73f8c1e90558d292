"""``mmd report RESULTS``: the course's graphs, summary.md and report.html from bench results or job sidecars."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="graphs and summary from bench results or sidecars",
        description=(
            "Render graph 1 (overall time by tile), graph 2 (CUDA time by tile), graph 3 (kernel time and "
            "GFLOP/s by size), graph 4 (error against float64 by K, where `mmd bench --accuracy` measured it) "
            "as PNG and SVG, summary.md, and report.html (the graphs and the speed-up tables as one self-contained, "
            "sortable web page), from RESULTS: a results.csv or results.yaml "
            "from `mmd bench`, the folder holding one, or a folder of job sidecars (*.timing.yaml, *.error.yaml)."
        ),
    )
    p.add_argument("results", type=Path, help="results.csv, results.yaml, or a folder")
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        help="output folder (default: report/ in a bench run's folder; for a folder of sidecars, an outbox, "
        "FOLDER.report beside it, never in it)",
    )
    p.add_argument("--log", action="store_true", help="logarithmic time axis on graphs 1 and 2")
    p.add_argument("--size", type=int, help="the size graphs 1 and 2 show (default: the largest in the data)")
    p.add_argument(
        "--peak-tflops", type=float, help="the GPU's fp32 peak in TFLOP/s (default: looked up by device name)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import report  # matplotlib's: only for this command

    rendered = report.render(args.results, args.out, log=args.log, size=args.size, peak_tflops=args.peak_tflops)
    for path in rendered.files:
        print(path)
    return 0
