"""Reading a job's input: the file's bytes, within limits, checked against its header before any big allocation."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path

import numpy as np

from ..atomic import StreamHash
from ..config import Settings, physical_memory_bytes
from ..errors import InputFormatError, LimitError
from ..textformat import Header

#: Bytes of working memory a job needs per element of C beyond the float32
#: matrices: the output text (``%6.2f`` and a little) while it is emitted.
TEXT_BYTES_PER_OUTPUT = 8

#: How far past its size at open a file may grow while read, when no
#: max_file_bytes is set; beyond that the writer is still at work.
GROWTH_SLACK = 1 << 20

#: Headers promising more values than the file can hold are refused before
#: parsing once their matrices would take more than this many bytes.
EARLY_REFUSAL_BYTES = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Refuse jobs beyond these before allocating anything (None: no limit)."""

    max_memory_bytes: int | None = None
    max_file_bytes: int | None = None
    max_dim: int | None = None


def limits_for(settings: Settings) -> Limits:
    """Job limits from ``settings``; memory defaults to what the machine holds."""
    memory = settings.max_memory_bytes if settings.max_memory_bytes is not None else physical_memory_bytes()
    return Limits(max_memory_bytes=memory, max_file_bytes=settings.max_file_bytes, max_dim=settings.max_dim)


#: Bytes per read into the caller's buffer: each piece goes to the hash as soon as it is in.
READ_CHUNK = 8 << 20


def read_input(
    path: Path,
    limits: Limits,
    into: Callable[[int], np.ndarray] | None = None,
    hasher: StreamHash | None = None,
) -> bytes | memoryview:
    """Read a job's bytes without following a symlink; refuse non-files and oversize files.

    With ``into``, a function giving a writable uint8 array of at least the
    size asked for (a backend's page-locked memory), the file is read into
    that and a memoryview of it returned. ``hasher`` is given the bytes as
    they come (its sha256 runs beside the read and what follows).
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputFormatError(f"cannot open {path.name}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFormatError(f"{path.name} is not a regular file")
        if limits.max_file_bytes is not None and info.st_size > limits.max_file_bytes:
            raise LimitError(
                f"file is {info.st_size} bytes; the limit is {limits.max_file_bytes}",
                {"bytes": info.st_size, "max_file_bytes": limits.max_file_bytes},
            )
        # A file still growing must not make mmd read without bound.
        cap = limits.max_file_bytes if limits.max_file_bytes is not None else info.st_size + GROWTH_SLACK
        with os.fdopen(fd, "rb", closefd=False) as fh:
            if into is not None and info.st_size:
                data = _read_into(fh, info.st_size, into, cap, hasher)
            else:
                data = fh.read(cap + 1)
                if hasher is not None and len(data) <= cap:
                    hasher.update(data)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise LimitError(
            f"{path.name} grew past {cap} bytes while being read (it was {info.st_size} bytes when opened)",
            {"bytes_at_open": info.st_size},
        )
    return data


def _read_into(
    fh: BufferedReader, size: int, into: Callable[[int], np.ndarray], cap: int, hasher: StreamHash | None
) -> bytes | memoryview:
    """``size`` bytes read straight into ``into(size)``, piece by piece to ``hasher``; a file that grew
    meanwhile is read up to ``cap + 1`` (and its hash left to the caller: the job is refused)."""
    view = memoryview(into(size).data).cast("B")[:size]
    got = 0
    while got < size:
        done = fh.readinto(view[got : min(got + READ_CHUNK, size)])
        if not done:
            break
        if hasher is not None:
            hasher.update(view[got : got + done])
        got += done
    if got < size:
        return view[:got]
    rest = fh.read(max(cap + 1 - size, 0))
    return bytes(view) + rest if rest else view


def check_header(header: Header, data_len: int, limits: Limits) -> None:
    """Refuse a header the file cannot hold or the memory limit cannot take, before allocating."""
    m, k, n = header.m, header.k, header.n
    if limits.max_dim is not None and max(m, k, n) > limits.max_dim:
        raise LimitError(
            f"line {header.line}: a {m}x{k}x{n} product exceeds the largest size allowed, {limits.max_dim}",
            {"line": header.line, "max_dim": limits.max_dim},
        )
    values = m * k + k * n
    # Each value takes at least one byte plus one separator (the last needs none).
    # Small shortfalls are left to the parser, whose message names the last line;
    # this check only stops a header from making the parser allocate for nothing.
    room = (data_len - header.body_offset + 1) // 2
    if values > room and 4 * values > EARLY_REFUSAL_BYTES:
        raise InputFormatError(
            f"line {header.line}: header promises {values} values ({m}x{k} and {k}x{n}) "
            f"but the file's {data_len} bytes can hold at most {room}",
            line=header.line,
        )
    need = 4 * (m * k + k * n + m * n) + TEXT_BYTES_PER_OUTPUT * m * n
    if limits.max_memory_bytes is not None and need > limits.max_memory_bytes:
        raise LimitError(
            f"line {header.line}: a {m}x{k}x{n} product needs about {need} bytes of memory; "
            f"the limit is {limits.max_memory_bytes}",
            {"line": header.line, "need_bytes": need, "max_memory_bytes": limits.max_memory_bytes},
        )
