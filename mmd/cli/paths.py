"""The paths a command line names: checked before a command does anything, and ``-`` for stdin or stdout.

A path that cannot be used as given (missing, the wrong kind, unreadable)
is the command line's fault: :class:`~mmd.errors.UnreadableError`, exit
status 2, and nothing is written, no error sidecar either. What can only be
found out by doing the work (a full disk, a refused input) is the command's
failure, status 1. The README's exit-status table states the rule.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

from ..errors import OutputError, UnreadableError

#: The path that means the standard output where a command writes a file (``-o -``), and the standard
#: input where it reads one (``mmd run -``).
STANDARD = Path("-")


def is_standard(path: Path | None) -> bool:
    """``path`` is ``-``: the standard input or output, by where it is given."""
    return path == STANDARD


def from_stdin(path: Path) -> Path:
    """``path``, a new file holding all of the standard input."""
    with open(path, "xb") as fh:
        shutil.copyfileobj(sys.stdin.buffer, fh, 1 << 20)
    return path


def input_file(path: Path) -> Path:
    """``path``, a regular file this process may read (links followed: the caller named it)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UnreadableError(f"{path}: no such file") from None
    except OSError as exc:
        raise UnreadableError(f"cannot read {path}: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise UnreadableError(f"{path} is a folder; give a matrix file")
    if not stat.S_ISREG(info.st_mode):
        # a device or FIFO would block or never end, and nothing may be written beside one (/dev/null.error.yaml)
        raise UnreadableError(f"{path} is not a regular file (a device, pipe or socket)")
    if not os.access(path, os.R_OK):
        raise UnreadableError(f"cannot read {path}: Permission denied")
    return path


def folder(path: Path, what: str = "folder") -> Path:
    """``path``, an existing folder; ``what`` names it in the message (``the inbox``)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UnreadableError(f"{what} {path}: no such folder") from None
    except OSError as exc:
        raise UnreadableError(f"{what} {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UnreadableError(f"{what} {path} is not a folder")
    return path


def output_file(path: Path) -> Path:
    """``path``, where a command may write a file: its folder exists (mmd makes none for one file), and it is
    not a folder itself."""
    parent = path.parent
    if not parent.exists():
        raise UnreadableError(f"{parent} (the output's folder) does not exist")
    if not parent.is_dir():
        raise UnreadableError(f"{parent} (the output's folder) is not a folder")
    if path.is_dir():
        raise UnreadableError(f"{path} is a folder; give a file name")
    return path


def output_folder(path: Path) -> Path:
    """``path`` made (with its parents) for a command that writes a folder of results; OutputError when it
    cannot be (a file in the way, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot make the folder {path}: {exc.strerror}") from None
    return path


def to_stdout(chunks: Iterable[bytes]) -> int:
    """Write ``chunks`` to the standard output; the bytes written."""
    out = sys.stdout.buffer
    total = 0
    for chunk in chunks:
        out.write(chunk)
        total += len(chunk)
    out.flush()
    return total
