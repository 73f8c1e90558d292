"""``mmd gen N -o FILE``: a valid random input."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gen", help="write a random input file", description="Write a valid random input file.")
    p.add_argument("n", nargs="?", type=int, help="size N: A and B are N×N")
    p.add_argument("--shape", nargs=3, type=int, metavar=("M", "K", "N"), help="A is M×K, B is K×N")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    p.add_argument("--range", nargs=2, type=float, default=(-10.0, 10.0), metavar=("LO", "HI"))
    p.add_argument("-o", "--output", type=Path, required=True, help="file to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np  # only for this command

    from ..atomic import write_atomic
    from ..generate import input_chunks, random_matrix

    if (args.n is None) == (args.shape is None):
        raise SystemExit("mmd gen: give either N or --shape M K N")
    m, k, n = (args.n, args.n, args.n) if args.shape is None else args.shape
    if min(m, k, n) <= 0:
        raise SystemExit("mmd gen: sizes must be positive")
    rng = np.random.default_rng(args.seed)
    try:
        a = random_matrix(rng, m, k, *args.range)
        b = random_matrix(rng, k, n, *args.range)
    except ValueError as exc:
        raise SystemExit(f"mmd gen: {exc}") from None
    written = write_atomic(args.output, input_chunks(a, b, square=args.shape is None))
    print(f"{written.path} ({m}x{k}x{n}, {written.bytes} bytes)")
    return 0
