"""The report's graphs, drawn with matplotlib (the ``report`` extra, imported only here and only to draw).

Each figure function returns a matplotlib ``Figure`` (Agg), so that a test
can read back what it shows; :func:`save` writes it as PNG and SVG. Every
log axis gets its ticks from :func:`log_ticks`: enough labelled ticks for
the span of its data, however narrow (a default log axis labels only the
powers of ten, which left one label on an axis of data within one decade).
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import kernels as registry
from ..atomic import write_atomic
from ..bench.rows import AccuracyRow, BenchRow
from ..errors import MissingExtra
from ..resources import install_hint
from .sweeps import TileSweep, sized

#: The fewest labelled ticks a log axis shows over its data.
MIN_LABELS = 3


def require_matplotlib() -> None:
    """The graphs are matplotlib's, an optional extra: the daemon and the one-shot commands never draw, so a
    service's install leaves it out; a command that draws says how to add it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtra(
            f"the graphs need matplotlib, which this install of mmd lacks: {install_hint('report')}"
        ) from None


def _figure(width: float = 9.0, height: float = 5.0) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colors(names: Iterable[str]) -> dict[str, Any]:
    """A color for each series of one graph, all different: in registry order (so a report's graphs agree
    where they show the same kernels), from tab10, or tab20 past ten series. cuBLAS SGEMM, the reference,
    is drawn black by the graphs and takes none."""
    from matplotlib import colormaps

    order = {name: i for i, name in enumerate(registry.NAMES)}
    shown = sorted(set(names), key=lambda n: (order.get(n, len(order)), n))
    colored = [n for n in shown if n != "cublas"]
    cmap = colormaps["tab10" if len(colored) <= 10 else "tab20"]
    colors = {n: cmap(i % cmap.N) for i, n in enumerate(colored)}
    return {n: colors.get(n, "black") for n in shown}


#: Fonts of placeholder boxes (matplotlib's own last resort): they hold every character and draw none of them.
_PLACEHOLDER_FONTS = frozenset({"Last Resort High-Efficiency"})


def _chars(path: str) -> frozenset[int]:
    from matplotlib import ft2font

    return frozenset(ft2font.FT2Font(path).get_charmap())


@functools.cache
def _own_font() -> tuple[str, frozenset[int]]:
    """The graphs' font (matplotlib's default, DejaVu Sans) and the characters it draws."""
    from matplotlib import font_manager

    path = font_manager.findfont(font_manager.FontProperties())
    return path, _chars(path)


@functools.cache
def _other_fonts() -> tuple[tuple[str, frozenset[int]], ...]:
    """Every other installed font's family and the characters it draws, by family name (the same choice on every
    run); read only once a name holds a character the graphs' font lacks."""
    from matplotlib import font_manager

    own, _ = _own_font()
    fonts = []
    for entry in sorted(font_manager.fontManager.ttflist, key=lambda e: (e.name, e.fname)):
        if entry.fname == own or entry.name in _PLACEHOLDER_FONTS:
            continue
        try:
            fonts.append((entry.name, _chars(entry.fname)))
        except (OSError, RuntimeError):  # a font file FreeType cannot read: not one to draw with
            continue
    return tuple(fonts)


@dataclass(frozen=True)
class Labels:
    """Names (kernels', students': anyone's) as a graph draws them, and the fonts to draw them in."""

    text: dict[str, str]
    #: The graphs' own font first, then a font for each character it lacks, where one is installed.
    families: tuple[str, ...]


def labels(names: Iterable[str]) -> Labels:
    """``names`` as drawn: a ``$`` escaped (it would start matplotlib's mathtext), and each character that no
    installed font draws written as its escape (``\\u884c``): matplotlib would warn and draw a box for it."""
    from matplotlib import rcParams

    _, own = _own_font()
    families: list[str] = list(rcParams["font.family"])
    text = {}
    for name in names:
        drawn = []
        for c in name.replace("$", r"\$"):
            if ord(c) not in own:
                family = next((f for f, chars in _other_fonts() if ord(c) in chars), None)
                if family is None:
                    c = f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
                elif family not in families:
                    families.append(family)
            drawn.append(c)
        text[name] = "".join(drawn)
    return Labels(text, tuple(families))


