"""Tests for mmd.textformat: exact bytes, exact values, strict refusals."""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmd import accel, textcore, textoutput
from mmd import textformat as tf
from mmd.errors import InputFormatError, ProductRangeError

from .conftest import SPECIAL_VALUES

# ---------------------------------------------------------------------------
# emit


def _specials() -> np.ndarray:
    vals = [np.float32(v) for v in SPECIAL_VALUES]
    # ties: k/100 + 0.005 that are exact in float32 (multiples of 1/8 etc.)
    vals += [np.float32(k / 8) for k in range(-200, 200)]
    return np.array(vals, dtype=np.float32)


def test_emit_specials_match_reference():
    vals = _specials()
    c = vals.reshape(1, -1)
    assert tf.emit(c) == tf.format_reference(c)
    assert tf.emit(vals.reshape(-1, 1)) == tf.format_reference(vals.reshape(-1, 1))


def test_emit_known_bytes():
    c = np.array([[0.125, 0.375, -0.001, -0.0], [1000.0, -100.0, 123456.78, 2.675]], dtype=np.float32)
    assert tf.emit(c) == (b"2 4\n  0.12  0.38 -0.00 -0.00\n1000.00-100.00123456.78  2.67\n")
    assert tf.emit(np.array([[7.0]], dtype=np.float32)) == b"1\n  7.00\n"


def test_emit_nan_inf_do_not_crash():
    c = np.array([[np.nan, np.inf, -np.inf, 1.0]], dtype=np.float32)
    assert tf.emit(c) == b"1 4\n   nan   inf  -inf  1.00\n"


def test_emit_chunks_same_bytes():
    rng = np.random.default_rng(3)
    c = rng.uniform(-5000, 5000, (37, 23)).astype(np.float32)
    whole = tf.emit(c)
    for rows in (1, 2, 5, 36, 37, 100):
        pieces = list(tf.emit_chunks(c, rows_per_chunk=rows))
        # the header line alone, then blocks of rows; rows in one block go with it, in one piece (one write)
        assert pieces[0] == b"37 23\n" if rows < 37 else pieces == [whole]
        assert b"".join(pieces) == whole
    assert whole == tf.format_reference(c)


def test_emit_float64_input_matches_python():
    c = np.array([[2.675, 0.125, 1.005, -1.005, 0.015]], dtype=np.float64)
    assert tf.emit(c) == tf.format_reference(c)


def test_emit_random_many_match_reference():
    rng = np.random.default_rng(1)
    for scale in (1.0, 10.0, 1000.0, 1e6, 1e12):
        c = (rng.standard_normal((40, 50)) * scale).astype(np.float32)
        assert tf.emit(c) == tf.format_reference(c)
    # random bit patterns (finite, all magnitudes)
    bits = rng.integers(0, 2**32, size=4000, dtype=np.uint64).astype(np.uint32)
    c = bits.view(np.float32)
    c = c[np.isfinite(c)].reshape(1, -1)
    assert tf.emit(c) == tf.format_reference(c)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 7),
    st.integers(1, 7),
    st.data(),
)
def test_emit_hypothesis(m, n, data):
    vals = data.draw(
        st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=m * n, max_size=m * n)
    )
    c = np.array(vals, dtype=np.float32).reshape(m, n)
    assert tf.emit(c) == tf.format_reference(c)


def test_emit_matches_c_printf(c_printf):
    rng = np.random.default_rng(7)
    vals = np.concatenate(
        [
            _specials(),
            rng.uniform(-10, 10, 3000).astype(np.float32),
            (rng.standard_normal(2000) * 1e4).astype(np.float32),
            np.float32((np.arange(-500, 500) + 0.5) / 100),  # near-ties
            -rng.uniform(0, 0.006, 200).astype(np.float32),  # negatives near zero
        ]
    ).astype(np.float32)
    want = c_printf(vals)
    got = tf.emit(vals.reshape(1, -1))
    assert got.split(b"\n", 1)[1] == want


# ---------------------------------------------------------------------------
# parse


def _doc(m, k, n, a_vals, b_vals, sep=" ") -> bytes:
    head = f"{n}\n" if m == k == n else f"{m} {k} {n}\n"
    return (head + sep.join(a_vals) + "\n" + sep.join(b_vals) + "\n").encode()


