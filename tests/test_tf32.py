"""cuBLAS's TF32 mode as a reference row: the registry entry, the fake's TF32 rounding, the backend's
math mode on both paths, and the TF32 tolerance the bench checks TF32 kernels against."""

from __future__ import annotations

import numpy as np
import pytest

from mmd import bench, textformat
from mmd import kernels as registry
from mmd.backends.base import MultiplyRequest
from mmd.check import full, tolerance
from mmd.check.product import reference
from mmd.errors import KernelError
from mmd.generate import input_chunks

from .fakes import cuda_backend, tf32_round


def rel_errors(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(max, rms) relative error against float64: max|C − ref| / max|ref|, ‖C − ref‖ / ‖ref‖."""
    ref = reference(a, b)
    diff = c.astype(np.float64) - ref
    return float(np.abs(diff).max() / np.abs(ref).max()), float(np.linalg.norm(diff) / np.linalg.norm(ref))


def uniform(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.uniform(-1, 1, (m, k)).astype(np.float32),
        rng.uniform(-1, 1, (k, n)).astype(np.float32),
    )


def test_the_registry_entry():
    spec = registry.get("cublas_tf32")
    assert spec.kind == registry.LIBRARY and spec.on_gpu and not spec.compiled and not spec.uses_tile
    assert spec.description == "cuBLAS with TF32 tensor cores (its speed ceiling, its accuracy)"
    assert spec.precision == "tf32" and registry.get("tc1").precision == "tf32"
    assert {registry.get(n).precision for n in registry.NAMES} <= set(registry.PRECISIONS)
    assert [n for n in registry.NAMES if registry.get(n).precision == "tf32"] == ["tc1", "cublas_tf32"]
    assert "cublas_tf32" in registry.GPU_KERNELS
    # The course's plan keeps the kernels the course teaches; the TF32 rung is the ladder plan's.
    assert set(registry.NAMES) - set(registry.COURSE_KERNELS) == {"tc1", "tc3", "cublas_tf32"}


def test_refused_before_ampere_with_the_reason():
    turing = registry.DeviceLimits(1024, 48 * 1024, 64 * 1024, name="Tesla T4", compute_capability=(7, 5))
    with pytest.raises(KernelError, match=r"^cublas_tf32 needs a GPU of compute capability 8.0 or newer \(TF32"):
        registry.check_launch("cublas_tf32", 32, turing)
    registry.check_launch("cublas", 32, turing)  # SGEMM runs anywhere
    backend, session = cuda_backend()
    session.device.limits = turing
    a, b = uniform(4, 4, 4)
    with pytest.raises(KernelError, match="TF32 tensor cores"):
        backend.multiply(a, b, MultiplyRequest(kernel="cublas_tf32"))
    assert session.allocs == 0 and session.products == 0


def test_tf32_rounding_of_the_fake():
    one = np.float32(1.0)
    ulp = 2.0**-10  # TF32's unit at 1
    x = np.array([1 + 2**-11, 1 + 2**-12, 1 + 2**-11 - 2**-23, -(1 + 2**-11), 3.0, 0.0, np.inf], np.float32)
    got = tf32_round(x)
    assert got.dtype == np.float32
    # ties away from zero (cvt.rna), below half a unit down, the sign kept, exact values and inf untouched
    assert got.tolist() == [1 + ulp, 1.0, 1.0, -(1 + ulp), 3.0, 0.0, np.inf]
    assert tf32_round(np.array([one])).tolist() == [1.0]
    rng = np.random.default_rng(1)
    v = rng.uniform(-1e3, 1e3, 100_000).astype(np.float32)
    r = tf32_round(v)
    assert not (r.view(np.uint32) & 0x1FFF).any()  # the low 13 mantissa bits are gone
    rel = np.abs(r.astype(np.float64) - v) / np.abs(v)
    assert rel.max() <= 2.0**-11  # at most half a unit
    assert 0.3 * 2.0**-11 < rel.mean() < 0.7 * 2.0**-11  # about a quarter of a unit on average, not zero


def test_the_backend_runs_cublas_in_tf32_mode_with_tf32_like_error():
    backend, session = cuda_backend()
    a, b = uniform(64, 512, 48)
    sgemm = backend.multiply(a, b, MultiplyRequest(kernel="cublas"))
    tf32 = backend.multiply(a, b, MultiplyRequest(kernel="cublas_tf32"))
    assert session.last is not None and session.last[0] == "cublas_tf32"
    assert tf32.kernel == "cublas_tf32" and tf32.tile is None
    # Each math mode is its own cuBLAS kernel: warmed up (set-up recorded as compile) on first use.
    assert "compile" in sgemm.timings_ms and "compile" in tf32.timings_ms
    assert "compile" not in backend.multiply(a, b, MultiplyRequest(kernel="cublas_tf32")).timings_ms
    max_s, rms_s = rel_errors(sgemm.c, a, b)
    max_t, rms_t = rel_errors(tf32.c, a, b)
    assert rms_s < 1e-6 and max_s < 1e-5
    assert 1e-4 < rms_t < 1e-3 and 1e-4 < max_t < 2e-3  # TF32's ~3e-4 (docs/tensorcores.md measures 2.6e-4)


def test_the_device_text_path_keeps_the_math_mode():
    backend, _ = cuda_backend()
    a, b = uniform(16, 256, 16, seed=3)
    data = b"".join(input_chunks(a * 10, b * 10, square=False))
    header = textformat.parse_header(data)
    read = textformat.parse(data, header)  # the two-decimal values the product is of
    sgemm = backend.multiply_text(data, header, MultiplyRequest(kernel="cublas"))
    tf32 = backend.multiply_text(data, header, MultiplyRequest(kernel="cublas_tf32"))
    assert rel_errors(tf32.c, read.a, read.b)[1] > 30 * rel_errors(sgemm.c, read.a, read.b)[1]


def test_tf32_tolerance_takes_a_tf32_product_that_fp32_refuses():
    for n in (16, 256):
        a, b = bench.make_inputs(n, n, n)
        ref = reference(a, b)
        fp32 = full.fp32_tolerance(a, b)
        tf32 = full.tf32_tolerance(fp32, n)
        c = tf32_round(a) @ tf32_round(b)
        assert not bench.check_product(c, ref, fp32, tolerance.TOLERANCES["fp32"]).ok
        report = bench.check_product(c, ref, tf32, tolerance.TOLERANCES["tf32"])
        assert report.ok, report.summary()
        # Truncated operands (the worst a TF32 path does) pass too; a kernel reading B's rows off by one,
        # or losing one element's sum, does not.
        bits = 0xFFFFE000
        trunc = (a.view(np.uint32) & bits).view(np.float32) @ (b.view(np.uint32) & bits).view(np.float32)
        assert bench.check_product(trunc, ref, tf32, "").ok
        shifted = tf32_round(a) @ tf32_round(np.roll(b, 1, axis=0))
        assert bench.check_product(shifted, ref, tf32, "").mismatches > n * n // 2
        c[n // 2, 3] = 0.0
        assert bench.check_product(c, ref, tf32, "").mismatches == 1
        # Same (|A||B|)-shaped allowance, wider by a fixed amount: 2^-9 on top of fp32's factor.
        np.testing.assert_allclose(tf32 - fp32, tolerance.TF32_OPERAND_ERROR * fp32 / (4 * np.sqrt(n) * 2.0**-23))


def test_the_bench_checks_tf32_kernels_against_the_tf32_tolerance(tmp_path):
    backend, _ = cuda_backend()
    plan = bench.Plan(kernels=("cublas", "cublas_tf32"), sizes=(64,), tiles=(32,), repeats=2)
    run = bench.run_plan(plan, backend, folder=tmp_path, env={})
    assert run.ok, [r.reason for r in run.rows]
    by = {r.kernel: r for r in run.rows}
    assert by["cublas_tf32"].status == "ok"
    assert by["cublas_tf32"].rel_error > 30 * by["cublas"].rel_error
