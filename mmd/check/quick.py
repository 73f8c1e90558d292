"""The quick check: Freivalds' method in its Gaussian form (Ji, Mascagni and Li, 2017), without numpy.

With E = C − A·B for an output C (m×n) of A (m×k) and B (k×n), and v
independent Gaussian vectors x_1..x_v (n) and y_1..y_v (m), the projections
E_i·x_t of a row i are independent normals of variance ‖E_i‖² (the row's
sum of squares), whatever E is, so ‖E_i‖⁻²·Σ_t (E_i·x_t)² is exactly χ²
with v degrees of freedom; columns alike with yᵀ·E. The check computes, for
each row and each column, the norm of its v projections, r_i = (Σ_t
(E_i·x_t)²)^½, in float64 without forming A·B, and refuses when any r_i
exceeds its bound z·σ_i (plus a margin for float64 rounding):

* σ_i bounds ‖E_i‖ for every output the full check passes: there |E_ij| ≤
  h + c·S_ij (h the print rounding, c·S the fp32 model, S = |A|·|B|;
  :mod:`mmd.check.tolerance`), so ‖E_i‖² ≤ σ_i² = n·h² + 2hc·Σ_j S_ij +
  c²·min(max_j S_ij·Σ_j S_ij, ‖a_i‖²·‖B‖²) ≥ Σ_j (h + c·S_ij)², with
  Σ_j S_ij = |a_i|·(|B|·1), max_j S_ij ≤ |a_i|·(row maxima of |B|) and
  S_ij ≤ ‖a_i‖·‖b_j‖ (Cauchy–Schwarz): O(n²) for all rows. A ``tol``
  replaces c·S by a constant, as in the full check.
* z² is χ²_v's upper quantile at ``false_alarm``/(m + n), so that all m + n
  norms together refuse an output the full check passes with a chance of at
  most ``false_alarm`` (a union bound).

What it catches follows from the same law. A row with ‖E_i‖ = ρ·(its bound
z·σ_i) is refused with probability exactly P(χ²_v > 1/ρ²) (:func:`caught`),
and missed with P(χ²_v ≤ 1/ρ²), whatever the row's errors look like: one
value off, the whole row shifted, noise. So every row (column) whose errors
against the exact product have ‖E_i‖ ≥ bound_i / q_v(miss)^½ (q_v: χ²_v's
lower quantile) is caught with probability ≥ 1 − miss: :func:`reach` gives
that factor, :attr:`QuickReport.catches` it as an rms per element of the
worst-bounded row or column. With 16 vectors and miss = 10⁻⁶ the factor is
1/q^½ = 0.83, and ‖E_i‖ must reach 8.0 σ_i (at m = n = 1024). σ_i itself
cannot shrink: honest sequential fp32 sums of constant matrices (every
element off alike, as a naive or tiled kernel sums) come close to the full
check's per-element allowance (docs/grading.md, "How it was measured", has
the figures), so a row of such a product has ‖E_i‖ near σ_i. A single value off by δ moves its row and its
column by δ each: two independent chances.

The work is O(n²) passes over A, B and C in :mod:`mmd._fastcheck`, which
reads plain buffers: :func:`project` (A and B's side) and :class:`OutputSums`
(C's, a block of rows at a time), and then :func:`verdict`, O((m + n)·v) in
Python. None of it needs numpy, so ``mmd check --quick`` of one output runs
without importing it. :mod:`mmd.check.quickarrays` makes the same sums in numpy where
the C passes are not built; both feed :func:`verdict`.

Every series here is a flat ``array('d')`` in C order: ``x_t`` is vectors×n
(xᵀ), ``y`` m×vectors, the projections of rows (``abx_t``, ``cx_t``)
vectors×m, those of columns (``yab``, ``yc``) vectors×n.
"""

from __future__ import annotations

import functools
import math
import operator
import random
import secrets
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import accel
from .tolerance import PRINT_HALF_UNIT, U64, model_factor, tolerance_of

#: The most vectors on each side the C passes take (mmd._fastcheck's MAX_VECTORS).
C_MAX_VECTORS = 16
#: Random vectors on each side unless a caller asks for another count (``mmd check`` does not): the C
#: passes' most, as each one more narrows the gap between what is never refused and what is always
#: caught (:func:`reach`: a row is caught from 2.65 times its bound at 8 vectors, 0.83 at 16).
VECTORS = C_MAX_VECTORS
#: The chance of a miss at which :attr:`QuickReport.catches` states what is caught.
MISS = 1e-6


