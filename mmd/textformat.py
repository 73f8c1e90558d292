"""The matrix text format: fast vectorized parse and byte-exact ``%6.2f`` emit.

Pure functions over bytes: no file I/O, no printing.

Input::

    [UTF-8 BOM] [blank lines] N | M K N   (the header line, positive integers)
    M*K values of A, then K*N of B   (any spaces, tabs, CR, LF between)

Output::

    N | M N
    m lines of n fields, each printf("%6.2f"), nothing between them, '\\n' after each

The C accelerator (``mmd._fasttext``) reads a body in up to :data:`WORKERS`
parts at once. Without it, the numpy paths work on ``np.frombuffer(data, uint8)``
in chunks (split at whitespace) on a pool of :data:`WORKERS` threads (numpy
releases the GIL).
Anything the vectorized code cannot convert exactly goes to a slow path that
uses Python's ``float()`` / ``'%6.2f' %``, so results are always exact.
See docs/textformat.md.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn

import numpy as np

from . import textcore
from .errors import InputFormatError, ProductRangeError
from .textcore import (
    C_MIN_SPLIT,
    WORKERS,
    Header,
    input_plausible,
    output_header,
    output_plausible,
    parse_header,
    shorten,
)

#: The C accelerator, where it is built (tests put a wrapper in its place that splits every parse).
_fasttext: ModuleType | None = textcore.fasttext

__all__ = [
    "Header",
    "Matrices",
    "parse_header",
    "parse",
    "emit",
    "emit_chunks",
    "emit_input_chunks",
    "parse_output",
    "check_output",
    "output_blocks",
    "raise_output_fault",
    "output_shape",
    "output_bytes_at_least",
    "OutputFault",
    "format_reference",
    "parse_reference",
]

#: Bytes per parse chunk (cut at the next whitespace byte).
PARSE_CHUNK = 1 << 18
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


def _as_u8(data: bytes | bytearray | memoryview) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def _line_at(data: bytes | memoryview, offset: int) -> int:
    """1-based line number of byte ``offset`` (counts '\\n' before it)."""
    offset = max(0, min(offset, len(data)))
    return int(np.count_nonzero(_as_u8(data)[:offset] == 10)) + 1


def _last_line(data: bytes | memoryview) -> int:
    """Line number of the last line of ``data`` (a final '\\n' ends it, it starts none)."""
    size = len(data)
    if size == 0:
        return 1
    end = size - 1 if _as_u8(data)[size - 1] == 10 else size
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
_F32_MAX = float(np.finfo(np.float32).max)


def _run_values(run: bytes) -> list[float] | str:
    """Values (as Python floats) of one whitespace-delimited run, or an error reason."""
    if _NUM_RE.fullmatch(run):
        return [float(run)]
    if _FIELDS_RE.fullmatch(run):
        return [float(f) for f in _FIELD_RE.findall(run)]
    return "is not a number"


def _too_big(v: float) -> bool:
    with np.errstate(over="ignore"):
        return bool(np.isinf(np.float32(v)))


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


# ---------------------------------------------------------------------------
# value parsing: vectorized fast path

# byte classes: 0 whitespace, 1 digit, 2 '.', 3 sign, 4 anything else
_CLS = np.full(256, 4, dtype=np.uint8)
for _c in b" \t\r\n":
    _CLS[_c] = 0
_CLS[ord("0") : ord("9") + 1] = 1
_CLS[ord(".")] = 2
_CLS[ord("+")] = 3
_CLS[ord("-")] = 3
_DIG = np.zeros(256, dtype=np.uint8)
_DIG[ord("0") : ord("9") + 1] = np.arange(10, dtype=np.uint8)
_P10F = np.array([10.0**i for i in range(23)], dtype=np.float64)
_MAXE = 22
_TWO53 = float(2**53)
_WS_RE = re.compile(rb"[ \t\r\n]")


def _chunk_bounds(data: bytes | memoryview, start: int, stop: int, size: int) -> list[tuple[int, int]]:
    """Split [start, stop) into pieces of about ``size`` bytes, cut at whitespace."""
    out = []
    pos = start
    while pos < stop:
        cut = pos + size
        if cut >= stop:
            out.append((pos, stop))
            break
        m = _WS_RE.search(data, cut, stop)
        end = stop if m is None else m.start() + 1
        out.append((pos, end))
        pos = end
    return out


def _scan(b: np.ndarray, want_offsets: bool = False):
    """Parse one chunk of body bytes (starting and ending at token boundaries).

    Returns ``(values float64, bad_runs, offsets)`` where bad_runs is a list of
    ``(run_start, run_end, first_token, last_token_excl)`` for runs the fast path
    could not take (their token values are placeholders), and offsets (only when
    asked) is the chunk-relative byte offset of each token.
    """
    n = b.size
    cls = _CLS.take(b)
    tok = cls != 0
    d = np.diff(tok.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    rstarts = np.flatnonzero(d == 1)
    if rstarts.size == 0:
        return np.empty(0, np.float64), [], np.empty(0, np.int64)
    rends = np.flatnonzero(d == -1)
    del d
    isdot = cls == 2
    issign = cls == 3
    # signs not at the start of a run, other bytes: runs needing care
    inner_sign = issign.copy()
    inner_sign[rstarts] = False
    ndots_run = np.add.reduceat(isdot, rstarts, dtype=np.int32)
    has_inner = bool(inner_sign.any())
    if has_inner or bool((ndots_run >= 2).any()):
        # touching %6.2f fields: split candidates right after each '.dd'
        multi = (ndots_run >= 2).astype(np.uint8)
        if has_inner:
            spos = np.flatnonzero(inner_sign)
            multi[np.searchsorted(rstarts, spos, side="right") - 1] = 1
        seg = np.diff(rstarts, append=n)
        mflag = np.zeros(n, dtype=bool)
        mflag[rstarts[0] :] = np.repeat(multi.view(bool), seg)
        cand = np.zeros(n, dtype=bool)
        # position i is a split point when bytes i-3..i are in one token and b[i-3] == '.'
        cand[3:] = isdot[:-3] & tok[1:-2] & tok[2:-1] & tok[3:]
        cand &= mflag
        st = np.zeros(n + 1, dtype=bool)
        st[rstarts] = True
        st[:n] |= cand
        tstarts = np.flatnonzero(st)
        en = np.zeros(n + 1, dtype=bool)
        en[rends] = True
        en[:n] |= cand  # a split at i ends the previous token at i
        tends = np.flatnonzero(en)
        split_tok = None  # computed below
        ndots = np.add.reduceat(isdot, tstarts, dtype=np.int32)
        # which tokens come from a run that was split (need exact '.dd' shape)
        run_of_tok = np.searchsorted(rstarts, tstarts, side="right") - 1
        pieces = np.bincount(run_of_tok, minlength=rstarts.size)
        split_tok = pieces[run_of_tok] >= 2
        del mflag, cand, st, en
    else:
        tstarts, tends = rstarts, rends
        ndots = ndots_run
        split_tok = None
    T = tstarts.size
    isd = cls == 1
    cd = np.cumsum(isd, dtype=np.int32)
    dend = cd[tends - 1]
    ndig = dend - (cd[tstarts] - isd[tstarts])
    seg = np.diff(tstarts, append=n)
    t0 = int(tstarts[0])
    e = np.repeat(dend, seg)
    e -= cd[t0:]
    np.minimum(e, _MAXE, out=e)
    w = _P10F.take(e)
    del e
    w *= _DIG.take(b[t0:])
    mant = np.add.reduceat(w, tstarts - t0)
    del w
    # fraction digits: the digits after the (single) dot
    frac = np.zeros(T, dtype=np.int32)
    dpos = np.flatnonzero(isdot)
    if dpos.size:
        dtok = np.repeat(np.arange(T), ndots)
        one = ndots[dtok] == 1
        frac[dtok[one]] = dend[dtok[one]] - cd[dpos[one]]
    bad = (ndots >= 2) | (ndig == 0) | (ndig > _MAXE) | (mant >= _TWO53)
    # signs anywhere but a token start, and unknown bytes (exponents, junk)
    inner = issign
    inner[tstarts] = False
    odd = np.flatnonzero(inner | (cls == 4))
    if odd.size:
        bad[np.searchsorted(tstarts, odd, side="right") - 1] = True
    if split_tok is not None:
        bad |= split_tok & ((ndots != 1) | (frac != 2) | (ndig < 3))
    vals = mant / _P10F.take(np.minimum(frac, _MAXE))  # long fractions are flagged bad above
    neg = b.take(tstarts) == 45
    np.negative(vals, out=vals, where=neg)
    bad_runs = []
    if bad.any():
        bt = np.flatnonzero(bad)
        runs = np.unique(np.searchsorted(rstarts, tstarts[bt], side="right") - 1)
        for r in runs.tolist():
            rs, re_ = int(rstarts[r]), int(rends[r])
            i0 = int(np.searchsorted(tstarts, rs, side="left"))
            i1 = int(np.searchsorted(tstarts, re_, side="left"))
            bad_runs.append((rs, re_, i0, i1))
    return vals, bad_runs, (tstarts if want_offsets else None)


_U = np.uint64
_H = _U(0x8080808080808080)
_ONES = _U(0x0101010101010101)
_DOTS = _U(0x2E2E2E2E2E2E2E2E)
_ZEROS = _U(0x3030303030303030)
_X21 = _U(0x2121212121212121)
_F0 = _U(0xF0F0F0F0F0F0F0F0)
_X06 = _U(0x0606060606060606)
_M1 = _U(0x000000FF000000FF)
_MUL1 = _U(100 + (1000000 << 32))
_MUL2 = _U(1 + (10000 << 32))
_LOW32 = _U(0xFFFFFFFF)
_ALL = (1 << 64) - 1


def _tab(values):
    return np.array(values, dtype=np.uint64)


def _keep(nbytes):  # top nbytes bytes of a word
    return 0 if nbytes <= 0 else (_ALL << (8 * (8 - nbytes))) & _ALL if nbytes < 8 else _ALL


# token length L (1..16): masks for the hi word (last 8 chars) and lo word
_KH = _tab([_keep(min(L, 8)) for L in range(17)])
_KL = _tab([_keep(L - 8) for L in range(17)])
_FH = _tab([0x3030303030303030 & ~_keep(min(L, 8)) & _ALL for L in range(17)])
_FL = _tab([0x3030303030303030 & ~_keep(L - 8) & _ALL for L in range(17)])
# remove the byte at p (0..7; 8 = none): keep above, shift below up one byte
_HM = _tab([(_ALL << (8 * (p + 1))) & _ALL if p < 8 else _ALL for p in range(8)] + [_ALL])
_LM = _tab([(1 << (8 * p)) - 1 for p in range(8)] + [0])
_Z30 = _tab([0x30] * 8 + [0])
_P10U8 = _U(10**8)


def _lowest_byte(dz: np.ndarray) -> np.ndarray:
    """Index (0..7) of the lowest byte with its top bit set in dz; 8 where dz == 0."""
    lb = dz & (~dz + _U(1))
    ex = (lb.astype(np.float64).view(np.int64) >> 52) - (1023 + 7)
    p = ex >> 3
    p[dz == 0] = 8
    return p


def _zero_bytes(x: np.ndarray) -> np.ndarray:
    return (x - _ONES) & ~x & _H


def _all_digits(x: np.ndarray) -> np.ndarray:
    return ((x & _F0) == _ZEROS) & (((x + _X06) & _F0) == _ZEROS)


def _parse8(x: np.ndarray) -> np.ndarray:
    v = x - _ZEROS
    v = v * _U(10) + (v >> _U(8))
    v = (((v & _M1) * _MUL1) + (((v >> _U(16)) & _M1) * _MUL2)) >> _U(32)
    return v & _LOW32


def _swar_scan(raw: np.ndarray):
    """Fast parse of a chunk: (values float64, ends, lengths, bad mask) or None to fall back."""
    size = raw.size
    b = raw
    # control bytes other than tab/LF/CR: let the general path name them
    if (b < 9).any() or ((b - np.uint8(11)) < 2).any() or ((b - np.uint8(14)) < 18).any():
        return None
    buf = np.empty(size + 24, dtype=np.uint8)
    buf[:16] = 32
    buf[16 : 16 + size] = b
    buf[16 + size :] = 32
    sep = buf <= 32
    endm = ~sep[:-1]
    endm &= sep[1:]
    ends = np.flatnonzero(endm)
    ends += 1
    if ends.size == 0:
        return np.empty(0, np.float64), ends, ends, np.zeros(0, bool)
    short = _short_scan(buf, ends)
    if short is not None:
        vals, ok = short
        return vals, ends - 16, np.full(ends.size, 16), ~ok
    v64 = np.ndarray(shape=(buf.size - 7,), dtype=np.uint64, buffer=buf, strides=(1,))
    hi = v64[ends - 8]
    lo = v64[ends - 16]
    sh = ~(((hi | _H) - _X21) | hi) & _H
    sl = ~(((lo | _H) - _X21) | lo) & _H
    # highest separator byte -> token length
    qh = ((sh.astype(np.float64).view(np.int64) >> 52) - 1023) >> 3
    ql = ((sl.astype(np.float64).view(np.int64) >> 52) - 1023) >> 3
    L = np.where(sh != 0, 7 - qh, 15 - ql)
    L[(sh == 0) & (sl == 0)] = 16
    longbad = (sh == 0) & (sl == 0)  # 16 or more chars: slow path
    hi &= _KH.take(L)
    hi |= _FH.take(L)
    lo &= _KL.take(L)
    lo |= _FL.take(L)
    first = buf.take(ends - L)
    neg = first == 45
    sgn = neg | (first == 43)
    if sgn.any():
        pos = (16 - L) & 7
        delta = np.where(sgn, (first ^ 0x30).astype(np.uint64), _U(0)) << (pos * 8).astype(np.uint64)
        inhi = L <= 8
        hi ^= np.where(inhi, delta, _U(0))
        lo ^= np.where(inhi, _U(0), delta)
    ph = _lowest_byte(_zero_bytes(hi ^ _DOTS))
    in_hi = ph < 8
    carry = np.where(in_hi, lo >> _U(56), _U(0))
    hi = (hi & _HM.take(ph)) | ((hi & _LM.take(ph)) << _U(8)) | carry
    lo = np.where(in_hi, (lo << _U(8)) | _U(0x30), lo)
    pl = _lowest_byte(_zero_bytes(lo ^ _DOTS))
    pl[in_hi] = 8
    in_lo = pl < 8
    lo = (lo & _HM.take(pl)) | ((lo & _LM.take(pl)) << _U(8)) | _Z30.take(pl)
    ok = _all_digits(hi) & _all_digits(lo)
    hasdot = in_hi | in_lo
    ok &= (L - sgn - hasdot) >= 1
    ok &= ~longbad
    mant = _parse8(lo) * _P10U8 + _parse8(hi)
    ok &= mant < _U(2**53)
    frac = np.where(in_hi, 7 - ph, np.where(in_lo, 15 - pl, 0))
    vals = mant.astype(np.float64) / _P10F.take(frac)
    _apply_sign(vals, neg)
    return vals, ends - 16, L, ~ok


_DASH = _U(0x2D2D2D2D2D2D2D2D)
_PLUS = _U(0x2B2B2B2B2B2B2B2B)
_X1D = _U(0x1D1D1D1D1D1D1D1D)
_X1B = _U(0x1B1B1B1B1B1B1B1B)
_XFF = _U(0xFF)
_DOT5 = _U(0x2E << 40)
_BYTE5 = _U(0xFF << 40)
_HM5 = _U((_ALL << 48) & _ALL)
_LM5 = _U((1 << 40) - 1)
_TOP = _U(0x80 << 56)
_TOP2 = _U(0x80 << 48)


def _short_scan(buf: np.ndarray, ends: np.ndarray):
    """SWAR parse when every token is at most 7 bytes long (the common case).

    ``buf`` is padded so ``ends - 8 >= 0``. Returns (values, ok) or None when a
    token is longer (the caller uses the 16-byte path).
    """
    v64 = np.ndarray(shape=(buf.size - 7,), dtype=np.uint64, buffer=buf, strides=(1,))
    hi = v64[ends - 8]
    sh = ~(((hi | _H) - _X21) | hi) & _H
    if not sh.all():
        return None
    # smear separator marks downwards: every byte at or below the highest one
    m = sh | (sh >> _U(8))
    m |= m >> _U(16)
    m |= m >> _U(32)
    g = (m >> _U(7)) * _XFF  # garbage bytes (separator and before)
    fm = ((m << _U(8)) & ~m) & _H  # first token byte marker
    hi &= ~g
    hi |= g & _ZEROS
    ff = (fm >> _U(7)) * _XFF
    first = hi & ff
    neg = first == (_DASH & ff)
    sgn = neg | (first == (_PLUS & ff))
    flip = neg.astype(np.uint64) * _X1D
    flip += (sgn & ~neg).astype(np.uint64) * _X1B
    flip &= ff
    hi ^= flip
    if ((hi & _BYTE5) == _DOT5).all():
        # every token ends '.dd': fixed layout, two fraction digits
        hi = (hi & _HM5) | ((hi & _LM5) << _U(8)) | _U(0x30)
        ok = _all_digits(hi)
        frac = None
        hasdot = np.ones(hi.size, dtype=bool)
    else:
        ph = _lowest_byte(_zero_bytes(hi ^ _DOTS))
        hasdot = ph < 8
        hi = (hi & _HM.take(ph)) | ((hi & _LM.take(ph)) << _U(8)) | _Z30.take(ph)
        ok = _all_digits(hi)
        frac = np.where(hasdot, 7 - ph, 0)
    # at least one digit: a 1-byte token may not be a sign or dot; a 2-byte one not both
    one = fm == _TOP
    two = fm == _TOP2
    ok &= ~(one & (sgn | hasdot))
    ok &= ~(two & sgn & hasdot)
    mant = _parse8(hi)
    if frac is None:
        vals = mant.astype(np.float64)
        vals /= 100.0
    else:
        vals = mant.astype(np.float64) / _P10F.take(frac)
    _apply_sign(vals, neg)
    return vals, ok


def _apply_sign(vals: np.ndarray, neg: np.ndarray) -> None:
    """Set the sign bit where ``neg`` (vals are >= 0; gives -0.0 for '-0')."""
    bits = vals.view(np.uint64)
    bits |= neg.astype(np.uint64) << _U(63)


def _parse_chunk(data: bytes | memoryview, lo: int, hi: int, as_f32: bool = True):
    """Values of bytes [lo, hi) of data (float32 or float64), raising on bad input."""
    b = _as_u8(data)[lo:hi]
    got = _swar_scan(b)
    if got is not None:
        vals, ends, L, bad = got
        nbad = int(np.count_nonzero(bad))
        if nbad and nbad * 64 > vals.size:
            got = None  # many odd tokens (touching fields?): the general path
    if got is None:
        vals, bad_runs, _ = _scan(b)
    else:
        bad_runs = []
        if nbad:
            for i in np.flatnonzero(bad).tolist():
                e = int(ends[i])
                m = _WS_RE.search(data, lo + e, hi)
                re_ = (hi if m is None else m.start()) - lo
                # the run starts at the last whitespace before e
                s = e - int(L[i]) if L[i] < 16 else _run_start(b, e)
                bad_runs.append((s, re_, i, i + 1))
    if bad_runs:
        parts = []
        prev = 0
        for rs, re_, i0, i1 in bad_runs:
            parts.append(vals[prev:i0])
            run = bytes(data[lo + rs : lo + re_])
            parts.append(np.array(_slow_run(data, lo + rs, run), dtype=np.float64))
            prev = i1
        parts.append(vals[prev:])
        vals = np.concatenate(parts)
    if not as_f32:
        return vals
    with np.errstate(over="ignore"):
        out = vals.astype(np.float32)
    if out.size and np.isinf(out).any():
        i = int(np.flatnonzero(np.isinf(out))[0])
        off = int(_value_offsets(data, lo, hi)[i])
        m = _WS_RE.search(data, off)
        end = hi if m is None else m.start()
        raise _range_error(data, off, bytes(data[off:end]))
    return out


def _run_start(b: np.ndarray, e: int) -> int:
    """Start of the whitespace-delimited run that ends just before ``e``."""
    lo = max(0, e - 64)
    ws = np.flatnonzero(_CLS.take(b[lo:e]) == 0)
    if ws.size == 0 and lo > 0:
        lo = 0
        ws = np.flatnonzero(_CLS.take(b[:e]) == 0)
    return lo + int(ws[-1]) + 1 if ws.size else 0


def _value_offsets(data: bytes | memoryview, lo: int, hi: int) -> np.ndarray:
    """Absolute byte offset of every value in [lo, hi) (slow runs: their run start)."""
    b = _as_u8(data)[lo:hi]
    _, bad_runs, tstarts = _scan(b, want_offsets=True)
    offs = tstarts.astype(np.int64) + lo
    if not bad_runs:
        return offs
    parts = []
    prev = 0
    for rs, re_, i0, i1 in bad_runs:
        parts.append(offs[prev:i0])
        vs = _run_values(bytes(data[lo + rs : lo + re_]))
        count = 1 if isinstance(vs, str) else len(vs)
        parts.append(np.full(count, lo + rs, dtype=np.int64))
        prev = i1
    parts.append(offs[prev:])
    return np.concatenate(parts)


def values_array(count: int, dtype: Any) -> np.ndarray:
    """An array for ``count`` values (a file's, a product's block; its contents undefined): a big one
    over :func:`mmd.textcore.buffer`'s memory (zeros), as numpy's own would ask the kernel for huge
    pages (see there); a smaller one numpy's, heap memory that the next job reuses: a folder of small
    outputs, every array over fresh mapped memory, was slower (docs/grading.md, "Memory")."""
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
    stop = len(data)
    bounds = _chunk_bounds(data, start, stop, PARSE_CHUNK)
    plausible = input_plausible(stop, start, expected)
    if out is None or not plausible:
        out = values_array(expected if plausible else 0, dtype if out is None else out.dtype)
    if textcore.USE_FASTTEXT and _fasttext is not None and plausible:
        status, _ = _fasttext.parse_values(data, start, out, None, C_MIN_SPLIT, WORKERS)
        if status == 0:
            return out
        # any problem: the numpy path below finds it again and words the error
    count = 0

    def work(bd):
        return _parse_chunk(data, bd[0], bd[1])

    for bd, vals in zip(bounds, _ordered_map(work, bounds), strict=True):
        nv = vals.size
        if count + nv > expected:
            extra = expected - count
            off = int(_value_offsets(data, bd[0], bd[1])[extra])
            line = _line_at(data, off)
            m = _WS_RE.search(data, off)
            shown = shorten(bytes(data[off : (stop if m is None else m.start())]))
            raise InputFormatError(
                f"too many values: expected {what}, found more; the first extra value '{shown}' is on line {line}",
                line=line,
                value=shown,
            )
        if plausible:
            out[count : count + nv] = vals
        count += nv
    if count != expected:
        line = _last_line(data)
        raise InputFormatError(f"line {line}: expected {what}, found {count}", line=line)
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
# reference implementations (slow, obviously correct)


def format_reference(c: np.ndarray) -> bytes:
    """Output file bytes with Python's ``'%6.2f' % float(x)`` per element."""
    c = np.asarray(c)
    if c.ndim != 2:
        raise ValueError("emit needs a 2-D matrix")
    m, n = c.shape
    lines = [(f"{n}" if m == n else f"{m} {n}") + "\n"]
    for row in c.tolist():
        lines.append("".join("%6.2f" % float(x) for x in row) + "\n")
    return "".join(lines).encode("ascii")


