"""summary.md: the tables behind the graphs, every kernel by size, speed-ups, efficiency, accuracy, and
every refused, wrong or skipped case with its reason. One function per section; the numbers are the
rows', formatted to three decimals."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from .. import kernels as registry
from ..bench.rows import STATUSES, AccuracyRow, BenchRow
from .load import Results
from .sweeps import TileSweep, accuracy_sweep, kernel_files, kernel_order, ok_rows, sized

#: The graphs' files, as summary.md links them.
GRAPH_FILES: tuple[str, ...] = ("graph1_overall.png", "graph2_cuda.png", "graph3_sizes.png")
ACCURACY_GRAPH = "graph4_accuracy.png"


@dataclass
class Sections:
    """What summary.md is made from: the results and what the graphs read out of them."""

    results: Results
    sweep: TileSweep
    tile: int | None
    sweeps: dict[str, list[BenchRow]]
    peak: tuple[float, str] | None

    def base(self, kernel: str, phase: str) -> dict[int, float]:
        """``kernel``'s median ``phase`` time by size, where it has one."""
        return {sized(r): ms for r in self.sweeps.get(kernel, []) if (ms := r.median(phase))}

    @property
    def sizes(self) -> list[int]:
        return sorted({sized(r) for rs in self.sweeps.values() for r in rs})


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _cell(row: BenchRow | None, phase: str) -> str:
    if row is None:
        return ""
    if row.status != "ok":
        return row.status
    spread = row.spread(phase)
    if spread is None:
        return "–"
    return f"{spread.median:.3f} [{spread.min:.3f}–{spread.max:.3f}]"


def _shape(row: BenchRow) -> str:
    return "?" if row.m is None else f"{row.m}×{row.k}×{row.n}"


def _tile(row: BenchRow) -> str:
    return "" if row.tile is None else str(row.tile)


@dataclass
class Table:
    """A table of the report, as data: summary.md writes it in Markdown, the report's page in HTML."""

    header: list[str]
    rows: list[list[str]]


def markdown_table(table: Table) -> list[str]:
    return _table(table.header, table.rows)


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return [*lines, ""]


def sweep_table(sweep: TileSweep, phase: str, fallback_kernel: bool = False) -> Table:
    """Graph 1's (``overall``) or graph 2's (``cuda``) numbers: median [min–max] ms per kernel and tile."""
    cols = [(f"tile {t}", t) for t in sweep.tiles] + ([("no tile", None)] if sweep.untiled_kernels else [])
    body = []
    for name in sweep.tiled_kernels + sweep.untiled_kernels:
        cells = []
        for _, tile in cols:
            if (tile is None) != (name in sweep.untiled_kernels):
                cells.append("")
                continue
            row = sweep.cells.get((name, tile))
            use = phase
            if fallback_kernel and row is not None and row.status == "ok" and row.spread(phase) is None:
                use = "kernel"
            text = _cell(row, use)
            cells.append(f"{text} (kernel)" if use != phase and text not in ("", "–") else text)
        body.append([name, *cells])
    return Table(["kernel", *[c[0] for c in cols]], body)


def ratio_table(
    sweeps: dict[str, list[BenchRow]],
    base: dict[int, float],
    value: Callable[[BenchRow], float | None],
    invert: bool = False,
    fmt: str = "{:.2f}×",
) -> Table:
    """Each kernel's ``base / value`` (``value / base`` where ``invert``) by size."""
    sizes = sorted({sized(r) for rows in sweeps.values() for r in rows})
    body = []
    for name, rows in sweeps.items():
        by_size = {sized(r): value(r) for r in rows}
        cells = []
        for s in sizes:
            v, b = by_size.get(s), base.get(s)
            cells.append("" if not v or not b else fmt.format(v / b if invert else b / v))
        body.append([name, *cells])
    return Table(["kernel", *[str(s) for s in sizes]], body)


