"""Tests for mmd.check.quick: the quick check's vectors and verdict, without numpy (numpy only checks them here)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from mmd.check import quick as freivalds


def test_vectors_are_seeded_and_pinned():
    """A seed names the same vectors on every run and every Python (Box-Muller on random(), whose
    stream Python keeps for a seed): the first values are pinned here, so a change is seen."""
    x_t, y = freivalds.random_vectors(3, 5, seed=7, vectors=2)
    assert len(x_t) == 10 and len(y) == 6
    again = freivalds.random_vectors(3, 5, seed=7, vectors=2)
    assert (x_t, y) == again and freivalds.random_vectors(3, 5, seed=8, vectors=2) != again
    # to a few units in the last place: libm's log, cos and sin may round differently elsewhere
    assert list(x_t[:4]) == pytest.approx([0.516166163357, 0.718472115169, 1.30316662171, 0.637767976777], rel=1e-11)


def test_vectors_are_standard_normal():
    x_t, y = freivalds.random_vectors(20000, 30000, seed=1, vectors=2)
    vals = np.frombuffer(x_t.tobytes() + y.tobytes())
    assert vals.size == 100000 and np.all(np.isfinite(vals))
    assert abs(vals.mean()) < 0.02 and abs(vals.std() - 1) < 0.02
    # the tails a projection's bound relies on: P(|X| > 3) = 0.0027
    assert 0.0020 < np.mean(np.abs(vals) > 3) < 0.0034
    assert abs(np.corrcoef(vals[:-1], vals[1:])[0, 1]) < 0.02  # the pairs of Box-Muller are independent


def test_threshold():
    # one vector: the norm is |N(0, 1)|
    assert freivalds.threshold(math.erfc(3 / math.sqrt(2)), 1) == pytest.approx(3.0)
    z = freivalds.threshold(1e-9 / 480, 16)
    assert freivalds.chi2_sf(z * z, 16) == pytest.approx(1e-9 / 480, rel=1e-9)


def test_the_module_needs_no_numpy():
    """Nor do grading and tally, until a check needs it (jobs.prepare: a full check does; --quick and
    a check against an expected output by the C accelerators do not)."""
    code = (
        "import sys, mmd.check.quick, mmd.check.compare, mmd.textcore, mmd.check.jobs as g, mmd.readahead; "
        "print('numpy' in sys.modules); g.prepare('inputs', quick=True); print('numpy' in sys.modules); "
        "g.prepare('expected', quick=False); print('numpy' in sys.modules); "
        "g.prepare('inputs', quick=False); print('numpy' in sys.modules); "
        "print(mmd.textcore.c_passes() is None or mmd.textcore.c_text() is None)"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    *imported, c_off = got.stdout.split()  # the child's route: the environment decides
    assert imported == ["False", c_off, c_off, "True"]
