"""Tests for mmd._fasttext, the optional C accelerator of mmd.textformat.

Every result is compared three ways: the C path, the exact Python path (the
module switch ``mmd.accel.ON`` off) and the slow references. Refusals must
give the same message, line and value with and without the accelerator.
"""

from __future__ import annotations

import locale
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmd import accel, textcore, textoutput
from mmd import textformat as tf
from mmd.errors import InputFormatError

from .conftest import SPECIAL_VALUES
from .test_textformat import BAD_TOKENS, VALUE_FORMS

ft = accel.fasttext
pytestmark = pytest.mark.skipif(ft is None, reason="mmd._fasttext is not built (no C compiler at install time)")


@pytest.fixture(autouse=True)
def _accelerated(monkeypatch):
    """Each test starts with the accelerator on (even under MMD_NO_C=1)."""
    monkeypatch.setattr(accel, "ON", ft is not None)


def _python_path(fn, *args):
    old = accel.ON
    accel.ON = False
    try:
        return fn(*args)
    finally:
        accel.ON = old


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _outcome(data: bytes):
    """('ok', bits of A, bits of B) or ('error', message, line, value)."""
    try:
        got = tf.parse(data)
    except InputFormatError as e:
        return ("error", str(e), e.line, e.value)
    return ("ok", _bits(got.a).tobytes(), _bits(got.b).tobytes(), got.a.shape, got.b.shape)


class _Split:
    """mmd._fasttext reading every input in three parts at once, however short (min_split=0)."""

    format_rows = staticmethod(ft.format_rows) if ft is not None else None

    @staticmethod
    def parse_values(data, offset, out_a, out_b=None, min_split=0, threads=2):
        return ft.parse_values(data, offset, out_a, out_b, 0, 3)


def _split_path(fn, *args):
    old = accel.fasttext
    accel.fasttext = _Split
    try:
        return fn(*args)
    finally:
        accel.fasttext = old


def _same_both_ways(data: bytes):
    fast = _outcome(data)
    slow = _python_path(_outcome, data)
    assert fast == slow
    assert _split_path(_outcome, data) == fast
    return fast


# ---------------------------------------------------------------------------
# the C functions themselves


def test_parse_values_statuses():
    a = np.zeros(2, np.float32)
    b = np.zeros(3, np.float32)
    assert ft.parse_values(b"x\n1 2.5\n-3 4e1 .5\n", 2, a, b) == (ft.OK, 18)
    np.testing.assert_array_equal(a, [1, 2.5])
    np.testing.assert_array_equal(b, [-3, 40, 0.5])
    assert ft.parse_values(b"1 2 3 4", 0, a, b) == (ft.TOO_FEW, 7)
    assert ft.parse_values(b"1 2 3 4 5 6", 0, a, b) == (ft.TOO_MANY, 10)
    assert ft.parse_values(b"1 2 x 4 5", 0, a, b) == (ft.NOT_A_NUMBER, 4)
    assert ft.parse_values(b"1 2 3 1e39 5", 0, a, b) == (ft.OUT_OF_RANGE, 6)
    assert ft.parse_values(b"1 2 3 4.001.00", 0, a, b) == (ft.OK, 14)
    np.testing.assert_array_equal(b, [3, 4, 1])
    one = np.zeros(5, np.float32)
    assert ft.parse_values(b" 1\t2\r\n3\n\n4 5 ", 0, one) == (ft.OK, 13)
    np.testing.assert_array_equal(one, [1, 2, 3, 4, 5])
    assert ft.parse_values(bytearray(b"1 2 3 4 5"), 0, one, None)[0] == ft.OK
    assert ft.parse_values(memoryview(b"..1 2 3 4 5")[2:], 0, one)[0] == ft.OK


def test_parse_values_two_threads():
    a = np.zeros(2, np.float32)
    b = np.zeros(3, np.float32)
    for body, want in [
        (b"1 2 3 4 5", (ft.OK, 9)),
        (b"1 2 3 4", (ft.TOO_FEW, 7)),
        (b"1 2 3 4 5 6", (ft.TOO_MANY, 11)),
        (b"1 2 3 4 5 6 7 8 9 10 11", (ft.TOO_MANY, 23)),
        (b"1 2 x 4 5", (ft.NOT_A_NUMBER, 4)),
        (b"1 2 3 4 x", (ft.NOT_A_NUMBER, 8)),
        (b"1 2 3 4 1e39", (ft.OUT_OF_RANGE, 8)),
        (b"1.002.00 3.00-4.005.00", (ft.OK, 22)),
        (b"1.002.003.00-4.005.00", (ft.OK, 21)),
        (b"  1.002.003.00-4.005.00\n\n", (ft.OK, 25)),
        (b"1.002.003.00-4.005.006.00", (ft.TOO_MANY, 0)),
    ]:
        got = ft.parse_values(body, 0, a, b, 0)
        assert got[0] == want[0], body
        if want[0] == ft.OK:
            assert got == want
            split = np.concatenate([a, b])
            assert ft.parse_values(body, 0, a, b) == want
            np.testing.assert_array_equal(split, np.concatenate([a, b]))
        assert ft.parse_values(body, 0, a, b)[0] == want[0]


def test_parse_values_float64_buffers_get_the_float32_values():
    """float64 destinations (mmd check's A and B, read for a float64 product) hold exactly the
    float32 values, whichever way the body is read: one thread, parts in place, parts through
    scratch (touching fields), and report the same statuses."""
    for body in (
        b"0.1 2.5 -3.33 1e-7 16777217",
        b"1.002.00 3.00-4.005.00",
        b"0.1 0.2 0.3 0.4 0.5 0.6",
        b"0.1 0.2 x 0.4 0.5",
        b"1 2 3 1e39 5",
    ):
        for split, threads in ((1 << 20, 1), (0, 2), (0, 3)):
            a32, b32 = np.zeros(2, np.float32), np.zeros(3, np.float32)
            a64, b64 = np.zeros(2), np.zeros(3)
            want = ft.parse_values(body, 0, a32, b32, split, threads)
            assert ft.parse_values(body, 0, a64, b64, split, threads) == want, body
            if want[0] == ft.OK:
                np.testing.assert_array_equal(a64, a32.astype(np.float64))
                np.testing.assert_array_equal(b64, b32.astype(np.float64))