def test_parse_basic_square_and_rect():
    got = tf.parse(b"2\n1 2\n3 4\n5 6 7 8\n")
    assert got.header == tf.Header(m=2, k=2, n=2, square=True, body_offset=2, line=1)
    np.testing.assert_array_equal(got.a, [[1, 2], [3, 4]])
    np.testing.assert_array_equal(got.b, [[5, 6], [7, 8]])
    assert got.a.dtype == np.float32 and got.a.flags.c_contiguous and got.b.flags.c_contiguous
    got = tf.parse(b"1 3 2\n1 2 3\n1 2\n3 4\n5 6")  # no final newline
    assert got.a.shape == (1, 3) and got.b.shape == (3, 2)
    np.testing.assert_array_equal(got.b, [[1, 2], [3, 4], [5, 6]])


def test_parse_1x1_bom_crlf_blank_lines():
    got = tf.parse(b"\xef\xbb\xbf1\r\n\r\n  -2.5\r\n\r\n\t+4e1 \r\n")
    assert got.a[0, 0] == np.float32(-2.5) and got.b[0, 0] == np.float32(40.0)
    assert got.header.body_offset == 6


#: Values in every form the grammar allows (tests/test_fasttext.py checks these and more on both paths).
VALUE_FORMS = [
    "3",
    "-2.50",
    ".5",
    "5.",
    "1.5e-3",
    "2E+4",
    "-0",
    "+7",
    "-.25",
    "0.1",
    "1e-45",
    "1e-50",
    "3.4028235e38",
    "-3.4028234e38",
    "12345678901234567890",
    "0.30000000000000004441",
    "1234567.891",
]


def test_parse_value_forms():
    toks = list(VALUE_FORMS)
    k = len(toks)
    data = _doc(1, k, 1, toks, ["1"] * k)
    got = tf.parse(data)
    want = np.array([np.float32(float(t)) for t in toks], dtype=np.float32)
    np.testing.assert_array_equal(got.a.reshape(-1), want)
    assert np.signbit(got.a[0, 6])


def test_parse_touching_fields():
    got = tf.parse(b"1 2 2\n100.00-25.50\n100.00100.00  -1.00  2.00\n")
    np.testing.assert_array_equal(got.a, [[100.0, -25.5]])
    np.testing.assert_array_equal(got.b, [[100.0, 100.0], [-1.0, 2.0]])


def test_parse_reads_emit_output_back():
    rng = np.random.default_rng(5)
    c = rng.uniform(-3000, 3000, (6, 6)).astype(np.float32)
    out = tf.emit(c)
    body = out.split(b"\n", 1)[1]
    doc = b"6\n" + body + body
    got = tf.parse(doc)
    want = np.float32(np.round(c.astype(np.float64), 2))
    np.testing.assert_array_equal(got.a, np.array([[np.float32(float("%.2f" % v)) for v in row] for row in c]))
    assert np.allclose(got.b, want, atol=0.006)


def _err(data: bytes) -> InputFormatError:
    with pytest.raises(InputFormatError) as info:
        tf.parse(data)
    return info.value


#: Tokens that are not values (tests/test_fasttext.py checks these and more on both paths).
BAD_TOKENS = [
    "x",
    "0x1p3",
    "nan",
    "NaN",
    "inf",
    "-Infinity",
    "infinity",
    "1_000",
    "3,5",
    "1e",
    "--1",
    "1.2.3",
    "+",
    ".",
    "1e39",
    "3.5e38",
    "-1e39",
    "1.2345.6",
    "1.23-4",
    "é",
    "1e5x",
]


@pytest.mark.parametrize("bad", BAD_TOKENS)
def test_parse_refuses_value(bad):
    data = b"2\n1 2\n3 4\n5 6\n7 " + bad.encode() + b"\n"
    e = _err(data)
    assert e.line == 5
    assert e.value == bad
    assert str(e).startswith("line 5: '")
    if bad in ("1e39", "3.5e38", "-1e39"):
        assert "outside float32 range" in str(e)
    else:
        assert "is not a number" in str(e)


def test_parse_refuses_binary_and_nul():
    e = _err(b"1\n\x00\n2\n")
    assert e.line == 2
    e = _err(b"1\n1\n\xff\xfe\n")
    assert e.line == 3 and "\\xff" in e.value


def test_parse_long_value_shortened():
    e = _err(b"1\n1\n" + b"9" * 30 + b"x" * 50 + b"\n")
    assert e.line == 3 and len(e.value) <= 40 and e.value.endswith("...")


