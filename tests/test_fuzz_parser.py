"""Fuzzing the input parser: it parses or refuses with a reason, never crashes, hangs or over-allocates.

Random bytes and near-valid files (a header, then values with mutations) go
through the daemon's path: ``textformat.parse_header``, ``pipeline.check_header``
with the memory limit, ``textformat.parse``. The outcome must be Matrices of the
promised shapes, or InputFormatError/LimitError with a non-empty reason. Each
example runs under a deadline (hypothesis) and a tracemalloc peak bound: a few
times the input plus the matrices the header promised, which check_header
keeps under the limit.
"""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmd import pipeline, textformat
from mmd.errors import InputFormatError, LimitError

#: Thousands of generated inputs: left out of `make quick`, run by `make test`.
pytestmark = pytest.mark.process

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
