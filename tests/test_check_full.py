"""Tests for the full check (mmd.check.full, with mmd.check.product and mmd.check.modelcheck): it keeps
its rule, its product comes in blocks as one GEMM would give it, and planted faults are caught (and by
the quick check where it can see them: tests/test_check_quickarrays.py tests the rest of it)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmd import accel, textoutput
from mmd import textformat as tf
from mmd.check import compare, full, modelcheck, product, quickarrays, tolerance
from mmd.cpus import worker_rows
from mmd.errors import InputFormatError
from mmd.generate import random_matrix

from .conftest import blocks_of

pytestmark = pytest.mark.usefixtures("check_passes")  # every test by the C passes, then by numpy's


def _blocks(prod: product.Float64Product) -> list[tuple[int, np.ndarray]]:
    """(r0, a copy of rows r0.. of A·B) for the product's blocks of rows, as :meth:`product.Float64Product.pairs`
    hands them out beside an output's (here zeros)."""
    rows = product.WholeRows(np.zeros(prod.shape))
    return [(r0, ref.copy()) for r0, _, ref in prod.pairs(rows)]


def reference_in_blocks(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A·B in float64 as the full check makes it: in its blocks of rows (:meth:`product.Float64Product.pairs`),
    whose GEMMs may round unlike one GEMM of the whole (test_product_blocks_round_as_a_gemm bounds by how much)."""
    blocks = [blk for _, blk in _blocks(product.product(a, b))]
    return np.concatenate(blocks) if blocks else np.zeros((a.shape[0], b.shape[1]))


def _old_against_inputs(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> compare.CheckReport:
    """The full check as it was written before the bounds: |A|·|B| in full, every element (the oracle)."""
    ref = reference_in_blocks(a, b)
    allowed = tolerance.PRINT_HALF_UNIT + full.fp32_tolerance(a, b)
    return full._report(out, ref, allowed, "0.005 + 4·sqrt(K)·eps·|A||B|")


def printed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The values a correct mmd output holds: the float32 product, printed %6.2f and read back."""
    return textoutput.parse_output(tf.emit(a @ b))


def same_report(got: compare.CheckReport, want: compare.CheckReport, rtol: float = 1e-9) -> None:
    """The same verdict, count, worst place and largest error; the relative error to ``rtol`` (its
    sums may be made in another order)."""
    assert (got.ok, got.shape, got.mismatches, got.worst, got.tolerance) == (
        want.ok,
        want.shape,
        want.mismatches,
        want.worst,
        want.tolerance,
    )
    np.testing.assert_equal(got.max_abs_error, want.max_abs_error)
    np.testing.assert_allclose(got.rel_error, want.rel_error, rtol=rtol)


# ---------------------------------------------------------------------------
# the full check: the same decisions as computing |A|·|B| everywhere


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(1, 150),
    st.integers(1, 12),
    st.integers(0, 2**32 - 1),
    st.lists(st.sampled_from([0.3, 0.97, 1.03, 3.0, 1e4]), max_size=6),
    st.sampled_from([1, 30, 1 << 20]),
)
def test_full_check_same_as_the_old_rule(m, k, n, seed, factors, ref_block):
    """Whatever blocks of rows the product comes in (``ref_block`` elements: one row, a few, all)."""
    with pytest.MonkeyPatch.context() as mp:
        blocks_of(mp, ref_block)
        _full_check_same_as_the_old_rule(m, k, n, seed, factors)


def _full_check_same_as_the_old_rule(m, k, n, seed, factors):
    rng = np.random.default_rng(seed)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    out = printed(a, b)
    ref = reference_in_blocks(a, b)
    allowed = tolerance.PRINT_HALF_UNIT + full.fp32_tolerance(a, b)
    for f in factors:  # errors around the allowance, either sign
        i, j = rng.integers(m), rng.integers(n)
        out[i, j] = ref[i, j] + rng.choice([-1, 1]) * f * allowed[i, j]
    same_report(full.against_inputs(out, a, b), _old_against_inputs(out, a, b))


@pytest.mark.parametrize("ref_block", [1, 5, 64, 1 << 20])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (37, 300, 19), (64, 8, 64), (3, 1000, 200)])
def test_product_blocks_round_as_a_gemm(m, k, n, ref_block, monkeypatch):
    """The product's blocks of rows, in order, cover A·B once and are within float64's GEMM error
    bound (k·u·|A|·|B|) of one GEMM of the whole; a given product is handed out as it is."""
    blocks_of(monkeypatch, ref_block)
    rng = np.random.default_rng(m + k + n)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    whole = a.astype(np.float64) @ b.astype(np.float64)
    starts, blocks = zip(*_blocks(product.product(a, b)), strict=True)
    assert list(starts) == list(np.cumsum([0] + [len(x) for x in blocks[:-1]]))
    got = np.concatenate(blocks)
    bound = 2 * k * 2.0**-53 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    assert got.shape == whole.shape and np.all(np.abs(got - whole) <= bound)
    given = product.product(a, b, gemm=lambda x, y: x @ y)
    np.testing.assert_array_equal(np.concatenate([blk for _, blk in _blocks(given)]), given.ref)


