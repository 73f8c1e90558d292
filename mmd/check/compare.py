"""The elementwise checks' report and totals, without numpy.

:class:`CheckReport` is what every value check gives (:mod:`mmd.check.full`'s
against a product, and two outputs compared here or there). :class:`ElementwiseTotals`
adds up a rule's totals block by block, as one pass over the whole gives them.
:func:`against_output_blocks` compares two outputs a block of rows at a time
through a :data:`UniformPass`: :func:`c_uniform` (mmd._fastcheck over plain
buffers) or mmd.check.full's numpy pass. So ``mmd check OUT EXPECTED`` with the C
accelerators reads, compares and reports without importing numpy, whose import
would be most of its time (docs/grading.md, "Speed", has the times).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .. import accel

#: One block's pass of the uniform rule |out − ref| ≤ allowed: (out, ref, rows, n, allowed) →
#: (mismatches, max |error|, Σ error², Σ ref², the flat index in the block of its worst element: the
#: first NaN excess, else the first largest). ``out`` and ``ref``: flat float64 rows×n.
UniformPass = Callable[[Any, Any, int, int, float], tuple[int, float, float, float, int]]


@dataclass(frozen=True)
class CheckReport:
    """The outcome of a value check."""

    ok: bool
    shape: tuple[int, int]
    mismatches: int
    max_abs_error: float
    worst: tuple[int, int] | None  # 0-based (row, col) of the largest excess over tolerance
    rel_error: float  # ‖out − ref‖ / ‖ref‖ (Frobenius)
    tolerance: str

    def summary(self) -> str:
        """One line for the terminal."""
        m, n = self.shape
        head = "ok" if self.ok else "MISMATCH"
        where = f", worst at row {self.worst[0] + 1} col {self.worst[1] + 1}" if self.worst and not self.ok else ""
        return (
            f"{head}: {m}x{n} values, {self.mismatches} outside tolerance ({self.tolerance}), "
            f"max |error| {self.max_abs_error:.4g}, relative error {self.rel_error:.3g}{where}"
        )


def same_values(shape: tuple[int, int], tol: float = 0.01) -> CheckReport:
    """The report of two outputs that hold the same finite values (``tol`` >= 0): no error anywhere."""
    return CheckReport(True, shape, 0, 0.0, None, 0.0, f"{tol:g}")


def nan_max(x: float, y: float) -> float:
    """max that keeps a NaN, as numpy's max over both would."""
    return math.nan if math.isnan(x) or math.isnan(y) else max(x, y)


def summed_report(
    shape: tuple[int, int],
    mismatches: int,
    max_err: float,
    ssq_err: float,
    ssq_ref: float,
    worst: int | None,
    tolerance: str,
) -> CheckReport:
    """A report from a pass's totals: ``worst`` a flat index (None: no mismatch), the relative
    error from the sums of squares of the error and of the reference."""
    denom = math.sqrt(ssq_ref)
    rel = math.sqrt(ssq_err) / denom if denom else math.sqrt(ssq_err)
    n = shape[1]
    return CheckReport(
        ok=mismatches == 0,
        shape=shape,
        mismatches=mismatches,
        max_abs_error=max_err,
        worst=None if worst is None else (worst // n, worst % n),
        rel_error=rel,
        tolerance=tolerance,
    )


@dataclass
class ElementwiseTotals:
    """An elementwise rule's totals over blocks of rows, combined as one pass over the whole gives them."""

    mismatches: int = 0
    max_err: float = 0.0
    ssq_err: float = 0.0
    ssq_ref: float = 0.0
    worst: int | None = None  # flat index: the first NaN excess, else the first largest (a mismatch or not)
    worst_excess: float = -math.inf

    def add(
        self, mismatches: int, max_err: float, ssq_err: float, ssq_ref: float, worst: int | None, excess: float
    ) -> None:
        """A block's totals; ``worst`` the flat index of its worst element, the first NaN excess
        else the first largest (a mismatch or not: the report names it only where there are
        mismatches, as np.argmax over every excess would), ``excess`` that element's excess."""
        self.mismatches += mismatches
        self.max_err = nan_max(self.max_err, max_err)
        self.ssq_err += ssq_err
        self.ssq_ref += ssq_ref
        earlier_nan = self.worst is not None and math.isnan(self.worst_excess)
        if worst is not None and not earlier_nan and (math.isnan(excess) or excess > self.worst_excess):
            self.worst, self.worst_excess = worst, excess

    def add_uniform(
        self, out: Any, ref: Any, rows: int, n: int, allowed: float, base: int, uniform: UniformPass
    ) -> None:
        """Rows of an output against the same rows of the reference (flat float64, rows×n), one
        allowance everywhere, by ``uniform``; ``base`` the flat index of their first element."""
        bad, max_err, ssq_err, ssq_ref, worst = uniform(out, ref, rows, n, allowed)
        self.add(bad, max_err, ssq_err, ssq_ref, base + worst, float(abs(out[worst] - ref[worst]) - allowed))

    def report(self, shape: tuple[int, int], tolerance: str) -> CheckReport:
        worst = self.worst if self.mismatches else None
        return summed_report(shape, self.mismatches, self.max_err, self.ssq_err, self.ssq_ref, worst, tolerance)


def c_uniform(out: Any, ref: Any, rows: int, n: int, allowed: float) -> tuple[int, float, float, float, int]:
    """The :data:`UniformPass` of mmd._fastcheck (on: :func:`mmd.accel.passes`), over any float64 buffers."""
    fc = accel.passes()
    assert fc is not None, "the C passes are off: see mmd.accel.passes"
    bad, max_err, ssq_err, ssq_ref, worst = fc.uniform(out, ref, rows, n, float(allowed), accel.C_SPLIT_ELEMS)
    return int(bad), float(max_err), float(ssq_err), float(ssq_ref), int(worst)


def against_output_blocks(
    blocks: Iterable[tuple[int, Any, Any, int]], shape: tuple[int, int], tol: float, uniform: UniformPass
) -> CheckReport:
    """One output against another, elementwise (both printed, so ``tol`` apart at most, 0.01 by
    default), over blocks of rows: (first row, output rows, expected rows, rows), each flat float64.
    Two outputs read a block at a time are never held whole."""
    tally = ElementwiseTotals()
    n = shape[1]
    for r0, out, expected, rows in blocks:
        tally.add_uniform(out, expected, rows, n, tol * (1 + 1e-9), r0 * n, uniform)
    return tally.report(shape, f"{tol:g}")
