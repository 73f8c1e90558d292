"""An mmd output file read back (``mmd check``): strictly, the exact bytes :func:`mmd.textformat.emit` writes
for some finite values, else the first fault's line and column.

Both paths, mmd._fasttext's one pass and the Python one here (the fallback where the accelerator is off, and
the oracle the tests hold it to), accept the same files, give the same float64 values (the double nearest
each printed decimal) and name the same first fault: its line, its column and one of :data:`OUTPUT_FAULTS`,
worded by one function. See docs/textformat.md.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from . import accel, textcore
from .errors import InputFormatError
from .textcore import C_MIN_SPLIT, WORKERS, output_header, output_plausible, shorten
from .textformat import FLOAT32_DIGITS, values_array

_OUT_FIELD_RE = re.compile(rb"( *)(-?(?:0|[1-9][0-9]*)\.[0-9][0-9])")
_NL_RE = re.compile(rb"\n")
#: Digits before the point of a field that is read as hundredths: |x|·100 stays below 10^15 < 2^53, so its
#: value is one correctly rounded division of exact operands (mmd._fasttext's fast reads). A wider field
#: is printf's of a float32 integer (every float32 from 2^24 on is one), read whole and held to that.
HUNDREDTHS_DIGITS = 13
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _float32_field(core: bytes) -> bool:
    """Whether ``core`` (a field without its padding, more than :data:`HUNDREDTHS_DIGITS` digits before the
    point) is printf's of a float32: an integer (".00"), a float32 exactly, and its exact decimal."""
    digits = core[:-3]
    if len(digits.lstrip(b"-")) > FLOAT32_DIGITS or core[-3:] != b".00":
        return False
    v = float(digits)  # correctly rounded
    if abs(v) > _FLOAT32_MAX or struct.unpack("f", struct.pack("f", v))[0] != v:
        return False
    return b"%.0f" % v == digits  # the decimal is that value's own, digit for digit


#: Fault kinds, numbered as mmd._fasttext numbers them (0 is "no fault").
OUTPUT_FAULTS: tuple[str, ...] = ("", "field", "width", "large", "count", "newline", "extra", "rows")


@dataclass(frozen=True)
class OutputFault:
    """The first place where an output file is not what mmd writes."""

    kind: str  # one of OUTPUT_FAULTS
    line: int  # 1-based
    line_start: int  # byte offset of that line
    pos: int  # byte offset of the fault
    count: int  # fields found (count), field bytes (width, large), values read (rows)


def _line_bytes(data: bytes | memoryview, start: int) -> bytes:
    """The bytes from ``start`` to the end of its line (without the newline)."""
    nl = _NL_RE.search(data, start)
    return bytes(data[start : len(data) if nl is None else nl.start()])


def _fault_error(data: bytes | memoryview, f: OutputFault, m: int, n: int) -> InputFormatError:
    """The one-line error for fault ``f``: ``line L, column C: reason``."""
    raw = bytes(data[f.pos : f.pos + 64])
    value: bytes | None = None
    if f.kind == "field":
        value = _line_bytes(data, f.pos)[:12]
        reason = f"field '{shorten(value)}' is not in %6.2f format"
    elif f.kind == "width":
        value = raw[: f.count]
        reason = f"field '{shorten(value)}' is not in %6.2f format (width)"
    elif f.kind == "large":
        value = raw[: f.count]
        reason = f"value '{shorten(value)}' is not a float32 as printf writes it"
    elif f.kind == "count":
        reason = f"expected {n} fields, found {f.count}"
    elif f.kind == "newline":
        reason = "missing final newline"
    elif f.kind == "extra":
        value = _line_bytes(data, f.line_start)[:40]
        reason = f"unexpected content after the last of {m} rows"
    elif f.kind == "rows":
        reason = f"expected {m} rows of {n} fields, found {f.count} values"
    else:  # pragma: no cover - a kind without words is a bug
        raise AssertionError(f"unknown output fault {f.kind!r}")
    column = f.pos - f.line_start + 1
    shown = None if value is None else shorten(value)
    return InputFormatError(f"line {f.line}, column {column}: {reason}", {"column": column}, line=f.line, value=shown)


def output_shape(data: bytes | memoryview) -> tuple[int, int]:
    """(m, n) from an output's header line, its rows unread; raises :class:`InputFormatError` as
    :func:`parse_output` would for that line."""
    m, n, _ = output_header(data)
    return m, n


def parse_output(data: bytes | memoryview) -> np.ndarray:
    """Read an mmd output file strictly; returns float64 m×n.

    Anything but the exact bytes :func:`emit` would write (for some finite
    values; a field wider than :data:`HUNDREDTHS_DIGITS` digits before the
    point must be printf's of a float32) raises :class:`InputFormatError`
    naming the first fault's line and column (``details["column"]``).
    """
    vals = _read_output(data, values=True)
    assert vals is not None
    return vals