def test_parse_values_bad_arguments():
    with pytest.raises(TypeError):
        ft.parse_values(b"1", 0, np.zeros(1, np.int32))
    with pytest.raises(TypeError):
        ft.parse_values(b"1", 0, np.zeros(1, np.float16))
    with pytest.raises(TypeError):  # A and B alike or not at all
        ft.parse_values(b"1 2", 0, np.zeros(1, np.float32), np.zeros(1, np.float64))
    with pytest.raises((TypeError, BufferError)):
        ft.parse_values(b"1", 0, b"\0\0\0\0")  # read-only
    with pytest.raises(ValueError):
        ft.parse_values(b"1", 5, np.zeros(1, np.float32))


def test_format_rows_shapes():
    assert ft.format_rows(np.zeros((0, 3), np.float32), 0, 3) == b""
    assert ft.format_rows(np.zeros((2, 0), np.float32), 2, 0) == b"\n\n"
    assert ft.format_rows(np.array([[1.5, -0.0]], np.float32), 1, 2) == b"  1.50 -0.00\n"
    with pytest.raises(ValueError):
        ft.format_rows(np.zeros((2, 2), np.float32), 2, 3)
    with pytest.raises(TypeError):
        ft.format_rows(np.zeros((2, 2), np.float64), 2, 2)
    assert tf.emit(np.zeros((3, 0), np.float32)) == _python_path(tf.emit, np.zeros((3, 0), np.float32))


# ---------------------------------------------------------------------------
# parse: same values as the Python path and the references

_num = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda v: "%.2f" % v),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),  # float64: double rounding, huge and tiny
    st.integers(-(10**25), 10**25).map(str),
    st.floats(-1e30, 1e30, allow_nan=False).map(lambda v: "%.4e" % v),
    st.floats(-1e38, 1e38, allow_nan=False).map(lambda v: "%.25e" % v),
    st.integers(0, 99999).map(lambda v: ".%d" % v),
    st.integers(0, 99999).map(lambda v: "%d." % v),
    st.integers(0, 999).map(lambda v: "+%d.5" % v),
    st.integers(0, 10**17).map(lambda v: "-%d.%d" % (v, v % 97)),
    st.tuples(st.integers(0, 10**6), st.integers(-60, 60), st.sampled_from(["e", "E", "e+", "E-", "e-0"])).map(
        lambda t: "%d%s%d" % (t[0], t[2], abs(t[1]))
    ),
    st.sampled_from(["0", "-0", "+0", "-0.0", "0e5", "-.0e-3", "00012.50", "0.000000000000000000000001e20"]),
)
_sep = st.sampled_from([" ", "\t", "\r\n", "\n", "\n\n", " \t ", "\r\n\r\n"])
# mmd output fields, to glue together without a separator
_field = st.floats(-99999, 99999, width=32).map(lambda v: "%.2f" % v)


def _float32_tie(f: float, nudge: int) -> str:
    """The exact decimal midpoint between float32 f and the next one up, nudged by 1e-40 relative."""
    f32 = np.float32(f)
    g32 = np.nextafter(f32, np.float32(np.inf))
    mid = (Decimal(float(f32)) + Decimal(float(g32))) / 2
    mid += mid * Decimal(nudge) * Decimal("1e-40")
    return format(mid, "f") if abs(mid) < Decimal("1e8") else format(mid, "e")


_tie = st.tuples(st.floats(1e-30, 1e30), st.sampled_from([-1, 0, 1]), st.booleans()).map(
    lambda t: ("-" if t[2] else "") + _float32_tie(t[0], t[1])
)


def _check_values(raw: bytes, toks: list[str]) -> None:
    fast = tf.parse(raw)
    split = _split_path(tf.parse, raw)
    np.testing.assert_array_equal(_bits(fast.a), _bits(split.a))
    np.testing.assert_array_equal(_bits(fast.b), _bits(split.b))
    ref = tf.parse_reference(raw)
    slow = _python_path(tf.parse, raw)
    flat = np.concatenate([fast.a.ravel(), fast.b.ravel()])
    want = np.array([np.float32(float(t)) for t in toks], dtype=np.float32)
    np.testing.assert_array_equal(_bits(flat), _bits(want))
    np.testing.assert_array_equal(_bits(fast.a), _bits(slow.a))
    np.testing.assert_array_equal(_bits(fast.b), _bits(slow.b))
    np.testing.assert_array_equal(_bits(fast.a), _bits(ref.a))
    np.testing.assert_array_equal(_bits(fast.b), _bits(ref.b))
    assert fast.header == slow.header
    assert fast.a.flags.c_contiguous and fast.b.flags.c_contiguous


@pytest.mark.integration  # seconds of examples or of real runs: left out of `make quick`
@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.data())
def test_parse_hypothesis_three_ways(m, k, n, data):
    count = m * k + k * n
    toks = data.draw(st.lists(st.one_of(_num, _tie), min_size=count, max_size=count))
    seps = data.draw(st.lists(_sep, min_size=count, max_size=count))
    body = "".join(t + s for t, s in zip(toks, seps, strict=True))
    raw = f"{m} {k} {n}\n{body}".encode()
    with np.errstate(over="ignore"):  # a token beyond float32 is the case looked for
        too_big = any(np.isinf(np.float32(float(t))) for t in toks)
    if too_big:
        assert _same_both_ways(raw)[1].endswith("is outside float32 range")
        return
    _check_values(raw, toks)


# the course's shape, which the C parser reads 64 bytes at a time, and runs that come close to it
_course = st.tuples(st.sampled_from(["", "-", "+"]), st.integers(0, 99), st.integers(0, 99), st.booleans()).map(
    lambda t: "%s%s%d.%02d" % (t[0], "0" if t[3] and t[1] < 10 else "", t[1], t[2])
)
_near = st.sampled_from(
    [
        ".00",
        "1.0",
        "1.",
        "123.45",
        "-123.45",
        "1.000",
        "--1.00",
        "+-1.00",
        "1-2.00",
        "1e5",
        "1.0e1",
        "-0.00",
        "+0.00",
        "00.00",
        "9.99",
        "-99.99",
        "1.002.00",
        "12.3",
        "0",
        "-5",
    ]
)


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


