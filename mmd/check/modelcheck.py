"""The full check's rule under the fp32 model, |out − ref| ≤ 0.005 + c·S with S = |A|·|B|, without
computing all of S: cheap bounds on S decide most elements as the product's blocks come
(:meth:`mmd.check.product.Float64Product.pairs`), and S is summed only where they cannot.

:class:`ModelCheck` is what :func:`mmd.check.full.against_product` runs when no ``tol`` replaces the
model; c is :func:`mmd.check.tolerance.model_factor`'s. Its passes are mmd._fastcheck's where it is
on, else numpy's (the fallback, and the oracle the C passes are tested against).
"""

from __future__ import annotations

import contextlib
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from .. import accel
from .compare import CheckReport, ElementwiseTotals, nan_max, summed_report
from .product import Float64Product, Rows
from .tolerance import PRINT_HALF_UNIT, U64, model_factor

#: Columns of A (rows of B) summed for the cheap lower bound of |A|·|B|.
_LOWER_TERMS = 64
#: Multiply-adds below which S at scattered elements is one GEMM over their rows and columns.
_SMALL_GEMM = 1 << 26
#: Elements per block of rows the numpy fallback of the model check hands a thread (cpus.BLOCK_ELEMS, a
#: different quantity, is what the C passes take per process).
_BLOCK_ELEMS = 1 << 20
#: Elements per chunk a thread's pass takes at a time: a chunk's float64 temporaries (256 KiB each)
#: stay in a core's L2 cache, where numpy's several passes over them run at cache speed rather than
#: at memory speed, and are reused from chunk to chunk (no allocation).
_CHUNK_ELEMS = 1 << 15