def fresh_seed() -> int:
    """A seed no one can know before the check: with a known seed, an output that is not the product
    can be made in O(n²) to pass (an error that the seed's vectors cannot see)."""
    return secrets.randbits(32)


def zeros(count: int) -> array[float]:
    """``count`` float64 zeros."""
    return array("d", bytes(8 * count))


@functools.lru_cache(maxsize=4)
def _vectors(m: int, n: int, seed: int, vectors: int) -> tuple[bytes, bytes]:
    rng = random.Random(seed)
    count = (n + m) * vectors
    out = zeros(count + 1)
    # Box-Muller on Python's Mersenne Twister: random() is the one stream Python keeps the same
    # for a seed from version to version (its gauss() may change), and numpy is not imported here
    two_pi = 2.0 * math.pi
    for i in range(0, count, 2):
        r = math.sqrt(-2.0 * math.log(1.0 - rng.random()))  # 1 - u is in (0, 1]
        t = two_pi * rng.random()
        out[i], out[i + 1] = r * math.cos(t), r * math.sin(t)
    split = 8 * n * vectors
    raw = out.tobytes()
    return raw[:split], raw[split : 8 * count]


_VECTORS_LOCK = threading.Lock()


def random_vectors(m: int, n: int, seed: int = 0, vectors: int = VECTORS) -> tuple[array[float], array[float]]:
    """The quick check's Gaussian vectors for an m×n product: x_t (vectors×n), then y (m×vectors),
    from ``seed`` (both sides make them here, so they agree; made once for both sides' threads)."""
    with _VECTORS_LOCK:
        x_t, y = _vectors(m, n, seed, vectors)
    return array("d", x_t), array("d", y)


@dataclass(frozen=True)
class Projections:
    """A (m×k) and B (k×n)'s side of the quick check: O(m + n) numbers, made before the output is read."""

    shape: tuple[int, int, int]  # m, k, n
    seed: int
    vectors: int
    x_t: array[float]  # vectors × n
    y: array[float]  # m × vectors
    abx_t: array[float]  # (A·(B·x))ᵀ, vectors × m
    yab: array[float]  # (yᵀ·A)·B, vectors × n
    row_sum: array[float]  # Σ_j S_ij, S = |A|·|B|
    row_max: array[float]  # ≥ max_j S_ij
    col_sum: array[float]  # Σ_i S_ij
    col_max: array[float]  # ≥ max_i S_ij
    a_row_ssq: array[float]  # Σ_k A_ik²
    b_col_ssq: array[float]  # Σ_k B_kj²


def c_usable(vectors: int) -> bool:
    """Whether the C passes are on (:func:`mmd.accel.passes`) and take this many vectors."""
    return accel.passes() is not None and 1 <= vectors <= C_MAX_VECTORS


def project(a: Any, b: Any, shape: tuple[int, int, int], seed: int = 0, vectors: int = VECTORS) -> Projections:
    """A and B's side by mmd._fastcheck (:func:`c_usable`): three passes (B, A, B again), each one
    read of its matrix with every sum of it at once. ``a`` and ``b``: C-ordered float32 or float64
    buffers of m×k and k×n values (k may be 0)."""
    fc = accel.passes()
    assert fc is not None and 1 <= vectors <= C_MAX_VECTORS, "the C passes are not usable: see c_usable"
    m, k, n = shape
    v = vectors
    x_t, y = random_vectors(m, n, seed, v)
    split = accel.C_SPLIT_ELEMS
    b_rows = zeros((v + 2) * k)  # (B·x)ᵀ, Σ_j |B_rj|, max_j |B_rj|
    b_col_ssq = zeros(n)
    a_rows = zeros((v + 3) * m)  # (A·B·x)ᵀ, |A|·Σ|B|, |A|·max|B|, Σ_k A_ik²
    a_cols = zeros((v + 2) * k)  # yᵀ·A, Σ_i |A_ik|, max_i |A_ik|
    b_cols = zeros((v + 2) * n)  # yᵀ·A·B, (Σ|A|)ᵀ·|B|, (max|A|)ᵀ·|B|
    if k:
        fc.b_rows(b, k, n, v, x_t, None, b_rows, b_col_ssq, split)
        fc.a_rows(a, m, k, v, b_rows, y, a_rows, a_cols, split)
        fc.b_cols(b, k, n, v, None, a_cols, None, b_cols, split)
    return Projections(
        shape=shape,
        seed=seed,
        vectors=v,
        x_t=x_t,
        y=y,
        abx_t=a_rows[: v * m],
        yab=b_cols[: v * n],
        row_sum=a_rows[v * m : (v + 1) * m],
        row_max=a_rows[(v + 1) * m : (v + 2) * m],
        col_sum=b_cols[v * n : (v + 1) * n],
        col_max=b_cols[(v + 1) * n :],
        a_row_ssq=a_rows[(v + 2) * m :],
        b_col_ssq=b_col_ssq,
    )