@pytest.mark.integration  # seconds of examples or of real runs: left out of `make quick`
@settings(max_examples=150, deadline=None)
@given(st.integers(2, 12), st.integers(2, 12), st.integers(2, 12), st.data())
def test_parse_course_windows(m, k, n, data):
    """Inputs of the course's shape, with other runs among them and whitespace of every kind, at every
    offset of the 64-byte windows: the same values three ways, in float32 and in float64."""
    count = m * k + k * n
    toks = data.draw(st.lists(_course, min_size=count, max_size=count))
    for i in data.draw(st.lists(st.integers(0, count - 1), max_size=3)):  # a few other runs among them
        toks[i] = data.draw(_near)
    seps = data.draw(st.lists(st.sampled_from([" ", " ", "\n", "\t", "\r\n", "  "]), min_size=count, max_size=count))
    lead = data.draw(st.sampled_from(["", " ", "\n", "   "]))
    raw = f"{m} {k} {n}\n{lead}".encode() + "".join(t + s for t, s in zip(toks, seps, strict=True)).encode()
    if not all(_is_float(t) for t in toks):  # a bad run, or touching fields: the same outcome every way
        _same_both_ways(raw)
        return
    _check_values(raw, toks)
    wide = tf.parse(raw, dtype=np.float64)
    narrow = tf.parse(raw)
    np.testing.assert_array_equal(wide.a, narrow.a.astype(np.float64))
    np.testing.assert_array_equal(wide.b, narrow.b.astype(np.float64))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.data())
def test_parse_touching_fields_three_ways(m, k, data):
    count = m * k + k
    toks = data.draw(st.lists(_field, min_size=count, max_size=count))
    # glue some neighbours together, as mmd's own output does
    glue = data.draw(st.lists(st.booleans(), min_size=count, max_size=count))
    body = "".join(t + ("" if g else " ") for t, g in zip(toks, glue, strict=True)) + "\n"
    raw = f"{m} {k} 1\n{body}".encode()
    _check_values(raw, toks)


def test_parse_fixed_cases_three_ways():
    toks = [
        *VALUE_FORMS,
        "9007199254740993",
        "9007199254740992.5",
        "1e22",
        "1e23",
        "123e-22",
        "1e-23",
        "0e999999999999",
        "1.00000005960464477539062500001",
        "1.000000059604644775390625",
        "3.40282356779733e38",
        "1" + "0" * 400 + "e-400",
        "0." + "0" * 400 + "1e401",
        "1e-99999999999999",
        "-1e-99999999999999",
        "100000000000000000000000000000.00",
        "16777217",
        "16777219",
    ]
    k = len(toks)
    raw = (f"1 {k} 1\n" + " ".join(toks) + "\n" + "\n".join(["1"] * k) + "\n").encode()
    _check_values(raw, toks + ["1"] * k)


def test_parse_values_short_shapes_exhaustive():
    """Every [+-]d.dd / dd.dd token (the C shortcut for the course's inputs), then the general loop."""
    toks = [f"{s}{i}.{f:02d}" for s in ("", "-", "+") for i in [*range(100), "00", "07"] for f in range(100)]
    want = np.array([np.float32(float(t)) for t in toks], dtype=np.float32)
    for sep in ("\n", " ", "\t", "\r\n"):
        data = sep.join(toks).encode()  # the last token has no whitespace after it
        out = np.zeros(len(toks), np.float32)
        assert ft.parse_values(data, 0, out)[0] == ft.OK
        np.testing.assert_array_equal(_bits(out), _bits(want))
    for bad in (b"1.23x", b"1.23\x00", b"1.23.00", b"12.345", b"1.23e5"):
        out = np.zeros(1, np.float32)
        st_, _ = ft.parse_values(bad + b"      ", 0, out)
        assert (st_ == ft.OK) == (bad in (b"12.345", b"1.23e5"))


def test_parse_into_callers_array():
    raw = b"1 2 2\n1.5 -2\n3 4e1\n.5 6\n"
    out = np.full(6, np.nan, np.float32)
    got = tf.parse(raw, out=out)
    np.testing.assert_array_equal(out, [1.5, -2, 3, 40, 0.5, 6])
    assert np.shares_memory(got.a, out) and np.shares_memory(got.b, out)
    with pytest.raises(InputFormatError) as info:
        tf.parse(b"1 2 2\n1.5 -2\n3 x\n.5 6\n", out=out)
    assert str(info.value) == "line 3: 'x' is not a number"


def test_parse_big_multichunk_three_ways():
    rng = np.random.default_rng(4)
    m, k, n = 60, 70, 50
    vals = rng.uniform(-1e4, 1e4, m * k + k * n)
    forms = ["%.2f", "%.6f", "%g", "%.3e", "%.17g", "%.9g", "%.1f"]
    toks = [forms[i % len(forms)] % v for i, v in enumerate(vals)]
    seps = [" ", "\t", "\r\n", "\n\n", "  "]
    raw = (f"{m} {k} {n}\n" + "".join(t + seps[i % 5] for i, t in enumerate(toks))).encode()
    _check_values(raw, toks)


def test_parse_reads_emit_output_back():
    rng = np.random.default_rng(9)
    c = rng.uniform(-3000, 3000, (40, 40)).astype(np.float32)
    body = tf.emit(c).split(b"\n", 1)[1]
    raw = b"40\n" + body + body
    toks = [("%.2f" % float(v)) for v in c.ravel()] * 2
    _check_values(raw, toks)


def test_python_path_long_fraction():
    # A regression test: more than 22 fraction digits once raised IndexError without the accelerator.
    raw = b"1\n1 1.0000000000000000000000000\n"
    np.testing.assert_array_equal(tf.parse(raw).b, [[1.0]])  # the accelerator reads it
    np.testing.assert_array_equal(_python_path(tf.parse, raw).b, [[1.0]])


# ---------------------------------------------------------------------------
# parse refusals: identical messages with and without the accelerator

BAD = [
    *BAD_TOKENS,
    "1e+",
    "1e-",
    "e5",
    ".e5",
    "+.",
    "-.e1",
    "1.00-",
    "1.001.0",
    "1.00+-2.00",
    "1.00.00",
    "1.0011-",
    "\x00",
    "\x0b",
    "\x0c",
    "\xa0",
    "1e400",
    "3.4028236e38",
    "3.4028235677973366e38",
    "99999999999999999999999999999999999999999.00",
    "1.001e39.00",
    "1.00" + "9" * 45 + ".00",
    "9" * 30 + "x" * 50,
    "1 2 3 4 5 6 7 8",
]