def test_parse_too_few_and_too_many():
    e = _err(b"3\n1 2 3\n4 5 6\n7 8 9\n1 2 3\n4 5 6\n7 8\n")
    assert str(e) == "line 7: expected 18 values (9 for A, 9 for B), found 17"
    assert e.line == 7
    e = _err(b"1\n1\n2\n\n3 4\n")
    assert e.line == 5 and e.value == "3" and str(e).startswith("too many values")
    e = _err(b"2 3 2\n")
    assert "found 0" in str(e)


def test_parse_too_many_after_touching_fields():
    e = _err(b"1\n1.001.00\n-2.00\n")
    assert e.line == 3 and e.value == "-2.00"


@pytest.mark.parametrize(
    "head",
    ["0", "-3", "3.0", "1e3", "2 3", "1 2 3 4", "abc", "+3", "3 0 3", "0x10", "３"],
)
def test_header_refusals(head):
    with pytest.raises(InputFormatError) as info:
        tf.parse_header(head.encode() + b"\n1 2\n")
    e = info.value
    assert e.line == 1
    assert str(e).startswith("line 1: header must be 'N' or 'M K N' with positive integers, got '")
    assert e.value == head.strip() or e.value == head


@pytest.mark.parametrize("head", ["9" * 5000, "2 3 " + "9" * 5000, "1" + "0" * 19, "0" * 9000 + "1" + "0" * 19])
def test_a_size_of_more_digits_than_any_file_holds_is_refused_in_a_short_line(head):
    """Python's int() refuses strings of over 4300 digits (a ValueError, a traceback from `mmd run`); a size of 20
    digits or more is past any file's values anyway. Leading zeros do not count, as for fscanf."""
    with pytest.raises(InputFormatError) as info:
        tf.parse_header(head.encode() + b"\n1 2\n")
    e = info.value
    assert e.line == 1 and len(str(e)) < 200
    assert str(e).startswith("line 1: a size in the header has more than 19 digits")
    assert tf.parse_header(b"0" * 9000 + b"3 0002 " + b"0" * 30 + b"1\n") == tf.Header(3, 2, 1, False, 9039, 1)


@pytest.mark.parametrize("head", ["", "   "])
def test_a_blank_first_line_is_skipped_and_the_next_one_judged(head):
    with pytest.raises(InputFormatError) as info:
        tf.parse_header(head.encode() + b"\n1 2\n")
    assert info.value.line == 2 and info.value.value == "1 2"
    assert str(info.value).startswith("line 2: header must be 'N' or 'M K N' with positive integers, got '1 2'")


def test_header_examples():
    assert tf.parse_header(b"4\n") == tf.Header(4, 4, 4, True, 2, 1)
    assert tf.parse_header(b"2 3 4\r\n") == tf.Header(2, 3, 4, False, 7, 1)
    assert tf.parse_header(b"\xef\xbb\xbf 2\t3 4 \n1") == tf.Header(2, 3, 4, False, 11, 1)
    assert tf.parse_header(b"5").body_offset == 1
    with pytest.raises(InputFormatError):
        tf.parse_header(b"")


@pytest.mark.parametrize(
    ("data", "header"),
    [
        (b"\n3\n1", tf.Header(3, 3, 3, True, 3, 2)),
        (b"\r\n\r\n  \t\n2 3 4\r\n1", tf.Header(2, 3, 4, False, 15, 4)),
        (b"\xef\xbb\xbf\n\n 5 \n", tf.Header(5, 5, 5, True, 9, 3)),
        (b"   \t 7", tf.Header(7, 7, 7, True, 6, 1)),
    ],
)
def test_blank_lines_and_whitespace_before_the_header_are_skipped(data, header):
    """As fscanf skips them (issue 15: a blank first line was refused though the README allows it)."""
    assert tf.parse_header(data) == header


def test_errors_after_leading_blank_lines_name_the_right_line():
    with pytest.raises(InputFormatError) as info:
        tf.parse_header(b"\n\n3.0\n1 2\n")
    assert info.value.line == 3 and str(info.value).startswith("line 3: header must be")
    data = b"\n\n2\n1 2\n3 x\n1 0 0 1\n"
    with pytest.raises(InputFormatError) as info:
        tf.parse(data, tf.parse_header(data))
    assert info.value.line == 5 and "'x'" in str(info.value)
    with pytest.raises(InputFormatError, match="whitespace only"):
        tf.parse_header(b"\n \n\t\r\n")