@dataclass
class OutputSums:
    """The output C (m×n)'s side of the quick check: O(m + n) numbers. By mmd._fastcheck they are
    summed a block of rows at a time (:meth:`start`, then :meth:`add`), so an output read a block at
    a time is never held whole."""

    shape: tuple[int, int]
    seed: int
    vectors: int
    cx_t: array[float]  # (C·x)ᵀ, vectors × m
    row_ssq: array[float]  # Σ_j C_ij²
    columns: array[float]  # yᵀ·C (vectors × n), then Σ_i C_ij² (n)
    nonfinite: int = 0  # NaN and infinite values
    first_nonfinite: int | None = None  # the flat index of the first

    @property
    def yc(self) -> array[float]:
        return self.columns[: self.vectors * self.shape[1]]

    @property
    def col_ssq(self) -> array[float]:
        return self.columns[self.vectors * self.shape[1] :]

    @classmethod
    def start(cls, shape: tuple[int, int], seed: int = 0, vectors: int = VECTORS) -> OutputSums:
        """Sums of no rows yet, for :meth:`add`."""
        m, n = shape
        return cls(shape, seed, vectors, zeros(vectors * m), zeros(m), zeros((vectors + 1) * n))

    def add(self, r0: int, block: Any, rows: int) -> None:
        """Add rows r0 .. r0 + rows (``block``: their float32 or float64 values, C order) by
        mmd._fastcheck's pass (:func:`c_usable`), which adds its columns' sums to ours."""
        fc = accel.passes()
        assert fc is not None and 1 <= self.vectors <= C_MAX_VECTORS, "the C passes are not usable: see c_usable"
        m, n = self.shape
        v = self.vectors
        if not rows or not n:
            return
        x_t, y = random_vectors(m, n, self.seed, v)
        rows_t = zeros((v + 1) * rows)
        w = y[r0 * v : (r0 + rows) * v]
        bad, at = fc.c_pass(block, rows, n, v, x_t, w, rows_t, self.columns, accel.C_SPLIT_ELEMS)
        for t in range(v):
            self.cx_t[t * m + r0 : t * m + r0 + rows] = rows_t[t * rows : (t + 1) * rows]
        self.row_ssq[r0 : r0 + rows] = rows_t[v * rows :]
        if bad and self.first_nonfinite is None:
            self.first_nonfinite = r0 * n + at
        self.nonfinite += bad


@dataclass(frozen=True)
class QuickReport:
    """The outcome of the quick check."""

    ok: bool
    shape: tuple[int, int]
    seed: int
    vectors: int  # random vectors on each side
    z: float  # standard deviations the norm of a row's (column's) projections may reach before it is refused
    false_alarm: float  # at most this chance of refusing a result the full check passes
    bound: float  # the largest bound a norm was held to
    worst_ratio: float  # max over rows and columns of the norm of its projections / its bound (> 1: refused)
    worst: tuple[str, int] | None  # ("row", i) or ("column", j), 0-based, where that ratio was reached
    nonfinite: int  # NaN or infinite values in the output (refused at once)
    tolerance: str
    # every row (column) whose errors against the exact product reach this root-mean-square per
    # value is refused with a chance of at least 1 - MISS (:func:`reach`); 0 where the output's
    # shape or a value not finite refused it without its sums
    catches: float = 0.0

    def summary(self) -> str:
        """One line for the terminal."""
        m, n = self.shape
        head = "ok" if self.ok else "MISMATCH"
        if self.nonfinite:
            what = f"{self.nonfinite} values are not finite"
        else:
            what = f"largest projection {self.worst_ratio:.3g} of its bound"
            if self.worst is not None and not self.ok:
                what += f", at {self.worst[0]} {self.worst[1] + 1}"
        return (
            f"{head} (quick): {m}x{n}, {what}; {self.vectors}+{self.vectors} Gaussian projections, seed {self.seed}, "
            f"bound {self.z:.2f} sigma (up to {self.bound:.4g}; tolerance {self.tolerance}), "
            f"false alarm < {self.false_alarm:.0e}{'; ' + self.caught_phrase() if self.catches else ''}"
        )

    def caught_phrase(self) -> str:
        """What this check catches, in a few words."""
        return caught_phrase(self.catches)

    def reason(self) -> str:
        """Why it was refused, in a few words (empty when ok)."""
        if self.ok:
            return ""
        if self.nonfinite:
            return f"{self.nonfinite} values are not finite"
        # a student's words: what was multiplied, and how far past the tolerance, not the test's own terms
        what = f"{self.worst[0]} {self.worst[1] + 1}" if self.worst else "the output"
        ratio = f"{self.worst_ratio:.3g}" if self.worst_ratio < 1000 else f"{self.worst_ratio:,.0f}"
        return (
            f"{what} is wrong: multiplied by {self.vectors} random vectors, it is off by {ratio} times what the "
            "tolerance allows"
        )