@pytest.mark.parametrize("bad", BAD)
def test_refusals_same_message(bad):
    raw = b"2\n1 2\n3 4\n5 6\n7 " + bad.encode("utf-8") + b"\n"
    got = _same_both_ways(raw)
    assert got[0] == "error"


@pytest.mark.parametrize(
    "raw",
    [
        b"3\n1 2 3\n4 5 6\n7 8 9\n1 2 3\n4 5 6\n7 8\n",
        b"1\n1\n2\n\n3 4\n",
        b"2 3 2\n",
        b"1\n1.001.00\n-2.00\n",
        b"1\n1\n",
        b"1 1 1\n1 2.00-3.00\n",
        b"2\n" + b"1 " * 100,
        b"1\n1 1e39\n",
        b"\xef\xbb\xbf1\r\n5\r\nx\r\n",
        b"1\n\x00\n2\n",
        b"1\n1\n\xff\xfe\n",
        b"1\n",
        b"1\n   \n",
    ],
)
def test_count_and_misc_refusals_same_message(raw):
    assert _same_both_ways(raw)[0] == "error"


_junk = st.sampled_from(["x", "e", "E", ".", "-", "+", "1e", "\x00", "\x0b", "é", "e99", "1e39", "0x", ",", "_"])


@pytest.mark.integration  # seconds of examples or of real runs: left out of `make quick`
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.data())
def test_corrupted_inputs_same_outcome(m, k, n, data):
    count = m * k + k * n + data.draw(st.integers(-2, 2))
    toks = data.draw(st.lists(st.one_of(_num, _field), min_size=max(0, count), max_size=max(0, count)))
    for _ in range(data.draw(st.integers(0, 2))):
        if toks:
            i = data.draw(st.integers(0, len(toks) - 1))
            j = data.draw(st.integers(0, len(toks[i])))
            toks[i] = toks[i][:j] + data.draw(_junk) + toks[i][j:]
    seps = data.draw(st.lists(st.sampled_from([" ", "\n", "", "\r\n"]), min_size=len(toks), max_size=len(toks)))
    body = "".join(t + s for t, s in zip(toks, seps, strict=True))
    raw = f"{m} {k} {n}\n{body}".encode()
    _same_both_ways(raw)


# ---------------------------------------------------------------------------
# emit: bytes equal format_reference, the Python path and C printf


def _emit_specials() -> np.ndarray:
    vals = list(SPECIAL_VALUES)
    vals += [k / 8 for k in range(-400, 400)]  # ties at every hundredth that float32 holds
    vals += [(k + 0.5) / 100 for k in range(-300, 300)]  # near-ties
    # around the internal boundaries |x*100| = 2^52 and 2^63
    for edge in (2.0**52 / 100, 2.0**63 / 100, 1e15 / 100, 1e17 / 100):
        f = np.float32(edge)
        vals += [float(np.nextafter(f, np.float32(0))), float(f), float(np.nextafter(f, np.float32(np.inf)))]
    arr = np.array(vals, dtype=np.float32)
    return np.concatenate([arr, -arr])


def _random_bits(rng, size: int) -> np.ndarray:
    bits = rng.integers(0, 2**32, size=size, dtype=np.uint64).astype(np.uint32)
    return bits.view(np.float32)


def test_emit_specials_and_random_bits(c_printf):
    rng = np.random.default_rng(12)
    vals = np.concatenate([_emit_specials(), _random_bits(rng, 20000)])
    vals = vals[np.isfinite(vals)]
    row = vals.reshape(1, -1)
    got = tf.emit(row)
    assert got == tf.format_reference(row)
    assert got == _python_path(tf.emit, row)
    assert got.split(b"\n", 1)[1] == c_printf(vals)


def test_emit_nan_inf_like_python():
    c = np.array([[np.nan, -np.nan, np.inf, -np.inf, 1.0, -0.0]], dtype=np.float32)
    nan_bits = np.array([0x7FC00001, 0xFFC00000, 0x7F800001], dtype=np.uint32).view(np.float32)
    c = np.concatenate([c, nan_bits.reshape(1, -1).repeat(2, axis=1)], axis=None).reshape(1, -1)
    got = tf.emit(c)
    assert got == tf.format_reference(c) == _python_path(tf.emit, c)
    assert got.startswith(b"1 12\n   nan   nan   inf  -inf  1.00 -0.00   nan")


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.data())
def test_emit_hypothesis(m, n, data):
    vals = data.draw(st.lists(st.floats(width=32), min_size=m * n, max_size=m * n))
    c = np.array(vals, dtype=np.float32).reshape(m, n)
    got = tf.emit(c)
    assert got == tf.format_reference(c)
    assert got == _python_path(tf.emit, c)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(1, 30), st.integers(0, 2**32 - 1), st.integers(1, 7))
def test_emit_random_bits_chunks(m, n, seed, rows):
    c = _random_bits(np.random.default_rng(seed), m * n).reshape(m, n)
    pieces = list(tf.emit_chunks(c, rows_per_chunk=rows))
    assert pieces == list(_python_path(lambda: list(tf.emit_chunks(c, rows_per_chunk=rows))))
    assert b"".join(pieces) == tf.format_reference(c)


def test_emit_other_layouts_and_dtypes():
    rng = np.random.default_rng(2)
    c = rng.uniform(-500, 500, (30, 20)).astype(np.float32)
    for view in (c.T, c[::2, ::3], c.astype(">f4"), c.astype(np.float16), np.asfortranarray(c)):
        assert tf.emit(view) == tf.format_reference(view) == _python_path(tf.emit, view)
    d = c.astype(np.float64) + 0.005  # float64 keeps the Python path (near-ties)
    assert tf.emit(d) == tf.format_reference(d)


def test_emit_big_matrix_same_as_python_path():
    rng = np.random.default_rng(5)
    c = (rng.standard_normal((300, 700)) * 3000).astype(np.float32)
    assert tf.emit(c) == _python_path(tf.emit, c)


