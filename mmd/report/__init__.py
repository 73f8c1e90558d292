"""The benchmark report: the course's graphs and the tables behind them, from results or sidecars.

Input is one of

* a ``results.csv`` or ``results.yaml`` written by :mod:`mmd.bench` (or the
  folder holding them), or
* a folder of job sidecars (``*.timing.yaml`` and ``*.error.yaml``, an outbox):
  runs of the same kernel, tile, shape and memory mode are pooled into one row
  (median, min and max per phase), and each kind of refusal (tile 64) becomes
  a ``refused`` row with its reason.

Output, in PNG and SVG (matplotlib, Agg):

1. ``graph1_overall``: overall time at the largest size (the course: 4096) —
   tiles on the x axis, one bar per kernel in each group, the interquartile
   range as error bars (min–max for results that have no quartiles);
   kernels without a tile (cublas, cpu) in their own group and as a dotted
   line across.
2. ``graph2_cuda``: the same for CUDA time (malloc + h2d + kernel + d2h +
   free); a kernel without CUDA phases (the cpu backend) shows its kernel
   time, and its label says so.
3. ``graph3_sizes``: kernel time and GFLOP/s against size at tile 32, with
   cuBLAS and the GPU's fp32 peak as references.
4. ``graph4_accuracy`` (where the run has an accuracy sweep, ``mmd bench
   --accuracy``): each kernel's max (dashed) and RMS (solid) relative error
   against float64 over K, log-log.

``summary.md``: the tables behind the graphs, every kernel by size (time
and its noise, TFLOP/s, ratio to cuBLAS SGEMM, error, SM clock), speed-up
over the cpu backend and over naive, efficiency against cuBLAS and the fp32
peak, and every refused, wrong or skipped case with its reason; and ``report.html``
(:mod:`.page`): the graphs and the speed-up tables as one self-contained, sortable web page.

The package, by concept: :mod:`.load` (reading results and sidecars),
:mod:`.sweeps` (what the graphs read out of the rows), :mod:`.figures` (the
graphs), :mod:`.summary` (summary.md) and :mod:`.compare` (two runs side by
side, for ``mmd bench --compare``), :mod:`.page` (the web pages: this report's, and a class's graded
kernels); :func:`render` puts them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..atomic import write_atomic
from ..errors import OutputError
from . import figures, page
from .compare import CaseComparison, Comparison, Ratio, compare, row_noise
from .load import ReportError, Results, load
from .summary import ACCURACY_GRAPH, GRAPH_FILES, Sections, summary_markdown
from .sweeps import (
    PEAK_FP32_TFLOPS,
    accuracy_sweep,
    cuda_or_kernel,
    graph_size,
    peak_for,
    size_sweep,
    sweep_tile,
    tile_sweep,
)

__all__ = [
    "PEAK_FP32_TFLOPS",
    "CaseComparison",
    "Comparison",
    "Ratio",
    "Rendered",
    "ReportError",
    "Results",
    "compare",
    "default_folder",
    "load",
    "peak_for",
    "render",
    "figures",
    "page",
    "row_noise",
]


#: The report's web page, beside summary.md.
PAGE_FILE = "report.html"


@dataclass
class Rendered:
    """What :func:`render` wrote."""

    folder: Path
    files: list[Path]
    summary: Path
    size: int | None
    tile: int | None


def sections(results: Results, size: int | None = None, peak_tflops: float | None = None) -> Sections:
    """What the graphs and summary.md show of ``results``: graphs 1-2 at ``size`` (default: the largest),
    the fp32 peak ``peak_tflops`` (default: looked up by the device's name)."""
    rows = results.rows
    tile = sweep_tile(rows)
    if peak_tflops is not None:
        peak: tuple[float, str] | None = (peak_tflops, "GPU (given)")
    else:
        devices = [results.environment.get("device")] + [r.device for r in rows if r.backend != "cpu"]
        peak = next((p for p in map(peak_for, devices) if p is not None), None)
    return Sections(results, tile_sweep(rows, graph_size(rows, size)), tile, size_sweep(rows, tile), peak)


def default_folder(results: Results) -> Path:
    """Where a report goes unless told: ``report/`` in a bench run's folder; for a folder of sidecars (an
    outbox, maybe a daemon's, which its readers expect to hold results only) ``<folder>.report`` beside it."""
    if results.kind == "sidecars":
        folder = results.source.resolve()
        return folder.with_name(folder.name + ".report")
    base = results.source if results.source.is_dir() else results.source.parent
    return base / "report"


def render(
    source: Path | Results,
    out: Path | None = None,
    *,
    log: bool = False,
    size: int | None = None,
    peak_tflops: float | None = None,
) -> Rendered:
    """Render graphs 1-3 (and 4 where there is an accuracy sweep; PNG and SVG), summary.md and report.html
    from ``source``.

    ``out`` defaults to :func:`default_folder`. Raises MissingExtra, before any work, where matplotlib (the
    ``report`` extra) is not installed.
    """
    figures.require_matplotlib()
    results = source if isinstance(source, Results) else load(Path(source))
    if out is None:
        out = default_folder(results)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot make the folder {out}: {exc.strerror} (give another with -o)") from None
    shown = sections(results, size, peak_tflops)
    sweep = shown.sweep
    where = f"{sweep.size}×{sweep.size}" if sweep.size is not None else "no size"
    files: list[Path] = []
    fig = figures.bars_figure(
        sweep, lambda r: ("overall", False), f"Graph 1: overall time at {where}", "overall time (ms, median", log
    )
    files += figures.save(fig, out, GRAPH_FILES[0].removesuffix(".png"))
    fig = figures.bars_figure(
        sweep,
        cuda_or_kernel,
        f"Graph 2: CUDA time (malloc + h2d + kernel + d2h + free) at {where}",
        "CUDA time (ms, median",
        log,
    )
    files += figures.save(fig, out, GRAPH_FILES[1].removesuffix(".png"))
    files += figures.save(
        figures.size_figure(shown.sweeps, shown.tile, shown.peak), out, GRAPH_FILES[2].removesuffix(".png")
    )
    accuracy = None
    if results.accuracy:
        mn = "; ".join(sorted({f"M = {r.m}, N = {r.n}" for r in results.accuracy}))
        fig = figures.accuracy_figure(accuracy_sweep(results.accuracy), mn)
        files += figures.save(fig, out, ACCURACY_GRAPH.removesuffix(".png"))
        accuracy = ACCURACY_GRAPH
    summary = out / "summary.md"
    write_atomic(summary, [summary_markdown(shown, accuracy).encode()], durable=False)
    files.append(summary)
    pngs = {p.name: p.read_bytes() for p in files if p.suffix == ".png"}
    html_page = out / PAGE_FILE
    write_atomic(html_page, [page.bench_page(shown, pngs).encode()], durable=False)
    files.append(html_page)
    return Rendered(out, files, summary, sweep.size, shown.tile)