def check_output(data: bytes | memoryview) -> tuple[int, int]:
    """:func:`parse_output`'s check alone: (m, n) of a well-formed output, its values not kept (the C
    path then allocates nothing); raises as :func:`parse_output` does."""
    _read_output(data, values=False)
    return output_shape(data)


def _read_output(data: bytes | memoryview, values: bool) -> np.ndarray | None:
    m, n, start = output_header(data)
    ft = accel.text()
    if ft is not None:
        # A body shorter than m rows of n 6-byte fields cannot pass: no array for it.
        plausible = output_plausible(len(data), start, m, n)
        out = values_array(m * n, np.float64).reshape(m, n) if plausible and values else None
        got = ft.parse_output_values(data, start, m, n, out, C_MIN_SPLIT, WORKERS)
        if got is None and (out is not None or not values):
            return out
        if got is None:  # pragma: no cover - a body that passes is never short
            raise AssertionError("an implausibly short output passed")
        kind, line, line_start, pos, count = got
        raise _fault_error(data, OutputFault(OUTPUT_FAULTS[kind], line, line_start, pos, count), m, n)
    vals, fault = _python_output(data, start, m, n)
    if fault is not None:
        raise _fault_error(data, fault, m, n)
    return np.array(vals, dtype=np.float64).reshape(m, n)


def output_blocks(data: bytes | memoryview, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """An output's values ``rows`` rows at a time: (first row, those rows' float64 values), in order.

    By the C parser, a block at a time into one buffer that the next block reuses
    (:func:`mmd.textcore.output_rows`: copy what must outlive a step); any fault raises as
    :func:`parse_output` does, naming the file's first fault, once the block that holds it is
    reached. Without the C accelerator, or with ``rows`` >= m, the output is read whole and handed
    out in blocks.
    """
    m, n, _ = output_header(data)
    step = max(1, rows)
    if accel.text() is None or step >= m:
        whole = parse_output(data)
        for r0 in range(0, m, step):
            yield r0, whole[r0 : r0 + step]
        return
    for r0, block, count in textcore.output_rows(memoryview(data), step, lambda: raise_output_fault(data)):
        yield r0, np.frombuffer(block.cast("B"), np.float64).reshape(count, n)


def raise_output_fault(data: bytes | memoryview) -> NoReturn:
    """Raise the first fault of an output that a read a block at a time refused (as :func:`check_output`)."""
    check_output(data)
    raise AssertionError("an output a block refused passed whole")  # pragma: no cover


def _python_output(data: bytes | memoryview, start: int, m: int, n: int) -> tuple[list[float], OutputFault | None]:
    """Values and first fault of an output body by the Python rules, a line at a time."""
    size = len(data)
    if start >= size:
        return [], OutputFault("rows", 1, 0, start - 1, 0)
    vals: list[float] = []
    ls, lineno, last = start, 2, start
    while ls < size:
        fault = _line_fault(data, ls, lineno, m, n)
        if fault is not None:
            return [], fault
        raw = _line_bytes(data, ls)
        vals.extend(float(core) for _, core in _OUT_FIELD_RE.findall(raw))
        last, ls, lineno = ls, ls + len(raw) + 1, lineno + 1
    if lineno - 2 < m:  # every line read is right: the file ends early
        return [], OutputFault("rows", lineno - 1, last, size - 1, len(vals))
    return vals, None


def _line_fault(data: bytes | memoryview, ls: int, lineno: int, m: int, n: int) -> OutputFault | None:
    """The first fault of the line at byte ``ls`` (the field rules of mmd._fasttext), or None."""
    if lineno > m + 1:
        return OutputFault("extra", lineno, ls, ls, 0)
    raw = _line_bytes(data, ls)
    has_nl = ls + len(raw) < len(data)
    pos = 0
    count = 0
    extra = None
    while pos < len(raw):
        mt = _OUT_FIELD_RE.match(raw, pos)
        if mt is None:
            return OutputFault("field", lineno, ls, ls + pos, 0)
        spaces, core = mt.group(1), mt.group(2)
        if len(spaces) != max(0, 6 - len(core)):
            return OutputFault("width", lineno, ls, ls + pos, mt.end() - pos)
        if len(core.lstrip(b"-")) - 3 > HUNDREDTHS_DIGITS and not _float32_field(core):
            return OutputFault("large", lineno, ls, ls + pos, mt.end() - pos)
        if count == n:
            extra = pos
        count += 1
        pos = mt.end()
    if count != n:
        return OutputFault("count", lineno, ls, ls + (len(raw) if extra is None else extra), count)
    if not has_nl:
        return OutputFault("newline", lineno, ls, ls + len(raw), 0)
    return None
