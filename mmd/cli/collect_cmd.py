"""``mmd collect``: a class's hand-in copied into a new folder of the grader's, with when each file arrived."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ExitStatus

EPILOG = """\
  mmd collect handin graded          handin/<login>/ -> graded/<login>/, and graded/.mmd-collect.json
  mmd check graded --inputs tests/ --by-student --before 2025-03-14T23:59

Run it at the deadline (at(1), a timer): what a student changes or removes
later changes nothing in the copy. Each file's arrival is its inode change
time in the student's folder as it was read (a student cannot set it back),
or the time it was read; mmd check --before judges by it. See docs/grading.md.

exit status:
  0  every student's files copied (links, FIFOs and folders are listed, not copied)
  1  a file or a student's folder could not be read (listed); the rest was copied
  2  usage: SRC is not a folder, DEST exists or cannot be made
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collect",
        help="copy a class's hand-in (a folder per student) into a new folder, recording when each file arrived",
        description=(
            "Copy each SRC/<login>/'s outputs and sidecars into the new folder DEST/<login>/ (0700), and record "
            "each file's sha256 and arrival in DEST/.mmd-collect.json, which mmd check --before judges by."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", type=Path, metavar="SRC", help="the hand-in: a folder per student")
    p.add_argument("dest", type=Path, metavar="DEST", help="a new folder for the copy (it must not exist)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..check.collect import collect
    from ..check.lateness import MANIFEST_NAME
    from ..textcore import printable

    done = collect(args.src, args.dest)  # UsageError: mmd.cli says it, status 2
    for line in done.skipped:
        print(line)
    record = printable(str(args.dest / MANIFEST_NAME))
    print(f"collected {done.files} files of {len(done.students)} students into {printable(str(args.dest))} ({record})")
    return ExitStatus.FAILED if done.unreadable else ExitStatus.OK
