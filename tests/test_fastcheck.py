"""Tests for mmd._fastcheck, the C passes of mmd.check's value checks.

Every check is made five ways on the same inputs: through the C passes
(their AVX2 kernels where the CPU has AVX2, and their two-double kernels),
each as mmd.check's full and quick checks call them and split over two threads on every size
(``_SPLIT_ELEMS`` 0), and through the numpy passes (the flag
``accel.ON`` switched off). The reports must agree exactly in their decisions, counts,
positions and largest error; the sums (relative error, the quick check's
projections) are summed in another order and agree to rounding.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmd import accel, textoutput
from mmd import textformat as tf
from mmd.check import full, quick, quickarrays, tolerance
from mmd.generate import random_matrix

from .test_check_full import same_report

fc = accel.fastcheck
pytestmark = pytest.mark.skipif(fc is None, reason="mmd._fastcheck is not built (no C compiler at install time)")


def _ways(fn: Callable[[], Any]) -> tuple[list[Any], Any]:
    """fn() through the C passes four ways (AVX2 kernels where the CPU has them, and the two-double ones; each
    whole and always split over two threads), and through the numpy passes."""
    old_flag, old_split = accel.ON, accel.C_SPLIT_ELEMS
    old_wide = fc.set_wide(True)
    c = []
    try:
        accel.ON = True
        for wide in (True, False):
            fc.set_wide(wide)
            for split in (old_split, 0):
                accel.C_SPLIT_ELEMS = split
                c.append(fn())
        accel.ON = False
        return c, fn()
    finally:
        accel.ON, accel.C_SPLIT_ELEMS = old_flag, old_split
        fc.set_wide(old_wide)


def _same_quick(got: quick.QuickReport, want: quick.QuickReport) -> None:
    assert (got.ok, got.shape, got.seed, got.vectors, got.z, got.nonfinite, got.tolerance) == (
        want.ok,
        want.shape,
        want.seed,
        want.vectors,
        want.z,
        want.nonfinite,
        want.tolerance,
    )
    np.testing.assert_allclose(got.bound, want.bound, rtol=1e-12)
    # a right output's residuals can be rounding alone: their ratio agrees to rounding of the bound's size
    np.testing.assert_allclose(got.worst_ratio, want.worst_ratio, rtol=1e-9, atol=1e-9)
    if not want.ok:
        assert got.worst == want.worst


def _printed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return textoutput.parse_output(tf.emit(a @ b))


_PLANTS = ["none", "near", "nan", "inf", "zeros", "wrong everywhere", "row", "column"]


def _planted(out: np.ndarray, a: np.ndarray, b: np.ndarray, plant: str, rng: np.random.Generator) -> np.ndarray:
    m, n = out.shape
    out = out.copy()
    i, j = int(rng.integers(m)), int(rng.integers(n))
    if plant == "near":  # errors either side of their allowance
        ref = a.astype(np.float64) @ b.astype(np.float64)
        allowed = tolerance.PRINT_HALF_UNIT + full.fp32_tolerance(a, b)
        pick = rng.random(out.shape) < 0.2
        out[pick] = (ref + rng.choice([-1.1, -0.9, 0.9, 1.1, 50.0], size=out.shape) * allowed)[pick]
    elif plant == "nan":
        out[i, j] = np.nan
        out[int(rng.integers(m)), int(rng.integers(n))] = np.inf
    elif plant == "inf":
        out[i, j] = -np.inf
    elif plant == "zeros":
        out[:] = 0.0
    elif plant == "wrong everywhere":
        out = out + rng.uniform(-5, 5, out.shape)
    elif plant == "row":
        out[i] += 3.0
    elif plant == "column":
        out[:, j] -= 3.0
    return out


shapes = st.tuples(st.integers(1, 24), st.integers(1, 40), st.integers(1, 24))


@pytest.mark.integration  # seconds of examples or of real runs: left out of `make quick`
@settings(max_examples=80, deadline=None)
@given(shapes, st.integers(0, 2**32 - 1), st.sampled_from(_PLANTS))
def test_full_check_same_both_ways(shape, seed, plant):
    m, k, n = shape
    rng = np.random.default_rng(seed)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    out = _planted(_printed(a, b), a, b, plant, rng)
    cs, numpy_ = _ways(lambda: full.against_inputs(out, a, b))
    for c in cs:
        same_report(c, numpy_, rtol=1e-12)
    cs, numpy_ = _ways(lambda: full.against_inputs(out, a, b, tol=0.02))
    for c in cs:
        same_report(c, numpy_, rtol=1e-12)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 30),
    st.integers(1, 30),
    st.integers(0, 2**32 - 1),
    st.sampled_from([*_PLANTS[2:], "expected nan", "expected inf", "same", "tie"]),
    st.sampled_from([0.01, 0.0, 1.5, -0.5]),
)
def test_against_output_same_both_ways(m, n, seed, plant, tol):
    rng = np.random.default_rng(seed)
    expected = np.round(rng.uniform(-99, 99, (m, n)), 2)
    out = np.round(expected + rng.choice([0.0, 0.0, 0.01, -0.02, 0.5], size=(m, n)), 2)
    if plant == "expected nan":
        expected[int(rng.integers(m)), int(rng.integers(n))] = np.nan
    elif plant == "expected inf":
        expected[int(rng.integers(m)), int(rng.integers(n))] = np.inf
        out[int(rng.integers(m)), int(rng.integers(n))] = np.inf
    elif plant == "same":
        out = expected.copy()
    elif plant == "tie":  # equal excesses: the first one is the worst
        out = expected.copy()
        out[rng.integers(m, size=3), rng.integers(n, size=3)] += 7.0
    else:
        out = _planted(out, np.eye(m, dtype=np.float32), expected.astype(np.float32), plant, rng)
    with np.errstate(invalid="ignore"):  # the numpy path's inf - inf
        cs, numpy_ = _ways(lambda: full.against_output(out, expected, tol))
    for c in cs:
        same_report(c, numpy_, rtol=1e-12)


@settings(max_examples=80, deadline=None)
@given(shapes, st.integers(0, 2**32 - 1), st.sampled_from(_PLANTS), st.integers(1, 5), st.sampled_from([None, 0.3]))
def test_quick_same_both_ways(shape, seed, plant, vectors, tol):
    m, k, n = shape
    rng = np.random.default_rng(seed)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    out = _planted(_printed(a, b), a, b, plant, rng)
    cs, numpy_ = _ways(lambda: quickarrays.quick_of(out, a, b, seed=seed % 100, vectors=vectors, tol=tol))
    for c in cs:
        _same_quick(c, numpy_)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
@pytest.mark.parametrize("layout", ["c", "fortran", "strided"])
def test_projections_of_any_matrix_same_both_ways(dtype, layout):
    rng = np.random.default_rng(7)
    a, b = random_matrix(rng, 37, 53), random_matrix(rng, 53, 29)
    if dtype == np.int32:
        a, b = np.round(a), np.round(b)
    a, b = a.astype(dtype), b.astype(dtype)
    if layout == "fortran":
        a, b = np.asfortranarray(a), np.asfortranarray(b)
    elif layout == "strided":
        a, b = np.repeat(a, 2, axis=1)[:, ::2], np.repeat(b, 2, axis=1)[:, ::2]
    cs, numpy_ = _ways(lambda: quickarrays.project(a, b, seed=3))
    for got in cs:
        for name in ("x_t", "y", "abx_t", "yab", "row_sum", "row_max", "col_sum", "col_max", "a_row_ssq", "b_col_ssq"):
            np.testing.assert_allclose(getattr(got, name), getattr(numpy_, name), rtol=1e-12, atol=1e-9, err_msg=name)
        assert (got.shape, got.seed, got.vectors) == (numpy_.shape, numpy_.seed, numpy_.vectors)


def test_more_vectors_than_the_c_passes_take_go_through_numpy():
    rng = np.random.default_rng(1)
    a, b = random_matrix(rng, 6, 7), random_matrix(rng, 7, 5)
    out = _printed(a, b)
    cs, numpy_ = _ways(lambda: quickarrays.quick_of(out, a, b, vectors=fc.MAX_VECTORS + 1))
    assert all(c == numpy_ for c in cs)


def test_big_enough_to_split_by_default_same_both_ways():
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, 300, 64), random_matrix(rng, 64, 301)  # 90300 elements: two threads
    out = _planted(_printed(a, b), a, b, "near", rng)
    assert out.size >= accel.C_SPLIT_ELEMS
    cs, numpy_ = _ways(lambda: full.against_inputs(out, a, b))
    for c in cs:
        same_report(c, numpy_, rtol=1e-12)
    cs, numpy_ = _ways(lambda: full.against_output(out, np.round(out, 1)))
    for c in cs:
        same_report(c, numpy_, rtol=1e-12)
    cs, numpy_ = _ways(lambda: quickarrays.quick_of(out, a, b))
    for c in cs:
        _same_quick(c, numpy_)


def test_the_c_passes_refuse_wrong_buffers():
    good = np.zeros((2, 3))
    with pytest.raises(TypeError, match="float64"):
        fc.uniform(good.astype(np.float32), good, 2, 3, 0.01)
    with pytest.raises(TypeError, match="6 values"):
        fc.uniform(np.zeros(5), good, 2, 3, 0.01)
    with pytest.raises(ValueError, match="C-contiguous"):  # numpy's own refusal
        fc.model(good, np.zeros((3, 2)).T, 2, 3, 1.0, 0.005, 10)
    with pytest.raises(ValueError, match="non-empty"):
        fc.model(good, good, 0, 3, 1.0, 0.005, 10)
    with pytest.raises(TypeError, match="float32 or float64"):
        fc.c_pass(good.astype(np.int64), 2, 3, 1, np.zeros((1, 3)), np.zeros((2, 1)), np.zeros(6), np.zeros(6))
    with pytest.raises(ValueError, match="v <= 16"):
        fc.b_rows(good, 2, 3, 17, np.zeros((17, 3)), None, np.zeros(38), np.zeros(3))


def test_no_fasttext_switches_the_c_passes_off():
    code = "import mmd.accel as a; print(a.passes() is not None, a.text() is not None)"
    env = dict(os.environ, MMD_NO_C="1")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "False False"
    env["MMD_NO_C"] = ""
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    built = accel.fasttext is not None
    assert got.stdout.strip() == f"{built} {built}"


def test_an_empty_inner_dimension_same_both_ways():
    a, b = np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32)
    out = np.zeros((3, 4))
    out[1, 2] = 0.5
    cs, numpy_ = _ways(lambda: full.against_inputs(out, a, b))
    for c in cs:
        same_report(c, numpy_, rtol=1e-12)
    assert not numpy_.ok and numpy_.worst == (1, 2)
    cs, numpy_ = _ways(lambda: quickarrays.quick_of(out, a, b))
    for c in cs:
        _same_quick(c, numpy_)


@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sumsq_rows_and_columns(wide, dtype):
    rng = np.random.default_rng(2)
    old = fc.set_wide(wide)
    try:
        for mat in (rng.standard_normal((7, 13)).astype(dtype), rng.standard_normal((13, 7)).astype(dtype)):
            rows = np.empty(mat.shape[0])
            m64 = mat.astype(np.float64)
            for split in (0, 1 << 30):
                cols = np.zeros(mat.shape[1])
                fc.sumsq(mat, *mat.shape, 1, None, None, rows, cols, split)
                np.testing.assert_allclose(rows, (m64 * m64).sum(axis=1), rtol=1e-12)
                np.testing.assert_allclose(cols, (m64 * m64).sum(axis=0), rtol=1e-12)
                # the column sums are added to what acc holds: rows given in blocks sum in one acc
                fc.sumsq(mat[:3].copy(), 3, mat.shape[1], 1, None, None, rows[:3].copy(), cols, split)
                np.testing.assert_allclose(cols, (m64 * m64).sum(axis=0) + (m64[:3] ** 2).sum(axis=0), rtol=1e-12)
    finally:
        fc.set_wide(old)
