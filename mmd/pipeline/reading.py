"""Reading a job's input: its header from the first bytes, checked against the file's size and the
limits, then the file's bytes in bounded reads.

A job is refused before its file is read when its header is bad, when its
size cannot match its header (too small to hold the values it promises, or
larger than they could take: see :func:`check_header`), or when it is over
the size limit (``max_file_bytes``, by default the memory limit: an input is
read whole). So a huge file (a 2 GB sparse one, say) costs one ``pread`` of
its first bytes to refuse.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path

import numpy as np

from .. import textcore, textformat
from ..atomic import StreamHash
from ..config import Settings, physical_memory_bytes
from ..errors import InputFormatError, LimitError
from ..textcore import Header

#: Bytes of working memory a job needs per element of C beyond the float32
#: matrices: the output text (``%6.2f`` and a little) while it is emitted.
TEXT_BYTES_PER_OUTPUT = 8

#: How far past its size at open a file may grow while read, when no
#: max_file_bytes is set; beyond that the writer is still at work. Growth is
#: read in pieces of this size.
GROWTH_SLACK = 1 << 20

#: Bytes per read into the caller's buffer: each piece goes to the hash as soon as it is in.
READ_CHUNK = 8 << 20

#: Headers promising more values than the file can hold are refused before
#: parsing once their matrices would take more than this many bytes.
EARLY_REFUSAL_BYTES = 1 << 20

#: What a file may hold beyond ``max_bytes_per_value`` per value: room for a
#: small file's blank lines, a BOM, CRLFs and the like.
SIZE_SLACK = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Refuse jobs beyond these before allocating anything (None: no limit)."""

    max_memory_bytes: int | None = None
    #: The largest file; None: ``max_memory_bytes``.
    max_file_bytes: int | None = None
    max_dim: int | None = None
    #: A file may take this many bytes per value its header promises, plus :data:`SIZE_SLACK`.
    max_bytes_per_value: int | None = None
    #: The largest output: judged at the least its shape makes (:func:`~mmd.textformat.output_bytes_at_least`)
    #: before any work, and at its real size once the product is known (:func:`check_output_size`).
    max_output_bytes: int | None = None
    #: An output may be at most this many times its input, or ``output_ratio_floor_bytes`` (class mode only).
    max_output_ratio: float | None = None
    output_ratio_floor_bytes: int = 0
    #: The room left for this job's output (a submitter's quota, the disk's reserve), and why it is so small.
    room: Room | None = None


@dataclass(frozen=True)
class Room:
    """How many bytes a job's output may take now, and the sentence that says what bounds it."""

    bytes: int
    why: str
    setting: str


def limits_for(settings: Settings) -> Limits:
    """Job limits from ``settings``; memory defaults to what the machine holds."""
    memory = settings.max_memory_bytes if settings.max_memory_bytes is not None else physical_memory_bytes()
    return Limits(
        max_memory_bytes=memory,
        max_file_bytes=settings.max_file_bytes,
        max_dim=settings.max_dim,
        max_bytes_per_value=settings.max_bytes_per_value,
        max_output_bytes=settings.max_output_bytes,
        # A student's output belongs to mmd (no quota of theirs counts it): in a class, a small input may
        # not make a huge one. One's own box has only the admin's max_output_bytes.
        max_output_ratio=settings.max_output_ratio if settings.class_mode else None,
        output_ratio_floor_bytes=settings.output_ratio_floor_bytes,
    )