def test_locale_does_not_change_bytes():
    old = locale.setlocale(locale.LC_NUMERIC)
    for name in ("de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "ru_RU.UTF-8"):
        try:
            locale.setlocale(locale.LC_NUMERIC, name)
            break
        except locale.Error:
            continue
    else:
        pytest.skip("no locale with a decimal comma installed")
    try:
        c = np.array([[1.5, 3e38, -1e20, 2.675]], dtype=np.float32)
        assert tf.emit(c) == tf.format_reference(c)
        raw = b"1 2 1\n1.5 0.30000000000000004441\n1e-50\n"
        got = tf.parse(raw)
        assert got.a[0, 1] == np.float32(0.30000000000000004441)
    finally:
        locale.setlocale(locale.LC_NUMERIC, old)


def test_env_var_forces_python_path():
    code = "import mmd.accel as a; print(a.ON)"
    root = Path(tf.__file__).resolve().parents[1]
    env = dict(os.environ, MMD_NO_C="1")
    run = dict(env=env, cwd=root, capture_output=True, text=True, check=True)
    out = subprocess.run([sys.executable, "-c", code], **run)
    assert out.stdout.strip() == "False"
    env["MMD_NO_C"] = ""
    out = subprocess.run([sys.executable, "-c", code], **run)
    assert out.stdout.strip() == "True"


# ---------------------------------------------------------------------------
# parse_output: the one-pass check of an output, against the Python path


class _OutSplit:
    """mmd._fasttext reading every output in three parts at once, however short (min_split=0)."""

    @staticmethod
    def parse_output_values(data, offset, m, n, out=None, min_split=0, threads=2):
        return ft.parse_output_values(data, offset, m, n, out, 0, 3)


def _output_outcome(data: bytes):
    """('ok', value bits, signs) or ('error', message, line, value, column)."""
    try:
        got = textoutput.parse_output(data)
    except InputFormatError as e:
        return ("error", str(e), e.line, e.value, e.details.get("column"))
    assert got.dtype == np.float64 and got.flags.c_contiguous
    return ("ok", got.shape, got.view(np.uint64).tobytes())


def _output_three_ways(data: bytes):
    """The C path (its AVX2 rows where the CPU has AVX2, then its SSE2 ones), the Python path and the C
    path in three parts give the same outcome."""
    fast = _output_outcome(data)
    was = ft.set_wide(False)
    try:
        assert _output_outcome(data) == fast
    finally:
        ft.set_wide(was)
    assert _python_path(_output_outcome, data) == fast
    old = accel.fasttext
    accel.fasttext = _OutSplit
    try:
        assert _output_outcome(data) == fast
    finally:
        accel.fasttext = old
    return fast


def test_parse_output_values_faults():
    good = b"2 3\n  1.00  2.00  3.00\n  4.00 -5.00-60.00\n"
    out = np.zeros(6)
    assert ft.parse_output_values(good, 4, 2, 3, out) is None
    np.testing.assert_array_equal(out, [1, 2, 3, 4, -5, -60])
    assert ft.parse_output_values(good, 4, 2, 3) is None
    cases = [
        # body, (kind, line, line_start, pos, count)
        (b"  1.00  2.00\n  4.00  5.00  6.00\n", (ft.OUT_COUNT, 2, 4, 16, 2)),
        (b"  1.00  2.00  3.00  4.00\n", (ft.OUT_COUNT, 2, 4, 22, 4)),
        (b"  1.00  2.00  3.00\n  4.00 5.00  6.00\n", (ft.OUT_WIDTH, 3, 23, 29, 5)),
        (b"  1.00  2.00  3.00\n  4.00  5.00  6.00", (ft.OUT_NEWLINE, 3, 23, 41, 0)),
        (b"  1.00  2.00  3.00\n", (ft.OUT_ROWS, 2, 4, 22, 3)),
        (b"", (ft.OUT_ROWS, 1, 0, 3, 0)),
        (b"  1.00  2.00  3.00\n  4.00  5.00  6.00\n\n", (ft.OUT_EXTRA, 4, 42, 42, 0)),
        (b"  1.00  2.00  x.00\n", (ft.OUT_FIELD, 2, 4, 16, 0)),
        (b"  1.00 +2.00  3.00\n", (ft.OUT_FIELD, 2, 4, 10, 0)),
        (b"  1.00  2.0   3.00\n", (ft.OUT_FIELD, 2, 4, 10, 0)),
        (b"  1.00 02.00  3.00\n", (ft.OUT_FIELD, 2, 4, 10, 0)),
        (b"  1.00\t2.00  3.00\n", (ft.OUT_FIELD, 2, 4, 10, 0)),
        (b"  1.00  2.00  3.00\r\n", (ft.OUT_FIELD, 2, 4, 22, 0)),
        (b"  1.00  2.00  3.00  \n", (ft.OUT_FIELD, 2, 4, 22, 0)),
        (b"  1.0012345678901234.00  3.00\n", (ft.OUT_LARGE, 2, 4, 10, 17)),
        (b"  1.00  -0.00  3.00\n", (ft.OUT_WIDTH, 2, 4, 10, 7)),
    ]
    for body, want in cases:
        data = b"2 3\n" + body
        assert ft.parse_output_values(data, 4, 2, 3, np.zeros(6)) == want, body
        assert ft.parse_output_values(data, 4, 2, 3, None, 0) == want, body
    assert ft.parse_output_values(b"1\n9999999999999.99\n", 2, 1, 1, out[:1]) is None
    assert out[0] == 9999999999999.99
    flt_max = b"340282346638528859811704183484516925440.00"
    assert ft.parse_output_values(b"1 2\n" + flt_max + b"-" + flt_max + b"\n", 4, 1, 2, out[:2]) is None
    assert out[:2].tolist() == [3.4028234663852886e38, -3.4028234663852886e38]
    for bad in (
        flt_max[:-3] + b".01",
        b"340282346638528859811704183484516925441.00",
        b"3" + flt_max,
        b"12345678901234.00",
    ):
        assert ft.parse_output_values(b"1\n" + bad + b"\n", 2, 1, 1, out[:1]) == (ft.OUT_LARGE, 2, 2, 2, len(bad))
    assert ft.parse_output_values(b"1\n -0.00\n", 2, 1, 1, out[:1]) is None
    assert np.signbit(out[0])


def test_parse_output_values_bad_arguments():
    with pytest.raises(ValueError):
        ft.parse_output_values(b"1\n  1.00\n", 1, 1, 1)  # not after the header's newline
    with pytest.raises(ValueError):
        ft.parse_output_values(b"1\n  1.00\n", 2, 0, 1)
    with pytest.raises(TypeError):
        ft.parse_output_values(b"1\n  1.00\n", 2, 1, 1, np.zeros(1, np.float32))
    with pytest.raises(TypeError):
        ft.parse_output_values(b"1\n  1.00\n", 2, 1, 1, np.zeros(2))


def test_parse_output_rows():
    """An output read a few rows at a time: the next offset, the rows' values, -1 on any fault
    (a bad field, a row cut short, a file ending early, a last row with no newline)."""
    body = b"  1.00  2.00  3.00\n  4.00 -5.00-60.00\n  7.00  8.00  9.00\n"
    data = b"3 3\n" + body
    out = np.zeros((2, 3))
    assert ft.parse_output_rows(data, 4, 2, 3, out) == 4 + 38
    np.testing.assert_array_equal(out, [[1, 2, 3], [4, -5, -60]])
    one = np.zeros((1, 3))
    assert ft.parse_output_rows(data, 42, 1, 3, one) == len(data)
    np.testing.assert_array_equal(one, [[7, 8, 9]])
    assert ft.parse_output_rows(data.replace(b"2.00", b"2.0x"), 4, 2, 3, out) == -1
    assert ft.parse_output_rows(data.replace(b"  2.00", b""), 4, 2, 3, out) == -1
    assert ft.parse_output_rows(data[:30], 4, 2, 3, out) == -1
    assert ft.parse_output_rows(data[:-1], 42, 1, 3, one) == -1
    out[:] = 0
    assert ft.parse_output_rows(data, 4, 2, 3, out, 1 << 20, 1, 4 + 38) == 4 + 38  # the end known
    np.testing.assert_array_equal(out, [[1, 2, 3], [4, -5, -60]])
    assert ft.parse_output_rows(data, 4, 2, 3, out, 1 << 20, 1, 4 + 19) == -1  # one row up to that end
    assert ft.parse_output_rows(data, 4, 2, 3, out, 1 << 20, 1, 4 + 37) == -1  # not after a newline
    with pytest.raises(ValueError):
        ft.parse_output_rows(data, 4, 2, 3, out, 1 << 20, 1, 4)  # no rows before the end
    with pytest.raises(ValueError):
        ft.parse_output_rows(data, 4, 2, 3, out, 1 << 20, 1, len(data) + 1)
    with pytest.raises(ValueError):
        ft.parse_output_rows(data, 3, 1, 3, one)  # not a line start
    with pytest.raises(ValueError):
        ft.parse_output_rows(data, 4, 0, 3, one)
    with pytest.raises(TypeError):
        ft.parse_output_rows(data, 4, 1, 3, np.zeros((1, 3), np.float32))
    with pytest.raises(TypeError):
        ft.parse_output_rows(data, 4, 2, 3, one)  # room for one row, not two


def test_row_blocks():
    """Where each block of rows begins, then the end of the last row, as parse_output_rows finds a
    block's end; None where the rows run out (a row missing, the last newline missing)."""
    rows = [b"  1.00  2.00  3.00\n", b"  4.00 -5.00-60.00\n", b"  7.00  8.00  9.00\n", b" 10.00 11.00 12.00\n"]
    data = b"4 3\n" + b"".join(rows)
    at = [4 + sum(map(len, rows[:i])) for i in range(5)]
    assert ft.row_blocks(data, 4, 4, 3, 1) == at
    assert ft.row_blocks(data, 4, 4, 3, 3) == [at[0], at[3], at[4]]
    assert ft.row_blocks(data, 4, 4, 3, 4) == [at[0], at[4]]
    assert ft.row_blocks(data, 4, 4, 3, 9) == [at[0], at[4]]
    assert ft.row_blocks(data + b"  1.00\n", 4, 4, 3, 2) == [at[0], at[2], at[4]]  # the caller sees what follows
    assert ft.row_blocks(data[: at[3]], 4, 4, 3, 2) is None
    assert ft.row_blocks(data[:-1], 4, 4, 3, 2) is None
    with pytest.raises(ValueError):
        ft.row_blocks(data, 3, 4, 3, 1)  # not a line start
    with pytest.raises(ValueError):
        ft.row_blocks(data, 4, 4, 3, 0)


@pytest.mark.parametrize("step", [1, 3, 7, 50])
def test_row_blocks_read_on_threads_in_any_order(step):
    """textcore.RowBlocks: every block read on its own thread, in reverse order, gives parse_output's
    values; a fault calls on_fault where it is found: missing rows and bytes after the last row at
    once, a bad field when its block is read."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(step)
    vals = (rng.standard_normal((41, 13)) * 300).astype(np.float32)
    text = tf.emit(vals)
    want = textoutput.parse_output(text)

    class Fault(Exception):
        pass

    def fault():
        raise Fault

    blocks = textcore.RowBlocks(memoryview(text), step, fault)
    got = np.full((41, 13), np.nan)
    starts = list(range(0, 41, step))[::-1]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda r0: blocks.read(r0, got[r0 : r0 + step].reshape(-1).data), starts))
    assert got.tobytes() == want.tobytes()
    lines = text.split(b"\n")
    for bad in (text + b"  1.00\n", text[:-1], b"\n".join([*lines[:-3], b""])):
        with pytest.raises(Fault):
            textcore.RowBlocks(memoryview(bad), step, fault)
    lines[40] = b" x" + lines[40][2:]
    spoilt = textcore.RowBlocks(memoryview(b"\n".join(lines)), step, fault)
    last = (39 // step) * step  # the block that holds row 39 (line 40)
    for r0 in range(0, 41, step):
        into = np.zeros((min(step, 41 - r0), 13))
        if r0 == last:
            with pytest.raises(Fault):
                spoilt.read(r0, into.reshape(-1).data)
        else:
            spoilt.read(r0, into.reshape(-1).data)


FLT_MAX = float(np.finfo(np.float32).max)
#: Float32 values from 1e13 on: fields of 14 to 39 digits before the point, which the byte loop reads whole.
WIDE_LEAST = float(np.nextafter(np.float32(1e13), np.float32(np.inf)))  # 10000000876544
_wide_value = st.floats(WIDE_LEAST, FLT_MAX, width=32) | st.floats(-FLT_MAX, -WIDE_LEAST, width=32)

_out_value = st.one_of(
    st.floats(-1e4, 1e4, width=32),
    st.floats(-(2.0**39), 2.0**39, width=32),
    st.sampled_from([0.0, -0.0, -0.004, 0.005, -0.005, 0.125, -99.995, 999.995, 9999999.0, -1e11]),
    _wide_value,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.data())
def test_output_values_three_ways(m, n, data):
    vals = data.draw(st.lists(_out_value, min_size=m * n, max_size=m * n))
    c = np.array(vals, dtype=np.float32).reshape(m, n)
    raw = tf.emit(c)
    got = _output_three_ways(raw)
    assert got[0] == "ok"
    want = np.array([[float("%.2f" % float(v)) for v in row] for row in c])
    np.testing.assert_array_equal(textoutput.parse_output(raw).view(np.uint64), want.view(np.uint64))


_out_junk = st.sampled_from([" ", "  ", "-", "0", "7", ".", "\n", "\t", "\r", "x", "+", "e", "\x00", "1.00", "-0.00"])


@pytest.mark.integration  # seconds of examples or of real runs: left out of `make quick`
@settings(max_examples=400, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_corrupted_outputs_same_outcome(m, n, data):
    vals = data.draw(st.lists(_out_value, min_size=m * n, max_size=m * n))
    raw = bytearray(tf.emit(np.array(vals, dtype=np.float32).reshape(m, n)))
    head = raw.index(b"\n") + 1
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(head, len(raw)))
        what = data.draw(st.sampled_from(["insert", "delete", "replace", "cut"]))
        junk = data.draw(_out_junk).encode()
        if what == "insert":
            raw[i:i] = junk
        elif what == "delete" and i < len(raw):
            del raw[i]
        elif what == "replace" and i < len(raw):
            raw[i : i + 1] = junk
        elif what == "cut":
            del raw[i:]
    _output_three_ways(bytes(raw))


@pytest.mark.integration  # seconds of examples or of real runs: left out of `make quick`
@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.integers(8, 40), st.data())
def test_corrupted_wide_outputs_same_outcome(m, n, data):
    """Rows long enough for the C path's 64-byte windows, corrupted anywhere (a fault found in a
    window must be named as the byte loop names it)."""
    vals = data.draw(st.lists(_out_value, min_size=m * n, max_size=m * n))
    raw = bytearray(tf.emit(np.array(vals, dtype=np.float32).reshape(m, n)))
    head = raw.index(b"\n") + 1
    i = data.draw(st.integers(head, len(raw) - 1))
    what = data.draw(st.sampled_from(["insert", "delete", "replace"]))
    junk = data.draw(_out_junk).encode()
    if what == "insert":
        raw[i:i] = junk
    elif what == "delete":
        del raw[i]
    else:
        raw[i : i + 1] = junk
    _output_three_ways(bytes(raw))


# fields that break the output grammar one rule at a time (a leading zero, a sign, the width, ...)
_BAD_FIELDS = [
    b" 01.00",
    b"-01.00",
    b" 00.50",
    b"+1.00",
    b"  +1.00",
    b" 1.0 0",
    b" 1 .00",
    b"  1.000",
    b"-  1.00",
    b" - 1.00",
    b"  1.00 ",
    b"   1.0",
    b"1.00",
    b"  -1.00",
    b" 12345678901234.00",
    b"  1.-0",
    b"  1..00",
]


@pytest.mark.parametrize("bad", _BAD_FIELDS)
def test_bad_fields_in_long_rows(bad):
    """A field that breaks one rule, at every place in rows long enough for the windows: the same
    outcome every way (the AVX2 rows check every field of a window at once)."""
    rng = np.random.default_rng(len(bad))
    vals = np.round(rng.uniform(-999, 999, (3, 23)), 2).astype(np.float32)
    rows = [b"".join(b"%6.2f" % v for v in row) + b"\n" for row in vals]
    for col in range(0, 23, 3):
        fields = [b"%6.2f" % v for v in vals[1]]
        fields[col] = bad
        got = b"3 23\n" + rows[0] + b"".join(fields) + b"\n" + rows[2]
        assert _output_three_ways(got)[0] == "error", (bad, col)


@pytest.fixture(params=[True, False], ids=["avx2", "sse2"])
def wide(request):
    """Outputs read by the AVX2 rows (where the CPU has them: else this is the SSE2 case again), then the SSE2 ones."""
    was = ft.set_wide(request.param)
    yield request.param
    ft.set_wide(was)


@pytest.mark.parametrize("threads", [1, 2, 3, 5, 16, 40])
def test_parts_read_alike(threads, wide):
    """Any number of parts (more than there are rows, more than MAX_PARTS) reads the same values,
    and a fault in any part is found (an output's named exactly as one thread names it)."""
    rng = np.random.default_rng(threads)
    a, b = rng.uniform(-10, 10, (37, 23)).astype(np.float32), rng.uniform(-10, 10, (23, 41)).astype(np.float32)
    data = b"".join(tf.emit_input_chunks(a, b, square=False))
    off = tf.parse_header(data).body_offset
    got_a, got_b = np.empty_like(a), np.empty_like(b)
    assert ft.parse_values(data, off, got_a, got_b, 0, threads) == (0, len(data))
    np.testing.assert_array_equal(got_a, tf.parse(data).a)
    np.testing.assert_array_equal(got_b, tf.parse(data).b)
    wide_a, wide_b = np.empty(a.shape), np.empty(b.shape)
    assert ft.parse_values(data, off, wide_a, wide_b, 0, threads) == (0, len(data))
    np.testing.assert_array_equal(wide_a, got_a.astype(np.float64))
    np.testing.assert_array_equal(wide_b, got_b.astype(np.float64))
    out = tf.emit(a @ b)
    o_off = out.index(b"\n") + 1
    want = np.empty((37, 41))
    assert ft.parse_output_values(out, o_off, 37, 41, want, 0, 1) is None
    got = np.empty((37, 41))
    assert ft.parse_output_values(out, o_off, 37, 41, got, 0, threads) is None
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
    for at in (o_off + 3, len(out) // 3, len(out) // 2 + 5, len(out) - 4):
        bad = out[:at] + b"x" + out[at + 1 :]
        assert ft.parse_output_values(bad, o_off, 37, 41, got, 0, threads) == ft.parse_output_values(
            bad, o_off, 37, 41, None, 0, 1
        )
        bad_in = data[: -at // 2] + b"x" + data[-at // 2 + 1 :]
        assert ft.parse_values(bad_in, off, got_a, got_b, 0, threads)[0] != 0


def _spoilt(field: bytes, how: str, at: int) -> bytes:
    """``field`` (a wide one, no padding) with one digit changed (to another but 0), one added, or a fraction."""
    digits = field[:-3]
    at = at % len(digits)
    if how == "digit" and digits[at : at + 1].isdigit():
        return digits[:at] + b"%d" % (int(digits[at : at + 1]) % 9 + 1) + digits[at + 1 :] + b".00"  # never a 0
    if how == "longer":
        return digits + b"0.00"
    return digits + b".50"


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.integers(1, 30), st.data())
def test_wide_fields_three_ways(m, n, data):
    """Fields of 14 to 39 digits before the point among ordinary ones, in rows long enough for the windows
    (which leave such rows to the byte loop): every path reads the same values, each the float32 printf
    wrote; one wide field spoilt (a digit, a digit more, a fraction) is the same first fault every way,
    or, where it is still printf's of a float32, its value."""
    vals = data.draw(st.lists(_out_value | _wide_value, min_size=m * n, max_size=m * n))
    c = np.array(vals, dtype=np.float32).reshape(m, n)
    raw = tf.emit(c)
    assert _output_three_ways(raw)[0] == "ok"
    np.testing.assert_array_equal(textoutput.parse_output(raw), [[float(b"%.2f" % float(v)) for v in row] for row in c])
    wide_at = [i for i, v in enumerate(c.reshape(-1)) if abs(float(v)) >= 1e13]
    if not wide_at:
        return
    i = data.draw(st.sampled_from(wide_at))
    fields = [b"%6.2f" % float(v) for v in c.reshape(-1)]
    fields[i] = _spoilt(
        fields[i], data.draw(st.sampled_from(["digit", "longer", "fraction"])), data.draw(st.integers(0, 40))
    )
    rows = [b"".join(fields[r * n : (r + 1) * n]) + b"\n" for r in range(m)]
    got = _output_three_ways(raw.split(b"\n", 1)[0] + b"\n" + b"".join(rows))
    if got[0] == "error":
        assert got[1].endswith("is not a float32 as printf writes it") and got[2] == 2 + i // n


def test_wide_output_values_exact(wide):
    """Every width the 64-byte windows read (1 to 13 digits, signs, zeros), against float()."""
    rng = np.random.default_rng(3)
    digits = rng.integers(0, 14, 4000)
    vals = np.array([rng.integers(0, 10**d) / 100 if d else 0.0 for d in digits]) * rng.choice([-1, 1], 4000)
    c = vals.reshape(40, 100)
    raw = b"40 100\n" + b"".join(b"".join(b"%6.2f" % v for v in row) + b"\n" for row in c)
    fields = [b"%6.2f" % v for v in c[0]]
    fields[3] = b"12345678901234.00"  # 14 digits, no float32: a fault the windows must leave to the byte loop
    big = raw.replace(b"".join(b"%6.2f" % v for v in c[0]), b"".join(fields), 1)
    assert _output_three_ways(big)[0] == "error"
    fields[3] = b"17592186044416.00"  # 2^44: a float32, read by the byte loop
    assert _output_three_ways(raw.replace(b"".join(b"%6.2f" % v for v in c[0]), b"".join(fields), 1))[0] == "ok"
    got = _output_three_ways(raw)
    assert got[0] == "ok"
    want = np.array([[float(b"%.2f" % v) for v in row] for row in c])
    np.testing.assert_array_equal(textoutput.parse_output(raw).view(np.uint64), want.view(np.uint64))


@pytest.mark.parametrize(
    "raw",
    [
        b"2 3\n",
        b"1\n",
        b"1\n  1.00",
        b"1\n  1.00\n  2.00\n  3.00\n",
        b"2\n  1.00  2.00\n  3.00  4.00\n  5.00  6.00\n  7.00  8.00\n",
        b"2\n  1.00  2.00\n  3.00x  4.00\n",
        b"2\n  1.00 2.00\n  3.00  x.00\n",
        b"2\n  1.00  2.00\n  3.00  4.00\n1e5\n",
        b"1 2\n10000000000000.00  1.00\n",
        b"1 2\n  1.00 1e400\n",
        b"1 2\n  1.00   nan\n",
        b"1 2\n  1.00  -inf\n",
        b"1 2\n  1.00123456789012345678901234567890.00\n",
        b"1 1\n  1.00\n",
        b"3 3\n  1.00  1.00  1.00\n",
        b"100000 100000\n  1.00\n",
        b"\xef\xbb\xbf1\n  1.00\n",
        b"1\n\xff\n",
    ],
)
def test_output_refusals_same_message(raw):
    got = _output_three_ways(raw)
    assert got[0] == "error" and got[1].startswith(f"line {got[2]}, column {got[4]}: ")


def test_output_big_fault_late_in_the_file():
    # big enough for the two-thread split; a fault in the second half, then one in the first
    rng = np.random.default_rng(8)
    c = (rng.standard_normal((300, 200)) * 3000).astype(np.float32)
    raw = bytearray(tf.emit(c))
    assert _output_three_ways(bytes(raw))[0] == "ok"
    late = len(raw) - 1000
    raw[late] = ord("x")
    got = _output_three_ways(bytes(raw))
    assert got[0] == "error" and got[2] > 250
    early = raw.index(b"\n") + 2
    raw[early] = ord("\t")
    got2 = _output_three_ways(bytes(raw))
    assert got2[2] == 2 and "is not in %6.2f format" in got2[1]
    del raw[-1]  # and the last newline
    assert _output_three_ways(bytes(raw))[2] == 2


def test_a_short_row_before_a_bad_field_is_the_first_fault_on_every_path():
    """Found by hypothesis: a row with too few fields, then a stray blank on the next line. A path without the
    accelerator compared the short row as a canonical partial row and named the blank first."""
    _output_three_ways(b"3 2\n  0.00-100.00\n9999999.00\n ")