def test_the_header_must_lie_in_the_first_bytes():
    """Leading blank space is bounded: the header line must end within HEADER_WINDOW bytes (docs/textformat.md)."""
    padded = b"\n" * (textcore.HEADER_WINDOW - 3) + b"2\n"
    assert tf.parse_header(padded).line == textcore.HEADER_WINDOW - 2
    with pytest.raises(InputFormatError, match="first 65536 bytes"):
        tf.parse_header(b"\n" * textcore.HEADER_WINDOW + b"2\n1 2 3 4 5 6 7 8\n")


def test_a_header_read_from_the_first_bytes_of_a_bigger_file():
    """``size``: the whole file's size when ``data`` is only its first bytes (the pipeline reads those first)."""
    assert tf.parse_header(b"4 5 6\n1 2", size=10**9) == tf.Header(4, 5, 6, False, 6, 1)
    assert tf.parse_header(b"12", size=2) == tf.Header(12, 12, 12, True, 2, 1)
    with pytest.raises(InputFormatError, match="header must be"):
        tf.parse_header(b"12", size=10**9)  # the line goes on past what was read: never a header


def test_parse_accepts_given_header():
    data = b"1 1 2\n3\n4 5\n"
    h = tf.parse_header(data)
    got = tf.parse(memoryview(data), h)
    np.testing.assert_array_equal(got.b, [[4, 5]])


def test_parse_mixed_forms_matches_reference():
    rng = np.random.default_rng(11)
    m, k, n = 13, 17, 11
    vals = rng.uniform(-1e4, 1e4, m * k + k * n)
    forms = ["%.2f", "%.6f", "%g", "%.3e", "%d", "%.17g"]
    toks = [(forms[i % len(forms)] % v) if forms[i % len(forms)] != "%d" else "%d" % int(v) for i, v in enumerate(vals)]
    seps = [" ", "\t", "\r\n", "\n\n", "  "]
    body = "".join(t + seps[i % len(seps)] for i, t in enumerate(toks))
    data = f"{m} {k} {n}\n{body}".encode()
    got = tf.parse(data)
    ref = tf.parse_reference(data)
    np.testing.assert_array_equal(got.a, ref.a)
    np.testing.assert_array_equal(got.b, ref.b)
    want = np.array([np.float32(float(t)) for t in toks], dtype=np.float32)
    np.testing.assert_array_equal(np.concatenate([got.a.ravel(), got.b.ravel()]), want)


_num = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda v: "%.2f" % v),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.integers(-(10**12), 10**12).map(str),
    st.floats(-1e30, 1e30, allow_nan=False).map(lambda v: "%.4e" % v),
    st.integers(0, 99999).map(lambda v: ".%d" % v),
    st.integers(0, 99999).map(lambda v: "%d." % v),
    st.integers(0, 999).map(lambda v: "+%d.5" % v),
    st.integers(0, 10**17).map(lambda v: "-%d.%d" % (v, v % 97)),
)
_sep = st.sampled_from([" ", "\t", "\r\n", "\n", "\n\n", " \t ", "\r\n\r\n"])


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.data())
def test_parse_hypothesis_vs_reference(m, k, n, data):
    count = m * k + k * n
    toks = data.draw(st.lists(_num, min_size=count, max_size=count))
    seps = data.draw(st.lists(_sep, min_size=count, max_size=count))
    body = "".join(t + s for t, s in zip(toks, seps, strict=True))
    raw = f"{m} {k} {n}\n{body}".encode()
    got = tf.parse(raw)
    ref = tf.parse_reference(raw)
    np.testing.assert_array_equal(got.a, ref.a)
    np.testing.assert_array_equal(got.b, ref.b)
    want = np.array([np.float32(float(t)) for t in toks], dtype=np.float32)
    flat = np.concatenate([got.a.ravel(), got.b.ravel()])
    np.testing.assert_array_equal(flat, want)
    np.testing.assert_array_equal(np.signbit(flat), np.signbit(want))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 7), st.integers(1, 7), st.data())
def test_round_trip_hypothesis(m, n, data):
    vals = data.draw(st.lists(st.floats(-1e5, 1e5, width=32), min_size=m * n, max_size=m * n))
    c = np.array(vals, dtype=np.float32).reshape(m, n)
    out = tf.emit(c)
    back = textoutput.parse_output(out)
    want = np.array([[float("%.2f" % float(v)) for v in row] for row in c])
    np.testing.assert_array_equal(back, want)
    # the output rows read as input (n x n ... use it as A with k = n)
    body = out.split(b"\n", 1)[1]
    doc = b"%d %d 1\n" % (m, n) + body + b"1\n" * n
    got = tf.parse(doc)
    np.testing.assert_array_equal(got.a, want.astype(np.float32))


