"""The full check: an output's values against a float64 product, or against another output.

The default tolerance follows :mod:`mmd.check.tolerance`'s model of printed fp32
results, so a correct fp32 result passes and a wrong one (a missing term, a
swapped index) does not.

* :func:`against_inputs` (and :func:`against_product`): every element against
  the float64 product (:mod:`mmd.check.product`: numpy's BLAS, or a ``gemm``
  provider such as a float64 GEMM on a GPU). The model's tolerance needs
  |A|·|B| only where cheap bounds on it cannot decide an element
  (:mod:`mmd.check.modelcheck`), so a correct result costs one float64
  product, not two.
* :func:`against_output`: one output against another, elementwise.

The quick check's numpy side, Freivalds' check in O(n²), is :mod:`mmd.check.quickarrays`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import accel
from . import compare
from .compare import CheckReport, ElementwiseTotals, same_values
from .modelcheck import ModelCheck
from .product import Float64Product, Gemm, Rows, WholeRows, product
from .tolerance import FACTOR, PRINT_HALF_UNIT, TF32_OPERAND_ERROR, fp32_factor, tolerance_of


def fp32_tolerance(a: np.ndarray, b: np.ndarray, factor: float = FACTOR) -> np.ndarray:
    """Elementwise fp32 error allowance: factor·sqrt(K)·eps·(|A|·|B|)."""
    return fp32_factor(a.shape[1], factor) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))


def tf32_tolerance(fp32_allowed: np.ndarray, k: int) -> np.ndarray:
    """:func:`fp32_tolerance`'s allowance (for inner dimension ``k``) widened for TF32 operands.

    Scaled from the fp32 allowance rather than recomputed, so |A|·|B| costs one product.
    """
    scaled: np.ndarray = fp32_allowed * (1.0 + TF32_OPERAND_ERROR / fp32_factor(k))
    return scaled


def _wrong_shape(shape: tuple[int, int], tolerance: str) -> CheckReport:
    return CheckReport(False, shape, math.prod(shape), float("inf"), None, float("inf"), tolerance)


def _report(out: np.ndarray, ref: np.ndarray, allowed: np.ndarray | float, tolerance: str) -> CheckReport:
    if out.shape != ref.shape:
        return _wrong_shape(out.shape, tolerance)
    err = np.abs(out - ref)
    excess = err - allowed
    bad = excess > 0
    bad |= ~np.isfinite(out)
    ok = not bool(bad.any())
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape) if excess.size and not ok else None
    denom = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(out - ref)) / denom if denom else float(np.linalg.norm(out - ref))
    return CheckReport(
        ok=ok,
        shape=(int(out.shape[0]), int(out.shape[1])),
        mismatches=int(bad.sum()),
        max_abs_error=float(err.max()) if err.size else 0.0,
        worst=(int(worst[0]), int(worst[1])) if worst is not None else None,
        rel_error=rel,
        tolerance=tolerance,
    )


def against_inputs(
    out: np.ndarray, a: np.ndarray, b: np.ndarray, tol: float | None = None, gemm: Gemm | None = None
) -> CheckReport:
    """Check printed values ``out`` against the float64 product of ``a`` and ``b``.

    ``tol`` (absolute, beyond print rounding) replaces the fp32 error model;
    ``gemm`` computes the reference product (see :func:`mmd.check.product.reference`).
    """
    return against_product(WholeRows.of(out), product(a, b, gemm), tol)


def against_product(out: Rows, prod: Float64Product, tol: float | None = None, precision: str = "fp32") -> CheckReport:
    """:func:`against_inputs` with the product's inputs at hand, the output's values read by ``out``; a
    ``precision`` of ``tf32`` (a TF32 kernel's product) widens the model by :data:`TF32_OPERAND_ERROR`."""
    tolerance = tolerance_of(tol, precision)
    if out.shape != prod.shape:
        return _wrong_shape(out.shape, tolerance)
    if not prod.shape[0] * prod.shape[1]:
        return _report(np.zeros(prod.shape), np.zeros(prod.shape), 0.0, tolerance)
    if tol is None:
        return ModelCheck(out, prod, precision).report(tolerance)
    totals = ElementwiseTotals()
    n = prod.shape[1]
    for r0, got, ref in prod.pairs(out):
        rows = ref.shape[0]
        totals.add_uniform(got.reshape(-1), ref.reshape(-1), rows, n, PRINT_HALF_UNIT + tol, r0 * n, uniform_pass)
    return totals.report(prod.shape, tolerance)


def against_output(out: np.ndarray, expected: np.ndarray, tol: float = 0.01) -> CheckReport:
    """Check printed values against another output (both rounded: default 0.01 apart at most).

    ``expected`` may be ``out`` itself (mmd.check.jobs passes it for an expected output with the
    output's very bytes): finite values are then all right, with no pass over them but one
    that finds any NaN or infinity.
    """
    allowed = tol * (1 + 1e-9)
    if expected is out and allowed >= 0 and out.size and bool(np.isfinite(out).all()):
        m, n = out.shape
        return same_values((int(m), int(n)), tol)
    return _uniform_report(out, expected, allowed, f"{tol:g}")


def _uniform_report(out: np.ndarray, ref: np.ndarray, allowed: float, tolerance: str) -> CheckReport:
    """:func:`_report` for one allowance everywhere, in blocks of rows on two threads (the same report)."""
    if out.shape != ref.shape or out.size == 0:
        return _report(out, ref, allowed, tolerance)
    m, n = (int(x) for x in out.shape)
    totals = ElementwiseTotals()
    totals.add_uniform(out.reshape(-1), ref.reshape(-1), m, n, allowed, 0, uniform_pass)
    return totals.report((m, n), tolerance)


def uniform_pass(
    out: np.ndarray, ref: np.ndarray, rows: int, n: int, allowed: float
) -> tuple[int, float, float, float, int]:
    """The :data:`mmd.check.compare.UniformPass` for numpy's arrays (flat, rows×n, any float type): mmd._fastcheck's
    where it is on, else :func:`_uniform_numpy`."""
    out64, ref64 = np.ascontiguousarray(out, dtype=np.float64), np.ascontiguousarray(ref, dtype=np.float64)
    if accel.passes() is not None:
        return compare.c_uniform(out64, ref64, rows, n, allowed)
    return _uniform_numpy(out64.reshape(rows, n), ref64.reshape(rows, n), allowed)


def _uniform_numpy(out: np.ndarray, ref: np.ndarray, allowed: float) -> tuple[int, float, float, float, int]:
    """:func:`uniform_pass` in plain numpy, over the whole matrices (the fallback where mmd._fastcheck is not
    built, and the C pass's oracle): (mismatches, max |error|, Σ error², Σ ref², the worst's flat index)."""
    err = np.abs(out - ref).ravel()
    excess = err - allowed
    worst = int(np.argmax(excess))  # the first NaN, else the first largest
    top = float(err.max())
    if math.isnan(top):  # a NaN error: a non-finite output counts whatever its error
        bad = int(np.count_nonzero((excess > 0) | ~np.isfinite(out.ravel())))
    else:  # no NaN error, so every non-finite output has an infinite error, > 0 excess
        bad = int(np.count_nonzero(excess > 0))
    rf = ref.ravel()
    return bad, top, float(np.einsum("i,i->", err, err)), float(np.einsum("i,i->", rf, rf)), worst