def parse_reference(data: bytes) -> Matrices:
    """Parse with Python tokenizing and ``float()`` (for tests)."""
    data = bytes(data)
    header = parse_header(data)
    runs = data[header.body_offset :].split()
    vals: list[float] = []
    for run in runs:
        got = _run_values(run)
        if isinstance(got, str):
            raise InputFormatError(f"'{shorten(run)}' {got}", value=shorten(run))
        vals.extend(got)
    m, k, n = header.m, header.k, header.n
    if len(vals) != m * k + k * n:
        raise InputFormatError(f"expected {m * k + k * n} values, found {len(vals)}")
    arr = np.array(vals, dtype=np.float64)
    if np.any(np.abs(arr) > _F32_MAX) and any(_too_big(v) for v in vals):
        raise InputFormatError("value outside float32 range")
    with np.errstate(over="ignore"):
        f = arr.astype(np.float32)
    return Matrices(header=header, a=f[: m * k].reshape(m, k).copy(), b=f[m * k :].reshape(k, n).copy())


# ---------------------------------------------------------------------------
# emit


@functools.cache
def _digit_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The digit tables: "d.ff" for a % 1000; right-aligned, then zero-padded, groups of four higher digits. Made on
    first use: the C accelerator emits without them, and every process that imports this module
    (mmd check, say) would otherwise pay about 10 ms for them."""
    t4 = np.frombuffer(b"".join(b"%d.%02d" % (v // 100, v % 100) for v in range(1000)), dtype=np.uint32)
    tp = np.frombuffer(b"    " + b"".join(b"%4d" % v for v in range(1, 10000)), dtype=np.uint32)
    tz = np.frombuffer(b"".join(b"%04d" % v for v in range(10000)), dtype=np.uint32)
    return t4, tp, tz


# a >= _THRESH[i]  <=>  the integer part has more than i+1 digits
_THRESH = np.array([10 ** (i + 3) for i in range(16)], dtype=np.int64)
_FAST_LIMIT = 1e15  # |x*100| below this: int64 path


def _emit_ints(a: np.ndarray, neg: np.ndarray, n: int) -> bytes:
    """Rows of n fields from hundredths ``a`` (int64 >= 0) and signs; each row ends '\\n'."""
    cnt = a.size
    if cnt == 0:
        return b""
    nd = np.searchsorted(_THRESH, a, side="right").astype(np.int32)
    nd += 1
    w = nd + 3
    w += neg
    np.maximum(w, 6, out=w)
    # newline before the first field of each row but the first (and one at the end)
    w[n::n] += 1
    W = ((int(w.max()) + 4) // 4) * 4
    nblk = W // 4
    slots = np.empty((cnt, W), dtype=np.uint8)
    s32 = slots.view(np.uint32)
    t4, tp, tz = _digit_tables()
    s32[:, nblk - 1] = t4.take(a % 1000)
    q = a // 1000
    for k in range(1, nblk):
        if k > 1:
            q //= 10000
        digits = q % 10000
        hi = q >= 10000
        if hi.any():
            s32[:, nblk - 1 - k] = np.where(hi, tz.take(digits), tp.take(digits))
        else:
            s32[:, nblk - 1 - k] = tp.take(digits)
    flat = slots.reshape(-1)
    base = np.arange(0, cnt * W, W, dtype=np.int64)
    if neg.any():
        ni = np.flatnonzero(neg)
        flat[base[ni] + (W - 4) - nd[ni]] = 45
    if cnt > n:
        rows = np.arange(n, cnt, n)
        flat[base[rows] + (W - w[rows])] = 10
    mask = np.arange(W, dtype=np.int32)[None, :] >= (W - w)[:, None]
    return slots[mask].tobytes() + b"\n"


def _emit_rows(c: np.ndarray) -> bytes:
    """Bytes of the rows of 2-D ``c`` (each row ends with '\\n')."""
    rows, n = c.shape
    if rows == 0 or n == 0:
        return b"\n" * rows
    exact = c.dtype in (np.float32, np.float16) or (np.issubdtype(c.dtype, np.integer) and c.dtype.itemsize <= 4)
    with np.errstate(invalid="ignore", over="ignore"):  # signalling NaNs and infinities take the slow path
        x = c.astype(np.float64).reshape(-1)
        y = x * 100.0
        r = np.rint(y)
        slow = ~(np.abs(r) < _FAST_LIMIT)
        if not exact:
            # x*100 may be inexact in float64: send near-ties to the exact path
            slow |= np.abs(np.abs(y - np.floor(y)) - 0.5) < 1e-6
    if slow.any():
        bad_rows = np.unique(np.flatnonzero(slow) // n)
        parts = []
        prev = 0
        for r_ in bad_rows.tolist():
            if r_ > prev:
                parts.append(_emit_rows(c[prev:r_]))
            parts.append(("".join("%6.2f" % float(v) for v in c[r_].tolist()) + "\n").encode("ascii"))
            prev = r_ + 1
        if prev < rows:
            parts.append(_emit_rows(c[prev:]))
        return b"".join(parts)
    a = np.abs(r).astype(np.int64)
    neg = np.signbit(x)
    return _emit_ints(a, neg, n)


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
    """The bytes of :func:`emit` in pieces: the header line, then blocks of rows."""
    c = _check_2d(c)
    m, n = c.shape
    yield _header_line(m, n)
    blocks = _row_blocks(m, n, rows_per_chunk)
    rows = _emit_rows
    if textcore.USE_FASTTEXT and c.dtype.kind == "f" and c.dtype.itemsize <= 4:
        rows = _emit_rows_c
    yield from _ordered_map(lambda bd: rows(c[bd[0] : bd[1]]), blocks)


def _emit_rows_c(c: np.ndarray) -> bytes:
    """:func:`_emit_rows` by mmd._fasttext (float32 and float16 convert exactly)."""
    block = np.ascontiguousarray(c, dtype=np.float32)
    if _fasttext is None:  # only chosen where the accelerator is built
        return _emit_rows(block)
    return _fasttext.format_rows(block, block.shape[0], block.shape[1])


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
    where it is built; anything else, or MMD_NO_FASTTEXT=1, through Python's
    own ``%`` formatting, which gives the same bytes.
    """
    a, b = _check_2d(a), _check_2d(b)
    m, k = a.shape
    if b.shape[0] != k or (square and not m == k == b.shape[1]):
        raise ValueError(f"A is {m}x{k} and B is {b.shape[0]}x{b.shape[1]}: not an input{' of N×N' if square else ''}")
    yield (b"%d\n" % m) if square else (b"%d %d %d\n" % (m, k, b.shape[1]))
    for mat in (a, b):
        blocks = _row_blocks(mat.shape[0], mat.shape[1], rows_per_chunk)
        fast = textcore.USE_FASTTEXT and mat.dtype.kind == "f" and mat.dtype.itemsize <= 4
        yield from _ordered_map(functools.partial(_input_block, mat, fast), blocks)