def _open(path: Path) -> int:
    """``path`` opened for reading, never through a symbolic link."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise InputFormatError(f"cannot open {path.name}: {exc.strerror}") from None


def _checked_size(fd: int, path: Path, limits: Limits, derived: bool = True) -> int:
    """The size of the open file; refused when it is not a regular file or over the size limit.

    ``derived``: also the memory limit where ``max_file_bytes`` is unset
    (:func:`check_header` checks that one last, after the reasons that say
    more).
    """
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise InputFormatError(f"{path.name} is not a regular file")
    _check_size(info.st_size, limits, explicit=True)
    if derived:
        _check_size(info.st_size, limits, explicit=False)
    return info.st_size


def _check_size(size: int, limits: Limits, explicit: bool) -> None:
    """``max_file_bytes`` (``explicit``), or where it is unset the memory limit (an input is read whole)."""
    if explicit:
        most, which = limits.max_file_bytes, "max_file_bytes"
    else:
        most, which = limits.max_memory_bytes, "max_file_bytes unset: the memory limit"
        if limits.max_file_bytes is not None:
            return
    if most is not None and size > most:
        details = {"bytes": size, "max_file_bytes": most}
        raise LimitError(f"file is {size} bytes; the limit is {most} ({which})", details)


@dataclass(frozen=True)
class Head:
    """What the first read of a job's file found: its header, its size, and the whole file when that read
    took all of it (a small file, then read once: :func:`read_input` is given it)."""

    header: Header
    size: int
    whole: bytes | None = None


#: The first read of a file: the header's window (and a BOM). A file no bigger is read whole by it.
_FIRST_READ = textcore.HEADER_WINDOW + len(textcore.BOM)


def read_header(path: Path, limits: Limits) -> Head:
    """The header of the file at ``path`` from its first bytes, and the file's size.

    Nothing else of a big file is read. A file that is not a regular one or
    is over ``max_file_bytes`` is refused here; :func:`check_header` with
    the size then refuses one whose size cannot match its header or that
    the memory limit cannot take, still unread (the job's error sidecar can
    then say its shape).
    """
    fd = _open(path)
    try:
        size = _checked_size(fd, path, limits, derived=False)
        head = os.pread(fd, _FIRST_READ, 0)
    finally:
        os.close(fd)
    return Head(textcore.parse_header(head, size=size), size, head if len(head) < _FIRST_READ else None)


def read_input(
    path: Path,
    limits: Limits,
    into: Callable[[int], np.ndarray] | None = None,
    hasher: StreamHash | None = None,
    head: Head | None = None,
) -> bytes | memoryview:
    """Read a job's bytes without following a symlink; refuse non-files and oversize files.

    The file is read as big as ``fstat`` says it is (a size the limits
    allowed), then whatever it grew by meanwhile in pieces of
    :data:`GROWTH_SLACK`, up to ``max_file_bytes`` (or that slack). With
    ``into``, a function giving a writable uint8 array of at least the size
    asked for (a backend's page-locked memory), the file is read into that
    and a memoryview of it returned. ``hasher`` is given the bytes as they
    come (its sha256 runs beside the read and what follows). ``head``: what
    :func:`read_header` found; a file it read whole is not read again.
    """
    if head is not None and head.whole is not None:
        size = head.size
        _check_size(size, limits, explicit=False)
        cap = limits.max_file_bytes if limits.max_file_bytes is not None else size + GROWTH_SLACK
        data: bytes | memoryview = head.whole
        if into is not None and data and len(data) <= cap:
            view = memoryview(into(len(data)).data).cast("B")[: len(data)]
            view[:] = data
            data = view
        if hasher is not None and len(data) <= cap:
            hasher.update(data)
    else:
        fd = _open(path)
        try:
            size = _checked_size(fd, path, limits)
            # A file still growing must not make mmd read without bound.
            cap = limits.max_file_bytes if limits.max_file_bytes is not None else size + GROWTH_SLACK
            with os.fdopen(fd, "rb", closefd=False) as fh:
                if into is not None and size:
                    data = _read_into(fh, size, into, cap, hasher)
                else:
                    first = fh.read(size)
                    rest = _read_growth(fh, cap - len(first))
                    data = first + rest if rest else first
                    if hasher is not None and len(data) <= cap:
                        hasher.update(data)
        finally:
            os.close(fd)
    if len(data) > cap:
        raise LimitError(
            f"{path.name} grew past {cap} bytes while being read (it was {size} bytes when opened)",
            {"bytes_at_open": size},
        )
    return data


def _read_growth(fh: BufferedReader, room: int) -> bytes:
    """What a file grew by since its size was taken: up to ``room + 1`` bytes, read in bounded pieces."""
    parts: list[bytes] = []
    got = 0
    while got <= room:
        piece = fh.read(min(GROWTH_SLACK, room + 1 - got))
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


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
    rest = _read_growth(fh, cap - size)
    return bytes(view) + rest if rest else view


def check_header(header: Header, data_len: int, limits: Limits) -> None:
    """Refuse, before anything is read or allocated: a product over ``max_dim``; a header the file cannot
    hold; a file far bigger than its header's values can take; an output over ``max_output_bytes`` or (class
    mode) ``max_output_ratio``; a product the memory limit cannot take; a file bigger than the memory limit
    where ``max_file_bytes`` is unset."""
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
    # The grammar lets a value and the blanks around it be any length, so no size is too big for it;
    # a generous average per value (a setting) is the bound, so that a file far beyond what its
    # header promises (a runaway writer, a sparse file) is refused before it is read.
    per = limits.max_bytes_per_value
    if per is not None and data_len > header.body_offset + values * per + SIZE_SLACK:
        most = header.body_offset + values * per + SIZE_SLACK
        raise LimitError(
            f"line {header.line}: the header promises {values} values (a {m}x{k}x{n} product) but the file has "
            f"{data_len} bytes, more than {most} ({per} bytes per value, blanks included, and 1 MiB more; "
            f"setting max_bytes_per_value)",
            {"line": header.line, "bytes": data_len, "max_bytes": most, "max_bytes_per_value": per},
        )
    _check_output(header, data_len, limits)
    need = 4 * (m * k + k * n + m * n) + TEXT_BYTES_PER_OUTPUT * m * n
    if limits.max_memory_bytes is not None and need > limits.max_memory_bytes:
        raise LimitError(
            f"line {header.line}: a {m}x{k}x{n} product needs about {need} bytes of memory; "
            f"the limit is {limits.max_memory_bytes}",
            {"line": header.line, "need_bytes": need, "max_memory_bytes": limits.max_memory_bytes},
        )
    _check_size(data_len, limits, explicit=False)  # last: the reasons above say more


def check_output_size(header: Header, data_len: int, limits: Limits, size: textformat.OutputSize) -> None:
    """Judge the output by its real size once the product is known, before a byte of it is written, by the
    limits :func:`check_header` judged at the least its shape makes (``limits``: the same ones, the same
    room): fields of values from 1000 on (or -100) are wider than 6 bytes, up to 43. Only where the bound
    ``size.at_most`` is over a limit is the exact size computed and judged; refused with check_header's
    kinds and words."""
    if _output_refusal(header, data_len, limits, size.at_most) is None:
        return
    refusal = _output_refusal(header, data_len, limits, size.exact())
    if refusal is not None:
        raise refusal


def _check_output(header: Header, data_len: int, limits: Limits) -> None:
    """Refuse an output over ``max_output_bytes``, or (class mode) over ``max_output_ratio`` times its
    input and ``output_ratio_floor_bytes``; judged at the least the header's shape makes."""
    refusal = _output_refusal(header, data_len, limits, textformat.output_bytes_at_least(header.m, header.n), True)
    if refusal is not None:
        raise refusal


