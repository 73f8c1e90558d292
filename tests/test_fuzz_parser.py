"""Fuzzing the parsers: they parse or refuse with a reason, never crash, hang or over-allocate.

Random bytes and near-valid files (a header, then values with mutations) go
through the daemon's path: ``textformat.parse_header``, ``pipeline.check_header``
with the memory limit, ``textformat.parse``. The outcome must be Matrices of the
promised shapes, or InputFormatError/LimitError with a non-empty reason. Each
example runs under a deadline (hypothesis) and a tracemalloc peak bound: a few
times the input plus the matrices the header promised, which check_header
keeps under the limit. Outputs of any float32 values, mutated, go through
mmd check's reader, by the C path and the Python one, which must agree.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmd import accel, pipeline, textformat, textoutput
from mmd.errors import InputFormatError, LimitError

#: Thousands of generated inputs: left out of `make quick`, run by `make test`.
pytestmark = pytest.mark.integration

LIMITS = pipeline.Limits(max_memory_bytes=64 << 20, max_file_bytes=1 << 20)
#: Bytes of working memory allowed beyond the input and the promised matrices.
SLACK = 4 << 20


def run_parser(data: bytes) -> str:
    """Parse like run_job does; returns "ok" or the refusal kind. Anything else raised fails the test."""
    tracemalloc.start()
    try:
        try:
            header = textformat.parse_header(data)
            pipeline.check_header(header, len(data), LIMITS)
            matrices = textformat.parse(data, header)
        except (InputFormatError, LimitError) as exc:
            assert exc.reason and isinstance(exc.reason, str)
            outcome = exc.kind
            promised = 0
        else:
            assert matrices.a.shape == (header.m, header.k) and matrices.b.shape == (header.k, header.n)
            outcome = "ok"
            promised = 4 * (header.m * header.k + header.k * header.n)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 8 * len(data) + 2 * promised + SLACK, f"peak {peak} bytes for a {len(data)}-byte input"
    return outcome


FUZZ = settings(
    max_examples=300,
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes(data):
    run_parser(data)


NUMBER = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(repr),
    st.sampled_from(["1e39", "-1e-50", "1.", ".5", "+3", "--1", "1e", "0x10", "nan", "inf", "1,5", "١", "1_0"]),
    st.text(alphabet="0123456789.eE+-", min_size=1, max_size=12),
)
SEP = st.sampled_from([" ", "\t", "\n", "\r\n", "  ", "\n\n", "", "\x00", "\v", "\f"])


@st.composite
def near_valid(draw) -> bytes:
    m, k, n = draw(st.integers(0, 12)), draw(st.integers(0, 12)), draw(st.integers(0, 12))
    square = draw(st.booleans())
    header = f"{m}" if square else f"{m} {k} {n}"
    header = draw(st.sampled_from([header, header + " ", " " + header, header + " 7", "-" + header, header + ".0"]))
    count = (m * m * 2 if square else m * k + k * n) + draw(st.integers(-2, 2))
    values = [draw(NUMBER) for _ in range(max(0, min(count, 300)))]
    body = "".join(v + draw(SEP) for v in values)
    prefix = draw(st.sampled_from(["", "\ufeff", "\n"]))
    return (prefix + header + draw(st.sampled_from(["\n", "\r\n", " ", ""])) + body).encode("utf-8", "replace")


@FUZZ
@given(near_valid())
def test_near_valid_inputs(data):
    run_parser(data)


@FUZZ
@given(
    st.integers(0, 10**12),
    st.integers(0, 10**12),
    st.integers(0, 10**12),
    st.binary(max_size=64),
)
def test_huge_headers_are_refused_before_allocating(m, k, n, body):
    data = f"{m} {k} {n}\n".encode() + body
    outcome = run_parser(data)
    if 4 * (m * k + k * n + m * n) > LIMITS.max_memory_bytes:
        assert outcome != "ok"


def test_header_promising_a_million_squared():
    assert run_parser(b"1000000 1000000 1000000\n1 2 3\n") in ("input", "limit")
    assert run_parser(b"1000000\n" + b"1 " * 1000) in ("input", "limit")


def test_whitespace_bomb_is_linear():
    data = b"1\n" + b" \t\r\n" * (1 << 18) + b"2\n" + b" " * (1 << 20) + b"3\n"
    assert run_parser(data) == "ok"
    assert run_parser(b" \n" * (1 << 20)) == "input"


# ---------------------------------------------------------------------------
# mmd check's reader of outputs: fields of every width a float32 makes, mutated


def read_output(data: bytes) -> tuple:
    """('ok', value bits) or ('input', message): anything else raised fails the test."""
    try:
        got = textoutput.parse_output(data)
    except InputFormatError as exc:
        assert exc.reason and isinstance(exc.reason, str)
        return ("input", exc.reason)
    return ("ok", got.shape, got.view("u8").tobytes())


def read_output_both_ways(data: bytes) -> tuple:
    """The C reader's outcome, the same as the Python one's (where the C one is built)."""
    was = accel.ON
    accel.ON = False
    try:
        python = read_output(data)
    finally:
        accel.ON = was
    if accel.fasttext is not None:
        accel.ON = True
        try:
            assert read_output(data) == python
        finally:
            accel.ON = was
    return python


FLOAT32 = st.integers(0, 2**32 - 1).map(lambda u: np.uint32(u).view(np.float32)).filter(np.isfinite)
OUT_JUNK = st.sampled_from([" ", "-", "0", "1", "9", ".", "\n", "x", "00", ".00", ".50", "1" * 30, "\x00"])


@st.composite
def near_valid_output(draw) -> bytes:
    m, n = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    c = np.array(draw(st.lists(FLOAT32, min_size=m * n, max_size=m * n)), np.float32).reshape(m, n)
    raw = bytearray(textformat.emit(c))
    head = raw.index(b"\n") + 1
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(head, len(raw)))
        junk = draw(OUT_JUNK).encode()
        what = draw(st.sampled_from(["insert", "delete", "replace"]))
        if what == "insert":
            raw[i:i] = junk
        elif what == "delete":
            del raw[i : i + 1]
        else:
            raw[i : i + 1] = junk
    return bytes(raw)


@FUZZ
@given(near_valid_output())
def test_near_valid_outputs_are_read_alike(data):
    """Outputs of any float32 values (fields up to 39 digits before the point), mutated: read or refused
    with a reason, never a crash, and the C reader and the Python one agree on the values and the first fault."""
    read_output_both_ways(data)


@FUZZ
@given(st.lists(FLOAT32, min_size=1, max_size=30))
def test_every_output_mmd_writes_is_read_back(vals):
    c = np.array(vals, np.float32).reshape(1, -1)
    got = read_output_both_ways(textformat.emit(c))
    assert got[0] == "ok"
    assert np.frombuffer(got[2], np.float64).tolist() == [float(b"%.2f" % float(v)) for v in vals]