def _legend(ax: Any, shown: Labels, fontsize: float, handles: list[Any] | None = None) -> None:
    """``ax``'s legend, its texts in ``shown``'s fonts (matplotlib falls back along the list character by
    character)."""
    from matplotlib.font_manager import FontProperties

    prop = FontProperties(family=list(shown.families), size=fontsize)
    if handles is None:
        ax.legend(prop=prop)
    else:
        ax.legend(handles=handles, prop=prop)


def save(fig: Any, out: Path, stem: str) -> list[Path]:
    """``out/<stem>.png`` and ``.svg`` (the SVG without a date, so that the same data gives the same bytes)."""
    png, svg = out / f"{stem}.png", out / f"{stem}.svg"
    for path, options in ((png, {"format": "png"}), (svg, {"format": "svg", "metadata": {"Date": None}})):
        buf = io.BytesIO()
        fig.savefig(buf, **options)
        write_atomic(path, [buf.getvalue()], durable=False)
    return [png, svg]


def png_bytes(fig: Any, dpi: float | None = None) -> bytes:
    """``fig`` as PNG, for a page that carries its graphs inline."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi or fig.dpi)
    return buf.getvalue()


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center")
    ax.set_xticks([])
    ax.set_yticks([])


def tick_label(value: float) -> str:
    """A tick's label: plain where it reads as a number (0.05, 250, 50,000), else ``2×10⁻⁷`` in mathtext."""
    if value == 0:
        return "0"
    if 1e4 <= abs(value) < 1e7 and value == round(value):
        return f"{value:,.0f}"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:g}"
    exponent = math.floor(math.log10(abs(value)))
    mantissa = round(value / 10**exponent, 6)
    power = f"10^{{{exponent}}}"
    return f"${power}$" if mantissa == 1 else f"${mantissa:g}\\times{power}$"


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks for a log axis over data from ``lo`` to ``hi`` (both > 0): the coarsest of the powers of ten,
    1-2-5 in each decade, every digit in each decade, and then evenly spaced round numbers, that puts
    :data:`MIN_LABELS` ticks within the data's range (the last one in any case)."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = min(lo, hi), max(lo, hi)
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    eps = 1e-9 * hi
    for subs in ((1,), (1, 2, 5), tuple(range(1, 10))):
        ticks = [d * 10.0**e for e in range(first, last + 1) for d in subs]
        if sum(lo - eps <= t <= hi + eps for t in ticks) >= MIN_LABELS:
            return ticks
    # Within a factor of a few (GFLOP/s from 130 to 190): round numbers, evenly spaced.
    linear = MaxNLocator(nbins=MIN_LABELS + 2, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
    return [float(t) for t in linear if t > 0]


def set_log_axis(axis: Any, values: Iterable[float | None]) -> None:
    """Make ``axis`` (``ax.xaxis`` or ``ax.yaxis``) logarithmic with :func:`log_ticks` over ``values``,
    every major tick labelled by :func:`tick_label`, minor ticks unlabelled; limits from the data."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    data = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    x = axis is axis.axes.xaxis
    if x:
        axis.axes.set_xscale("log")
    else:
        axis.axes.set_yscale("log")
    if not data:
        return
    lo, hi = min(data), max(data)
    axis.set_major_locator(FixedLocator(log_ticks(lo, hi)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: tick_label(v)))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())
    # A margin of a twentieth of the data's span on each side (a factor of 1.1 at the least), as the
    # default autoscale would: the fixed ticks outside it are not drawn.
    pad = max((hi / lo) ** 0.05, 1.1)
    if x:
        axis.axes.set_xlim(lo / pad, hi * pad)
    else:
        axis.axes.set_ylim(lo / pad, hi * pad)


def _categories(axis: Any, values: Sequence[int]) -> None:
    """A log axis of powers of two (sizes, K): a tick and its label at every value, nothing between (until
    :func:`_readable_categories` leaves out the labels that crowd)."""
    axis.axes.set_xscale("log", base=2)
    axis.axes.set_xticks(list(values), [str(v) for v in values])
    axis.axes.minorticks_off()


#: The least room (points) between two x labels of a :func:`_categories` axis.
LABEL_GAP_PT = 4.0


def _readable_categories(fig: Any) -> None:
    """Leave out each x label of ``fig``'s :func:`_categories` axes that would touch the next one kept, from
    the right (the largest value is always labelled): an outbox's sizes crowd (1000 beside 1024, 2000 beside
    2048) and their labels overlapped. Every tick stays. Called once the figure is complete: the labels'
    places come from its layout."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    gap = renderer.points_to_pixels(LABEL_GAP_PT)
    for ax in fig.axes:
        labels = ax.get_xticklabels()
        keep: list[str] = []
        left = math.inf
        for label in reversed(labels):
            box = label.get_window_extent(renderer)
            fits = box.x1 + gap <= left
            keep.append(label.get_text() if fits else "")
            left = box.x0 if fits else left
        ax.set_xticks(ax.get_xticks(), keep[::-1])


