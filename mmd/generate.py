"""Random test inputs: never zeros (they hide unwritten outputs), values with two decimals."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from . import textformat

#: Bytes per value while one matrix is drawn: the int64 hundredths, the mask of zeros, the float32 result.
DRAW_BYTES_PER_VALUE = 8 + 1 + 4


def memory_needed(m: int, k: int, n: int) -> int:
    """The most memory :func:`random_matrix` takes to draw A (M×K) and then B (K×N), A kept meanwhile."""
    return max(DRAW_BYTES_PER_VALUE * m * k, 4 * m * k + DRAW_BYTES_PER_VALUE * k * n)


def hundredths(lo: float, hi: float) -> tuple[int, int]:
    """[lo, hi] in hundredths; ValueError when it holds no non-zero two-decimal value."""
    lo_h, hi_h = round(lo * 100), round(hi * 100)
    if lo_h > hi_h or (lo_h == hi_h == 0):
        raise ValueError(f"range [{lo:g}, {hi:g}] holds no non-zero two-decimal values")
    return lo_h, hi_h


def random_matrix(rng: np.random.Generator, rows: int, cols: int, lo: float = -10.0, hi: float = 10.0) -> np.ndarray:
    """A float32 matrix of values in [lo, hi] with two decimals and no zeros."""
    lo_h, hi_h = hundredths(lo, hi)
    h = rng.integers(lo_h, hi_h, size=(rows, cols), endpoint=True)
    zero = h == 0
    if zero.any():
        # Replace zeros by the nearest non-zero value inside the range.
        h[zero] = 1 if hi_h >= 1 else -1
    # h / 100 in float64, rounded to float32 on the way out: no float64 temporary
    out = np.empty((rows, cols), dtype=np.float32)
    np.divide(h, 100.0, out=out, casting="same_kind")
    return out


def input_chunks(a: np.ndarray, b: np.ndarray, square: bool) -> Iterator[bytes]:
    """The input file for ``a`` and ``b``: header, A's rows, B's rows, values as ``%.2f``.

    The bytes are Python's ``'%.2f' % float(x)``, written by mmd._fasttext
    where it is built (:func:`mmd.textformat.emit_input_chunks`).
    """
    return textformat.emit_input_chunks(a, b, square)
