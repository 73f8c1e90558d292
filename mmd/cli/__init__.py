"""The ``mmd`` command line: parses options, builds objects, calls the library.

No job logic lives here. Each sub-command is a module with ``register(sub)``
that adds its parser and sets ``func(args) -> int``; what a sub-command runs
is imported when it runs (cli.options says why).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import select
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from .. import __version__
from ..errors import ConfigError, ExitStatus, MmdError, UsageError
from .options import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Parser

#: Sub-command modules, in the order `mmd --help` lists them.
COMMANDS: tuple[str, ...] = (
    "run", "gen", "check", "collect", "grade", "kernels", "hand-in", "serve", "status", "cancel", "rm", "submit",
    "bench", "report", "config", "completion",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every available sub-command."""
    parser = Parser(prog="mmd", description="Matrix-multiply batch processor for GPU lab machines.")
    parser.add_argument("--version", action="version", version=f"mmd {__version__}")
    parser.set_defaults(ends_process=False)  # a command that leaves its teardown to the process's end says so
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    # not required: argparse would answer an unknown option alone (`mmd --foo`) with "COMMAND is
    # required"; main() refuses no COMMAND itself, after the unknown options
    parser.commands = sub.choices
    for name in COMMANDS:
        try:
            module = importlib.import_module(f".{name.replace('-', '_')}_cmd", __name__)  # hand-in: hand_in_cmd
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(__name__):
                continue  # a command not built yet in this tree
            raise
        module.register(sub)
    _add_help(parser, sub)
    return parser


def _add_help(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:
    """``mmd help [COMMAND]``: ``mmd --help``, or ``mmd COMMAND --help``, on stdout."""
    names = list(sub.choices)
    helper = sub.add_parser("help", help="show the commands, or one command's options")
    helper.add_argument("topic", nargs="?", choices=names, metavar="COMMAND", help="one of: " + ", ".join(names))

    def show(args: argparse.Namespace) -> int:
        (parser if args.topic is None else sub.choices[args.topic]).print_help()
        return EXIT_OK

    helper.set_defaults(func=show)


def _warn_in_one_line(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
    """A warning as the CLI says everything: one line, no source location (a user's shell set it, not mmd)."""
    print(f"mmd: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None, *, exiting: bool = False) -> int:
    """Run the command line; returns the exit status (mmd.errors.ExitStatus, the README's table).

    ``exiting``: the process ends when this returns (:func:`entry`), so a command that sets
    ``ends_process`` may leave what it holds for the process's end to release.
    """
    warnings.showwarning = _warn_in_one_line
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["serve"]:
        _start_fork_server()
    parser = build_parser()
    if not words:  # a newcomer's first try: the commands, not "required: COMMAND"
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args, extra = parser.parse_known_args(words)
    if extra:
        # argparse reports a sub-command's unknown flags from the top parser ("mmd: ..."): name the
        # command when they came after it.
        where = words.index(extra[0]) if extra[0] in words else len(words)  # not a word itself: -xyz's part
        after = args.command in words and where > words.index(args.command)
        owner = getattr(parser, "commands", {}).get(args.command, parser) if after else parser
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:  # options only (`mmd --verbose`)
        parser.error("give a COMMAND")
    args.exiting = exiting
    status = _call(args)
    if exiting and args.ends_process:
        # What the command left (mmd run: a CUDA context, its page-locked buffers) is the kernel's to release
        # with the process: freed one by one, then torn down with the interpreter, it was a GPU job's
        # slowest step after its write.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):  # a closed pipe: what it would have said is lost either way
                stream.flush()
        os._exit(status)
    return status


def _start_fork_server() -> None:
    """The daemon's workers' fork server started first thing, so that everything else of the daemon's start (the
    command line, the settings, the daemon's imports, the scan of the inbox) runs beside its imports, which a
    fresh daemon's first job otherwise waits for. Where it cannot start, ``mmd serve`` says why as it asks again."""
    from .. import spawning

    with contextlib.suppress(MmdError):
        spawning.context()


def _call(args: argparse.Namespace) -> int:
    """The command's exit status, with its refusals worded on stderr."""
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"mmd {args.command}: {exc.reason}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:
        print(f"mmd {args.command}: configuration: {exc.reason}", file=sys.stderr)
        return EXIT_CONFIG
    except MmdError as exc:
        print(f"mmd {args.command}: {exc.reason}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"mmd {args.command}: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:
        if not _reader_gone():
            raise  # a pipe of mmd's own broke, not its output's: a bug to see
        return ExitStatus.PIPE_CLOSED


def _reader_gone() -> bool:
    """Whether the standard output's or error's reader has closed its end (``mmd gen 512 -o - | head -1``)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (OSError, ValueError):  # not a file (a test's capture)
            continue
        # the kernel flags the writing end of a pipe whose readers are gone as an error
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        if any(events & select.POLLERR for _, events in poll.poll(0)):
            return True
    return False


def entry() -> NoReturn:
    """The ``mmd`` program (the console script, ``python -m mmd``): :func:`main`, whose status ends the process.

    Every command's output is flushed here, so that a reader that stopped reading ends the command quietly,
    with the status a shell gives one a closed pipe stopped, whether its output was cut off as it was written
    or once it was all buffered."""
    try:
        try:
            status: str | int | None = main(exiting=True)
        except SystemExit as exc:  # argparse's --help, --version and refusals
            status = exc.code
        sys.stdout.flush()
    except BrokenPipeError:
        if not _reader_gone():
            raise
        # what stays buffered for the closed pipe would fail again as the interpreter ends
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = ExitStatus.PIPE_CLOSED
    sys.exit(status)