def _input_block(mat: np.ndarray, fast: bool, bounds: tuple[int, int]) -> bytes:
    block = mat[bounds[0] : bounds[1]]
    if fast and _fasttext is not None:
        block = np.ascontiguousarray(block, dtype=np.float32)
        return _fasttext.format_input_rows(block, block.shape[0], block.shape[1])
    fmt = " ".join(["%.2f"] * block.shape[1]) + "\n"
    with np.errstate(invalid="ignore"):  # a signalling NaN converts to a quiet one, as printf shows it
        rows = block.astype(np.float64).tolist()
    return "".join(fmt % tuple(row) for row in rows).encode()


# ---------------------------------------------------------------------------
# reading an output file back (mmd check)
#
# Both paths, mmd._fasttext's one pass and the numpy one below, accept the
# same files, give the same float64 values (the double nearest each printed
# decimal) and name the same first fault: its line, its column and one of
# these kinds, worded by _fault_error.

_OUT_FIELD_RE = re.compile(rb"( *)(-?(?:0|[1-9][0-9]*)\.[0-9][0-9])")
_NL_RE = re.compile(rb"\n")
#: Digits before the point that mmd check reads: |x|*100 stays below 1e15 < 2^53, exact in float64.
OUTPUT_INT_DIGITS = 13

