"""Padding to what a kernel needs changes no bit of any output: a float32 emulation of the kernels' sums."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mmd.errors import LimitError
from mmd.kernelfile.declaration import Declaration
from mmd.kernelfile.padding import Requirement, check_padded, crop, pad_operands, padded_shape

F32 = np.float32


def accumulate(a: np.ndarray, b: np.ndarray, fused: bool, start_with_first: bool) -> np.ndarray:
    """C = A·B as a kernel's thread sums it: over k in order, in float32, one term at a time.

    ``fused``: each step is an FMA, modelled as the float64 sum of the exact float32 product (exact in
    float64) and the accumulator, rounded once to float32; otherwise a float32 product, then a float32
    add (the course's ``Pvalue += M * N`` without contraction). ``start_with_first``: the accumulator
    starts as the first product instead of +0.0 (so a sum can be −0.0).
    """
    m, k = a.shape
    n = b.shape[1]
    c = np.empty((m, n), dtype=F32)
    with np.errstate(all="ignore"):
        for i in range(m):
            for j in range(n):
                acc = F32(a[i, 0] * b[0, j]) if start_with_first else F32(0.0)
                for p in range(1 if start_with_first else 0, k):
                    if fused:
                        acc = F32(np.float64(a[i, p]) * np.float64(b[p, j]) + np.float64(acc))
                    else:
                        acc = F32(F32(a[i, p] * b[p, j]) + acc)
                c[i, j] = acc
    return c


VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 3.0e38, -3.0e38, 1e-45, float("inf"), float("nan")]),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
)


@st.composite
def problem(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, Requirement]:
    m, k, n = (draw(st.integers(1, 6)) for _ in range(3))
    a = draw(hnp.arrays(F32, (m, k), elements=VALUES))
    b = draw(hnp.arrays(F32, (k, n), elements=VALUES))
    need = Requirement(draw(st.booleans()), *(draw(st.integers(1, 4)) for _ in range(3)))
    return a, b, need


@given(problem(), st.booleans(), st.booleans())
@settings(max_examples=300, deadline=None)
def test_padding_changes_no_bit_of_any_output(case: tuple, fused: bool, start_with_first: bool) -> None:
    a, b, need = case
    m, n = a.shape[0], b.shape[1]
    pa, pb = pad_operands(a, b, need)
    assert (pa.shape[0], pa.shape[1], pb.shape[1]) == padded_shape(m, a.shape[1], n, need)
    want = accumulate(a, b, fused, start_with_first)
    got = crop(accumulate(pa, pb, fused, start_with_first), m, n)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fused", [False, True])
def test_a_negative_zero_sum_stays_negative_zero(fused: bool) -> None:
    """−0.0·1 is −0.0; padded with +0.0 against −0.0 it stays −0.0 (a +0.0 pad in B would make it +0.0)."""
    a, b = np.array([[-0.0]], dtype=F32), np.array([[1.0]], dtype=F32)
    need = Requirement(square=True, rows=4, columns=4, depth=4)
    pa, pb = pad_operands(a, b, need)
    got = crop(accumulate(pa, pb, fused, start_with_first=True), 1, 1)
    assert np.signbit(got[0, 0]) and got[0, 0] == 0
    wrong_b = np.zeros_like(pb)
    wrong_b[:1, :1] = b
    assert not np.signbit(accumulate(pa, wrong_b, fused, start_with_first=True)[0, 0])  # why −0.0 is needed


def test_padded_shapes() -> None:
    assert padded_shape(1, 1, 1, Requirement()) == (1, 1, 1)
    assert padded_shape(37, 53, 29, Requirement(False, 16, 32, 8)) == (48, 56, 32)
    assert padded_shape(37, 53, 29, Requirement(True, 16, 32, 8)) == (64, 64, 64)
    assert padded_shape(5, 7, 3, Declaration(arguments=("A", "B", "C", "width")).requirement(4)) == (8, 8, 8)
    assert padded_shape(5, 7, 3, Declaration(multiples=False).requirement(4)) == (5, 7, 3)


def test_nothing_to_pad_keeps_the_arrays() -> None:
    a, b = np.ones((4, 8), dtype=F32), np.ones((8, 4), dtype=F32)
    pa, pb = pad_operands(a, b, Requirement(False, 4, 4, 4))
    assert pa is a and pb is b and crop(a, 4, 8) is a


def test_a_long_thin_product_through_a_square_kernel_is_refused_not_allocated() -> None:
    square = Declaration(arguments=("A", "B", "C", "width")).requirement(32)
    with pytest.raises(LimitError, match=r"^a 1x100000x1 product is padded to 100000x100000x100000 for this kernel: "
                       r"120000000000 bytes of memory; the limit is 17179869184$"):  # fmt: skip
        check_padded(1, 100000, 1, square, max_dim=None, max_memory=16 << 30)
    with pytest.raises(LimitError, match=r"padded to 100000x100000x100000 .* past the largest size allowed, 65536"):
        check_padded(1, 100000, 1, square, max_dim=65536, max_memory=None)
    check_padded(1, 100000, 1, Requirement(False, 32, 32, 32), max_dim=None, max_memory=16 << 30)  # rectangular
    check_padded(4096, 4096, 4096, square, max_dim=4096, max_memory=1 << 30)  # nothing to pad