def caught_phrase(catches: float) -> str:
    """What a quick check whose figure is ``catches`` (:attr:`QuickReport.catches`) catches, in a few words."""
    return f"catches any row or column off by >= {catches:.3g} rms (chance >= 1 - {MISS:.0e})"


def chi2_sf(x: float, v: int) -> float:
    """P(χ²_v > x), by the recurrence Q(x; v + 2) = Q(x; v) + (x/2)^(v/2)·e^(-x/2)/Γ(v/2 + 1)
    from Q(x; 1) = erfc((x/2)^½) or Q(x; 2) = e^(-x/2): a sum of v/2 positive terms, exact in the
    far upper tail the bound lives in."""
    if x <= 0:
        return 1.0
    h = x / 2
    q, a = (math.erfc(math.sqrt(h)), 0.5) if v % 2 else (math.exp(-h), 1.0)
    while a < v / 2:
        q += math.exp(a * math.log(h) - h - math.lgamma(a + 1))
        a += 1
    return q


def chi2_cdf(x: float, v: int) -> float:
    """P(χ²_v ≤ x), by the series Σ_i e^(-x/2)·(x/2)^(v/2 + i)/Γ(v/2 + i + 1): no cancellation in
    the lower tail a miss lives in."""
    if x <= 0:
        return 0.0
    h, a = x / 2, v / 2
    term = math.exp(a * math.log(h) - h - math.lgamma(a + 1))
    total, i = 0.0, 0
    while term > total * 1e-17 or i <= h:
        total += term
        i += 1
        term *= h / (a + i)
    return min(total, 1.0)


def _root(f: Any, target: float) -> float:
    """The x in (0, 2000) at which the increasing ``f`` reaches ``target`` (bisection)."""
    lo, hi = 0.0, 2000.0
    for _ in range(100):  # to 2000/2^100: below float64's resolution of any answer here
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return hi


@functools.lru_cache(maxsize=16)
def threshold(tail: float, v: int) -> float:
    """The z with P(χ²_v > z²) = tail: the norm of v standard normals exceeds z with chance ``tail``."""
    return math.sqrt(_root(lambda x: -chi2_sf(x, v), -tail))


@functools.lru_cache(maxsize=16)
def reach(v: int, miss: float = MISS) -> float:
    """The fraction of its bound a row's (column's) error norm ‖E_i‖ must reach to be refused with a
    chance of at least 1 - ``miss``, at ``v`` vectors: ‖E_i‖·(χ²_v)^½ exceeds the bound unless χ²_v ≤
    (bound/‖E_i‖)², so the fraction is 1/q^½ with q χ²_v's ``miss`` quantile."""
    return 1 / math.sqrt(_root(lambda x: chi2_cdf(x, v), miss))


def caught(ratio: float, v: int) -> float:
    """The chance that a row (column) whose error norm is ``ratio`` times its bound is refused, at
    ``v`` vectors: P(χ²_v > 1/ratio²), exactly, whatever the errors' pattern."""
    return chi2_sf(1 / (ratio * ratio), v) if ratio > 0 else 0.0