#: The bound on |value| that mmd writes: from 10^13 on a field has more digits than mmd check reads.
OUTPUT_MAX = 10.0**OUTPUT_INT_DIGITS


def check_product(c: np.ndarray) -> None:
    """Raise :class:`ProductRangeError` where the product ``c`` holds a value that is not finite or
    not below :data:`OUTPUT_MAX` in magnitude: its field (``inf``, ``nan``, 14 digits) is one that
    mmd check refuses, so the job is refused rather than served. Two reductions, no copy; the
    count and the first place only on refusal."""
    if c.size == 0 or (bool(c.max() < OUTPUT_MAX) and bool(c.min() > -OUTPUT_MAX)):  # NaN fails both
        return
    bad = ~(np.abs(c) < OUTPUT_MAX)
    first = int(np.argmax(bad))
    row, col = divmod(first, c.shape[1])
    value = float(c.flat[first])
    raise ProductRangeError(
        f"the product does not fit the output format: {int(bad.sum())} of {c.size} values are not finite or "
        f"have more than {OUTPUT_INT_DIGITS} digits before the point (first at row {row + 1}, col {col + 1}: "
        f"{value:.6g})",
        {"count": int(bad.sum()), "row": row + 1, "column": col + 1},
    )


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
        limit = f"at most {OUTPUT_INT_DIGITS} digits before the point"
        reason = f"value '{shorten(value)}' too large for an mmd output ({limit})"
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

    Anything but the exact bytes :func:`emit` would write (for some values
    below 1e13) raises :class:`InputFormatError` naming the first fault's line
    and column (``details["column"]``).
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
    if textcore.USE_FASTTEXT and _fasttext is not None:
        # A body shorter than m rows of n 6-byte fields cannot pass: no array for it.
        plausible = output_plausible(len(data), start, m, n)
        out = values_array(m * n, np.float64).reshape(m, n) if plausible and values else None
        got = _fasttext.parse_output_values(data, start, m, n, out, C_MIN_SPLIT, WORKERS)
        if got is None and (out is not None or not values):
            return out
        if got is None:  # pragma: no cover - a body that passes is never short
            raise AssertionError("an implausibly short output passed")
        kind, line, line_start, pos, count = got
        raise _fault_error(data, OutputFault(OUTPUT_FAULTS[kind], line, line_start, pos, count), m, n)
    vals, fault = _numpy_output(data, start, m, n)
    if fault is not None:
        raise _fault_error(data, fault, m, n)
    return vals


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
    if not (textcore.USE_FASTTEXT and _fasttext is not None) or step >= m:
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