def _output_refusal(
    header: Header, data_len: int, limits: Limits, out: int, at_least: bool = False
) -> LimitError | None:
    """The refusal of an output of ``out`` bytes (``at_least`` that many: judged from the header) by the
    limits; None where they allow it."""
    m, k, n = header.m, header.k, header.n
    makes = f"line {header.line}: a {m}x{k}x{n} product makes an output of {'at least ' if at_least else ''}{out} bytes"
    if limits.max_output_bytes is not None and out > limits.max_output_bytes:
        return LimitError(
            f"{makes}; the limit is {limits.max_output_bytes} (max_output_bytes)",
            {"line": header.line, "output_bytes": out, "max_output_bytes": limits.max_output_bytes},
        )
    room = limits.room
    if room is not None and out > room.bytes:
        return LimitError(
            f"{makes}; {room.why}",
            {"line": header.line, "output_bytes": out, "room_bytes": max(room.bytes, 0), "setting": room.setting},
        )
    ratio, floor = limits.max_output_ratio, limits.output_ratio_floor_bytes
    if ratio is not None and out > max(ratio * data_len, floor):
        return LimitError(
            f"{makes}, {out // max(data_len, 1)} times its input's {data_len}; in class mode an output may be at "
            f"most {ratio:g} times its input or {floor} bytes, whichever is larger "
            "(max_output_ratio, output_ratio_floor_bytes)",
            {
                "line": header.line,
                "output_bytes": out,
                "input_bytes": data_len,
                "max_output_ratio": ratio,
                "output_ratio_floor_bytes": floor,
            },
        )
    return None
