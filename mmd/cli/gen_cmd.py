"""``mmd gen N -o FILE``: a valid random input."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from .. import progress
from ..errors import LimitError, UsageError
from . import paths


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gen", help="write a random input file", description="Write a valid random input file.")
    p.add_argument("n", nargs="?", type=int, help="size N: A and B are N×N")
    p.add_argument("--shape", nargs=3, type=int, metavar=("M", "K", "N"), help="A is M×K, B is K×N")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    p.add_argument(
        "--range",
        nargs=2,
        type=float,
        default=(-10.0, 10.0),
        metavar=("LO", "HI"),
        help="values are drawn from LO to HI with two decimals, never zero (default: -10 10)",
    )
    p.add_argument("-o", "--output", type=Path, required=True, help="file to write; - for the standard output")
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar (one is drawn on stderr on a terminal for large sizes)",
    )
    p.set_defaults(func=run)


#: Sizes from this many values of A and B on show their progress on a terminal (a 1024×1024 pair; below
#: that the file is written too soon for a bar to be read).
SHOWN_FROM_VALUES = 2 * 1024 * 1024
#: What gen does, as its progress bar names it.
STEPS = {"draw": "draw A and B", "write": "write"}


def _counted(chunks: Iterator[bytes], steps: progress.Steps) -> Iterator[bytes]:
    """``chunks``, telling ``steps`` the megabytes written so far."""
    done = 0
    for chunk in chunks:
        yield chunk
        done += len(chunk)
        steps.note(f"{done / 1e6:.0f} MB")


def run(args: argparse.Namespace) -> int:
    from ..config import physical_memory_bytes
    from ..generate import hundredths, memory_needed

    if (args.n is None) == (args.shape is None):
        raise UsageError("give either N or --shape M K N")
    m, k, n = (args.n, args.n, args.n) if args.shape is None else args.shape
    if min(m, k, n) <= 0:
        raise UsageError("sizes must be positive")
    lo, hi = args.range
    try:
        hundredths(lo, hi)
    except ValueError as exc:
        raise UsageError(f"--range: {exc}") from None
    stdout = paths.is_standard(args.output)
    if not stdout:
        paths.output_file(args.output)
    need, have = memory_needed(m, k, n), physical_memory_bytes()
    if have is not None and need > have:
        raise LimitError(
            f"a {m}x{k}x{n} input needs about {need / 2**30:.1f} GiB of memory to draw; this machine has "
            f"{have / 2**30:.1f} GiB"
        )
    import numpy as np  # only for this command

    from ..atomic import write_atomic
    from ..generate import input_chunks, random_matrix

    rng = np.random.default_rng(args.seed)
    shown = progress.on_terminal(quiet=args.quiet) and m * k + k * n >= SHOWN_FROM_VALUES
    with progress.Steps(f"mmd gen {m}x{k}x{n}", STEPS, shown=shown) as steps:
        steps.step("draw")
        try:
            a = random_matrix(rng, m, k, lo, hi)
            b = random_matrix(rng, k, n, lo, hi)
        except MemoryError:  # under the machine's size, but not free now
            raise LimitError(f"not enough free memory to draw a {m}x{k}x{n} input (about {need} bytes)") from None
        steps.step("write")
        chunks = _counted(input_chunks(a, b, square=args.shape is None), steps)
        if stdout:
            paths.to_stdout(chunks)  # the bytes only: a pipe's reader wants nothing else
            return 0
        done = write_atomic(args.output, chunks)
    print(f"{done.path} ({m}x{k}x{n}, {done.bytes} bytes)")
    return 0
