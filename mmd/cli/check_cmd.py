"""``mmd check OUTPUT (EXPECTED | --input INPUT)``: exact format, then values."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import textformat, verify
from ..errors import MmdError
from ..pipeline import Limits, read_input


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="check an output's format and values",
        description="Check OUTPUT's exact format, then its values against EXPECTED or a float64 product of INPUT.",
    )
    p.add_argument("output", type=Path)
    p.add_argument("expected", type=Path, nargs="?", help="an expected output file")
    p.add_argument("--input", type=Path, help="the input file: compare with its float64 product")
    p.add_argument("--tol", type=float, help="absolute tolerance beyond print rounding")
    p.set_defaults(func=run)


def _load(path: Path, what: str):
    try:
        return read_input(path, Limits())
    except MmdError as exc:
        raise MmdError(f"{what} {path}: {exc.reason}") from None


def run(args: argparse.Namespace) -> int:
    if (args.expected is None) == (args.input is None):
        print("mmd check: give either EXPECTED or --input INPUT", file=sys.stderr)
        return 2
    try:
        out = textformat.parse_output(_load(args.output, "output"))
    except MmdError as exc:
        print(f"FORMAT: {args.output}: {exc.reason}")
        return 1
    if args.input is not None:
        mats = textformat.parse(_load(args.input, "input"))
        report = verify.against_inputs(out, mats.a, mats.b, args.tol)
    else:
        try:
            expected = textformat.parse_output(_load(args.expected, "expected"))
        except MmdError as exc:
            raise MmdError(f"expected output {args.expected}: {exc.reason}") from None
        report = verify.against_output(out, expected, 0.01 if args.tol is None else args.tol)
    print(f"{args.output}: format ok; {report.summary()}")
    return 0 if report.ok else 1
