"""The GPU text path on a real GPU: parsed values and output bytes exactly the host's, same refusals.

Whole jobs go through :func:`mmd.pipeline.run_job` with ``text_path="gpu"``.
Parsing is checked with B = I (so C = A exactly): C must equal
``np.float32(float(token))`` for every token; the output must equal
``textformat.format_reference`` of the downloaded C byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmd import textformat
from mmd.backends import CpuBackend
from mmd.backends.base import MultiplyRequest
from mmd.record import as_dict

from ..conftest import run_file

pytestmark = pytest.mark.gpu

GPU = MultiplyRequest(kernel="tiled", tile=16, memory="device", text_path="gpu")
HOST = MultiplyRequest(kernel="cpu", text_path="host")
SEPS = [" ", "\t", "\n", "\r\n", "  ", " \r\n"]
#: Values that matter for %6.2f: ties of the binary value, -0 results, wide fields, huge magnitudes.
SPECIAL = [0.125, -0.125, 0.375, 2.675, -0.001, -0.0, 0.0, 0.005, 999.995, 1e6 + 0.5, -123456.789, 1e10, 9.999989e12]


def f32(x: float) -> float:
    return float(np.float32(x))


values = st.one_of(
    st.floats(-1e4, 1e4, width=32),
    st.floats(-999999995904.0, 999999995904.0, width=32),  # +-1e12, as float32
    st.sampled_from([f32(v) for v in SPECIAL]),
    st.integers(-(10**6), 10**6).map(lambda i: f32(i / 8)),
)
styles = st.sampled_from(["repr", "g9", "e", "f2", "int-ish"])


def token(v: float, style: str) -> str:
    if style == "repr":
        return repr(v)
    if style == "g9":
        return "%.9g" % v
    if style == "e":
        return "%.8e" % v
    if style == "f2":
        return "%.2f" % v
    return "%.0f" % v if abs(v) < 1e9 else repr(v)


def write_input(tmp_path, a: np.ndarray, tokens: list[str], seps: list[str], name: str, crlf: bool) -> bytes:
    m, k = a.shape
    eye = ["1" if i == j else "0" for i in range(k) for j in range(k)]
    body = "".join(t + s for t, s in zip(tokens + eye, seps * (len(tokens) + len(eye)), strict=False))
    text = (f"{m} {k} {k}" + ("\r\n" if crlf else "\n") + body).encode()
    (tmp_path / name).write_bytes(text)
    return text


def gpu_job(backend, tmp_path, name: str, request=GPU):
    src = tmp_path / name
    out = tmp_path / (name + ".out")
    return run_file(src, out, backend, request), out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=st.tuples(st.integers(1, 12), st.integers(1, 12)),
    data=st.data(),
    style=styles,
    seps=st.lists(st.sampled_from(SEPS), min_size=1, max_size=5),
    crlf=st.booleans(),
)
def test_parse_and_emit_equal_the_host(cuda_backend, tmp_path, shape, data, style, seps, crlf):
    m, k = shape
    vals = data.draw(st.lists(values, min_size=m * k, max_size=m * k))
    a = np.array(vals, np.float32).reshape(m, k)
    tokens = [token(float(v), style) for v in a.reshape(-1)]
    text = write_input(tmp_path, a, tokens, seps, "p.txt", crlf)
    result, out = gpu_job(cuda_backend, tmp_path, "p.txt")
    assert result.ok, result.record.get("error")
    assert as_dict(result.record)["text"]["path"] == "gpu"
    want = textformat.parse_reference(text).a  # float(token) then float32
    c = np.array(result.product.c)
    assert np.array_equal(c, want), "parsed values differ from float32(strtod)"
    got = out.read_bytes()
    assert got == textformat.format_reference(c)
    assert got == textformat.emit(want) or np.signbit(want).any()  # -0 * 1 + 0 may print as 0.00


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.lists(values, min_size=3, max_size=3), min_size=1, max_size=6))
def test_printf_read_back_form(cuda_backend, tmp_path, rows):
    """mmd's own %6.2f output (touching fields) reads back as input."""
    a = np.array(rows, np.float32)
    m, k = a.shape
    body = "".join("".join("%6.2f" % float(v) for v in row) + "\n" for row in a)
    eye = "".join(" ".join("1" if i == j else "0" for j in range(k)) + "\n" for i in range(k))
    text = f"{m} {k} {k}\n{body}{eye}".encode()
    (tmp_path / "r.txt").write_bytes(text)
    result, out = gpu_job(cuda_backend, tmp_path, "r.txt")
    assert result.ok, result.record.get("error")
    assert np.array_equal(np.array(result.product.c), textformat.parse_reference(text).a)
    assert out.read_bytes() == textformat.format_reference(np.array(result.product.c))


def test_exotic_tokens_take_the_exact_path(cuda_backend, tmp_path):
    toks = ["1e3", "-2.5E-2", "0.1000000000000000055511151231257827", "1234567890.12345678901234", "+.5", "5.",
            "-0", "1" + "0" * 12, "0." + "0" * 30 + "1", "7"]  # fmt: skip
    m, k = 2, 5
    text = (f"{m} {k} {k}\n" + " ".join(toks) + "\n"
            + "\n".join(" ".join("1" if i == j else "0" for j in range(k)) for i in range(k))).encode()  # fmt: skip
    (tmp_path / "x.txt").write_bytes(text)
    result, out = gpu_job(cuda_backend, tmp_path, "x.txt")
    assert result.ok, result.record.get("error")
    assert as_dict(result.record)["text"]["exotic_runs"] >= 5
    assert np.array_equal(np.array(result.product.c), textformat.parse_reference(text).a)
    assert out.read_bytes() == textformat.format_reference(np.array(result.product.c))


