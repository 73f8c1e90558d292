"""Tests for mmd.check.quick: the quick check's vectors and verdict, without numpy (numpy only checks them here)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from mmd.check import quick


def test_vectors_are_seeded_and_pinned():
    """A seed names the same vectors on every run and every Python (Box-Muller on random(), whose
    stream Python keeps for a seed): the first values are pinned here, so a change is seen."""
    x_t, y = quick.random_vectors(3, 5, seed=7, vectors=2)
    assert len(x_t) == 10 and len(y) == 6
    again = quick.random_vectors(3, 5, seed=7, vectors=2)
    assert (x_t, y) == again and quick.random_vectors(3, 5, seed=8, vectors=2) != again
    # to a few units in the last place: libm's log, cos and sin may round differently elsewhere
    assert list(x_t[:4]) == pytest.approx([0.516166163357, 0.718472115169, 1.30316662171, 0.637767976777], rel=1e-11)


def test_vectors_are_standard_normal():
    x_t, y = quick.random_vectors(20000, 30000, seed=1, vectors=2)
    vals = np.frombuffer(x_t.tobytes() + y.tobytes())
    assert vals.size == 100000 and np.all(np.isfinite(vals))
    assert abs(vals.mean()) < 0.02 and abs(vals.std() - 1) < 0.02
    # the tails a projection's bound relies on: P(|X| > 3) = 0.0027
    assert 0.0020 < np.mean(np.abs(vals) > 3) < 0.0034
    assert abs(np.corrcoef(vals[:-1], vals[1:])[0, 1]) < 0.02  # the pairs of Box-Muller are independent


def test_threshold():
    # one vector: the norm is |N(0, 1)|
    assert quick.threshold(math.erfc(3 / math.sqrt(2)), 1) == pytest.approx(3.0)
    z = quick.threshold(1e-9 / 480, 16)
    assert quick.chi2_sf(z * z, 16) == pytest.approx(1e-9 / 480, rel=1e-9)


def test_the_module_needs_no_numpy():
    """Nor do the switch, the text core, the comparisons and the jobs: a check imports numpy only where
    it needs it (--quick by the C accelerators does not)."""
    code = (
        "import sys, mmd.check.quick, mmd.check.compare, mmd.textcore, mmd.check.jobs, mmd.accel; "
        "print('numpy' in sys.modules)"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert got.stdout.split() == ["False"]