#: A bar's phase: (the phase, whether it is the kernel's time standing in for the one asked).
BarPhase = Callable[[BenchRow], tuple[str, bool]]


def whisker(row: BenchRow, phase: str, quartiles: bool) -> tuple[float, float] | None:
    """The error bar of ``row``'s ``phase``: its interquartile range (``quartiles``), else its min–max."""
    spread = row.spread(phase)
    if spread is None:
        return None
    q = row.quartiles.get(phase)
    return (q.q1, q.q3) if quartiles and q is not None else (spread.min, spread.max)


def bars_figure(sweep: TileSweep, value: BarPhase, title: str, ylabel: str, log: bool) -> Any:
    """Graphs 1 and 2: one group of bars per tile (and one for kernels without a tile), a bar per kernel
    at its median, its interquartile range as error bars (one slow call stretches the min–max to the top of
    the graph and flattens every other bar); results from before the quartiles were recorded show their
    min–max, and ``ylabel`` is completed with which."""
    fig = _figure()
    ax = fig.subplots()
    ax.set_title(title)
    kernels = sweep.tiled_kernels + sweep.untiled_kernels
    if not kernels:
        _no_data(ax, f"no results at size {sweep.size}")
        return fig
    colors = _colors(kernels)
    shown_as = labels(kernels)
    groups: list[tuple[str, int | None, list[str]]] = [(f"{t}×{t}", t, sweep.tiled_kernels) for t in sweep.tiles]
    if sweep.untiled_kernels:
        groups.append(("no tile", None, sweep.untiled_kernels))
    per_group = max(len(g[2]) for g in groups)
    width = 0.8 / per_group
    labelled: set[str] = set()
    kernel_time: set[str] = set()
    shown: list[float] = []
    ran = [r for r in sweep.cells.values() if r.status == "ok" and r.spread(value(r)[0]) is not None]
    quartiles = all(value(r)[0] in r.quartiles for r in ran)
    ylabel += "; bars: interquartile range)" if quartiles else "; bars: min–max, these results have no quartiles)"
    for gi, (_, tile, names) in enumerate(groups):
        for bi, name in enumerate(names):
            x = gi - 0.4 + width * (bi + 0.5)
            row = sweep.cells.get((name, tile))
            if row is None:
                continue
            if row.status != "ok":
                ax.text(
                    x, 0.02, "refused", transform=ax.get_xaxis_transform(), rotation=90, ha="center",
                    va="bottom", fontsize=8, color=colors[name],
                )  # fmt: skip
                continue
            phase, is_kernel = value(row)
            spread, bar = row.spread(phase), whisker(row, phase, quartiles)
            if spread is None or bar is None:
                continue
            if is_kernel:
                kernel_time.add(name)
            yerr = [[spread.median - bar[0]], [bar[1] - spread.median]]
            label = None if name in labelled else shown_as.text[name]
            ax.bar(x, spread.median, width, color=colors[name], yerr=yerr, capsize=2, label=label)
            labelled.add(name)
            shown += list(bar)
            if tile is None and sweep.tiles:  # the same value as a line across the tile groups
                ax.axhline(spread.median, color=colors[name], linestyle=":", linewidth=1)
    kernel_time = {shown_as.text[name] for name in kernel_time}
    for handle in ax.get_legend_handles_labels()[0]:
        if handle.get_label() in kernel_time:
            handle.set_label(f"{handle.get_label()} (kernel time)")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_xlabel("tile (T×T threads per block)")
    ax.set_ylabel(ylabel)
    if log:
        set_log_axis(ax.yaxis, shown)
    if labelled:
        _legend(ax, shown_as, 8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def size_figure(sweeps: dict[str, list[BenchRow]], tile: int | None, peak: tuple[float, str] | None) -> Any:
    """Graph 3: kernel time and GFLOP/s against N, log-log, cuBLAS dashed black, the fp32 peak dotted red."""
    fig = _figure(12.0, 5.0)
    ax_t, ax_g = fig.subplots(1, 2)
    where = f"tile {tile}" if tile is not None else "no tiled kernel"
    fig.suptitle(f"Graph 3: kernel time and GFLOP/s against size ({where})")
    if not sweeps:
        _no_data(ax_t, "no results")
        _no_data(ax_g, "no results")
        return fig
    colors = _colors(sweeps)
    shown_as = labels(sweeps)
    times: list[float | None] = []
    rates: list[float | None] = []
    for name, rows in sweeps.items():
        sizes = [sized(r) for r in rows]
        ref = name == "cublas"
        style = dict(
            color="black" if ref else colors[name],
            linestyle="--" if ref else "-",
            marker="o",
            linewidth=2 if ref else 1.5,
            label=shown_as.text[name],
        )
        kernel_ms = [r.median("kernel") for r in rows]
        rate = [r.gflops for r in rows]
        ax_t.plot(sizes, _gaps(kernel_ms), **style)
        ax_g.plot(sizes, _gaps(rate), **style)
        times += kernel_ms
        rates += rate
    if peak is not None:
        tflops, label = peak
        ax_g.axhline(tflops * 1000, color="red", linestyle=":", label=f"fp32 peak ({label}, {tflops:g} TFLOP/s)")
        rates.append(tflops * 1000)
    ax_t.set_title("kernel time")
    ax_t.set_ylabel("kernel time (ms, median of the timed calls)")
    ax_g.set_title("GFLOP/s")
    ax_g.set_ylabel("GFLOP/s (2·N³ / kernel time)")
    sizes = sorted({sized(r) for rows in sweeps.values() for r in rows})
    for ax, values in ((ax_t, times), (ax_g, rates)):
        _categories(ax.xaxis, sizes)
        set_log_axis(ax.yaxis, values)
        ax.set_xlabel("N (N×N times N×N)")
        ax.grid(alpha=0.3, which="both")
        _legend(ax, shown_as, 8)
    _readable_categories(fig)
    return fig


def _gaps(values: Iterable[float | None]) -> list[float]:
    """NaN for what a log axis cannot show (a missing value, an exact product's 0): a gap, not a warning."""
    return [v if v is not None and v > 0 else math.nan for v in values]


def accuracy_figure(sweep: dict[str, list[AccuracyRow]], where: str) -> Any:
    """Graph 4: each kernel's RMS (solid) and max (dashed) relative error against float64 over K, log-log."""
    from matplotlib.lines import Line2D

    fig = _figure()
    ax = fig.subplots()
    ax.set_title(f"Graph 4: error against float64 vs K ({where})")
    if not sweep:
        _no_data(ax, "no accuracy results")
        return fig
    colors = _colors(sweep)
    shown_as = labels(sweep)
    errors: list[float | None] = []
    for name, rows in sweep.items():
        ks = [r.k for r in rows]
        color = "black" if name == "cublas" else colors[name]  # cuBLAS SGEMM: the reference, as in graph 3
        rms, top = [r.rms_rel_error for r in rows], [r.max_rel_error for r in rows]
        ax.plot(ks, _gaps(rms), color=color, linestyle="-", marker="o", label=shown_as.text[name])
        ax.plot(ks, _gaps(top), color=color, linestyle="--", marker=".")
        errors += rms + top
    _categories(ax.xaxis, sorted({r.k for rows in sweep.values() for r in rows}))
    set_log_axis(ax.yaxis, errors)
    ax.set_xlabel("K (inner dimension: A is M×K, B is K×N)")
    ax.set_ylabel("relative error against float64")
    handles, _ = ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], color="gray", linestyle="-", label="RMS: ‖C − ref‖ / ‖ref‖"),
        Line2D([], [], color="gray", linestyle="--", label="max: max|C − ref| / max|ref|"),
    ]
    _legend(ax, shown_as, 8, handles)
    ax.grid(alpha=0.3, which="both")
    _readable_categories(fig)
    return fig