def _numpy_output(data: bytes | memoryview, start: int, m: int, n: int) -> tuple[np.ndarray | None, OutputFault | None]:
    try:
        return _canonical_output(data, start, len(data), m, n)
    except InputFormatError as exc:
        # A token the value parser refuses sits on exc.line; a fault in the
        # lines before it comes first, and those lines hold none it refuses.
        bad_line = exc.line if exc.line is not None else 2
    ls = _line_offset(data, bad_line)
    _, fault = _canonical_output(data, start, ls, m, n)
    if fault is not None and fault.kind != "rows":  # rows: only the cut's doing
        return None, fault
    return None, (_line_fault(data, ls, bad_line, m, n) or OutputFault("field", bad_line, ls, ls, 0))


def _line_offset(data: bytes | memoryview, line: int) -> int:
    """Byte offset where 1-based ``line`` starts."""
    nls = np.flatnonzero(_as_u8(data) == 10)
    return 0 if line <= 1 else int(nls[line - 2]) + 1


def _canonical_output(
    data: bytes | memoryview, start: int, stop: int, m: int, n: int
) -> tuple[np.ndarray | None, OutputFault | None]:
    """Values and first fault of data[:stop] as an output: read its values, re-emit them, compare bytes."""
    limit = m * n
    if start >= stop:
        return None, OutputFault("rows", 1, 0, start - 1, 0)
    parts = []
    count = 0
    for vals in _ordered_map(
        lambda bd: _parse_chunk(data, bd[0], bd[1], as_f32=False), _chunk_bounds(data, start, stop, PARSE_CHUNK)
    ):
        parts.append(vals)
        count += vals.size
        if count > limit + n:
            break
    vals = np.concatenate(parts) if parts else np.empty(0, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.rint(np.abs(vals) * 100.0)
    # values too large to print exactly: a placeholder makes their field differ
    big = ~(a < 1e15)
    a[big] = 0
    a = a.astype(np.int64)
    neg = np.signbit(vals)
    full = (vals.size // n) * n
    canon = _emit_ints(a[:full], neg[:full], n)
    if full < vals.size:
        canon += _emit_ints(a[full:], neg[full:], n)
    got = _as_u8(data)[start:stop]
    want = np.frombuffer(canon, dtype=np.uint8)
    size = min(got.size, want.size)
    diff = np.flatnonzero(got[:size] != want[:size])
    if diff.size == 0 and got.size == want.size and vals.size == limit:
        return vals.reshape(m, n), None
    off = start + (int(diff[0]) if diff.size else size)
    off = min(off, stop - 1)
    lineno = _line_at(data, off)
    if full < vals.size:  # the values past the last full row re-emit as a short line: the row they are is short
        short = 2 + full // n
        if short < lineno:
            fault = _line_fault(data[:stop], _line_offset(data, short), short, m, n)
            if fault is not None:
                return None, fault
    if lineno > m + 1:
        ls = _line_offset(data, m + 2)
        return None, OutputFault("extra", m + 2, ls, ls, 0)
    ls = _line_offset(data, lineno)
    fault = _line_fault(data[:stop], ls, lineno, m, n)
    if fault is not None:
        return None, fault
    # every line read is right: the file ends early
    last = _last_line(data[:stop])
    ls = _line_offset(data, last)
    return None, OutputFault("rows", last, ls, stop - 1, vals.size)


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
        if len(core.lstrip(b"-").split(b".")[0]) > OUTPUT_INT_DIGITS:
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