@dataclass
class _Sieve:
    """What the first pass of :class:`ModelCheck` found: the elements |ref| ≤ S does not pass."""

    max_err: float = 0.0
    ssq_err: float = 0.0
    ssq_ref: float = 0.0
    nonfinite: int = 0  # NaN and infinite values in the output
    first_nan: int | None = None  # flat index of the first NaN in the output
    first_nonfinite: int | None = None  # and of its first NaN or infinite value
    left: int = 0  # finite elements left; the lists below hold them, unless there are more than m·n/8
    flats: list[np.ndarray] = dataclasses.field(default_factory=list)
    errs: list[np.ndarray] = dataclasses.field(default_factory=list)  # their |error|
    refs: list[np.ndarray] = dataclasses.field(default_factory=list)  # and the reference there

    def add(
        self,
        sums: tuple[float, float, float],
        nonfinite: int,
        first_nonfinite: int | None,
        first_nan: int | None,
        left: int,
        found: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        """A block's findings (max |error|, Σ error², Σ ref²; the NaN and infinite values; the finite
        elements left, then their flat indices, |error| and reference), indices the whole output's."""
        self.max_err = nan_max(self.max_err, sums[0])
        self.ssq_err += sums[1]
        self.ssq_ref += sums[2]
        self.nonfinite += nonfinite
        if self.first_nonfinite is None:
            self.first_nonfinite = first_nonfinite
        if self.first_nan is None:
            self.first_nan = first_nan
        self.left += left
        self.flats.append(found[0])
        self.errs.append(found[1])
        self.refs.append(found[2])

    @property
    def worst_nonfinite(self) -> int | None:
        """As np.argmax over every excess would pick: the first NaN, else the first infinite value."""
        return self.first_nan if self.first_nan is not None else self.first_nonfinite


class ModelCheck:
    """The rule |out − ref| ≤ 0.005 + c·S, S = |A|·|B|, without computing all of S.

    S is bounded below by |ref| (free) and by the sum of its first 64 terms,
    above by ‖a_i‖·‖b_j‖ (Cauchy–Schwarz), with margins for float64 rounding
    wide enough that any order of summation of S agrees with them. An
    element within the lower bound's allowance passes, one beyond the upper
    bound's fails; S itself is computed only for the rest, and for the
    failures that could be the worst one. When most elements are left
    undecided (a result wrong everywhere), S is made in full too, a block of
    rows at a time beside the product's, as it always was before these bounds.
    The reference comes a block of rows at a time beside the output's
    (:meth:`Float64Product.pairs`), each block sieved as it comes.
    """

    def __init__(self, out: Rows, prod: Float64Product, precision: str = "fp32") -> None:
        self.out, self.prod, self.a64, self.b64 = out, prod, prod.a64, prod.b64
        m, k = self.a64.shape
        n = self.b64.shape[1]
        self.m, self.n, self.k = m, n, k
        # c in the allowance 0.005 + c·S: fp32's model, plus TF32's operand rounding for a TF32 product
        self.c = model_factor(k, precision)
        gamma = (k + 4) * U64
        self.lo_scale = 1 - 2 * gamma
        self.hi_scale = 1 + 4 * gamma

    def _block_numpy(
        self, o_all: np.ndarray, rf_all: np.ndarray
    ) -> tuple[tuple[float, float, float], np.ndarray, np.ndarray, np.ndarray]:
        """Sums (max |error|, Σ error², Σ ref²), then the flat indices of the elements left (NaN and
        infinite values among them), their |error| and the reference there, in one block's terms."""
        err_buf = np.empty(min(o_all.size, _CHUNK_ELEMS))
        allowed_buf = np.empty_like(err_buf)
        passed_buf = np.empty(err_buf.shape, dtype=bool)
        scale = self.c * self.lo_scale
        max_err, ssq_err, ssq_ref = 0.0, 0.0, 0.0
        lefts, errs = [], []
        for s in range(0, o_all.size, _CHUNK_ELEMS):
            o, rf = o_all[s : s + _CHUNK_ELEMS], rf_all[s : s + _CHUNK_ELEMS]
            err, allowed, passed = err_buf[: o.size], allowed_buf[: o.size], passed_buf[: o.size]
            np.subtract(o, rf, out=err)
            np.abs(err, out=err)
            np.abs(rf, out=allowed)
            allowed *= scale
            allowed += PRINT_HALF_UNIT
            np.less_equal(err, allowed, out=passed)
            np.logical_not(passed, out=passed)  # not passed: a NaN or infinite value's too
            left = np.flatnonzero(passed)
            if left.size:
                lefts.append(left + s)
                errs.append(err[left])
            max_err = nan_max(max_err, float(err.max()))
            ssq_err += float(np.einsum("i,i->", err, err))
            ssq_ref += float(np.einsum("i,i->", rf, rf))
        left = np.concatenate(lefts) if lefts else np.empty(0, dtype=np.intp)
        err_left = np.concatenate(errs) if errs else np.empty(0)
        return (max_err, ssq_err, ssq_ref), left, err_left, rf_all[left]

    def _sieve_numpy(self, sieve: _Sieve, out: np.ndarray, ref: np.ndarray, base: int) -> None:
        """Rows of the output against the same rows of the reference, in blocks on two threads
        (numpy releases the GIL in these loops)."""
        rows, n = out.shape
        step = max(1, _BLOCK_ELEMS // max(n, 1))
        bounds = [(r, min(rows, r + step)) for r in range(0, rows, step)]

        def block(rb: tuple[int, int]) -> tuple[tuple[float, float, float], np.ndarray, np.ndarray, np.ndarray]:
            return self._block_numpy(out[rb[0] : rb[1]].ravel(), ref[rb[0] : rb[1]].ravel())

        if len(bounds) > 1:
            with ThreadPoolExecutor(max_workers=2) as pool:
                parts = list(pool.map(block, bounds))
        else:
            parts = [block(bd) for bd in bounds]
        for (r0, _), (sums, left, err, rf) in zip(bounds, parts, strict=True):
            o = out[r0:].ravel()[left]
            finite = np.isfinite(o)  # every non-finite value is among those left
            nonfinite, nan = np.flatnonzero(~finite), np.flatnonzero(np.isnan(o))
            at = base + r0 * n
            sieve.add(
                sums,
                int(nonfinite.size),
                int(left[nonfinite[0]]) + at if nonfinite.size else None,
                int(left[nan[0]]) + at if nan.size else None,
                int(np.count_nonzero(finite)),
                (left[finite] + at, err[finite], rf[finite]),
            )

    def _sieve_c(self, fc: ModuleType, sieve: _Sieve, out: np.ndarray, ref: np.ndarray, base: int, limit: int) -> None:
        rows, n = out.shape
        ref = np.ascontiguousarray(ref)
        got = fc.model(out, ref, rows, n, self.c * self.lo_scale, PRINT_HALF_UNIT, limit, accel.C_SPLIT_ELEMS)
        max_err, ssq_err, ssq_ref, nonfinite, first_nan, first_nonfinite, left, flat, err = got
        at = np.frombuffer(flat, dtype=np.int64).astype(np.intp, copy=False)  # empty beyond the limit
        sieve.add(
            (max_err, ssq_err, ssq_ref),
            nonfinite,
            first_nonfinite + base if nonfinite else None,
            first_nan + base if first_nan >= 0 else None,
            left,
            (at + base, np.frombuffer(err, dtype=np.float64), ref.ravel()[at]),
        )

    def _sieve(self, fc: ModuleType | None) -> _Sieve | None:
        """Every block of the reference as it comes; None once more than m·n/8 elements are left
        (S is then made in full: the rest of the sieve would not be used)."""
        sieve = _Sieve()
        limit = self.m * self.n // 8
        with contextlib.closing(self.prod.pairs(self.out)) as pairs:  # stopped early: its workers stop
            for r0, out, ref in pairs:
                if fc is not None:
                    self._sieve_c(fc, sieve, out, ref, r0 * self.n, limit - sieve.left)
                else:
                    self._sieve_numpy(sieve, out, ref, r0 * self.n)
                if sieve.left > limit:
                    return None
        return sieve

    def _exact_s(self, flat: np.ndarray) -> np.ndarray:
        """S = |A|·|B| at the row-major flat indices ``flat``, by the cheaper of two ways."""
        n, k = self.n, self.k
        rows, ri = np.unique(flat // n, return_inverse=True)
        cols, ci = np.unique(flat % n, return_inverse=True)
        if rows.size * cols.size <= 4 * flat.size or rows.size * cols.size * k <= _SMALL_GEMM:
            # few rows or few columns (a wrong row, column or tile): one small GEMM
            sub = np.abs(self.a64[rows]) @ np.abs(self.b64[:, cols])
            return np.asarray(sub[ri, ci])
        # scattered: one dot product each, over columns of B gathered once
        abs_bt = np.abs(self.b64[:, cols]).T.copy()
        got = np.empty(flat.size)
        step = max(1, (1 << 20) // max(k, 1))
        for s in range(0, flat.size, step):
            f = flat[s : s + step]
            got[s : s + step] = np.einsum("ek,ek->e", np.abs(self.a64[f // n]), abs_bt[ci[s : s + step]])
        return got

    def _norms(self, fc: ModuleType | None) -> tuple[np.ndarray, np.ndarray]:
        """‖a_i‖ for every row of A and ‖b_j‖ for every column of B."""
        (m, k), n = self.a64.shape, self.n
        if fc is None or not k:
            return np.sqrt(np.einsum("ik,ik->i", self.a64, self.a64)), np.sqrt(
                np.einsum("kj,kj->j", self.b64, self.b64)
            )
        a_rows, b_rows = np.empty(m), np.empty(k)
        a_cols, b_cols = np.zeros(k), np.zeros(n)  # the passes add to their column sums
        fc.sumsq(np.ascontiguousarray(self.a64), m, k, 1, None, None, a_rows, a_cols, accel.C_SPLIT_ELEMS)
        fc.sumsq(np.ascontiguousarray(self.b64), k, n, 1, None, None, b_rows, b_cols, accel.C_SPLIT_ELEMS)
        return np.sqrt(a_rows), np.sqrt(b_cols)

    def _in_full(self, tolerance: str) -> CheckReport:
        """The rule with S made in full, a block of rows at a time beside the reference's."""
        abs_b = np.abs(self.b64)
        totals = ElementwiseTotals()
        for r0, out, ref in self.prod.pairs(self.out):
            rows = ref.shape[0]
            allowed = PRINT_HALF_UNIT + self.c * (np.abs(self.a64[r0 : r0 + rows]) @ abs_b)
            err = np.abs(out - ref)
            excess = err - allowed
            bad = (excess > 0) | ~np.isfinite(out)
            worst = int(np.argmax(excess))
            totals.add(
                int(np.count_nonzero(bad)),
                float(err.max()),
                float(np.einsum("ij,ij->", err, err)),
                float(np.einsum("ij,ij->", ref, ref)),
                r0 * self.n + worst,
                float(excess.flat[worst]),
            )
        return totals.report((self.m, self.n), tolerance)

    def report(self, tolerance: str) -> CheckReport:
        m, n = self.m, self.n
        fc = accel.passes()
        sieve = self._sieve(fc)
        if sieve is None:  # wrong nearly everywhere
            return self._in_full(tolerance)
        flat = np.concatenate(sieve.flats).astype(np.intp, copy=False)
        err, ref_left = np.concatenate(sieve.errs), np.concatenate(sieve.refs)
        # the sum of S's first p terms, a second lower bound
        p = min(self.k, _LOWER_TERMS)
        i, j = flat // n, flat % n
        s_lo = np.einsum("ek,ek->e", np.abs(self.a64[i, :p]), np.abs(self.b64[:p, :].T[j]))
        s_lo = np.maximum(s_lo, np.abs(ref_left)) * self.lo_scale
        norm_a, norm_b = self._norms(fc)
        allowed_lo = PRINT_HALF_UNIT + self.c * s_lo
        allowed_hi = PRINT_HALF_UNIT + self.c * norm_a[i] * norm_b[j] * self.hi_scale
        sure_bad = err > allowed_hi
        # an element's excess (err - allowance) lies in [err - allowed_hi, err - allowed_lo]: S is
        # needed where the bounds disagree, and for the failures that could be the worst one
        need = (err > allowed_lo) & ~sure_bad
        if sure_bad.any():
            need |= sure_bad & (err - allowed_lo >= np.max((err - allowed_hi)[sure_bad]))
        excess = err - allowed_hi
        excess[err <= allowed_lo] = -1.0  # passes: its excess is never looked at
        idx = np.flatnonzero(need)
        if idx.size:
            excess[idx] = err[idx] - (PRINT_HALF_UNIT + self.c * self._exact_s(flat[idx]))
        bad = sure_bad | (excess > 0)
        mismatches = sieve.nonfinite + int(np.count_nonzero(bad))
        worst = sieve.worst_nonfinite
        if worst is None and bad.any():
            cand = np.flatnonzero(bad)
            worst = int(flat[cand[np.argmax(excess[cand])]])
        return summed_report((m, n), mismatches, sieve.max_err, sieve.ssq_err, sieve.ssq_ref, worst, tolerance)