def student_figures(
    kernels: dict[str, tuple[dict[int, float], dict[int, float]]], size: int, tile: int
) -> tuple[Any, Any]:
    """A student's two course graphs from ``kernels``: name -> (kernel ms by tile at ``size``, kernel ms by size
    at ``tile``). Graph 1: a group of bars per tile, a bar per kernel; graph 2: time against size, log-log."""
    colors = _colors(kernels)
    shown_as = labels(kernels)
    label = shown_as.text
    by_tile = _figure(5.0, 3.0)
    ax = by_tile.subplots()
    ax.set_title(f"Graph 1: kernel time at {size}×{size}", fontsize=10)
    tiles = sorted({t for times, _ in kernels.values() for t in times})
    if not tiles:
        _no_data(ax, "no timed results")
    width = 0.8 / max(len(kernels), 1)
    for bi, (name, (times, _)) in enumerate(kernels.items()):
        xs = [ti - 0.4 + width * (bi + 0.5) for ti, t in enumerate(tiles) if t in times]
        ax.bar(xs, [times[t] for t in tiles if t in times], width, color=colors[name], label=label[name])
    ax.set_xticks(range(len(tiles)), [f"{t}×{t}" for t in tiles])
    ax.set_xlabel("tile", fontsize=8)
    ax.set_ylabel("kernel time (ms)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(axis="y", alpha=0.3)
    by_size = _figure(5.0, 3.0)
    ax = by_size.subplots()
    ax.set_title(f"Graph 2: kernel time against size (tile {tile})", fontsize=10)
    sizes = sorted({z for _, times in kernels.values() for z in times})
    shown: list[float | None] = []
    for name, (_, times) in kernels.items():
        zs = sorted(times)
        ax.plot(zs, [times[z] for z in zs], marker="o", color=colors[name], label=label[name])
        shown += [times[z] for z in zs]
    if sizes:
        _categories(ax.xaxis, sizes)
        set_log_axis(ax.yaxis, shown)
    else:
        _no_data(ax, "no timed results")
    ax.set_xlabel("N", fontsize=8)
    ax.set_ylabel("kernel time (ms)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, which="both")
    for fig in (by_tile, by_size):
        for a in fig.axes:
            if a.get_legend_handles_labels()[0]:
                _legend(a, shown_as, 7)
    return by_tile, by_size