def test_pairs_of_no_rows():
    """A product with no rows hands out no blocks (and starts no workers); one with no columns, its rows'
    empty blocks."""
    assert _blocks(product.product(np.zeros((0, 3)), np.zeros((3, 2)))) == []
    got = _blocks(product.product(np.zeros((3, 2)), np.zeros((2, 0))))
    assert [r0 for r0, _ in got] == list(range(0, 3, worker_rows(3, 0))) and all(b.size == 0 for _, b in got)


def test_pairs_run_blas_on_one_thread_and_give_it_back(monkeypatch):
    """While any :meth:`product.Float64Product.pairs` runs (two at once here, on two threads that outlive them, as
    a folder's checks run them), numpy's BLAS has one thread, its workers one product block each; the
    last one done, or failed, on whichever thread, gives the threads back."""
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_info

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    before = blas_threads()
    blocks_of(monkeypatch, 1)  # a block a row
    rng = np.random.default_rng(3)
    a, b = random_matrix(rng, 6, 5), random_matrix(rng, 5, 4)
    seen: list[set[int]] = []

    class Rows:
        shape = (6, 4)

        def __init__(self, fail_at: int | None = None) -> None:
            self.fail_at = fail_at

        def read(self, r0: int, into: np.ndarray) -> np.ndarray:
            seen.append(blas_threads())
            if r0 == self.fail_at:
                raise InputFormatError("a fault", line=r0 + 2)
            into[:] = 0.0
            return into

    with ThreadPoolExecutor(1) as one, ThreadPoolExecutor(1) as other:
        first = product.product(a, b).pairs(Rows())
        one.submit(next, first).result()
        assert blas_threads() == {1}
        second = product.product(a, b).pairs(Rows(fail_at=3))
        with pytest.raises(InputFormatError):
            other.submit(list, second).result()
        assert blas_threads() == {1}  # the first still runs
        rest = other.submit(list, first).result()  # ends on another thread than it began
    assert [r0 for r0, _, _ in rest] == [1, 2, 3, 4, 5]
    assert blas_threads() == before and seen and all(t == {1} for t in seen)


@pytest.mark.parametrize(
    "plant",
    [
        "scattered",  # many elements near their allowance: S by one GEMM over their rows and columns
        "scattered, dots",  # the same, S one dot product each
        "row",  # one row near it: one small GEMM
        "everywhere",  # most elements: S in full
        "nonfinite",
    ],
)
@pytest.mark.parametrize("ref_block", [1, 7 * 80 + 3, 1 << 20])  # the product a row, 7 rows, all at a time
def test_full_check_every_way_of_computing_s(plant, ref_block, monkeypatch):
    blocks_of(monkeypatch, ref_block)
    if plant == "scattered, dots":
        monkeypatch.setattr(modelcheck, "_SMALL_GEMM", 0)
    rng = np.random.default_rng(3)
    m, k, n = 90, 300, 80
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    out = printed(a, b)
    ref = reference_in_blocks(a, b)
    allowed = tolerance.PRINT_HALF_UNIT + full.fp32_tolerance(a, b)
    sign = rng.choice([-1.0, 1.0], size=out.shape)
    if plant.startswith("scattered"):
        pick = rng.random(out.shape) < 0.05
        out[pick] = (ref + sign * allowed * rng.choice([0.9, 1.1], size=out.shape))[pick]
    elif plant == "row":
        out[7] = ref[7] + sign[7] * allowed[7] * np.where(np.arange(n) % 2, 0.95, 1.05)
    elif plant == "everywhere":
        out = ref + sign * allowed * rng.choice([0.9, 1.1], size=out.shape)
    else:
        out[3, 4], out[5, 6], out[1, 2] = np.inf, np.nan, -np.inf
    same_report(full.against_inputs(out, a, b), _old_against_inputs(out, a, b))