def _head(results: Results) -> list[str]:
    rows = results.rows
    if results.kind == "sidecars":
        # A sidecar row pools the jobs of one case (``repeats`` of them): count the jobs, then the cases.
        counts = {s: sum(r.repeats or 1 for r in rows if r.status == s) for s in STATUSES}
        tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        source = f"(job sidecars; {sum(counts.values())} jobs: {tally}, in {len(rows)} cases.)"
    else:
        counts = {s: sum(1 for r in rows if r.status == s) for s in STATUSES}
        tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        source = f"(mmd bench); {tally}."
    return ["# mmd benchmark report", "", f"Source: `{results.source}` {source}", ""]


def _failed(rows: list[BenchRow]) -> list[str]:
    failing = [r for r in rows if r.status in ("wrong", "error")]
    if not failing:
        return []
    out = ["## FAILED: wrong results and errors", ""]
    out += ["These cases returned a wrong product; their times are not graphed.", ""]
    body = [[r.kernel or "", _tile(r), _shape(r), r.status.upper(), r.reason or ""] for r in failing]
    return out + _table(["kernel", "tile", "shape", "status", "reason"], body)


def _environment_and_kernels(results: Results) -> list[str]:
    out: list[str] = []
    if results.environment:
        out += ["## Environment", ""]
        out += _table(["", ""], [[k, "" if v is None else v] for k, v in results.environment.items()])
    names = kernel_order({r.kernel for r in results.rows if r.kernel})
    files = kernel_files(results.rows)
    out += ["## Kernels", ""]
    out += _table(["kernel", "what it is"], [[n, _what(n, files)] for n in names])
    return [
        *out,
        "## Definitions",
        "",
        "- **overall**: in memory, the wall time of one multiply call; through files (and in sidecars), "
        "read + parse + CUDA phases + emit + write, from the start of the job to the output written (the commit's "
        "syncs and renames follow).",
        "- **cuda**: malloc + h2d + kernel + d2h + free, timed with CUDA events (the course's CUDA time). "
        "The cpu backend has no CUDA phases: its kernel time stands in, marked (kernel).",
        "- **kernel**: the kernel (or cuBLAS, or numpy) alone. GFLOP/s = 2·M·K·N / kernel time.",
        "- Cells are the median [min–max] in ms over the timed repeats.",
        "",
    ]


def _what(name: str, files: dict[str, BenchRow]) -> str:
    """A kernel's line in the table of kernels: the registry's words, or a kernel file's path and sha256."""
    if name in files:
        row = files[name]
        return f"kernel file {row.kernel_file or name}, sha256 {row.kernel_sha256}"
    return registry.REGISTRY[name].description if name in registry.REGISTRY else "?"


def _graphs(s: Sections) -> list[str]:
    size = s.sweep.size
    out = [f"## Graph 1: overall time at {size}×{size} (ms)", "", f"![graph 1]({GRAPH_FILES[0]})", ""]
    out += markdown_table(sweep_table(s.sweep, "overall"))
    out += [f"## Graph 2: CUDA time at {size}×{size} (ms)", "", f"![graph 2]({GRAPH_FILES[1]})", ""]
    out += markdown_table(sweep_table(s.sweep, "cuda", fallback_kernel=True))
    where = f"tile {s.tile}" if s.tile is not None else "any tile"
    out += [f"## Graph 3: kernel time and GFLOP/s against size ({where})", "", f"![graph 3]({GRAPH_FILES[2]})", ""]
    sizes = s.sizes
    out += ["Kernel time (ms, median):", ""]
    out += _table(
        ["kernel", *map(str, sizes)],
        [[n, *[_ms({sized(r): r.median("kernel") for r in rs}.get(z)) for z in sizes]] for n, rs in s.sweeps.items()],
    )
    out += ["GFLOP/s:", ""]
    out += _table(
        ["kernel", *map(str, sizes)],
        [
            [n, *[("" if (g := {sized(r): r.gflops for r in rs}.get(z)) is None else f"{g:.1f}") for z in sizes]]
            for n, rs in s.sweeps.items()
        ],
    )
    return out