def test_long_touching_runs(cuda_backend, tmp_path):
    k = 200  # a row of 200 touching 7-byte fields: a 1400-byte run, beyond MAX_RUN
    a = np.full((2, k), 1234.5, np.float32)
    a[1, :] = -9.999989e12  # the widest fields the format holds
    body = "".join("".join("%6.2f" % float(v) for v in row) + "\n" for row in a[:1])
    body += " ".join(repr(float(v)) for v in a[1]) + "\n"
    eye = "".join(" ".join("1" if i == j else "0" for j in range(k)) + "\n" for i in range(k))
    text = f"2 {k} {k}\n{body}{eye}".encode()
    (tmp_path / "h.txt").write_bytes(text)
    result, out = gpu_job(cuda_backend, tmp_path, "h.txt")
    assert result.ok, result.record.get("error")
    assert np.array_equal(np.array(result.product.c), textformat.parse_reference(text).a)
    assert out.read_bytes() == textformat.format_reference(np.array(result.product.c))


@pytest.mark.parametrize(
    "text",
    [
        "2\n1 0 0 1\n1 0 0 -1e14\n",  # 15 digits before the point: the gpu formats it
        "2\n1 0 0 1\n1 0 0 5e14\n",
        "2\n1 0 0 1\n1 0 0 -3.4028234663852886e38\n",  # FLT_MAX's 39 digits: the host formats it
    ],
)
def test_a_wide_field_is_written_as_on_the_host(cuda_backend, tmp_path, text):
    (tmp_path / "w.txt").write_text(text)
    result, out = gpu_job(cuda_backend, tmp_path, "w.txt")
    assert result.ok, result.error
    assert as_dict(result.record)["text"]["path"] == "gpu"
    got = out.read_bytes()
    assert got == textformat.format_reference(np.array(result.product.c))
    (tmp_path / "h.txt").write_text(text)
    host, host_out = gpu_job(CpuBackend(), tmp_path, "h.txt", request=HOST)
    assert host.ok and host_out.read_bytes() == got


@pytest.mark.parametrize(
    "text",
    [
        "1\n3e38\n10\n",  # beyond float32
        "1 2 1\n3e38 3e38\n3e38\n-3e38\n",  # inf - inf
    ],
)
def test_a_product_that_is_not_finite_is_refused_as_on_the_host(cuda_backend, tmp_path, text):
    (tmp_path / "o.txt").write_text(text)
    result, out = gpu_job(cuda_backend, tmp_path, "o.txt")
    host, _ = gpu_job(CpuBackend(), tmp_path, "o.txt", request=HOST)
    assert not result.ok and not out.exists()
    rec = as_dict(result.record)
    assert rec["error"]["kind"] == "overflow"
    # the same count; the first value may differ: a fused multiply-add makes inf where numpy's product
    # and sum make nan (3e38·-3e38 + inf is inf, rounded first it is -inf + inf)
    counted = [r["error"]["reason"].split(" (first at")[0] for r in (rec, as_dict(host.record))]
    assert counted[0] == counted[1]


BAD = [
    b"2\n1 2\n3 x4\n1 0 0 1\n",
    b"2\n1 2\n3 4\n1 0 0\n",
    b"2\n1 2\n3 4\n1 0 0 1 5\n",
    b"2\n1 nan\n3 4\n1 0 0 1\n",
    b"2\n1 2\r\n3 inf\n1 0 0 1\n",
    b"2\n1 2\n3 1e39\n1 0 0 1\n",
    b"2\n1 2\n3 -4e40\n1 0 0 1\n",
    b"2\n1 2\n3 1.2.3\n1 0 0 1\n",
    b"2\n1 2\n3 4\n1 0 0 1\x00\n",
    b"2\n1 2\n3 4\n1 0 0 --1\n",
    b"2\n1 2\n3 4.5-\n1 0 0 1\n",
]


@pytest.mark.parametrize("text", BAD, ids=range(len(BAD)))
def test_refusals_match_the_host_path(cuda_backend, tmp_path, text):
    (tmp_path / "e.txt").write_bytes(text)
    gpu, out = gpu_job(cuda_backend, tmp_path, "e.txt")
    host, _ = gpu_job(CpuBackend(), tmp_path, "e.txt", HOST)
    assert not gpu.ok and not host.ok and not out.exists()
    assert as_dict(gpu.record)["error"] == as_dict(host.record)["error"]


def test_whole_job_random_512(cuda_backend, tmp_path):
    from mmd.generate import input_chunks

    rng = np.random.default_rng(5)
    a = rng.uniform(-10, 10, (512, 512)).astype(np.float32)
    b = rng.uniform(-10, 10, (512, 512)).astype(np.float32)
    src = tmp_path / "w.txt"
    src.write_bytes(b"".join(input_chunks(a, b, square=True)))
    result, out = gpu_job(cuda_backend, tmp_path, "w.txt")
    assert result.ok and as_dict(result.record)["text"]["path"] == "gpu"
    assert not as_dict(result.record)["text"]["host_parse"]
    parsed = textformat.parse(src.read_bytes())
    c = np.array(result.product.c)
    ref = parsed.a.astype(np.float64) @ parsed.b.astype(np.float64)
    assert np.abs(c - ref).max() < 1e-5 * np.sqrt(512) * np.abs(ref).max()  # float32 accumulation
    assert out.read_bytes() == textformat.emit(c)
    t = as_dict(result.record)["timings_ms"]
    assert t["cuda"] == pytest.approx(sum(t[p] for p in ("malloc", "h2d", "kernel", "d2h", "free")), abs=0.01)
