"""The matrix text format's numpy-free core: a file's bytes, the header lines, and the C parser's
reads into plain buffers.

:mod:`mmd.textformat` builds on it. It imports no numpy, so that ``mmd check --quick``, which reads
and sums by the C accelerators alone (:mod:`mmd.accel`), starts without numpy's import.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol, TypeVar

from . import accel
from .cpus import usable_cores
from .errors import InputFormatError, NotRegularFile, UnreadableError

BOM = b"\xef\xbb\xbf"

#: The fewest bytes the C parsers give a thread of its own.
C_MIN_SPLIT = 1 << 20
#: Threads a parse or an emit uses (the C parsers' parts, the emit's pool): the usable cores, at most 8.
WORKERS = min(8, usable_cores())

#: Characters of an offending value shown in an error.
MAX_SHOWN = 40


@dataclass(frozen=True)
class Header:
    """The parsed first line of an input file."""

    m: int
    k: int
    n: int
    square: bool  # header was a single N
    body_offset: int  # byte offset in data where the values start (after header line)
    line: int  # 1-based line number of the header line (after any blank lines before it)


def printable(raw: bytes | str) -> str:
    """``raw`` as text that is safe to show anywhere: on a terminal, in XML 1.0, in JSON.

    Bytes that are not UTF-8 (in a ``str``, the surrogates a file name's bytes become) are shown
    as ``\\xff``, and every character that is not printable (control characters, ANSI escapes,
    bidirectional overrides, surrogates) as its Python escape: a file name a student chose can
    neither move a terminal's cursor nor break a report.
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8", errors="surrogateescape")
    text = bytes(raw).decode("utf-8", errors="backslashreplace")
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def shorten(raw: bytes | str, limit: int = MAX_SHOWN) -> str:
    """A printable (:func:`printable`), shortened form of an offending value."""
    text = printable(raw)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


# ---------------------------------------------------------------------------
# an input's header

_HEADER_RE = re.compile(rb"[ \t]*([0-9]+)(?:[ \t]+([0-9]+)[ \t]+([0-9]+))?[ \t]*\r?")
#: Blank lines and whitespace before the header are skipped, as ``fscanf`` skips them, but the
#: header line must end within this many bytes (after a BOM): the pipeline reads only the file's
#: first bytes to check the header before it reads the rest (docs/textformat.md).
HEADER_WINDOW = 1 << 16
_BLANKS = b" \t\r\n"


def _header_error(got: bytes, line: int) -> InputFormatError:
    shown = shorten(got.rstrip(b"\r"))
    return InputFormatError(
        f"line {line}: header must be 'N' or 'M K N' with positive integers, got '{shown}'",
        line=line,
        value=shown,
    )


#: Digits a header's size may have, leading zeros aside: 10^19 values are past any file, and a longer number could
#: be past what Python's int() converts (4300 digits) too.
MAX_SIZE_DIGITS = 19


def _size(digits: bytes, line: int) -> int:
    significant = digits.lstrip(b"0")
    if len(significant) > MAX_SIZE_DIGITS:
        raise InputFormatError(
            f"line {line}: a size in the header has more than {MAX_SIZE_DIGITS} digits ({len(significant)}): "
            "no file holds that many values",
            line=line,
            value=shorten(significant),
        )
    return int(significant or b"0")


def parse_header(data: bytes | memoryview, size: int | None = None) -> Header:
    """Parse the header line; raises :class:`InputFormatError` naming its line.

    An optional UTF-8 BOM, then any blank lines and whitespace (skipped, as
    ``fscanf`` skips them), then the header line, which must end within
    :data:`HEADER_WINDOW` bytes. ``data`` may be only the file's first bytes
    (at least ``HEADER_WINDOW + 3`` of them, or all of it): ``size`` is then
    the whole file's size. ``body_offset`` and ``line`` count from the start
    of the file.
    """
    total = len(data) if size is None else size
    start = 3 if bytes(data[:3]) == BOM else 0
    head = bytes(data[start : start + HEADER_WINDOW])
    whole = total - start <= len(head)  # the header window holds the rest of the file
    lead = len(head) - len(head.lstrip(_BLANKS))
    line_no = head.count(b"\n", 0, lead) + 1
    if lead == len(head):
        if whole:
            what = "empty" if total == start else "whitespace only"
            raise InputFormatError(f"line 1: the file is {what}; expected a header 'N' or 'M K N'", line=1)
        raise InputFormatError(
            f"line {line_no}: no header in the first {HEADER_WINDOW} bytes (blank lines before the header are "
            f"skipped, up to that many)",
            line=line_no,
        )
    nl = head.find(b"\n", lead)
    if nl < 0:
        if not whole:  # the line goes on past the window: never a header
            raise _header_error(head[lead : lead + 60], line_no)
        line = head[lead:]
        body = start + len(head)
    else:
        line = head[lead:nl]
        body = start + nl + 1
    match = _HEADER_RE.fullmatch(line)
    if not match:
        raise _header_error(line, line_no)
    sizes = [_size(g, line_no) for g in match.groups() if g is not None]
    square = len(sizes) == 1
    m, k, n = sizes * 3 if square else sizes
    if m <= 0 or k <= 0 or n <= 0:
        raise _header_error(line, line_no)
    return Header(m=m, k=k, n=n, square=square, body_offset=body, line=line_no)


# ---------------------------------------------------------------------------
# an output's header

_OUT_HEADER_RE = re.compile(rb"([1-9][0-9]*)(?: ([1-9][0-9]*))?\n")


def output_header(data: bytes | memoryview) -> tuple[int, int, int]:
    """(m, n, offset of the first row) of an output; raises naming line 1."""
    head = bytes(data[:64])
    hm = _OUT_HEADER_RE.match(head)
    if hm is None or (hm.group(2) is not None and hm.group(1) == hm.group(2)):
        nl = head.find(b"\n")
        got = head if nl < 0 else head[:nl]
        raise InputFormatError(
            f"line 1, column 1: header must be 'N' or 'M N' (as mmd writes it), got '{shorten(got)}'",
            {"column": 1},
            line=1,
            value=shorten(got),
        )
    m = int(hm.group(1))
    n = m if hm.group(2) is None else int(hm.group(2))
    return m, n, hm.end()


# ---------------------------------------------------------------------------
# what the C parsers are given


def input_plausible(size: int, start: int, count: int) -> bool:
    """Whether a body of ``size - start`` bytes can hold ``count`` values (each takes two bytes at
    least, its separator included): one that cannot is refused before any buffer is made for it."""
    return count <= (size - start + 1) // 2 + 1


#: The least bytes of an output field: ``%6.2f`` pads to 6; values from 1000 on (or -100) take more.
FIELD_WIDTH = 6


def output_plausible(size: int, start: int, m: int, n: int) -> bool:
    """Whether an output body of ``size - start`` bytes can hold m rows of n 6-byte fields."""
    return (size - start) // m >= FIELD_WIDTH * n + 1


# ---------------------------------------------------------------------------
# values into plain buffers, by the C parsers (no numpy: --quick in mmd.check.jobs)


#: Buffers from this size on are mapped; smaller ones come from the heap, which reuses the memory that
#: earlier ones freed.
MAP_BUFFER_BYTES = 1 << 23


def buffer(size: int) -> mmap.mmap | bytearray:
    """``size`` bytes for values (zeros): mmd's big arrays of values, numpy's too
    (:mod:`mmd.textformat`), come from here.

    A big one is a fresh private mapping in small pages, asked for no huge pages: the kernel's
    answer to that advice is a gamble: fast where another process has just freed huge pages, many
    times slower where the kernel compacts memory to make them, while small pages cost the same
    every time (numpy asks for huge pages for its big arrays). A shared mapping (mmap's default) is
    shmem, slower still. A smaller one is heap memory, which the next job reuses: a folder of small
    jobs would otherwise map fresh pages for each."""
    if size < MAP_BUFFER_BYTES:
        return bytearray(size)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


@dataclass(frozen=True)
class Values:
    """Values a C parser put in a plain buffer: an output's float64 (``shape`` (m, n)), or an input's A
    then B (``shape`` (m, k, n)), float64 where ``wide`` (the float32 values), else float32."""

    buffer: mmap.mmap | bytearray
    shape: tuple[int, ...]
    wide: bool

    def view(self) -> memoryview[float]:
        """The values as a flat memoryview of float64 (``wide``) or float32."""
        return memoryview(self.buffer).cast("d" if self.wide else "f")


def output_values(data: memoryview) -> Values | None:
    """A well-formed output's values by the C parser; None where it is off, the body cannot hold its
    rows, or the output has a fault (mmd.textformat words it)."""
    ft = accel.text()
    m, n, start = output_header(data)
    if ft is None or not output_plausible(len(data), start, m, n):
        return None
    buf = buffer(8 * m * n)
    with memoryview(buf).cast("d") as view:
        fault = ft.parse_output_values(data, start, m, n, view, C_MIN_SPLIT, WORKERS)
    return Values(buf, (m, n), True) if fault is None else None


def output_ok(data: memoryview) -> bool:
    """Whether an output is well formed, by the C parser (on, see :func:`mmd.accel.text`), its values not
    kept; False where its body cannot hold its rows, or it has a fault (mmd.textformat words it)."""
    ft = accel.text()
    assert ft is not None, "the C parser is off: see mmd.accel.text"
    m, n, start = output_header(data)
    if not output_plausible(len(data), start, m, n):
        return False
    return ft.parse_output_values(data, start, m, n, None, C_MIN_SPLIT, WORKERS) is None


def input_values(data: memoryview, wide: bool) -> Values | None:
    """A valid input's A and B by the C parser (float64 where ``wide``, else float32); None where it
    is off, the body cannot hold the values, or the input is not valid (mmd.textformat words it)."""
    ft = accel.text()
    h = parse_header(data)
    count = h.m * h.k + h.k * h.n
    if ft is None or not input_plausible(len(data), h.body_offset, count):
        return None
    buf = buffer((8 if wide else 4) * count)
    with memoryview(buf).cast("d" if wide else "f") as view:
        status, _ = ft.parse_values(data, h.body_offset, view, None, C_MIN_SPLIT, WORKERS)
    return Values(buf, (h.m, h.k, h.n), wide) if status == 0 else None


def output_rows(
    data: memoryview, rows: int, on_fault: Callable[[], NoReturn]
) -> Iterator[tuple[int, memoryview[float], int]]:
    """An output's float64 values ``rows`` rows at a time by the C parser (on, see :func:`mmd.accel.text`):
    (first row, a flat view of the block's values, its rows). Every block lands in one buffer that
    the next one reuses (copy what must outlive a step), so a 4096 output is never held whole: its
    134 MB of fresh pages cost more than reading it into 16 MB again and again. A fault (in a block,
    or bytes after the last row) calls ``on_fault``, which raises the fault's error, once the block
    that holds it is reached (one past the last row: after the last block)."""
    ft = accel.text()
    assert ft is not None, "the C parser is off: see mmd.accel.text"
    m, n, off = output_header(data)
    step = max(1, min(rows, m))
    whole = memoryview(buffer(8 * step * n)).cast("d")  # not released: a caller's array may still use it
    for r0 in range(0, m, step):
        count = min(step, m - r0)
        block = whole[: count * n]
        off = ft.parse_output_rows(data, off, count, n, block, C_MIN_SPLIT, WORKERS)
        if off < 0:
            break
        yield r0, block, count
    if off != len(data):
        on_fault()


class _Block(Protocol):
    """A writable C-contiguous float64 buffer that knows its size (a numpy array, say)."""

    @property
    def nbytes(self) -> int: ...


_B = TypeVar("_B", bound=_Block)


class RowBlocks:
    """An output's rows in blocks of ``step``, any block read on any thread into a buffer of its own
    by the C parser (on, see :func:`mmd.accel.text`), one thread a block: mmd.check.product's workers read each
    block beside its own rows of the product (this is a :class:`mmd.check.product.Rows`), and the output
    is never held whole. Where every block begins and ends is found first (one newline search a
    row); a fault found then (rows missing, bytes after the last row) or in a block (:meth:`read`)
    calls ``on_fault``, which raises the fault's error."""

    def __init__(self, data: memoryview, step: int, on_fault: Callable[[], NoReturn]) -> None:
        ft = accel.text()
        assert ft is not None, "the C parser is off: see mmd.accel.text"
        m, n, off = output_header(data)
        assert m > 0 and n > 0 and step > 0, "an output with rows and columns, in blocks of rows"
        self.shape, self.step, self.data, self.on_fault, self._ft = (m, n), step, data, on_fault, ft
        starts = ft.row_blocks(data, off, m, n, step)
        if starts is None or starts[-1] != len(data):
            on_fault()
        self.starts = starts

    def read(self, r0: int, into: _B) -> _B:
        """Rows r0.. (r0 a block's first row), as many as ``into`` holds, into ``into``."""
        m, n = self.shape
        i, rows = r0 // self.step, into.nbytes // (8 * n)
        assert r0 % self.step == 0 and rows == min(self.step, m - r0), "one whole block"
        start, end = self.starts[i], self.starts[i + 1]
        if self._ft.parse_output_rows(self.data, start, rows, n, into, C_MIN_SPLIT, 1, end) != end:
            self.on_fault()
        return into


# ---------------------------------------------------------------------------
# a file's bytes

#: Files at least this big are mapped rather than read (no copy of the bytes).
MAP_BYTES = 1 << 20


#: What a file that is not a regular one is, by its ``stat.S_IFMT`` type.
_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def not_regular(path: Path, mode: int) -> NotRegularFile:
    """The error for ``path``, whose ``lstat`` mode is not a regular file's."""
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return NotRegularFile(f"{printable(path.name)} is {kind}: not opened", {"kind": kind})


def read_bytes(path: Path, follow: bool = True) -> bytes | mmap.mmap:
    """The bytes of a regular file; big ones mapped. Raises :class:`UnreadableError`.

    A mapped file must not shrink while it is read (that would end the
    process with SIGBUS); mmd writes its outputs by rename, never in place.

    ``follow=False`` is for files a student made: ``path`` is looked at with ``lstat`` and opened
    only if it is a regular file, never through a symbolic link (``O_NOFOLLOW``, so a link put in
    its place after the ``lstat`` is not followed either): a link to the grader's files, a FIFO or
    a device raises :class:`NotRegularFile`, no byte of it read (opening a device may act on it).
    """
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    if not follow:
        try:
            mode = os.lstat(path).st_mode
        except OSError as exc:
            raise UnreadableError(f"cannot read {printable(str(path))}: {exc.strerror}") from None
        if not stat.S_ISREG(mode):
            raise not_regular(path, mode)
        flags |= os.O_NOFOLLOW
    try:
        # O_NONBLOCK: a FIFO named like an output must not hang the check
        fd = os.open(path, flags)
    except OSError as exc:
        if not follow and exc.errno == errno.ELOOP:  # made a link since the lstat
            raise not_regular(path, stat.S_IFLNK) from None
        raise UnreadableError(f"cannot read {printable(str(path))}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            if not follow:
                raise not_regular(path, info.st_mode)
            raise UnreadableError(f"cannot read {printable(str(path))}: not a regular file")
        if info.st_size >= MAP_BYTES:
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            return mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise UnreadableError(f"cannot read {printable(str(path))}: {exc.strerror}") from None
    finally:
        os.close(fd)


#: Bytes compared at a time where the C accelerators are off.
COMPARE_BYTES = 1 << 20


def same_bytes(x: memoryview, y: memoryview) -> bool:
    """Whether two buffers hold the same bytes (one memcmp, without the GIL, by the C accelerator
    where it is on; else a block at a time, stopping at the first that differs)."""
    if len(x) != len(y):
        return False
    ft = accel.text()
    if ft is not None:
        return ft.same_bytes(x, y)
    # as bytes, a block at a time: memoryviews compare item by item, which is slower
    step = COMPARE_BYTES
    return all(x[i : i + step].tobytes() == y[i : i + step].tobytes() for i in range(0, len(x), step))