def _kernel_table(s: Sections) -> list[str]:
    """Every kernel at every size: median ± noise, TFLOP/s, cuBLAS SGEMM's time over its own, error, SM clock."""
    cublas = s.base("cublas", "kernel")
    out = ["## Every kernel by size", ""]
    out += [
        "Kernel time (median ± its noise: half the 95 % interval of the median), TFLOP/s, "
        "× cuBLAS = cuBLAS SGEMM's kernel time / the kernel's (above 1: faster), "
        "error = ‖C − ref‖ / ‖ref‖ against float64 on the case's inputs, the SM clock during the timed calls.",
        "",
    ]
    body = []
    for name, rs in s.sweeps.items():
        for r in rs:
            ms, size = r.median("kernel"), sized(r)
            noise = "–" if r.kernel_noise is None else f"±{r.kernel_noise:.1%}"
            ratio = f"{cublas[size] / ms:.2f}×" if ms and size in cublas else ""
            tflops = "" if r.gflops is None else f"{r.gflops / 1000:.2f}"
            error = "" if r.rel_error is None else f"{r.rel_error:.1e}"
            clock = "" if r.sm_clock_mhz is None else f"{r.sm_clock_mhz:.0f}"
            if r.throttled:
                clock += f" THROTTLED ({r.throttle_reasons or '?'})"
            body.append([name, str(size), _ms(ms), noise, str(r.repeats), tflops, ratio, error, clock])
    header = ["kernel", "size", "kernel ms", "noise", "calls", "TFLOP/s", "× cuBLAS", "error vs float64", "SM MHz"]
    return out + _table(header, body)


def naive_kernel(s: Sections) -> str:
    """The kernel the speed-ups are over: mmd's naive, or where a run has kernel files and not it, the first of
    them (the course's P1, which P2 and P-last are measured against)."""
    files = [name for name in kernel_files(s.results.rows) if name in s.sweeps]
    return "naive" if "naive" in s.sweeps or not files else files[0]


def _speedups(s: Sections) -> list[str]:
    out = ["## Speed-up over the cpu backend", ""]
    if "cpu" in s.sweeps:
        for phase in ("overall", "kernel"):
            out += [f"{phase} time: cpu {phase} / kernel {phase} (higher is faster):", ""]
            out += markdown_table(
                ratio_table(s.sweeps, s.base("cpu", phase), functools.partial(BenchRow.median, phase=phase))
            )
    else:
        out += ["No cpu results to compare with.", ""]
    naive = naive_kernel(s)
    out += [f"## Speed-up over {naive}", ""]
    if naive in s.sweeps:
        out += [f"kernel time: {naive} kernel / kernel (higher is faster):", ""]
        out += markdown_table(ratio_table(s.sweeps, s.base(naive, "kernel"), lambda r: r.median("kernel")))
        if naive != "naive":
            out += [f"{naive} is the first kernel file of this run; mmd's own naive did not run.", ""]
    else:
        out += ["No naive results to compare with.", ""]
    return out


def _efficiency(s: Sections) -> list[str]:
    out = ["## Efficiency", ""]
    if "cublas" in s.sweeps:
        out += ["Against cuBLAS: cuBLAS kernel time / kernel time (100% = as fast as cuBLAS):", ""]
        out += markdown_table(
            ratio_table(s.sweeps, s.base("cublas", "kernel"), lambda r: r.median("kernel"), fmt="{:.1%}")
        )
    else:
        out += ["No cuBLAS results to compare with.", ""]
    if s.peak is not None:
        tflops, label = s.peak
        peak_gflops = {z: tflops * 1000 for z in s.sizes}
        out += [f"Against the fp32 peak of the {label} ({tflops:g} TFLOP/s): GFLOP/s / peak:", ""]
        out += markdown_table(ratio_table(s.sweeps, peak_gflops, lambda r: r.gflops, invert=True, fmt="{:.1%}"))
    else:
        out += ["The GPU's fp32 peak is not known for this device (give --peak-tflops).", ""]
    return out


