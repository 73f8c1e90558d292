"""Checking results: an output's values against a float64 product, or against another output.

Printed values carry ``%6.2f`` rounding (half a hundredth) on top of fp32
arithmetic error, which grows about as sqrt(K)·eps·(|A|·|B|) for a dot product
of length K. The default tolerance follows that model, so a correct fp32
result passes and a wrong one (a missing term, a swapped index) does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Half a unit in the last printed place of ``%6.2f``, plus a hair for binary rounding.
PRINT_HALF_UNIT = 0.005 * (1 + 1e-9)
_EPS32 = float(np.finfo(np.float32).eps)


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


def fp32_tolerance(a: np.ndarray, b: np.ndarray, factor: float = 4.0) -> np.ndarray:
    """Elementwise fp32 error allowance: factor·sqrt(K)·eps·(|A|·|B|)."""
    k = a.shape[1]
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return factor * np.sqrt(max(k, 1)) * _EPS32 * scale


def _report(out: np.ndarray, ref: np.ndarray, allowed: np.ndarray | float, tolerance: str) -> CheckReport:
    if out.shape != ref.shape:
        return CheckReport(False, tuple(out.shape), out.size, float("inf"), None, float("inf"), tolerance)
    err = np.abs(out - ref)
    excess = err - allowed
    bad = excess > 0
    bad |= ~np.isfinite(out)
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape) if excess.size else None
    denom = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(out - ref)) / denom if denom else float(np.linalg.norm(out - ref))
    return CheckReport(
        ok=not bool(bad.any()),
        shape=(int(out.shape[0]), int(out.shape[1])),
        mismatches=int(bad.sum()),
        max_abs_error=float(err.max()) if err.size else 0.0,
        worst=(int(worst[0]), int(worst[1])) if worst is not None else None,
        rel_error=rel,
        tolerance=tolerance,
    )


def against_inputs(out: np.ndarray, a: np.ndarray, b: np.ndarray, tol: float | None = None) -> CheckReport:
    """Check printed values ``out`` against the float64 product of ``a`` and ``b``.

    ``tol`` (absolute, beyond print rounding) replaces the fp32 error model.
    """
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if tol is None:
        allowed: np.ndarray | float = PRINT_HALF_UNIT + fp32_tolerance(a, b)
        desc = "0.005 + 4·sqrt(K)·eps·|A||B|"
    else:
        allowed, desc = PRINT_HALF_UNIT + tol, f"0.005 + {tol:g}"
    return _report(out, ref, allowed, desc)


def against_output(out: np.ndarray, expected: np.ndarray, tol: float = 0.01) -> CheckReport:
    """Check printed values against another output (both rounded: default 0.01 apart at most)."""
    return _report(out, expected, tol * (1 + 1e-9), f"{tol:g}")


def reference_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The float64 product that results are checked against."""
    return np.matmul(a.astype(np.float64), b.astype(np.float64))
