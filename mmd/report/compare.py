"""Two runs side by side (``mmd bench --compare``): each case's B/A ratios of the medians, with the two
runs' noise combined, and a verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bench.rows import BenchRow
from .load import Results, load

VERDICTS: tuple[str, ...] = ("faster", "slower", "within noise")


def row_noise(row: BenchRow, phase: str) -> tuple[float | None, bool]:
    """(the noise of ``phase``'s median in ``row``, whether it is measured).

    Runs from before the noise columns have none: half their min–max range
    over the median stands in (what :func:`mmd.bench.median_noise` gives for
    five samples or fewer), marked as not measured.
    """
    noise = {"kernel": row.kernel_noise, "overall": row.overall_noise}.get(phase)
    if noise is not None:
        return noise, True
    spread = row.spread(phase)
    if spread is not None and spread.median:
        return (spread.max - spread.min) / (2.0 * spread.median), False
    return None, False


@dataclass(frozen=True)
class Ratio:
    """B's median over A's for one phase, with the two runs' noise combined (a fraction, 0.02 = 2 %)."""

    a_ms: float
    b_ms: float
    noise: float
    measured: bool  # both noises measured (else a min–max range stood in)

    @property
    def value(self) -> float:
        return self.b_ms / self.a_ms

    @property
    def verdict(self) -> str:
        """``faster`` (B takes less time), ``slower``, or ``within noise``."""
        if self.value < 1.0 - self.noise:
            return "faster"
        if self.value > 1.0 + self.noise:
            return "slower"
        return "within noise"


def _ratio(a: BenchRow, b: BenchRow, phase: str) -> Ratio | None:
    a_ms, b_ms = a.median(phase), b.median(phase)
    (na, ma), (nb, mb) = row_noise(a, phase), row_noise(b, phase)
    if not a_ms or not b_ms or na is None or nb is None:
        return None
    # Each noise is a relative half-width; for a ratio of independent medians they add in quadrature.
    return Ratio(a_ms, b_ms, math.hypot(na, nb), ma and mb)


@dataclass(frozen=True)
class CaseComparison:
    """One case in two runs: the kernel and overall ratios B/A, and the verdict on the kernel's."""

    key: tuple[Any, ...]
    a: BenchRow | None
    b: BenchRow | None
    kernel: Ratio | None
    overall: Ratio | None

    @property
    def verdict(self) -> str:
        """One of :data:`VERDICTS` (on kernel time), else why the case cannot be compared."""
        if self.a is None or self.b is None:
            return "only in A" if self.b is None else "only in B"
        if self.a.status != "ok" or self.b.status != "ok":
            return f"not compared (A {self.a.status}, B {self.b.status})"
        if self.kernel is None:
            return "not compared (no kernel time)"
        return self.kernel.verdict

    @property
    def throttled(self) -> str:
        """Which run was throttled during the case: ``""``, ``"A"``, ``"B"`` or ``"A and B"``."""
        runs = [name for name, row in (("A", self.a), ("B", self.b)) if row is not None and row.throttled]
        return " and ".join(runs)


@dataclass
class Comparison:
    """Two runs, case by case."""

    a: Results
    b: Results
    cases: list[CaseComparison]

    def counts(self) -> dict[str, int]:
        """Cases per verdict (the three of :data:`VERDICTS`, then the others)."""
        found = [c.verdict for c in self.cases]
        keys = list(VERDICTS) + sorted({v for v in found if v not in VERDICTS})
        return {v: found.count(v) for v in keys}

    def text(self) -> str:
        """What ``mmd bench --compare`` prints."""

        def source(name: str, r: Results) -> str:
            facts = [str(r.environment[k]) for k in ("device", "date") if r.environment.get(k)]
            return f"{name} = {r.source}" + (f" ({', '.join(facts)})" if facts else "")

        lines = [source("A", self.a), source("B", self.b)]
        lines.append("B/A of the medians (under 1: B takes less time) ± the two runs' noise combined (95 %)")
        # the mode and memory columns only where a case was not run in memory, in device memory
        show_where = any(c.key[6] != "memory" or c.key[5] not in (None, "device") for c in self.cases)
        body = []
        for c in self.cases:
            kernel, tile, m, k, n, memory, mode = c.key
            cells = [str(kernel), "-" if tile is None else str(tile), f"{m}x{k}x{n}"]
            if show_where:
                cells.append(f"{mode}/{memory or '-'}")
            ms = "" if c.kernel is None else f"{c.kernel.a_ms:.3f} → {c.kernel.b_ms:.3f}"
            cells += [ms, _ratio_text(c.kernel), _ratio_text(c.overall)]
            verdict = c.verdict + (f" (throttled in {c.throttled})" if c.throttled else "")
            body.append([*cells, verdict])
        header = ["kernel", "tile", "shape", *(["mode/memory"] if show_where else []), "kernel ms A → B"]
        header += ["kernel B/A", "overall B/A", "verdict"]
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
        for row in [header, *body]:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        counts = ", ".join(f"{n} {v}" for v, n in self.counts().items() if n)
        lines.append(f"{len(self.cases)} cases: {counts or 'none'}")
        if any(r is not None and not r.measured for c in self.cases for r in (c.kernel, c.overall)):
            lines.append("~: a run without noise columns (before mmd bench measured it): half its min–max range")
        return "\n".join(lines) + "\n"


def _ratio_text(ratio: Ratio | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio.value:.3f} ±{ratio.noise:.1%}" + ("" if ratio.measured else "~")


def compare(a: Path | Results, b: Path | Results) -> Comparison:
    """Run A against run B (each a results folder, results.csv or results.yaml), case by case."""
    ra = a if isinstance(a, Results) else load(Path(a))
    rb = b if isinstance(b, Results) else load(Path(b))

    def keyed(rows: list[BenchRow]) -> dict[tuple[Any, ...], BenchRow]:
        return {r.key: r for r in rows}

    in_a, in_b = keyed(ra.rows), keyed(rb.rows)
    cases = []
    for key in [*in_a, *(k for k in in_b if k not in in_a)]:
        row_a, row_b = in_a.get(key), in_b.get(key)
        kernel = overall = None
        if row_a is not None and row_b is not None:
            kernel, overall = _ratio(row_a, row_b, "kernel"), _ratio(row_a, row_b, "overall")
        cases.append(CaseComparison(key, row_a, row_b, kernel, overall))
    return Comparison(ra, rb, cases)
