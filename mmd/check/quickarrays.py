"""The quick check (:mod:`mmd.check.quick`) of numpy arrays: A and B's side (:func:`project`), the
output's (:func:`output_sums`), and the whole check of an output held whole (:func:`quick_of`).

By mmd._fastcheck's passes where they are usable (:func:`mmd.check.quick.c_usable`), else plain
numpy in float64 (the fallback, and the oracle the C passes are tested against); both feed
:func:`mmd.check.quick.verdict`. :mod:`mmd.check.quick` itself needs no numpy.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np

from . import quick


def _c_matrix(mat: np.ndarray) -> np.ndarray:
    """``mat`` as the C passes read it: float32 or float64 (native order) as it is, anything else in float64."""
    if mat.dtype == np.float32 or mat.dtype == np.float64:
        return np.ascontiguousarray(mat)
    return np.ascontiguousarray(mat, dtype=np.float64)


def quick_of(
    out: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    seed: int = 0,
    vectors: int = quick.VECTORS,
    false_alarm: float = 1e-9,
    tol: float | None = None,
) -> quick.QuickReport:
    """The quick check (:mod:`mmd.check.quick`) of an output held whole: O(n²) work for an m×n output."""
    shape = (int(out.shape[0]), int(out.shape[1])) if out.ndim == 2 else (0, 0)
    sums = output_sums([(0, out)] if out.ndim == 2 else [], shape, seed, vectors)
    return quick.verdict(sums, project(a, b, seed, vectors), false_alarm, tol)


def _series(x: np.ndarray) -> array[float]:
    """``x`` as :mod:`mmd.check.quick` keeps its series: a flat float64 array in C order."""
    return array("d", np.ascontiguousarray(x, dtype=np.float64).tobytes())


def _numpy_vectors(m: int, n: int, seed: int, vectors: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`mmd.check.quick.random_vectors` as numpy takes them: x (n × vectors), y (m × vectors)."""
    x_t, y = quick.random_vectors(m, n, seed, vectors)
    return np.frombuffer(x_t).reshape(vectors, n).T, np.frombuffer(y).reshape(m, vectors)


def project(a: np.ndarray, b: np.ndarray, seed: int = 0, vectors: int = quick.VECTORS) -> quick.Projections:
    """A and B's side of the quick check: by mmd._fastcheck where it is usable
    (:func:`mmd.check.quick.c_usable`), else plain numpy in float64 over the whole matrices (the
    fallback, and the oracle the C passes are tested against)."""
    m, k = a.shape
    n = b.shape[1]
    if quick.c_usable(vectors) and a.size and b.size:
        return quick.project(_c_matrix(a), _c_matrix(b), (m, k, n), seed, vectors)
    x, y = _numpy_vectors(m, n, seed, vectors)
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    abs_a, abs_b = np.abs(a64), np.abs(b64)
    a_col_sum, a_col_max = abs_a.sum(axis=0), abs_a.max(axis=0, initial=0.0)
    return quick.Projections(
        shape=(m, k, n),
        seed=seed,
        vectors=vectors,
        x_t=_series(x.T),
        y=_series(y),
        abx_t=_series((a64 @ (b64 @ x)).T),
        yab=_series((y.T @ a64) @ b64),
        row_sum=_series(abs_a @ abs_b.sum(axis=1)),
        row_max=_series(abs_a @ abs_b.max(axis=1, initial=0.0)),
        col_sum=_series(a_col_sum @ abs_b),
        col_max=_series(a_col_max @ abs_b),
        a_row_ssq=_series(np.einsum("ik,ik->i", a64, a64)),
        b_col_ssq=_series(np.einsum("kj,kj->j", b64, b64)),
    )


def output_sums(
    blocks: Iterable[tuple[int, np.ndarray]], shape: tuple[int, int], seed: int = 0, vectors: int = quick.VECTORS
) -> quick.OutputSums:
    """The output's side of the quick check (:class:`mmd.check.quick.OutputSums`) from consecutive
    blocks of rows (first row, rows): no block is needed once it has been summed, so an output read
    a block at a time (:func:`mmd.textoutput.output_blocks`) is never held whole. By mmd._fastcheck
    where it is usable, else plain numpy a block at a time (the fallback and oracle)."""
    m, n = shape
    sums = quick.OutputSums.start(shape, seed, vectors)
    if quick.c_usable(vectors):
        for r0, blk in blocks:
            if blk.size:
                sums.add(r0, _c_matrix(blk), blk.shape[0])
        return sums
    x, y = _numpy_vectors(m, n, seed, vectors)
    cx, yc = np.zeros((m, vectors)), np.zeros((vectors, n))
    row_ssq, col_ssq = np.zeros(m), np.zeros(n)
    for r0, blk in blocks:
        r1 = r0 + blk.shape[0]
        if not blk.size:
            continue
        blk64 = np.asarray(blk, dtype=np.float64)
        finite = np.isfinite(blk64)
        bad = int(blk64.size - np.count_nonzero(finite))
        if bad:
            if sums.first_nonfinite is None:
                sums.first_nonfinite = r0 * n + int(np.flatnonzero(~finite)[0])
            sums.nonfinite += bad
            continue
        cx[r0:r1] = blk64 @ x
        yc += y[r0:r1].T @ blk64
        row_ssq[r0:r1] = np.einsum("ij,ij->i", blk64, blk64)
        col_ssq += np.einsum("ij,ij->j", blk64, blk64)
    sums.cx_t[:], sums.row_ssq[:] = _series(cx.T), _series(row_ssq)
    sums.columns[:] = _series(np.concatenate([yc.ravel(), col_ssq]))
    return sums
