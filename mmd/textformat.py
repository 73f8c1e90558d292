"""The matrix text format: parse and byte-exact ``%6.2f`` emit.

Pure functions over bytes: no file I/O, no printing.

Input::

    [UTF-8 BOM] [blank lines] N | M K N   (the header line, positive integers)
    M*K values of A, then K*N of B   (any spaces, tabs, CR, LF between)

Output::

    N | M N
    m lines of n fields, each printf("%6.2f"), nothing between them, '\\n' after each

Two paths, one switch (:mod:`mmd.accel`): the C accelerator (``mmd._fasttext``), which reads a body
in up to :data:`WORKERS` parts at once and emits rows on a pool of as many threads; and the exact
pure-Python path (Python's ``float()`` and ``'%6.2f' %``), the fallback where the accelerator is
off and the oracle the tests hold it to. Both accept the same files, give the same values and
bytes, and word the same first fault: a file the C parser refuses is read again by the Python path,
which words the error. An output read back (``mmd check``) is :mod:`mmd.textoutput`'s. See
docs/textformat.md.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import accel, textcore
from .errors import InputFormatError, ProductRangeError
from .textcore import (
    C_MIN_SPLIT,
    WORKERS,
    Header,
    input_plausible,
    parse_header,
    shorten,
)

__all__ = [
    "Header",
    "Matrices",
    "parse_header",
    "parse",
    "emit",
    "emit_chunks",
    "emit_input_chunks",
    "output_bytes_at_least",
    "output_bytes",
    "OutputSize",
    "check_product",
    "format_reference",
    "parse_reference",
]

#: Elements per emit chunk (rows are never split).
EMIT_CHUNK_ELEMS = 1 << 16


@dataclass(frozen=True)
class Matrices:
    """A parsed input: A (m×k) and B (k×n), float32, C-contiguous."""

    header: Header
    a: np.ndarray
    b: np.ndarray


# ---------------------------------------------------------------------------
# helpers


def _line_at(data: bytes | memoryview, offset: int) -> int:
    """1-based line number of byte ``offset`` (counts '\\n' before it)."""
    offset = max(0, min(offset, len(data)))
    return bytes(memoryview(data)[:offset]).count(b"\n") + 1


def _last_line(data: bytes | memoryview) -> int:
    """Line number of the last line of ``data`` (a final '\\n' ends it, it starts none)."""
    size = len(data)
    if size == 0:
        return 1
    end = size - 1 if memoryview(data)[size - 1] == 10 else size
    return _line_at(data, end)


def _ordered_map(fn: Callable[[Any], Any], items: Iterable[Any], workers: int | None = None) -> Iterator[Any]:
    """``map`` on a small thread pool, results in order, at most 2*workers in flight."""
    items = list(items)
    workers = WORKERS if workers is None else workers
    if workers <= 1 or len(items) <= 1:
        for it in items:
            yield fn(it)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending = []
        it = iter(items)
        for item in it:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * workers:
                break
        try:
            while pending:
                fut = pending.pop(0)
                res = fut.result()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.submit(fn, nxt))
                yield res
        finally:
            for fut in pending:
                fut.cancel()


# ---------------------------------------------------------------------------
# value parsing: slow exact path

_NUM_RE = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_FIELDS_RE = re.compile(rb"(?:[+-]?[0-9]+\.[0-9][0-9])+")
_FIELD_RE = re.compile(rb"[+-]?[0-9]+\.[0-9][0-9]")
#: The least magnitude that float32 rounds to infinity: halfway from its largest value to 2^128.
_F32_OVERFLOW = 2.0**128 - 2.0**103
_RUN_RE = re.compile(rb"[^ \t\r\n]+")


def _run_values(run: bytes) -> list[float] | str:
    """Values (as Python floats) of one whitespace-delimited run, or an error reason."""
    if _NUM_RE.fullmatch(run):
        return [float(run)]
    if _FIELDS_RE.fullmatch(run):
        return [float(f) for f in _FIELD_RE.findall(run)]
    return "is not a number"


def _too_big(v: float) -> bool:
    """Whether float32 holds no value for ``v`` (it rounds to infinity)."""
    return abs(v) >= _F32_OVERFLOW


def run_values(run: bytes) -> list[float] | None:
    """The values of one whitespace-delimited run by the exact host rule; None when the run is refused.

    The GPU text path hands the runs its kernels cannot convert exactly to this.
    """
    vals = _run_values(run)
    if isinstance(vals, str) or any(_too_big(v) for v in vals):
        return None
    return vals


def _range_error(data: bytes | memoryview, offset: int, raw: bytes) -> InputFormatError:
    line = _line_at(data, offset)
    shown = shorten(raw)
    return InputFormatError(f"line {line}: '{shown}' is outside float32 range", line=line, value=shown)


def _slow_run(data: bytes | memoryview, offset: int, run: bytes) -> list[float]:
    vals = _run_values(run)
    if isinstance(vals, str):
        line = _line_at(data, offset)
        shown = shorten(run)
        raise InputFormatError(f"line {line}: '{shown}' {vals}", line=line, value=shown)
    for v in vals:
        if _too_big(v):
            raise _range_error(data, offset, run)
    return vals


def _python_values(data: bytes | memoryview, start: int, expected: int, what: str) -> list[float]:
    """Exactly ``expected`` values of data[start:] by the exact Python rule, run by run; raises the
    first fault (in the file's order) naming its line."""
    vals: list[float] = []
    for mt in _RUN_RE.finditer(data, start):
        got = _slow_run(data, mt.start(), mt.group())
        if len(vals) + len(got) > expected:
            line = _line_at(data, mt.start())
            shown = shorten(mt.group())
            raise InputFormatError(
                f"too many values: expected {what}, found more; the first extra value '{shown}' is on line {line}",
                line=line,
                value=shown,
            )
        vals.extend(got)
    if len(vals) != expected:
        line = _last_line(data)
        raise InputFormatError(f"line {line}: expected {what}, found {len(vals)}", line=line)
    return vals


def _run_start(data: bytes | memoryview, pos: int) -> int:
    """Where the whitespace-delimited run that holds byte ``pos`` starts."""
    view = memoryview(data)
    while pos > 0 and view[pos - 1] not in b" \t\r\n":
        pos -= 1
    return pos


def _word_c_refusal(data: bytes | memoryview, start: int, out: np.ndarray, status: int, pos: int) -> None:
    """Raise the fault of the run the C parser refused at ``pos`` (status 1: not a number, 4: outside
    float32; the first such run in the file), worded by the Python rule, where no fault comes before
    it: the C parser reads the bytes before that run again (into ``out``) and finds no more values
    than ``expected`` there. Return where it cannot say (a count's fault, or too many values before
    the run): the Python path then reads the whole body."""
    if status not in (1, 4) or not 0 <= pos < len(data):
        return
    rs = _run_start(data, pos)
    ft = accel.text()
    assert ft is not None, "only after the C parser refused"
    before, _ = ft.parse_values(memoryview(data)[:rs], start, out, None, C_MIN_SPLIT, WORKERS)
    mt = _RUN_RE.match(data, rs)
    if before in (0, 2) and mt is not None:  # exactly as many values before it, or fewer
        _slow_run(data, rs, mt.group())


def values_array(count: int, dtype: Any) -> np.ndarray:
    """An array for ``count`` values (a file's, a product's block; its contents undefined): a big one
    over :func:`mmd.textcore.buffer`'s memory (zeros), as numpy's own would ask the kernel for huge
    pages (see there); a smaller one numpy's, heap memory that the next job reuses, where fresh mapped
    memory for every array would cost a folder of small outputs a page fault per page each time."""
    dt = np.dtype(dtype)
    if count * dt.itemsize < textcore.MAP_BUFFER_BYTES:
        return np.empty(count, dt)
    return np.frombuffer(textcore.buffer(count * dt.itemsize), dt)


def _parse_values(
    data: bytes | memoryview,
    start: int,
    expected: int,
    what: str,
    out: np.ndarray | None = None,
    dtype: Any = np.float32,
) -> np.ndarray:
    """Parse exactly ``expected`` float32 values from data[start:] (into ``out``, else a new array of
    ``dtype``: float32, or float64 holding the float32 values); raise naming lines otherwise."""
    plausible = input_plausible(len(data), start, expected)
    if out is None or not plausible:
        out = values_array(expected if plausible else 0, dtype if out is None else out.dtype)
    ft = accel.text()
    if ft is not None and plausible:
        status, pos = ft.parse_values(data, start, out, None, C_MIN_SPLIT, WORKERS)
        if status == 0:
            return out
        _word_c_refusal(data, start, out, status, pos)
    vals = _python_values(data, start, expected, what)
    out[:] = np.array(vals, dtype=np.float64)  # float64 first: float32 rounds each value once
    return out


def parse(
    data: bytes | memoryview, header: Header | None = None, out: np.ndarray | None = None, dtype: Any = np.float32
) -> Matrices:
    """Parse a whole input file into float32 A and B; raises :class:`InputFormatError`.

    ``out``, a C-contiguous float32 array of m*k + k*n elements (a backend's
    page-locked memory, say), receives the values; A and B are views of it.
    ``dtype=np.float64`` gives A and B as float64 arrays of the same float32
    values: what a float64 reference product reads, with no conversion pass
    and no float32 copy (mmd check).
    """
    if header is None:
        header = parse_header(data)
    m, k, n = header.m, header.k, header.n
    na, nb = m * k, k * n
    what = f"{na + nb} values ({na} for A, {nb} for B)"
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, not {np.dtype(dtype)}")
    if out is not None and (out.dtype != np.float32 or out.size != na + nb or not out.flags.c_contiguous):
        raise ValueError(f"out must be a C-contiguous float32 array of {na + nb} elements")
    vals = _parse_values(
        data, header.body_offset, na + nb, what, out=None if out is None else out.reshape(-1), dtype=dtype
    )
    a = vals[:na].reshape(m, k)
    b = vals[na:].reshape(k, n)
    return Matrices(header=header, a=a, b=b)


# ---------------------------------------------------------------------------
# the exact Python path as a whole (the tests' oracle)


def format_reference(c: np.ndarray) -> bytes:
    """Output file bytes with Python's ``'%6.2f' % float(x)`` per element."""
    c = _check_2d(c)
    return _header_line(*c.shape) + _python_rows(c)


def parse_reference(data: bytes | memoryview) -> Matrices:
    """A whole input by the exact Python path alone (float32 A and B)."""
    header = parse_header(data)
    m, k, n = header.m, header.k, header.n
    what = f"{m * k + k * n} values ({m * k} for A, {k * n} for B)"
    vals = np.array(_python_values(data, header.body_offset, m * k + k * n, what), dtype=np.float64).astype(np.float32)
    return Matrices(header=header, a=vals[: m * k].reshape(m, k).copy(), b=vals[m * k :].reshape(k, n).copy())


# ---------------------------------------------------------------------------
# emit


def _python_rows(c: np.ndarray) -> bytes:
    """Bytes of the rows of 2-D ``c`` by Python's ``'%6.2f'`` (each row ends with '\\n')."""
    with np.errstate(invalid="ignore"):  # a signalling NaN converts to a quiet one, as printf shows it
        rows = c.astype(np.float64).tolist()
    return "".join("".join("%6.2f" % x for x in row) + "\n" for row in rows).encode("ascii")


def _c_rows(c: np.ndarray) -> bytes | None:
    """Bytes of the rows of 2-D ``c`` by mmd._fasttext, where it is on and ``c`` is float32 or float16
    (which convert to float32 exactly); else None."""
    ft = accel.text()
    if ft is None or c.dtype.kind != "f" or c.dtype.itemsize > 4:
        return None
    block = np.ascontiguousarray(c, dtype=np.float32)
    return ft.format_rows(block, block.shape[0], block.shape[1])


def _emit_rows(c: np.ndarray) -> bytes:
    got = _c_rows(c)
    return _python_rows(c) if got is None else got


def _header_line(m: int, n: int) -> bytes:
    return (b"%d\n" % n) if m == n else (b"%d %d\n" % (m, n))


def output_bytes_at_least(m: int, n: int) -> int:
    """The size of the smallest output an ``m`` × ``n`` product makes: its header line, then m rows of n
    fields of :data:`~mmd.textcore.FIELD_WIDTH` bytes and a newline (wider values only add to it)."""
    return len(_header_line(m, n)) + m * (textcore.FIELD_WIDTH * n + 1)


def _row_blocks(m: int, n: int, rows_per_chunk: int | None) -> list[tuple[int, int]]:
    step = rows_per_chunk if rows_per_chunk and rows_per_chunk > 0 else max(1, EMIT_CHUNK_ELEMS // max(1, n))
    return [(i, min(m, i + step)) for i in range(0, m, step)]


def _check_2d(c: np.ndarray) -> np.ndarray:
    c = np.asarray(c)
    if c.ndim != 2:
        raise ValueError(f"emit needs a 2-D matrix, got shape {c.shape}")
    return c


def emit_chunks(c: np.ndarray, rows_per_chunk: int | None = None) -> Iterator[bytes]:
    """The bytes of :func:`emit` in pieces: the header line, then blocks of rows (one piece in all where the rows
    are one block: a small output is then one write)."""
    c = _check_2d(c)
    m, n = c.shape
    blocks = _row_blocks(m, n, rows_per_chunk)
    if len(blocks) == 1:
        yield _header_line(m, n) + _emit_rows(c)
        return
    yield _header_line(m, n)
    yield from _ordered_map(lambda bd: _emit_rows(c[bd[0] : bd[1]]), blocks)


def emit(c: np.ndarray) -> bytes:
    """The full output file for matrix ``c``: header line, then ``%6.2f`` rows."""
    return b"".join(emit_chunks(c))


# ---------------------------------------------------------------------------
# input files (mmd gen)


def emit_input_chunks(a: np.ndarray, b: np.ndarray, square: bool, rows_per_chunk: int | None = None) -> Iterator[bytes]:
    """An input file for ``a`` and ``b`` in pieces: header, then A's rows, then B's rows.

    The header is ``N`` when ``square`` (A and B are N×N), else ``M K N``;
    each value is ``'%.2f' % float(x)``, one space between values, one
    matrix row per line. float32 (and float16) go through mmd._fasttext
    where it is on (:mod:`mmd.accel`); anything else through Python's
    own ``%`` formatting, which gives the same bytes.
    """
    a, b = _check_2d(a), _check_2d(b)
    m, k = a.shape
    if b.shape[0] != k or (square and not m == k == b.shape[1]):
        raise ValueError(f"A is {m}x{k} and B is {b.shape[0]}x{b.shape[1]}: not an input{' of N×N' if square else ''}")
    yield (b"%d\n" % m) if square else (b"%d %d %d\n" % (m, k, b.shape[1]))
    for mat in (a, b):
        blocks = _row_blocks(mat.shape[0], mat.shape[1], rows_per_chunk)
        yield from _ordered_map(functools.partial(_input_block, mat), blocks)


def _input_block(mat: np.ndarray, bounds: tuple[int, int]) -> bytes:
    block = mat[bounds[0] : bounds[1]]
    ft = accel.text()
    if ft is not None and block.dtype.kind == "f" and block.dtype.itemsize <= 4:
        block = np.ascontiguousarray(block, dtype=np.float32)
        return ft.format_input_rows(block, block.shape[0], block.shape[1])
    fmt = " ".join(["%.2f"] * block.shape[1]) + "\n"
    with np.errstate(invalid="ignore"):  # a signalling NaN converts to a quiet one, as printf shows it
        rows = block.astype(np.float64).tolist()
    return "".join(fmt % tuple(row) for row in rows).encode()


# ---------------------------------------------------------------------------
# an output's size (reading an output back is mmd.textoutput's)

#: Digits before the point of the widest field printf writes for a float32: FLT_MAX's,
#: 340282346638528859811704183484516925440.
FLOAT32_DIGITS = 39
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _field_width(x: float) -> int:
    return len("%6.2f" % x)


def check_product(c: np.ndarray) -> OutputSize:
    """Raise :class:`ProductRangeError` where the product ``c`` holds a value that is not finite: printf
    writes ``inf`` or ``nan`` for it, no number, so the job is refused rather than served. Else the size
    of its output, bounded from the same two reductions (its widest field is the largest value's or the
    least one's). No copy; the count and the first place only on refusal."""
    m, n = c.shape
    if c.size == 0:
        return OutputSize(output_bytes_at_least(m, n), c)
    hi, lo = float(c.max()), float(c.min())
    if math.isfinite(hi) and math.isfinite(lo):  # NaN makes both NaN
        widest = max(_field_width(hi), _field_width(lo))
        return OutputSize(len(_header_line(m, n)) + m * (widest * n + 1), c)
    bad = ~np.isfinite(c)
    first = int(np.argmax(bad))
    row, col = divmod(first, n)
    value = float(c.flat[first])
    raise ProductRangeError(
        f"the product holds values that are not finite, which the output format has no number for: "
        f"{int(bad.sum())} of {c.size} (first at row {row + 1}, col {col + 1}: {value:.6g})",
        {"count": int(bad.sum()), "row": row + 1, "column": col + 1},
    )


@functools.cache
def _width_steps() -> np.ndarray:
    """The least float32 magnitude whose field has each number of digits before the point from 2 to
    :data:`FLOAT32_DIGITS` (the field's width grows with the magnitude): a binary search over the
    positive float32 bit patterns, which are ordered as their values, by Python's ``'%.2f'``."""
    steps = []
    top = int(np.float32(_FLOAT32_MAX).view(np.uint32))
    for digits in range(2, FLOAT32_DIGITS + 1):
        lo, hi = 0, top  # the field of bits ``hi`` has that many digits at least
        while lo < hi:
            mid = (lo + hi) // 2
            if len("%.2f" % float(np.uint32(mid).view(np.float32))) - 3 >= digits:
                hi = mid
            else:
                lo = mid + 1
        steps.append(np.uint32(lo).view(np.float32))
    return np.array(steps, np.float32)


def output_bytes(c: np.ndarray) -> int:
    """The exact size of :func:`emit`'s output of the finite float32 (or float16) product ``c``: its header
    line, then per field 6 bytes and what its digits and sign take beyond them, a newline a row. A pass
    over every value, a block of rows at a time (the text paths ask only where :func:`check_product`'s
    bound is over a limit)."""
    c = _check_2d(c)
    if c.dtype.kind != "f" or c.dtype.itemsize > 4:
        raise ValueError(f"output_bytes needs float32 or float16 values, not {c.dtype}")
    m, n = c.shape
    steps = _width_steps()
    extra = 0
    for r0, r1 in _row_blocks(m, n, None):
        block = np.asarray(c[r0:r1], np.float32)
        digits = np.searchsorted(steps, np.abs(block), side="right") + 1
        extra += int(np.maximum(digits + np.signbit(block) - 3, 0).sum())
    return output_bytes_at_least(m, n) + extra


@dataclass(frozen=True)
class OutputSize:
    """How big a product's output is, known before a byte of it is written: at most :attr:`at_most` (every
    field as wide as its widest), exactly :meth:`exact`."""

    at_most: int
    #: The product whose output it is; None where the output is made and its size known (``at_most``).
    product: np.ndarray | None = None

    def exact(self) -> int:
        """The output's exact size: :func:`output_bytes`, a pass over the product, where it is not known."""
        return self.at_most if self.product is None else output_bytes(self.product)