def _accuracy(rows: list[AccuracyRow], graph: str) -> list[str]:
    sweep = accuracy_sweep(rows)
    ks = sorted({r.k for rs in sweep.values() for r in rs})
    mn = sorted({(r.m, r.n) for rs in sweep.values() for r in rs})
    where = ", ".join(f"M = {m}, N = {n}" for m, n in mn) or "no results"
    out = [f"## Graph 4: accuracy against float64 ({where}, inputs uniform in [−1, 1])", ""]
    out += [f"![graph 4]({graph})", ""]
    out += [
        "max = max|C − ref| / max|ref|, RMS = ‖C − ref‖ / ‖ref‖ (Frobenius), ref the float64 product. "
        "fp32's tolerance: every element within 4·sqrt(K)·eps·(|A|·|B|), the bar mmd checks fp32 kernels "
        "against (TF32 kernels are checked against their own).",
        "",
    ]
    columns: tuple[tuple[str, Callable[[AccuracyRow], float | None]], ...] = (
        ("Max relative error", lambda r: r.max_rel_error),
        ("RMS relative error", lambda r: r.rms_rel_error),
    )
    for label, column in columns:
        out += [f"{label}:", ""]
        out += _table(
            ["kernel", *map(str, ks)],
            [
                [n, *[("" if (v := {r.k: column(r) for r in rs}.get(k)) is None else f"{v:.1e}") for k in ks]]
                for n, rs in sweep.items()
            ],
        )
    body = []
    for name, rs in sweep.items():
        outside = [str(r.k) for r in rs if r.within_fp32_tolerance is False]
        body.append([name, f"outside at K = {', '.join(outside)}" if outside else "within at every K"])
    out += ["Within fp32's tolerance:", ""]
    out += _table(["kernel", "fp32's tolerance"], body)
    others = [r for r in rows if r.status != "ok"]
    if others:
        out += _table(
            ["kernel", "K", "status", "reason"], [[r.kernel, str(r.k), r.status, r.reason or ""] for r in others]
        )
    return out


def _other_shapes(results: Results) -> list[str]:
    others = [r for r in ok_rows(results.rows) if r.size is None]
    if not others:
        return []
    # The graphs and the tables above hold N×N×N cases only: the other shapes' times are here.
    out = ["## Other shapes", "", "Cases that are not N×N×N (not graphed), median [min–max] in ms:", ""]
    calls = "jobs" if results.kind == "sidecars" else "repeats"
    body = [
        [r.kernel or "", _tile(r), _shape(r), str(r.repeats or 1), _cell(r, "overall"), _cell(r, "kernel")]
        for r in others
    ]
    return out + _table(["kernel", "tile", "shape", calls, "overall", "kernel"], body)


def _refused_and_skipped(rows: list[BenchRow]) -> list[str]:
    refused = [r for r in rows if r.status == "refused"]
    out = ["## Refused cases", ""]
    if refused:
        body = [[r.kernel or "", _tile(r), _shape(r), str(r.repeats or 1), r.reason or ""] for r in refused]
        out += _table(["kernel", "tile", "shape", "times", "reason"], body)
    else:
        out += ["None.", ""]
    skipped = [r for r in rows if r.status == "skipped"]
    if skipped:
        out += ["## Skipped cases", ""]
        body = [[r.kernel or "", _tile(r), _shape(r), r.reason or ""] for r in skipped]
        out += _table(["kernel", "tile", "shape", "reason"], body)
    return out


def summary_markdown(sections: Sections, accuracy: str | None = None) -> str:
    """summary.md; ``accuracy``: graph 4's file name, when the results have an accuracy sweep."""
    results = sections.results
    out = _head(results) + _failed(results.rows) + _environment_and_kernels(results)
    out += _graphs(sections) + _kernel_table(sections) + _speedups(sections) + _efficiency(sections)
    if accuracy:
        out += _accuracy(results.accuracy, accuracy)
    out += _other_shapes(results) + _refused_and_skipped(results.rows)
    return "\n".join(out).rstrip() + "\n"
