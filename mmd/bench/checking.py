"""A case's inputs and how its product is checked: once per case, elementwise against the float64 product."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..check import compare as tally
from ..check import full
from ..check.product import reference
from ..generate import random_matrix


class Wrong(Exception):
    """A result that does not match its reference; the message says how."""


@dataclass
class Inputs:
    """One shape's inputs and what results are checked against."""

    a: np.ndarray
    b: np.ndarray
    ref: np.ndarray
    allowed: np.ndarray  # fp32's tolerance
    text: Path | None = None  # the input file (files mode), written on first use
    _tf32: np.ndarray | None = None

    @classmethod
    def of(cls, a: np.ndarray, b: np.ndarray) -> Inputs:
        """``a`` and ``b`` with their float64 product and fp32's tolerance."""
        return cls(a, b, reference(a, b), full.fp32_tolerance(a, b))

    def allowed_for(self, precision: str) -> np.ndarray:
        """The elementwise tolerance for a kernel of ``precision`` (TF32's made on first use)."""
        if precision != "tf32":
            return self.allowed
        if self._tf32 is None:
            self._tf32 = full.tf32_tolerance(self.allowed, self.a.shape[1])
        return self._tf32


def make_inputs(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The case's A and B: random, never zero, the same for every kernel at this shape."""
    rng = np.random.default_rng([seed, m, k, n])
    return random_matrix(rng, m, k), random_matrix(rng, k, n)


def check_product(c: np.ndarray, ref: np.ndarray, allowed: np.ndarray | float, tolerance: str) -> tally.CheckReport:
    """Compare ``c`` elementwise with the float64 ``ref`` under ``allowed``."""
    if c.shape != ref.shape:
        return tally.CheckReport(False, tuple(c.shape), c.size, float("inf"), None, float("inf"), tolerance)
    diff = c.astype(np.float64) - ref
    err = np.abs(diff)
    excess = err - allowed
    bad = (excess > 0) | ~np.isfinite(c)
    worst = np.unravel_index(int(np.argmax(np.where(np.isfinite(excess), excess, np.inf))), excess.shape)
    norm = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(diff)) / norm if norm else float(np.linalg.norm(diff))
    return tally.CheckReport(
        ok=not bool(bad.any()),
        shape=(int(c.shape[0]), int(c.shape[1])),
        mismatches=int(bad.sum()),
        max_abs_error=float(err.max()) if err.size else 0.0,
        worst=(int(worst[0]), int(worst[1])),
        rel_error=rel,
        tolerance=tolerance,
    )