def _ratios(mine: Sequence[float], theirs: Sequence[float], count: int, bounds: Sequence[float]) -> list[float]:
    """For each of ``count`` rows (or columns): the norm of mine - theirs over its vectors (series
    t: [t·count, (t+1)·count)) over its bound. A NaN (an input so large that its products overflow)
    counts as infinitely far out."""
    diffs = [
        list(map(operator.sub, mine[t * count : (t + 1) * count], theirs[t * count : (t + 1) * count]))
        for t in range(len(mine) // max(count, 1))
    ]
    norms = map(math.hypot, *diffs) if diffs else [0.0] * count
    ratios = list(map(operator.truediv, norms, bounds))
    return [math.inf if r != r else r for r in ratios]


def verdict(
    sums: OutputSums, proj: Projections, false_alarm: float = 1e-9, tol: float | None = None, precision: str = "fp32"
) -> QuickReport:
    """The quick check's verdict from the output's sums and A and B's, made with the same seed and vectors;
    a ``precision`` of ``tf32`` (a TF32 kernel's product) widens the model as the full check does."""
    m, k, n = proj.shape
    v, seed = proj.vectors, proj.seed
    if (sums.seed, sums.vectors) != (seed, v):
        raise ValueError(f"the output's sums are of seed {sums.seed}, {sums.vectors} vectors; A and B's of {seed}, {v}")
    tolerance = tolerance_of(tol, precision)
    z = threshold(false_alarm / max(m + n, 1), v)
    if sums.shape != (m, n) or sums.nonfinite:
        first = sums.first_nonfinite
        return QuickReport(
            ok=False,
            shape=sums.shape,
            seed=seed,
            vectors=v,
            z=z,
            false_alarm=false_alarm,
            bound=0.0,
            worst_ratio=math.inf,
            worst=None if first is None else ("row", first // max(sums.shape[1], 1)),
            nonfinite=sums.nonfinite,
            tolerance=tolerance,
        )
    h = PRINT_HALF_UNIT
    ssq_a, ssq_b = math.fsum(proj.a_row_ssq), math.fsum(proj.b_col_ssq)
    if tol is None:
        # Σ_j S_ij = row_sum exactly; Σ_j S_ij² ≤ max_j S_ij·Σ_j S_ij ≤ row_max·row_sum, and
        # ≤ ‖a_i‖²·‖B‖² (Cauchy–Schwarz on each S_ij): the smaller of the two; columns alike
        c = model_factor(k, precision)
        var_rows = [
            n * h * h + 2 * h * c * s + c * c * min(mx * s, a_ssq * ssq_b)
            for s, mx, a_ssq in zip(proj.row_sum, proj.row_max, proj.a_row_ssq, strict=True)
        ]
        var_cols = [
            m * h * h + 2 * h * c * s + c * c * min(mx * s, ssq_a * b_ssq)
            for s, mx, b_ssq in zip(proj.col_sum, proj.col_max, proj.b_col_ssq, strict=True)
        ]
    else:
        var_rows, var_cols = [n * (h + tol) ** 2] * m, [m * (h + tol) ** 2] * n
    # float64 rounding of the projections: at most about (k + m + n)·u of the sums of |terms|,
    # themselves at most these norms (Cauchy–Schwarz), over all the vectors together
    gamma = 2 * (k + m + n + 4) * U64
    xn = math.sqrt(sum(map(operator.mul, proj.x_t, proj.x_t)))  # all the vectors' 2-norm together
    yn = math.sqrt(sum(map(operator.mul, proj.y, proj.y)))
    norm_a, norm_b = math.sqrt(ssq_a), math.sqrt(ssq_b)
    bound_rows = [
        z * math.sqrt(var) + gamma * xn * (math.sqrt(c_ssq) + math.sqrt(a_ssq) * norm_b)
        for var, c_ssq, a_ssq in zip(var_rows, sums.row_ssq, proj.a_row_ssq, strict=True)
    ]
    bound_cols = [
        z * math.sqrt(var) + gamma * yn * (math.sqrt(c_ssq) + norm_a * math.sqrt(b_ssq))
        for var, c_ssq, b_ssq in zip(var_cols, sums.col_ssq, proj.b_col_ssq, strict=True)
    ]
    ratio_rows = _ratios(sums.cx_t, proj.abx_t, m, bound_rows)
    ratio_cols = _ratios(sums.yc, proj.yab, n, bound_cols)
    # the first largest of each, as numpy's argmax
    i = max(range(m), key=ratio_rows.__getitem__, default=0)
    j = max(range(n), key=ratio_cols.__getitem__, default=0)
    row_ratio = ratio_rows[i] if m else 0.0
    col_ratio = ratio_cols[j] if n else 0.0
    if row_ratio >= col_ratio:
        worst_ratio, worst = row_ratio, ("row", i)
    else:
        worst_ratio, worst = col_ratio, ("column", j)
    # a row's rms is its norm over sqrt(n): the least rms caught in the worst-bounded row or column
    rms_bound = max(
        max(bound_rows, default=0.0) / math.sqrt(max(n, 1)), max(bound_cols, default=0.0) / math.sqrt(max(m, 1))
    )
    return QuickReport(
        ok=worst_ratio <= 1.0,
        shape=(m, n),
        seed=seed,
        vectors=v,
        z=z,
        false_alarm=false_alarm,
        bound=max(bound_rows + bound_cols, default=0.0),
        worst_ratio=worst_ratio,
        worst=worst,
        nonfinite=0,
        tolerance=tolerance,
        catches=reach(v) * rms_bound,
    )
