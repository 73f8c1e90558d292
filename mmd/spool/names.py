"""The spool's names: its layout, which inbox names are jobs, the names a claimed job and its output take.

Everything here is pure (no file is touched, but by :func:`resolve_output`'s
``exists``): the constants of the layout, the rule for job names
(:func:`is_job_name`), the name a job is claimed under (:func:`safe_name`) and
shown under (:func:`shown`), its output's versions and their reservations
(:func:`output_path`, :func:`claim_path`, :func:`resolve_output`), its
``.work`` folder's name (:func:`work_folder_name`) and its archive's
(:func:`archive_name`), the lock, state and arrivals files' names, and what
an inbox entry must be to be read (:func:`entry_problem`).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import unicodedata
from collections.abc import Callable
from pathlib import Path

from .. import record
from ..errors import SpoolError

WORK_DIR, DONE_DIR, FAILED_DIR = ".work", ".done", ".failed"
#: An empty folder kept in ``.work`` and renamed to the next job's folder.
SPARE_DIR = ".spare"
LOCK_NAME = ".mmd.lock"
STATE_NAME = ".mmd-state.json"
OUTPUT_SUFFIX = ".out"
#: The reservation of an output version: ``outbox/.<stem>[.<v>].claim``, made at the claim.
CLAIM_SUFFIX = ".claim"
#: A claimed job's record of its starts and holds, in its ``.work`` folder (a dot name: never a job's).
ATTEMPTS_NAME = ".mmd-attempts.json"

#: Names that are never jobs: hidden files (our own folders and temporaries
#: included), and the usual "still being written" suffixes.
IGNORED_PREFIXES: tuple[str, ...] = (".",)
IGNORED_SUFFIXES: tuple[str, ...] = (".tmp", ".part", "~")

#: Versions tried before giving up on an output name (m.out, m.1.out ...).
MAX_VERSIONS = 10_000

#: The longest name (UTF-8 bytes) a claimed job keeps. Every name derived from it
#: must fit NAME_MAX (255): ``<stem>.9999.timing.yaml`` (+17), the archive's
#: ``<name>.<job id>`` (+13) and write_atomic's ``.<name>.<pid>.tmp`` (+13 for a
#: 7-digit pid) on top of the output's own name.
MAX_NAME_BYTES = 224
#: Characters never kept in a claimed name: C0/C1 controls (newline, tab, escape
#: ...), DEL, and the bidirectional overrides that make ``txt.exe`` read as
#: ``exe.txt``. Each becomes ``_``.
_BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")

_WORK_RE = re.compile(r"(?P<job>[0-9a-f]{12})\.(?P<version>[0-9]+)")


def host_lock_name(host_id: str) -> str:
    """A shared inbox's per-host lock: ``.mmd.<host_id>.lock``."""
    return f".mmd.{host_id}.lock"


def state_name(host_id: str | None) -> str:
    """The daemon's state file: ``.mmd-state.json``, or ``.mmd-state.<host_id>.json`` on a shared inbox."""
    return f".mmd-state.{host_id}.json" if host_id else STATE_NAME


def arrivals_name(host_id: str | None) -> str:
    """The record of when the daemon first saw what waits in the inbox: ``.mmd-arrivals.json``, or
    ``.mmd-arrivals.<host_id>.json`` on a shared inbox (beside the state file)."""
    return f".mmd-arrivals.{host_id}.json" if host_id else ".mmd-arrivals.json"


def is_job_name(name: str) -> bool:
    """Whether a file called ``name`` in the inbox is a job (not hidden, not a partial)."""
    return bool(name) and not name.startswith(IGNORED_PREFIXES) and not name.endswith(IGNORED_SUFFIXES)


def safe_name(name: str) -> str:
    """The name a job is claimed under: ``name`` itself when it is harmless.

    Control characters, bidirectional overrides and bytes that are not UTF-8
    (Python's surrogate escapes) become ``_``; a name longer than
    :data:`MAX_NAME_BYTES` is cut (on a character boundary, keeping its last
    suffix) and given 8 hex digits of the original's sha256, so two long names
    that share a prefix stay apart. A name from a folder listing cannot hold
    ``/`` or be ``.``/``..``, so the result is one plain name in its folder.
    """
    if name.isascii() and name.isprintable():  # nearly every name: nothing to replace
        clean = name
    else:
        clean = "".join("_" if unicodedata.category(ch) in ("Cc", "Cs") or ch in _BIDI else ch for ch in name)
    if len(clean.encode("utf-8")) <= MAX_NAME_BYTES:
        return clean
    tag = hashlib.sha256(os.fsencode(name)).hexdigest()[:8]
    stem, dot, suffix = clean.rpartition(".")
    if not dot or not stem or len(suffix.encode()) > 16:
        stem, suffix = clean, ""
    tail = f"-{tag}" + (f".{suffix}" if suffix else "")
    room = MAX_NAME_BYTES - len(tail.encode())
    cut = stem.encode("utf-8")[:room].decode("utf-8", "ignore")
    return cut + tail


