"""A case's statistics: each phase's median, min, max and quartiles over the timed calls, and how well the median
is known."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence

from .rows import PHASES, Quartiles, Spread

#: Confidence of the interval behind :func:`median_noise`.
NOISE_CONFIDENCE = 0.95

#: One call's phases: phase → ms.
Sample = Mapping[str, float]


def phase_quartiles(samples: Sequence[Sample]) -> dict[str, Quartiles]:
    """Each phase's first and third quartiles over the samples (in µs-rounded ms; numpy's default, linear,
    interpolation), for the phases some sample has."""
    out: dict[str, Quartiles] = {}
    for phase in PHASES:
        values = [s[phase] for s in samples if s.get(phase) is not None]
        if len(values) == 1:
            out[phase] = Quartiles(round(values[0], 3), round(values[0], 3))
        elif values:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
            out[phase] = Quartiles(round(q1, 3), round(q3, 3))
    return out


def phase_stats(samples: Sequence[Sample]) -> dict[str, Spread]:
    """Each phase's median, min and max over the samples (in µs-rounded ms), for the phases some sample has."""
    out: dict[str, Spread] = {}
    for phase in PHASES:
        values = [s[phase] for s in samples if s.get(phase) is not None]
        if values:
            out[phase] = Spread(round(statistics.median(values), 3), round(min(values), 3), round(max(values), 3))
    return out


@functools.cache
def median_rank(n: int, confidence: float = NOISE_CONFIDENCE) -> int:
    """The 0-based rank j such that [x_(j), x_(n-1-j)] of n sorted samples holds the median at ``confidence``.

    Distribution-free: the number of samples below the true median is
    Binomial(n, 1/2), so the interval misses it with probability
    2·P(B ≤ j). j is the largest rank keeping that within 1 − confidence;
    with 5 samples or fewer no rank does (2·2^-5 > 5 %) and the whole range
    stands in (87.5 % at 4 samples, 94 % at 5).
    """
    tail = (1.0 - confidence) / 2.0
    j, below = 0, 0.0
    for i in range(n // 2):
        below += math.comb(n, i) / 2.0**n
        if below > tail:
            break
        j = i
    return j


def median_noise(values: Sequence[float]) -> float | None:
    """How well the median of ``values`` is known: half the width of its 95 % confidence interval, over it.

    nvbench and friends stop on the samples' relative spread, which does not
    shrink with more samples; the median's interval does (as 1/√n), so
    "repeat until the noise is under 2 %" ends for any steady distribution,
    and a noisy start (a cold clock, a neighbour's job) drops out of the
    interval as samples come. None without samples; 0 for one sample.
    """
    if not values:
        return None
    xs = sorted(values)
    med = statistics.median(xs)
    j = median_rank(len(xs))
    width = xs[len(xs) - 1 - j] - xs[j]
    if med <= 0:
        return 0.0 if width == 0 else math.inf
    return width / (2.0 * med)


def noise_of(samples: Sequence[Sample], phase: str) -> float | None:
    """:func:`median_noise` of one phase over the samples, to 4 significant digits."""
    noise = median_noise([s[phase] for s in samples if s.get(phase) is not None])
    return None if noise is None else float(f"{noise:.4g}")


def settled(samples: Sequence[Sample], target: float) -> bool:
    """Whether the kernel median is known well enough: its noise under ``target`` (the kernel phase is
    the one GFLOP/s and every comparison rest on)."""
    noise = median_noise([s["kernel"] for s in samples if s.get("kernel") is not None])
    return noise is not None and noise < target


def gflops(m: int, k: int, n: int, kernel_ms: float | None) -> float | None:
    """2·m·k·n / the kernel's time, in GFLOP/s (None without a kernel time)."""
    return round(2.0 * m * k * n / (kernel_ms * 1e6), 3) if kernel_ms else None