def test_full_check_reports():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = np.eye(2, dtype=np.float32)
    r = full.against_inputs(np.array([[1.0, 2.0], [3.0, 4.0]]), a, b)
    assert r.ok and r.mismatches == 0 and r.worst is None and r.max_abs_error == 0.0
    assert r.summary().startswith("ok: 2x2 values, 0 outside tolerance")
    r = full.against_inputs(np.array([[1.0, 2.0], [3.0, 4.5]]), a, b)
    assert not r.ok and r.worst == (1, 1) and r.mismatches == 1
    assert "worst at row 2 col 2" in r.summary()
    r = full.against_inputs(np.zeros((2, 3)), a, b)
    assert not r.ok and r.shape == (2, 3)
    r = full.against_inputs(np.array([[1.0, 2.0], [3.0, 4.5]]), a, b, tol=0.6)
    assert r.ok and r.tolerance == "0.005 + 0.6"


def test_reference_takes_a_gemm():
    rng = np.random.default_rng(1)
    a, b = random_matrix(rng, 5, 7), random_matrix(rng, 7, 3)
    calls = []

    def gemm(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        calls.append((x.dtype, y.dtype, x.shape, y.shape))
        return x @ y

    got = product.reference(a, b, gemm)
    assert calls == [(np.float64, np.float64, (5, 7), (7, 3))]
    np.testing.assert_array_equal(got, a.astype(np.float64) @ b.astype(np.float64))
    assert full.against_inputs(printed(a, b), a, b, gemm=gemm).ok and len(calls) == 2
    with pytest.raises(ValueError, match="gave shape"):
        product.reference(a, b, lambda x, y: np.zeros((2, 2)))
    with pytest.raises(ValueError, match="cannot multiply"):
        product.reference(a, a)


# ---------------------------------------------------------------------------
# planted faults: what the full check and the quick check catch


def _faults(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """Each kind of wrong output, from a right one (square, 256)."""
    wrong = {}
    c = out.copy()
    c[10, 20] += 1.0  # a hundred hundredths off: well beyond the per-element tolerance (~0.05)
    wrong["element, small"] = c
    c = out.copy()
    c[10, 20] += 1000.0
    wrong["element, large"] = c
    c = out.copy()
    c[30] = out[31]  # an index off by one: the next row's values
    wrong["row"] = c
    c = out.copy()
    c[:, 40] = out[:, 41]
    wrong["column"] = c
    c = out.copy()
    c[32:48, 64:80] = out[48:64, 64:80]  # a 16x16 tile written from its neighbour
    wrong["tile"] = c
    wrong["transposed"] = out.T.copy()
    wrong["operands swapped"] = printed(b, a)
    wrong["zeros"] = np.zeros_like(out)
    c = out.copy()
    c[100, 200] = np.nan
    wrong["NaN"] = c
    return wrong


def test_planted_faults_full_and_quick():
    rng = np.random.default_rng(11)
    a, b = random_matrix(rng, 256, 256), random_matrix(rng, 256, 256)
    out = printed(a, b)
    assert full.against_inputs(out, a, b).ok
    assert quickarrays.quick_of(out, a, b, seed=0).ok
    caught = {}
    for kind, bad in _faults(out, a, b).items():
        whole = full.against_inputs(bad, a, b)
        assert whole.ok == _old_against_inputs(bad, a, b).ok
        caught[kind] = (not whole.ok, not quickarrays.quick_of(bad, a, b, seed=0).ok)
    assert caught == {
        "element, small": (True, False),  # only the full check sees one element off by a little
        "element, large": (True, True),
        "row": (True, True),
        "column": (True, True),
        "tile": (True, True),
        "transposed": (True, True),
        "operands swapped": (True, True),
        "zeros": (True, True),
        "NaN": (True, True),
    }


def test_planted_faults_rectangular():
    rng = np.random.default_rng(12)
    a, b = random_matrix(rng, 120, 300, -3, 3), random_matrix(rng, 300, 90, -3, 3)
    out = printed(a, b)
    assert full.against_inputs(out, a, b).ok and quickarrays.quick_of(out, a, b, seed=5).ok
    for where in (np.s_[17], np.s_[:, 33], np.s_[64:80, 16:32]):
        bad = out.copy()
        bad[where] *= -1
        assert not full.against_inputs(bad, a, b).ok
        assert not quickarrays.quick_of(bad, a, b, seed=5).ok
    assert not quickarrays.quick_of(out[:, :89], a, b).ok


@pytest.mark.parametrize(("block", "ref_block"), [(7, 19), (7, 1), (1 << 20, 1 << 20)])
@pytest.mark.parametrize("seed", range(6))
def test_uniform_allowance_in_blocks_same_as_whole(block, ref_block, seed, monkeypatch):
    # against_output and --tol: one allowance everywhere, reported as the whole-matrix code did
    blocks_of(monkeypatch, ref_block)
    monkeypatch.setattr(modelcheck, "_BLOCK_ELEMS", block)
    rng = np.random.default_rng(seed)
    ref = np.round(rng.uniform(-50, 50, (23, 19)), 2)
    out = ref + rng.choice([0.0, 0.0, 0.0, 0.004, -0.011, 0.02], size=ref.shape)
    if seed % 3 == 1:
        out[rng.integers(23), rng.integers(19)] = np.nan
        out[rng.integers(23), rng.integers(19)] = np.inf
    if seed % 3 == 2:
        out = ref.copy()
        out[[3, 12, 20], [5, 5, 5]] += 0.5  # a tie: the first one is the worst
    same_report(full.against_output(out, ref), full._report(out, ref, 0.01 * (1 + 1e-9), "0.01"))
    b = ref.astype(np.float32)  # A = I: the product is B
    want = full._report(out, b.astype(np.float64), tolerance.PRINT_HALF_UNIT + 0.01, "0.005 + 0.01")
    same_report(full.against_inputs(out, np.eye(23, dtype=np.float32), b, tol=0.01), want)


@pytest.mark.parametrize(("block", "chunk", "ref_block"), [(40, 7, 17), (100, 13, 1), (1 << 20, 5, 1 << 20)])
@pytest.mark.parametrize("seed", range(4))
def test_chunked_passes_report_as_one_pass(block, chunk, ref_block, seed, monkeypatch):
    """The elementwise passes, in blocks of the product, blocks for threads and chunks within them,
    report as whole-matrix code."""
    blocks_of(monkeypatch, ref_block)
    monkeypatch.setattr(modelcheck, "_BLOCK_ELEMS", block)
    monkeypatch.setattr(modelcheck, "_CHUNK_ELEMS", chunk)
    rng = np.random.default_rng(seed)
    m, k, n = 23, 40, 17
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    out = printed(a, b)
    ref = reference_in_blocks(a, b)
    allowed = tolerance.PRINT_HALF_UNIT + full.fp32_tolerance(a, b)
    pick = rng.random(out.shape) < 0.1
    out[pick] = (ref + rng.choice([-1.2, -0.9, 0.9, 1.2, 50.0], size=out.shape) * allowed)[pick]
    if seed % 2:
        out[rng.integers(m), rng.integers(n)] = np.nan
        out[rng.integers(m), rng.integers(n)] = -np.inf
    same_report(full.against_inputs(out, a, b), _old_against_inputs(out, a, b))
    finite = np.where(np.isfinite(out), out, 0.0)  # no inf - inf below (numpy warns)
    expected = np.round(finite + rng.choice([0.0, 0.0, 0.01, -0.03], size=out.shape), 2)
    if seed % 2:
        expected[rng.integers(m), rng.integers(n)] = np.nan  # an expected NaN beside a finite output: not counted
        expected[[2, 9], [3, 3]] += 7.0  # a tie between two chunks: the first is the worst
    whole = full._report(out, expected, 0.01 * (1 + 1e-9), "0.01")
    same_report(full.against_output(out, expected), whole)


@pytest.mark.parametrize("plant", ["none", "nan", "inf", "negative tol", "empty"])
def test_an_output_against_itself_reports_as_against_a_copy(plant):
    rng = np.random.default_rng(2)
    out = np.round(rng.uniform(-99, 99, (9, 7)), 2)
    tol = -0.5 if plant == "negative tol" else 0.01
    if plant == "nan":
        out[3, 4] = np.nan
    if plant == "inf":
        out[1, 1] = np.inf
    if plant == "empty":
        out = np.empty((0, 7))
    with np.errstate(invalid="ignore"):  # inf - inf, where an infinity is checked against itself
        want = full.against_output(out, out.copy(), tol)
        got = full.against_output(out, out, tol)
    same_report(got, want)


def test_output_blocks_keep_the_first_nan_excess_as_the_worst():
    """As the whole-matrix rule picks it: an expected NaN (a NaN excess, not itself a mismatch) in an
    early block is the worst place once any block has a mismatch."""
    expected = np.round(np.random.default_rng(5).uniform(-9, 9, (6, 4)), 2)
    out = expected.copy()
    expected[1, 2] = np.nan
    out[4, 3] += 1.0
    whole = full.against_output(out, expected)
    for uniform in (full.uniform_pass, compare.c_uniform) if accel.passes() else (full.uniform_pass,):
        pairs = ((r, out[r : r + 2].ravel(), expected[r : r + 2].ravel(), 2) for r in range(0, 6, 2))
        same_report(compare.against_output_blocks(pairs, (6, 4), 0.01, uniform), whole)
    assert whole.worst == (1, 2)