def shown(name: str) -> str:
    """``name`` for a log line or a message: controls and undecodable bytes escaped, never raw."""
    if name.isascii() and name.isprintable():
        return name
    return "".join(ch if ch.isprintable() and ch not in _BIDI else ascii(ch)[1:-1] for ch in name)


def archive_name(name: str, job_id: str) -> str:
    """The name job ``job_id``'s input ``name`` is archived under where its own is taken (or too long):
    ``<stem>.<job>.<suffix>``, or ``<name>.<job>`` for a name without a suffix."""
    safe = safe_name(name)
    stem, dot, suffix = safe.rpartition(".")
    return f"{stem}.{job_id}.{suffix}" if dot and stem else f"{safe}.{job_id}"


def output_path(outbox: Path, stem: str, version: int = 0) -> Path:
    """``outbox/<stem>.out``, or ``outbox/<stem>.<version>.out`` for a later version."""
    return outbox / (f"{stem}.{version}{OUTPUT_SUFFIX}" if version else f"{stem}{OUTPUT_SUFFIX}")


def names_of(output: Path) -> tuple[Path, Path, Path]:
    """The three names a job may commit: output, timing sidecar, error sidecar."""
    return output, record.timing_path(output), record.error_path(output)


def claim_path(outbox: Path, stem: str, version: int = 0) -> Path:
    """The reservation of output version ``version`` of ``stem``: ``outbox/.<stem>[.<v>].claim``."""
    return outbox / (f".{stem}.{version}{CLAIM_SUFFIX}" if version else f".{stem}{CLAIM_SUFFIX}")


def resolve_output(
    outbox: Path, stem: str, exists: Callable[[Path], bool] = os.path.lexists, start: int = 0
) -> tuple[int, list[str]]:
    """The first free output version for ``stem`` (from ``start``) and the names that made earlier ones taken.

    A version is taken when its reservation (a job holds it) or any of its
    output, timing or error sidecar exists, so a new result never overwrites,
    or sits beside, an older job's files. The reservation is looked at first:
    a job commits its output before it drops its reservation.
    """
    collided: list[str] = []
    for version in range(start, MAX_VERSIONS):
        names = (claim_path(outbox, stem, version), *names_of(output_path(outbox, stem, version)))
        taken = [p.name for p in names if exists(p)]
        if not taken:
            return version, collided
        collided.extend(taken)
    raise SpoolError(f"{MAX_VERSIONS} outputs named {stem}.* already exist in {outbox}; clear some")


def entry_problem(info: os.stat_result) -> str | None:
    """Why an inbox entry (its ``lstat``) must not be read, or None for a plain file.

    A symbolic link is never followed. A regular file with more than one name
    may be a hard link to a file outside the spool (``ln /etc/shadow inbox/x``
    on the same filesystem): mmd cannot tell, so it reads none.
    """
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link; mmd never follows links"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file (a folder, device, pipe or socket)"
    if info.st_nlink > 1:
        return f"has {info.st_nlink} hard links; mmd reads only files with one name (copy it, do not link it)"
    return None


def writable_problem(info: os.stat_result) -> str | None:
    """Why an input others could change must not be read in class mode, or None.

    A file its group or others may write could be rewritten by a classmate
    between its drop and its claim (the inbox's group is the class). With
    the write bits off, the kernel also refuses classmates a hard link to it
    (``fs.protected_hardlinks``). Group bits are the ACL mask where the file
    has an ACL, so a named entry that grants write sets them too.
    """
    mode = stat.S_IMODE(info.st_mode)
    if not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    who = "its group and others" if mode & stat.S_IWGRP and mode & stat.S_IWOTH else (
        "its group" if mode & stat.S_IWGRP else "others")  # fmt: skip
    return (
        f"is writable by {who} (mode {mode:03o}), so someone else could change it after you dropped it; "
        f"chmod go-w it (or set umask 022) and drop it again"
    )


def work_folder_name(job_id: str, version: int) -> str:
    """The ``.work`` folder of a claimed job: ``<job>.<version>``."""
    return f"{job_id}.{version}"


def parse_work_folder(name: str) -> tuple[str, int] | None:
    """``<job>.<v>`` → (job, v); None for a name mmd did not make."""
    match = _WORK_RE.fullmatch(name)
    if not match:
        return None
    return match["job"], int(match["version"])
