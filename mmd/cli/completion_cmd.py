"""``mmd completion bash|zsh``: the shell's completion script for mmd, made from mmd's own parser (shtab)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, cast

SHELLS = ("bash", "zsh")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "completion",
        help="print the shell's completion script for mmd",
        description="Print a completion script for SHELL on stdout: the commands, their options, the choices "
        "of each, and file names where a command takes a path. Bash: "
        "`mmd completion bash > ~/.local/share/bash-completion/completions/mmd`; zsh: "
        "`mmd completion zsh > ~/.zfunc/_mmd`, with ~/.zfunc in $fpath before compinit. Made again after an "
        "upgrade, it knows the new commands.",
    )
    p.add_argument("shell", choices=SHELLS, help="the shell the script is for")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import shtab

    from . import build_parser
    from .options import Parser

    parser = build_parser()
    assert isinstance(parser, Parser)
    for command in parser.commands.values():
        if isinstance(command, Parser):
            command.add_later_options()  # the options a command adds only when it is used: all of them, here
        # argparse lists a parser's arguments only in _actions (shtab reads them there too); shtab's interface
        # for what an argument completes is an attribute set on it
        for action in command._actions:
            if action.type is Path:
                cast(Any, action).complete = shtab.FILE
    print(shtab.complete(parser, shell=args.shell))
    return 0