# ---------------------------------------------------------------------------
# parse_output


def test_parse_output_ok():
    c = np.array([[1.5, -2.25, 1000.0], [0.0, -0.0, 123456.0]], dtype=np.float32)
    got = textoutput.parse_output(tf.emit(c))
    assert got.dtype == np.float64 and got.shape == (2, 3)
    np.testing.assert_array_equal(got, [[1.5, -2.25, 1000.0], [0.0, -0.0, 123456.0]])
    sq = textoutput.parse_output(b"1\n  3.14\n")
    assert sq[0, 0] == 3.14


def _out_err(data: bytes) -> InputFormatError:
    with pytest.raises(InputFormatError) as info:
        textoutput.parse_output(data)
    return info.value


def test_parse_output_strict():
    good = b"2 3\n  1.00  2.00  3.00\n  4.00  5.00  6.00\n"
    assert textoutput.parse_output(good).shape == (2, 3)
    e = _out_err(b"2 3\n  1.00  2.00\n  4.00  5.00  6.00\n")
    assert e.line == 2 and "expected 3 fields, found 2" in str(e)
    e = _out_err(b"2 3\n  1.00  2.00  3.00\n  4.00  5.00  6.00")
    assert e.line == 3 and "missing final newline" in str(e)
    e = _out_err(b"2 3\n  1.00  2.00  3.00\n  4.00 5.00  6.00\n")
    assert e.line == 3 and "%6.2f" in str(e)
    e = _out_err(b"2 3\n  1.00  2.00  3.00\n  4.00  5.0   6.00\n")
    assert e.line == 3
    e = _out_err(b"2 3\n  1.00  2.00  3.00\n  4.00  5.00 6.000\n")
    assert e.line == 3
    e = _out_err(b"2 3\n  1.00  2.00  3.00\n  4.00  5.00  6.00\n  7.00  8.00  9.00\n")
    assert e.line == 4
    e = _out_err(b"2 3\n  1.00  2.00  3.00\n")
    assert e.line == 2 and "expected 2 rows" in str(e)
    e = _out_err(b"2 3\n  1.00  2.00  3.00\n\n  4.00  5.00  6.00\n")
    assert e.line == 3
    e = _out_err(b"2 3\n  1.00  2.00  x.00\n  4.00  5.00  6.00\n")
    assert e.line == 2
    e = _out_err(b"2 3\n +1.00  2.00  3.00\n  4.00  5.00  6.00\n")
    assert e.line == 2


@pytest.mark.parametrize("head", [b"3 3\n", b"2 3 4\n", b"03\n", b" 3\n", b"3\r\n", b"x\n", b"", b"\xef\xbb\xbf1\n"])
def test_parse_output_bad_header(head):
    e = _out_err(head + b"  1.00\n")
    assert e.line == 1 and "header" in str(e)


def test_parse_output_wide_touching():
    c = np.array([[-2133.45, 1234.5, 100.0, -0.004]], dtype=np.float32)
    out = tf.emit(c)
    assert out == b"1 4\n-2133.451234.50100.00 -0.00\n"
    np.testing.assert_array_equal(textoutput.parse_output(out), [[-2133.45, 1234.5, 100.0, -0.0]])


def test_references_agree_small():
    data = b"2\n1 2.5 -3 4e-2\n.5 5. 6 7\n"
    a = tf.parse(data)
    r = tf.parse_reference(data)
    np.testing.assert_array_equal(a.a, r.a)
    np.testing.assert_array_equal(a.b, r.b)


# ---------------------------------------------------------------------------
# parse_output: the first fault's line, column and words (both paths)


@pytest.fixture(params=["c", "numpy"])
def accelerator(request, monkeypatch):
    """Through mmd._fasttext, then through the numpy path."""
    if request.param == "c" and accel.fasttext is None:
        pytest.skip("mmd._fasttext is not built")
    monkeypatch.setattr(accel, "ON", request.param == "c")
    return request.param


