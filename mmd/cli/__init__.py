"""The ``mmd`` command line: parses options, builds objects, calls the library.

No job logic lives here. Each sub-command is a module with ``register(sub)``
that adds its parser and sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import MmdError

#: Sub-command modules, in the order `mmd --help` lists them.
COMMANDS: tuple[str, ...] = ("run", "gen", "check", "kernels", "serve", "status", "submit", "bench", "report")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + message
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every available sub-command."""
    parser = _Parser(prog="mmd", description="Matrix-multiply batch processor for GPU lab machines.")
    parser.add_argument("--version", action="version", version=f"mmd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f".{name}_cmd", __name__)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(__name__):
                continue  # a command not built yet in this tree
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 refused/failed, 2 usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MmdError as exc:
        print(f"mmd {args.command}: {exc.reason}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"mmd {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
