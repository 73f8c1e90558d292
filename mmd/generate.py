"""Random test inputs: never zeros (they hide unwritten outputs), values with two decimals."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def random_matrix(rng: np.random.Generator, rows: int, cols: int, lo: float = -10.0, hi: float = 10.0) -> np.ndarray:
    """A float32 matrix of values in [lo, hi] with two decimals and no zeros."""
    lo_h, hi_h = round(lo * 100), round(hi * 100)
    if lo_h > hi_h or (lo_h == hi_h == 0):
        raise ValueError(f"range [{lo}, {hi}] holds no non-zero two-decimal values")
    h = rng.integers(lo_h, hi_h, size=(rows, cols), endpoint=True)
    zero = h == 0
    if zero.any():
        # Replace zeros by the nearest non-zero value inside the range.
        h[zero] = 1 if hi_h >= 1 else -1
    return (h / 100.0).astype(np.float32)


def input_chunks(a: np.ndarray, b: np.ndarray, square: bool) -> Iterator[bytes]:
    """The input file for ``a`` and ``b``: header, A's rows, B's rows, values as ``%.2f``."""
    m, k = a.shape
    n = b.shape[1]
    yield (f"{m}\n" if square else f"{m} {k} {n}\n").encode()
    for mat in (a, b):
        fmt = " ".join(["%.2f"] * mat.shape[1]) + "\n"
        for start in range(0, mat.shape[0], 256):
            block = mat[start : start + 256].astype(np.float64)
            yield "".join(fmt % tuple(row) for row in block).encode()