@pytest.mark.parametrize(
    ("raw", "message", "value"),
    [
        (b"2 3\n  1.00  2.00\n  4.00  5.00  6.00\n", "line 2, column 13: expected 3 fields, found 2", None),
        (b"2 3\n  1.00  2.00  3.00  9.00\n  4.00  5.00  6.00\n", "line 2, column 19: expected 3 fields, found 4", None),
        (b"1 2\n  1.00  2.00", "line 2, column 13: missing final newline", None),
        (b"1 2\n  1.00 2.00\n", "line 2, column 7: field ' 2.00' is not in %6.2f format (width)", " 2.00"),
        (b"1 2\n  1.00   2.00\n", "line 2, column 7: field '   2.00' is not in %6.2f format (width)", "   2.00"),
        (b"1 2\n  1.00  x.00\n", "line 2, column 7: field '  x.00' is not in %6.2f format", "  x.00"),
        (b"1 2\n  1.00  2.0\n", "line 2, column 7: field '  2.0' is not in %6.2f format", "  2.0"),
        (b"1 2\n  1.00  1e+00\n", "line 2, column 7: field '  1e+00' is not in %6.2f format", "  1e+00"),
        (b"1 2\n  1.00  2.00\r\n", "line 2, column 13: field '\\r' is not in %6.2f format", "\\r"),
        (b"2 1\n  1.00\n", "line 2, column 7: expected 2 rows of 1 fields, found 1 values", None),
        (b"2 1\n", "line 1, column 4: expected 2 rows of 1 fields, found 0 values", None),
        (b"1 1\n  1.00\n", "line 1, column 1: header must be 'N' or 'M N' (as mmd writes it), got '1 1'", "1 1"),
        (b"1\n  1.00\n  2.00\n", "line 3, column 1: unexpected content after the last of 1 rows", "  2.00"),
        (b"1\n  1.00\n\n", "line 3, column 1: unexpected content after the last of 1 rows", ""),
        # more than 13 digits before the point: printf's of a float32 (an integer, exactly its decimal) or a fault
        (
            b"1 2\n  1.0010000000000000.00\n",  # 1e13 is no float32 (9999999827968 is the nearest)
            "line 2, column 7: value '10000000000000.00' is not a float32 as printf writes it",
            "10000000000000.00",
        ),
        (
            b"1 2\n  1.0017592186044416.50\n",  # 2^44, a float32, with a fraction
            "line 2, column 7: value '17592186044416.50' is not a float32 as printf writes it",
            "17592186044416.50",
        ),
        (
            b"1 2\n  1.00-17592186044417.00\n",  # 2^44 + 1: no float32
            "line 2, column 7: value '-17592186044417.00' is not a float32 as printf writes it",
            "-17592186044417.00",
        ),
        (
            # FLT_MAX + 1: the double nearest it is FLT_MAX, a float32, but these are not its digits
            b"1 2\n340282346638528859811704183484516925441.00  1.00\n",
            "line 2, column 1: value '3402823466385288598117041834845169254...' is not a float32 as printf writes it",
            "3402823466385288598117041834845169254...",
        ),
        (
            b"1 2\n  1.003402823466385288598117041834845169254400.00\n",  # 40 digits: beyond every float32
            "line 2, column 7: value '3402823466385288598117041834845169254...' is not a float32 as printf writes it",
            "3402823466385288598117041834845169254...",
        ),
        (
            b"1 2\n  1.001000000000000000000000000000000000000000.00\n",  # 1e39: beyond float32, 40 digits
            "line 2, column 7: value '1000000000000000000000000000000000000...' is not a float32 as printf writes it",
            "1000000000000000000000000000000000000...",
        ),
        (
            b"1 2\n  1.00 17592186044416.00\n",  # a wide field padded: the width rule comes first
            "line 2, column 7: field ' 17592186044416.00' is not in %6.2f format (width)",
            " 17592186044416.00",
        ),
    ],
)
def test_parse_output_first_fault_words(accelerator, raw, message, value):
    e = _out_err(raw)
    assert str(e) == message
    assert e.value == value
    assert e.details["column"] == int(message.split("column ")[1].split(":")[0])


def test_parse_output_first_fault_wins(accelerator):
    # a width fault on line 2 comes before junk on line 3 and a count fault on line 4
    raw = b"3 2\n  1.00 2.00\n  1.00  x.00\n  1.00\n"
    assert str(_out_err(raw)) == "line 2, column 7: field ' 2.00' is not in %6.2f format (width)"
    raw = b"3 2\n  1.00  2.00\n  1.00  2.00\n  1.00  2.00  \n  x\n"
    assert str(_out_err(raw)) == "line 4, column 13: field '  ' is not in %6.2f format"


def test_parse_output_largest_values(accelerator):
    got = textoutput.parse_output(b"1 3\n9999999999999.99-9999999999999.99 -0.00\n")
    assert got.tolist() == [[9999999999999.99, -9999999999999.99, -0.0]]
    assert np.signbit(got[0, 2])
    c = np.array([[3e12, -0.004, 123456.78]], dtype=np.float32)
    np.testing.assert_array_equal(textoutput.parse_output(tf.emit(c)), [[float("%.2f" % float(v)) for v in c[0]]])


