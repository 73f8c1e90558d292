"""Tests for mmd.check.quickarrays, the quick check of numpy arrays: no false alarm where the full check
passes, a seeded and stated bound, non-finite values and wrong shapes refused, an output summed a block
at a time as whole (what it catches: tests/test_check_full.py and tests/test_quick_detection.py)."""

from __future__ import annotations

import numpy as np
import pytest

from mmd.check import full, quick, quickarrays, tolerance
from mmd.generate import random_matrix

from .test_check_full import printed, reference_in_blocks

pytestmark = pytest.mark.usefixtures("check_passes")  # every test by the C passes, then by numpy's


@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (64, 64, 64), (40, 500, 70), (256, 8, 256)])
def test_quick_passes_every_right_output(m, k, n):
    rng = np.random.default_rng(m * 1000 + n)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    out = printed(a, b)
    for seed in range(25):
        r = quickarrays.quick_of(out, a, b, seed=seed)
        assert r.ok, r.summary()
        assert r.worst_ratio < 0.5


def test_quick_passes_outputs_at_the_edge_of_the_tolerance():
    # every element as far off as the full check allows: the bound must still hold
    rng = np.random.default_rng(2)
    a, b = random_matrix(rng, 100, 400), random_matrix(rng, 400, 120)
    ref = reference_in_blocks(a, b)
    allowed = tolerance.PRINT_HALF_UNIT + full.fp32_tolerance(a, b)
    for signs in (np.ones(ref.shape), rng.choice([-1.0, 1.0], size=ref.shape)):
        out = ref + 0.999 * signs * allowed
        assert full.against_inputs(out, a, b).ok
        for seed in range(20):
            r = quickarrays.quick_of(out, a, b, seed=seed)
            assert r.ok, r.summary()


def test_quick_is_seeded_and_reports_its_bound():
    rng = np.random.default_rng(4)
    a, b = random_matrix(rng, 50, 60), random_matrix(rng, 60, 70)
    out = printed(a, b)
    r1, r2, r3 = (quickarrays.quick_of(out, a, b, seed=seed) for seed in (9, 9, 10))
    assert r1 == r2 and r1.worst_ratio != r3.worst_ratio
    assert r1.seed == 9 and r1.vectors == 16 and r1.false_alarm == 1e-9
    # z: the norms of all 50 + 70 rows' and columns' 16 projections together refuse a passing result
    # with chance at most 1e-9
    assert r1.z == pytest.approx(quick.threshold(1e-9 / 120, 16))
    assert 9 < r1.z < 9.5 and r1.bound > 0
    s = r1.summary()
    assert s.startswith("ok (quick): 50x70, largest projection") and "seed 9" in s and "sigma" in s
    bad = out.copy()
    bad[7] += 50
    r = quickarrays.quick_of(bad, a, b, seed=9)
    assert not r.ok and r.worst == ("row", 7) and "at row 8" in r.summary()
    r = quickarrays.quick_of(out, a, b, seed=9, tol=0.5)
    assert r.ok and r.tolerance == "0.005 + 0.5"
    r = quickarrays.quick_of(bad, a, b, vectors=1, false_alarm=1e-3)
    assert r.vectors == 1 and r.z < r1.z


def test_quick_refuses_nonfinite_and_wrong_shapes():
    rng = np.random.default_rng(6)
    a, b = random_matrix(rng, 4, 5), random_matrix(rng, 5, 6)
    out = printed(a, b)
    out[2, 3] = np.inf
    r = quickarrays.quick_of(out, a, b)
    assert not r.ok and r.nonfinite == 1 and r.worst == ("row", 2) and "1 values are not finite" in r.summary()
    r = quickarrays.quick_of(np.zeros((6, 4)), a, b)
    assert not r.ok and r.shape == (6, 4)


@pytest.mark.parametrize("rows", [1, 3, 16, 1000])
@pytest.mark.parametrize("plant", ["none", "wrong", "nan"])
def test_output_sums_in_blocks_same_as_whole(rows, plant):
    """--quick's output pass a block of rows at a time (as mmd.check.jobs reads an output): the sums
    within float64 rounding of one pass's (BLAS sums a row of one block in its own order), and the
    same verdict."""
    rng = np.random.default_rng(rows)
    a, b = random_matrix(rng, 37, 11), random_matrix(rng, 11, 29)
    out = printed(a, b)
    if plant == "wrong":
        out[20, 5] += 3.0
    elif plant == "nan":
        out[[9, 30], [4, 0]] = np.nan
    whole = quickarrays.output_sums([(0, out)], out.shape, seed=4)
    blocks = quickarrays.output_sums(((r, out[r : r + rows]) for r in range(0, 37, rows)), out.shape, seed=4)
    assert (blocks.nonfinite, blocks.first_nonfinite) == (whole.nonfinite, whole.first_nonfinite)
    if plant != "nan":
        np.testing.assert_allclose(blocks.cx_t, whole.cx_t, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(blocks.row_ssq, whole.row_ssq, rtol=1e-12)
        np.testing.assert_allclose(blocks.yc, whole.yc, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(blocks.col_ssq, whole.col_ssq, rtol=1e-12)
    proj = quickarrays.project(a, b, seed=4)
    got, want = quick.verdict(blocks, proj), quick.verdict(whole, proj)
    assert (got.ok, got.worst, got.nonfinite) == (want.ok, want.worst, want.nonfinite)
    assert got.worst_ratio == pytest.approx(want.worst_ratio, rel=1e-9)
    assert got.ok == (plant == "none") and want == quickarrays.quick_of(out, a, b, seed=4)
    with pytest.raises(ValueError, match="seed"):
        quick.verdict(quickarrays.output_sums([(0, out)], out.shape, seed=5), proj)