FLT_MAX = float(np.finfo(np.float32).max)
#: Float32 values whose fields are wider than 13 digits before the point, up to FLT_MAX's 39.
WIDE = [FLT_MAX, -FLT_MAX, 1e13, -1e13, 123456789012345.0, 2.0**44, 2.0**63, 2.0**64, 1e16, 1e20, -3e38, 1e38]


def test_mmd_check_reads_every_float32_mmd_writes(accelerator):
    """Fields of up to 39 digits before the point: each read back as its float32, exactly."""
    c = np.array([WIDE, [-v for v in WIDE]], dtype=np.float32)
    out = tf.emit(c)
    assert out.split(b"\n")[1].startswith(b"340282346638528859811704183484516925440.00-3402823466385288")
    got = textoutput.parse_output(out)
    assert got.tolist() == c.astype(np.float64).tolist()
    assert textoutput.check_output(out) == (2, len(WIDE))
    smallest = np.nextafter(np.float32(1e13), np.float32(np.inf))  # the least float32 of 14 digits
    assert textoutput.parse_output(b"1 2\n10000000876544.00-10000000876544.00\n").tolist() == [
        [float(smallest), -float(smallest)]
    ]


def test_only_a_product_that_is_not_finite_is_refused():
    """Every finite float32 is printf's number; inf and nan are not."""
    c = np.array([[FLT_MAX, -FLT_MAX], [1e13, 0.5]], dtype=np.float32)
    size = tf.check_product(c)
    assert size.exact() == len(tf.emit(c)) <= size.at_most
    for bad, first in ((np.inf, "inf"), (-np.inf, "-inf"), (np.nan, "nan")):
        c[1, 0] = bad
        with pytest.raises(ProductRangeError) as info:
            tf.check_product(c)
        assert info.value.kind == "overflow"
        assert str(info.value) == (
            "the product holds values that are not finite, which the output format has no number for: "
            f"1 of 4 (first at row 2, col 1: {first})"
        )
        assert info.value.details == {"count": 1, "row": 2, "column": 1}


_finite_f32 = st.integers(0, 2**32 - 1).map(lambda u: np.uint32(u).view(np.float32)).filter(np.isfinite)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.data())
def test_output_size_is_exact_and_its_bound_holds(m, n, data):
    """output_bytes is len(emit) for any float32 bit patterns; check_product's bound is never below it."""
    vals = data.draw(st.lists(st.one_of(_finite_f32, st.sampled_from(WIDE)), min_size=m * n, max_size=m * n))
    c = np.array(vals, dtype=np.float32).reshape(m, n)
    size = tf.check_product(c)
    assert tf.output_bytes(c) == size.exact() == len(tf.emit(c)) <= size.at_most
    if len({len("%6.2f" % float(v)) for v in c.reshape(-1)}) == 1:
        assert size.at_most == size.exact()


def test_output_size_of_a_big_product_in_blocks():
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    c = bits[np.isfinite(bits)][:270_000].reshape(600, 450)
    assert tf.output_bytes(c) == len(tf.emit(c))
    assert tf.output_bytes(np.zeros((0, 3), np.float32)) == tf.output_bytes_at_least(0, 3)
    with pytest.raises(ValueError):
        tf.output_bytes(np.zeros((2, 2)))  # float64: not a product's values


@pytest.fixture(scope="module")
def libc_printf():
    """C's own snprintf("%6.2f"), through ctypes: the definition of the format."""
    libc = ctypes.CDLL(None)

    def fmt(x: float) -> bytes:
        buf = ctypes.create_string_buffer(64)
        libc.snprintf(buf, 64, b"%6.2f", ctypes.c_double(x))
        return buf.value

    return fmt


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_finite_f32, min_size=1, max_size=40))
def test_every_finite_float32_is_written_as_printf_writes_it(accelerator, libc_printf, vals):
    """Any float32 bit patterns, FLT_MAX's 39 digits and negatives included: C printf's bytes, and Python's."""
    c = np.array(vals, dtype=np.float32).reshape(1, -1)
    want = b"".join(libc_printf(float(v)) for v in c[0])
    assert want == b"".join(b"%6.2f" % float(v) for v in c[0])
    out = tf.emit(c)
    assert out.split(b"\n", 1)[1] == want + b"\n"
    assert textoutput.parse_output(out).tolist() == [[float(b"%.2f" % float(v)) for v in c[0]]]  # the printed decimals


def test_the_widest_fields_are_printf_s(c_printf):
    edges = [FLT_MAX, 1e13, 1e16, 2.0**63 / 100, 2.0**52 / 100, 1e38]
    vals = np.array([w for e in edges for w in (e, -e)], np.float32)
    vals = np.concatenate(
        [vals, np.nextafter(vals, np.float32(0)), np.nextafter(vals[2:], vals[2:] * 2)]
    )  # not past FLT_MAX
    assert tf.emit(vals.reshape(1, -1)).split(b"\n", 1)[1] == c_printf(vals)


# ---------------------------------------------------------------------------
# input files (mmd gen): the bytes of the generator before the C emitter


def _old_input_chunks(a: np.ndarray, b: np.ndarray, square: bool):
    """mmd.generate.input_chunks as it was written before emit_input_chunks (the bytes to keep)."""
    m, k = a.shape
    n = b.shape[1]
    yield (f"{m}\n" if square else f"{m} {k} {n}\n").encode()
    for mat in (a, b):
        fmt = " ".join(["%.2f"] * mat.shape[1]) + "\n"
        for start in range(0, mat.shape[0], 256):
            with np.errstate(invalid="ignore"):  # signalling NaN bits
                block = mat[start : start + 256].astype(np.float64)
            yield "".join(fmt % tuple(row) for row in block).encode()


@pytest.mark.parametrize("accelerated", [True, False])
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40), st.integers(0, 2**32 - 1), st.integers(1, 9))
def test_emit_input_same_bytes_as_the_old_generator(accelerated, m, k, n, seed, rows):
    from mmd.generate import input_chunks, random_matrix

    if accelerated and accel.fasttext is None:
        pytest.skip("mmd._fasttext is not built")
    old_flag = accel.ON
    accel.ON = accelerated
    try:
        rng = np.random.default_rng(seed)
        a, b = random_matrix(rng, m, k, -1000, 1000), random_matrix(rng, k, n, -1000, 1000)
        want = b"".join(_old_input_chunks(a, b, square=False))
        assert b"".join(tf.emit_input_chunks(a, b, square=False, rows_per_chunk=rows)) == want
        assert b"".join(input_chunks(a, b, square=False)) == want
        sq = random_matrix(rng, m, m)
        assert b"".join(input_chunks(sq, sq, square=True)) == b"".join(_old_input_chunks(sq, sq, square=True))
    finally:
        accel.ON = old_flag


def test_emit_input_any_float32(accelerator):
    # every float32 (ties, -0.0, huge, tiny, nan and inf) as Python's '%.2f' writes it
    vals = np.array(
        [0.125, 0.375, -0.001, -0.0, 0.0, 2.675, 1e20, -3e38, 1e-30, np.nan, np.inf, -np.inf, 2.0**53, 5e15],
        dtype=np.float32,
    )
    bits = np.random.default_rng(3).integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    a = np.concatenate([vals, bits]).reshape(-1, 2)
    b = np.ones((2, 1), np.float32)
    assert b"".join(tf.emit_input_chunks(a, b, square=False)) == b"".join(_old_input_chunks(a, b, square=False))
    with pytest.raises(ValueError):
        list(tf.emit_input_chunks(a, np.ones((3, 1), np.float32), square=False))
    with pytest.raises(ValueError):
        list(tf.emit_input_chunks(a, b, square=True))


def _mapping_flags(buf: object) -> str | None:
    """The permissions /proc/self/maps shows for the mapping that holds ``buf`` (Linux), else None."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    for line in maps.read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return line.split()[1]
    return None


def test_value_buffers_are_zeroed_private_memory():
    """Big buffers are private mappings (a shared one is shmem, slower to fault in: textcore.buffer),
    small ones heap memory; both start at zeros, and numpy's arrays for values use them."""
    for size in (16, textcore.MAP_BUFFER_BYTES):
        buf = textcore.buffer(size)
        assert len(buf) == size and not any(memoryview(buf)[:: max(1, size // 64)])
    flags = _mapping_flags(buf)
    assert isinstance(buf, mmap.mmap) and (flags is None or flags == "rw-p"), flags
    big = tf.values_array(textcore.MAP_BUFFER_BYTES // 8, np.float64)
    assert isinstance(big.base, memoryview) and isinstance(big.base.obj, mmap.mmap)
    assert big.flags.writeable and not big.any()
