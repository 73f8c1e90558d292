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
   tiles on the x axis, one bar per kernel in each group, min–max as error
   bars; kernels without a tile (cublas, cpu) in their own group and as a
   dotted line across.
2. ``graph2_cuda``: the same for CUDA time (malloc + h2d + kernel + d2h +
   free); a kernel without CUDA phases (the cpu backend) shows its kernel
   time, and its label says so.
3. ``graph3_sizes``: kernel time and GFLOP/s against size at tile 32, with
   cuBLAS and the GPU's fp32 peak as references.
4. ``graph4_accuracy`` (where the run has an accuracy sweep, ``mmd bench
   --accuracy``): each kernel's max (dashed) and RMS (solid) relative error
   against float64 over K, log-log.

and ``summary.md``: the tables behind the graphs, every kernel by size (time
and its noise, TFLOP/s, ratio to cuBLAS SGEMM, error, SM clock), speed-up
over the cpu backend and over naive, efficiency against cuBLAS and the fp32
peak, and every refused, wrong or skipped case with its reason.

:func:`compare` sets two runs side by side for ``mmd bench --compare``.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import kernels as registry
from ..bench import ACCURACY_COLUMNS, COLUMNS, phase_stats
from ..errors import MissingExtra, OutputError, UnreadableError
from ..record import ERROR_SUFFIX, TIMING_SUFFIX, ErrorRecord, Shape, TimingRecord, read

#: Known GPUs' fp32 peak (TFLOP/s, boost clock, no tensor cores), most specific pattern first.
PEAK_FP32_TFLOPS: tuple[tuple[str, float, str], ...] = (
    (r"H100.*PCIe", 51.2, "H100 PCIe"),
    (r"H100.*NVL", 60.0, "H100 NVL"),
    (r"H100", 67.0, "H100 SXM"),
    (r"H200", 67.0, "H200"),
    (r"A100", 19.5, "A100"),
    (r"\bT400\b", 1.09, "T400"),
)

#: The tile the size sweep is read at when present.
SWEEP_TILE = 32

_INT_COLUMNS = {"tile", "m", "k", "n", "repeats", "warmup"}
_FLOAT_COLUMNS = {c for c in COLUMNS if c.endswith(("_ms", "_noise"))} | {
    "gflops",
    "max_abs_error",
    "rel_error",
    "sm_clock_mhz",
    "max_rel_error",
    "rms_rel_error",
}
_BOOL_COLUMNS = {"converged", "throttled", "within_fp32_tolerance"}


class ReportError(UnreadableError):
    """The report's input cannot be read (no results, no sidecars, a malformed file): the command line names
    the wrong thing (exit status 2)."""

    kind = "report"


# -- reading -----------------------------------------------------------------


@dataclass
class Results:
    """Rows in :data:`mmd.bench.COLUMNS` form, where they came from, and the environment when known."""

    rows: list[dict[str, Any]]
    source: Path
    environment: dict[str, Any] = field(default_factory=dict)
    kind: str = "bench"  # bench | sidecars
    #: The accuracy sweep's rows (accuracy.yaml or accuracy.csv beside the results), in ACCURACY_COLUMNS form.
    accuracy: list[dict[str, Any]] = field(default_factory=list)


def _typed(row: dict[str, Any], columns: tuple[str, ...] = COLUMNS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col in columns:
        value = row.get(col)
        if value == "" or value is None:
            out[col] = None
        elif col in _INT_COLUMNS:
            out[col] = int(value)
        elif col in _FLOAT_COLUMNS:
            out[col] = float(value)
        elif col in _BOOL_COLUMNS:
            out[col] = value if isinstance(value, bool) else str(value).lower() == "true"
        else:
            out[col] = str(value)
    return out


def read_csv(path: Path) -> Results:
    """Rows of a results.csv (and the environment of its results.yaml, if beside it)."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in ("kernel", "m", "k", "n") if c not in (reader.fieldnames or ())]
            if missing:
                raise ReportError(f"{path} has no {', '.join(missing)} columns: not a results.csv from mmd bench")
            rows = [_typed(r) for r in reader]
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None
    env: dict[str, Any] = {}
    beside = path.with_name("results.yaml")
    if beside.is_file():
        env = _load_yaml(beside).get("environment") or {}
    return Results(rows, path, env)


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path} is not a mapping")
    return data


def read_yaml(path: Path) -> Results:
    """Rows and environment of a results.yaml."""
    data = _load_yaml(path)
    if not isinstance(data.get("rows"), list):
        raise ReportError(f"{path} has no rows: not a results.yaml from mmd bench")
    try:
        rows = [_typed(r) for r in data["rows"]]
    except (TypeError, ValueError, AttributeError) as exc:
        raise ReportError(f"{path}: malformed row: {exc}") from None
    return Results(rows, path, data.get("environment") or {})


def _sidecar_row(
    kernel: Any, backend: Any, tile: Any, shape: Shape | None, memory: Any, status: str, count: int, **more: Any
) -> dict[str, Any]:
    """A results row for ``count`` pooled job sidecars of one case (jobs run through files, no warm-up)."""
    row: dict[str, Any] = {c: None for c in COLUMNS}
    if shape is not None:
        row.update(m=shape.m, k=shape.k, n=shape.n)
    row.update(kernel=kernel, backend=backend, tile=tile, memory=memory, mode="files")
    row.update(status=status, repeats=count, warmup=0, **more)
    return row


def _read_record(path: Path) -> TimingRecord | ErrorRecord:
    try:
        return read(path)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None


def read_sidecars(folder: Path) -> Results:
    """Pool a folder's timing sidecars by case; one ``refused`` row per kind of refusal."""
    timing = sorted(folder.glob("*" + TIMING_SUFFIX))
    errors = sorted(folder.glob("*" + ERROR_SUFFIX))
    if not timing and not errors:
        raise ReportError(f"{folder} holds no results.csv, results.yaml or job sidecars (*{TIMING_SUFFIX})")
    groups: dict[tuple[Any, ...], list[TimingRecord]] = {}
    for path in timing:
        rec = _read_record(path)
        if isinstance(rec, TimingRecord):
            groups.setdefault((rec.kernel, rec.tile, rec.shape, rec.memory, rec.backend, rec.device), []).append(rec)
    rows: list[dict[str, Any]] = []
    devices: list[str] = []
    for (kernel, tile, shape, memory, backend, device), recs in groups.items():
        samples = [{p: v for p, v in dataclasses.asdict(r.timings_ms).items() if v is not None} for r in recs]
        row = _sidecar_row(kernel, backend, tile, shape, memory, "ok", len(recs), device=device)
        row.update(phase_stats(samples))
        if row["kernel_median_ms"]:
            row["gflops"] = round(2.0 * shape.m * shape.k * shape.n / (row["kernel_median_ms"] * 1e6), 3)
        rows.append(row)
        if device:
            devices.append(device)
    refusals: dict[tuple[Any, ...], list[ErrorRecord]] = {}
    for path in errors:
        err = _read_record(path)
        if not isinstance(err, ErrorRecord):
            continue
        req = err.requested
        key = (
            req.kernel if req else None,
            req.tile if req else None,
            err.shape,
            req.memory if req else None,
            err.backend,
            err.error.reason,
        )
        refusals.setdefault(key, []).append(err)
    for (kernel, tile, shape, memory, backend, reason), errs in refusals.items():
        rows.append(_sidecar_row(kernel, backend, tile, shape, memory, "refused", len(errs), reason=reason))
    env = {"device": max(set(devices), key=devices.count)} if devices else {}
    return Results([_typed(r) for r in rows], folder, env, kind="sidecars")


def load(source: Path) -> Results:
    """Results from a results.csv/yaml, the folder holding one, or a folder of sidecars (with the accuracy
    sweep's rows where an accuracy.yaml or accuracy.csv lies beside the results)."""
    source = Path(source)
    if source.is_dir():
        for name, reader in (("results.yaml", read_yaml), ("results.csv", read_csv)):
            if (source / name).is_file():
                return _with_accuracy(reader(source / name))
        return read_sidecars(source)
    if not source.exists():
        raise ReportError(f"{source}: no such file or folder")
    if source.suffix == ".csv":
        return _with_accuracy(read_csv(source))
    if source.suffix in (".yaml", ".yml"):
        return _with_accuracy(read_yaml(source))
    raise ReportError(f"{source}: give a results.csv, a results.yaml or a folder")


def read_accuracy(folder: Path) -> list[dict[str, Any]]:
    """The rows of the accuracy.yaml (else accuracy.csv) in ``folder``; none without either."""
    try:
        if (folder / "accuracy.yaml").is_file():
            rows = _load_yaml(folder / "accuracy.yaml").get("rows")
            if not isinstance(rows, list):
                raise ReportError(f"{folder / 'accuracy.yaml'} has no rows: not an accuracy.yaml from mmd bench")
            return [_typed(r, ACCURACY_COLUMNS) for r in rows]
        if (folder / "accuracy.csv").is_file():
            with open(folder / "accuracy.csv", newline="", encoding="utf-8") as fh:
                return [_typed(r, ACCURACY_COLUMNS) for r in csv.DictReader(fh)]
    except (OSError, TypeError, ValueError, AttributeError) as exc:
        raise ReportError(f"cannot read the accuracy sweep in {folder}: {exc}") from None
    return []


def _with_accuracy(results: Results) -> Results:
    results.accuracy = read_accuracy(results.source.parent)
    return results


# -- reading the rows ----------------------------------------------------------


def size_of(row: dict[str, Any]) -> int | None:
    """N for an N×N×N case; None for other shapes (not graphed)."""
    m, k, n = row.get("m"), row.get("k"), row.get("n")
    return m if m is not None and m == k == n else None


def sized(row: dict[str, Any]) -> int:
    """N of a row already known to be an N×N×N case (the sweeps hold only those)."""
    size = size_of(row)
    if size is None:
        raise ValueError(f"not a square case: {row.get('m')}x{row.get('k')}x{row.get('n')}")
    return size


def uses_tile(kernel: str) -> bool:
    """Whether the tile matters for ``kernel`` (unknown names are taken to use one)."""
    spec = registry.REGISTRY.get(kernel)
    return spec.uses_tile if spec is not None else True


def kernel_order(names: Iterable[str]) -> list[str]:
    """Registry order (naive ... cpu), unknown names after, alphabetically."""
    order = {name: i for i, name in enumerate(registry.NAMES)}
    return sorted(set(names), key=lambda n: (order.get(n, len(order)), n))


def peak_for(device: str | None) -> tuple[float, str] | None:
    """(fp32 peak in TFLOP/s, GPU label) for a known device name."""
    for pattern, tflops, label in PEAK_FP32_TFLOPS:
        if device and re.search(pattern, device):
            return tflops, label
    return None


def _ok(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] == "ok"]


def graph_size(rows: list[dict[str, Any]], size: int | None = None) -> int | None:
    """The size graphs 1-2 show: ``size``, else the largest square size with a result or a refusal."""
    if size is not None:
        return size
    sizes = [s for r in rows if r["status"] in ("ok", "refused") and (s := size_of(r)) is not None]
    return max(sizes) if sizes else None


def sweep_tile(rows: list[dict[str, Any]]) -> int | None:
    """The tile graph 3 reads: 32 when present, else the tile with the most sizes."""
    tiled = [r for r in _ok(rows) if r["tile"] is not None and uses_tile(r["kernel"]) and size_of(r)]
    if not tiled:
        return None
    tiles = [r["tile"] for r in tiled]
    if SWEEP_TILE in tiles:
        return SWEEP_TILE
    return max(sorted(set(tiles)), key=lambda t: len({sized(r) for r in tiled if r["tile"] == t}))


@dataclass
class TileSweep:
    """The rows behind graphs 1-2: one size, kernels by tile."""

    size: int | None
    tiles: list[int]
    tiled_kernels: list[str]
    untiled_kernels: list[str]
    cells: dict[tuple[str, int | None], dict[str, Any]]  # (kernel, tile) → row (ok or refused)


def tile_sweep(rows: list[dict[str, Any]], size: int | None) -> TileSweep:
    at = [r for r in rows if r["status"] in ("ok", "refused") and size is not None and size_of(r) == size]
    cells: dict[tuple[str, int | None], dict[str, Any]] = {}
    for r in at:
        tile = r["tile"] if uses_tile(r["kernel"]) else None
        key = (r["kernel"], tile)
        if key not in cells or (cells[key]["status"] != "ok" and r["status"] == "ok"):
            cells[key] = r
    tiled = kernel_order(k for k, t in cells if t is not None)
    untiled = kernel_order(k for k, t in cells if t is None)
    tiles = sorted({t for _, t in cells if t is not None})
    return TileSweep(size, tiles, tiled, untiled, cells)


def size_sweep(rows: list[dict[str, Any]], tile: int | None) -> dict[str, list[dict[str, Any]]]:
    """kernel → ok rows by ascending size: tiled kernels at ``tile``, untiled ones at any tile."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in _ok(rows):
        if size_of(r) is None or (uses_tile(r["kernel"]) and r["tile"] != tile):
            continue
        out.setdefault(r["kernel"], []).append(r)
    return {k: sorted(out[k], key=sized) for k in kernel_order(out)}


def cuda_or_kernel(row: dict[str, Any]) -> tuple[float | None, float | None, float | None, bool]:
    """(median, min, max, is_kernel_time): CUDA time, or kernel time where the row has no CUDA phases."""
    if row.get("cuda_median_ms") is not None:
        return row["cuda_median_ms"], row["cuda_min_ms"], row["cuda_max_ms"], False
    return row.get("kernel_median_ms"), row.get("kernel_min_ms"), row.get("kernel_max_ms"), True


# -- comparing two runs (mmd bench --compare) ------------------------------------

#: What makes two rows the same case.
CASE_KEY: tuple[str, ...] = ("kernel", "tile", "m", "k", "n", "memory", "mode")
VERDICTS: tuple[str, ...] = ("faster", "slower", "within noise")


def row_noise(row: dict[str, Any], phase: str) -> tuple[float | None, bool]:
    """(the noise of ``phase``'s median in ``row``, whether it is measured).

    Runs from before the noise columns have none: half their min–max range
    over the median stands in (what :func:`mmd.bench.median_noise` gives for
    five samples or fewer), marked as not measured.
    """
    noise = row.get(f"{phase}_noise")
    if noise is not None:
        return float(noise), True
    med, lo, hi = (row.get(f"{phase}_{s}_ms") for s in ("median", "min", "max"))
    if med and lo is not None and hi is not None:
        return (hi - lo) / (2.0 * med), False
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


def _ratio(a: dict[str, Any], b: dict[str, Any], phase: str) -> Ratio | None:
    a_ms, b_ms = a.get(f"{phase}_median_ms"), b.get(f"{phase}_median_ms")
    (na, ma), (nb, mb) = row_noise(a, phase), row_noise(b, phase)
    if not a_ms or not b_ms or na is None or nb is None:
        return None
    # Each noise is a relative half-width; for a ratio of independent medians they add in quadrature.
    return Ratio(a_ms, b_ms, math.hypot(na, nb), ma and mb)


@dataclass(frozen=True)
class CaseComparison:
    """One case in two runs: the kernel and overall ratios B/A, and the verdict on the kernel's."""

    key: tuple[Any, ...]
    a: dict[str, Any] | None
    b: dict[str, Any] | None
    kernel: Ratio | None
    overall: Ratio | None

    @property
    def verdict(self) -> str:
        """One of :data:`VERDICTS` (on kernel time), else why the case cannot be compared."""
        if self.a is None or self.b is None:
            return "only in A" if self.b is None else "only in B"
        if self.a["status"] != "ok" or self.b["status"] != "ok":
            return f"not compared (A {self.a['status']}, B {self.b['status']})"
        if self.kernel is None:
            return "not compared (no kernel time)"
        return self.kernel.verdict

    @property
    def throttled(self) -> str:
        """Which run was throttled during the case: ``""``, ``"A"``, ``"B"`` or ``"A and B"``."""
        runs = [name for name, row in (("A", self.a), ("B", self.b)) if row is not None and row.get("throttled")]
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

    def keyed(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
        return {tuple(r[c] for c in CASE_KEY): r for r in rows}

    in_a, in_b = keyed(ra.rows), keyed(rb.rows)
    cases = []
    for key in [*in_a, *(k for k in in_b if k not in in_a)]:
        row_a, row_b = in_a.get(key), in_b.get(key)
        kernel = overall = None
        if row_a is not None and row_b is not None:
            kernel, overall = _ratio(row_a, row_b, "kernel"), _ratio(row_a, row_b, "overall")
        cases.append(CaseComparison(key, row_a, row_b, kernel, overall))
    return Comparison(ra, rb, cases)


# -- drawing -------------------------------------------------------------------


def require_matplotlib() -> None:
    """The graphs are matplotlib's, an optional extra: the daemon and the one-shot commands never draw, so a
    service's install leaves it out; a command that draws says how to add it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtra(
            "the graphs need matplotlib, which this install of mmd lacks: pip install 'mmd[report]'"
        ) from None


def _figure(width: float = 9.0, height: float = 5.0) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colors(names: Iterable[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    order = {name: i for i, name in enumerate(registry.NAMES)}
    extra = iter(range(len(order), 10 * 100))
    return {n: cmap((order[n] if n in order else next(extra)) % 10) for n in names}


def _save(fig: Any, out: Path, stem: str) -> list[Path]:
    png, svg = out / f"{stem}.png", out / f"{stem}.svg"
    fig.savefig(png, format="png")
    fig.savefig(svg, format="svg", metadata={"Date": None})
    return [png, svg]


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center")
    ax.set_xticks([])
    ax.set_yticks([])


def _bars(
    sweep: TileSweep,
    value: Callable[[dict[str, Any]], tuple[float | None, float | None, float | None, bool]],
    title: str,
    ylabel: str,
    log: bool,
) -> Any:
    fig = _figure()
    ax = fig.subplots()
    kernels = sweep.tiled_kernels + sweep.untiled_kernels
    if not kernels:
        _no_data(ax, f"no results at size {sweep.size}")
        ax.set_title(title)
        return fig
    colors = _colors(kernels)
    groups: list[tuple[str, int | None, list[str]]] = [(f"{t}×{t}", t, sweep.tiled_kernels) for t in sweep.tiles]
    if sweep.untiled_kernels:
        groups.append(("no tile", None, sweep.untiled_kernels))
    per_group = max(len(g[2]) for g in groups)
    width = 0.8 / per_group
    labelled: set[str] = set()
    kernel_time: set[str] = set()
    for gi, (_, tile, names) in enumerate(groups):
        for bi, name in enumerate(names):
            x = gi - 0.4 + width * (bi + 0.5)
            row = sweep.cells.get((name, tile))
            if row is None:
                continue
            if row["status"] != "ok":
                ax.text(
                    x,
                    0.02,
                    "refused",
                    transform=ax.get_xaxis_transform(),
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    color=colors[name],
                )
                continue
            med, lo, hi, is_kernel = value(row)
            if med is None:
                continue
            if is_kernel:
                kernel_time.add(name)
            yerr = [[med - lo], [hi - med]] if lo is not None and hi is not None else None
            ax.bar(x, med, width, color=colors[name], yerr=yerr, capsize=2, label=None if name in labelled else name)
            labelled.add(name)
            if tile is None and sweep.tiles:  # the same value as a line across the tile groups
                ax.axhline(med, color=colors[name], linestyle=":", linewidth=1)
    for handle in ax.get_legend_handles_labels()[0]:
        if handle.get_label() in kernel_time:
            handle.set_label(f"{handle.get_label()} (kernel time)")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_xlabel("tile")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    if labelled:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def _size_figure(sweeps: dict[str, list[dict[str, Any]]], tile: int | None, peak: tuple[float, str] | None) -> Any:
    fig = _figure(12.0, 5.0)
    ax_t, ax_g = fig.subplots(1, 2)
    if not sweeps:
        _no_data(ax_t, "no results")
        _no_data(ax_g, "no results")
        return fig
    colors = _colors(sweeps)
    for name, rows in sweeps.items():
        sizes = [sized(r) for r in rows]
        ref = name == "cublas"
        style = dict(
            color="black" if ref else colors[name],
            linestyle="--" if ref else "-",
            marker="o",
            linewidth=2 if ref else 1.5,
            label=name,
        )
        ax_t.plot(sizes, [r["kernel_median_ms"] for r in rows], **style)
        ax_g.plot(sizes, [r["gflops"] for r in rows], **style)
    if peak is not None:
        tflops, label = peak
        ax_g.axhline(tflops * 1000, color="red", linestyle=":", label=f"fp32 peak ({label}, {tflops:g} TFLOP/s)")
    where = f"tile {tile}" if tile is not None else "no tiled kernel"
    ax_t.set_title(f"kernel time vs size ({where})")
    ax_t.set_ylabel("kernel time (ms, median)")
    ax_g.set_title(f"GFLOP/s vs size ({where})")
    ax_g.set_ylabel("GFLOP/s (2·N³ / kernel time)")
    sizes = sorted({sized(r) for rows in sweeps.values() for r in rows})
    for ax in (ax_t, ax_g):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("N (N×N times N×N)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return fig


def accuracy_sweep(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """kernel → its ok accuracy rows by ascending K, kernels in registry order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in _ok(rows):
        out.setdefault(r["kernel"], []).append(r)
    return {k: sorted(out[k], key=lambda r: r["k"]) for k in kernel_order(out)}


def _positive(values: Iterable[float | None]) -> list[float]:
    """NaN for what a log axis cannot show (an exact product's 0): a gap, not a warning."""
    return [v if v is not None and v > 0 else math.nan for v in values]


def _accuracy_figure(sweep: dict[str, list[dict[str, Any]]], where: str) -> Any:
    from matplotlib.lines import Line2D

    fig = _figure()
    ax = fig.subplots()
    if not sweep:
        _no_data(ax, "no accuracy results")
        return fig
    colors = _colors(sweep)
    for name, rows in sweep.items():
        ks = [r["k"] for r in rows]
        color = "black" if name == "cublas" else colors[name]  # cuBLAS SGEMM: the reference, as in graph 3
        ax.plot(ks, _positive(r["rms_rel_error"] for r in rows), color=color, linestyle="-", marker="o", label=name)
        ax.plot(ks, _positive(r["max_rel_error"] for r in rows), color=color, linestyle="--", marker=".")
    ks = sorted({r["k"] for rows in sweep.values() for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()
    ax.set_xlabel("K (inner dimension)")
    ax.set_ylabel("relative error against float64")
    ax.set_title(f"Graph 4: error against float64 vs K ({where})")
    handles, _ = ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], color="gray", linestyle="-", label="RMS: ‖C − ref‖ / ‖ref‖"),
        Line2D([], [], color="gray", linestyle="--", label="max: max|C − ref| / max|ref|"),
    ]
    ax.legend(handles=handles, fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig


# -- the summary ---------------------------------------------------------------


def _phase_ms(row: dict[str, Any], phase: str) -> float | None:
    value: float | None = row[f"{phase}_median_ms"]
    return value


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _cell(row: dict[str, Any] | None, phase: str) -> str:
    if row is None:
        return ""
    if row["status"] != "ok":
        return row["status"]
    med = row.get(f"{phase}_median_ms")
    if med is None:
        return "–"
    return f"{med:.3f} [{row[f'{phase}_min_ms']:.3f}–{row[f'{phase}_max_ms']:.3f}]"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return [*lines, ""]


def _sweep_table(sweep: TileSweep, phase: str, fallback_kernel: bool = False) -> list[str]:
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
            if fallback_kernel and row is not None and row["status"] == "ok" and row.get("cuda_median_ms") is None:
                use = "kernel"
            text = _cell(row, use)
            cells.append(f"{text} (kernel)" if use != phase and text not in ("", "–") else text)
        body.append([name, *cells])
    return _table(["kernel", *[c[0] for c in cols]], body)


def _ratio_table(
    sweeps: dict[str, list[dict[str, Any]]],
    base: dict[int, float],
    value: Callable[[dict[str, Any]], float | None],
    invert: bool = False,
    fmt: str = "{:.2f}×",
) -> list[str]:
    sizes = sorted({sized(r) for rows in sweeps.values() for r in rows})
    body = []
    for name, rows in sweeps.items():
        by_size = {sized(r): value(r) for r in rows}
        cells = []
        for s in sizes:
            v, b = by_size.get(s), base.get(s)
            if not v or not b:
                cells.append("")
            else:
                cells.append(fmt.format(v / b if invert else b / v))
        body.append([name, *cells])
    return _table(["kernel", *[str(s) for s in sizes]], body)


def summary_markdown(
    results: Results,
    sweep: TileSweep,
    tile: int | None,
    sweeps: dict[str, list[dict[str, Any]]],
    peak: tuple[float, str] | None,
    graphs: list[str],
    accuracy: str | None = None,
) -> str:
    """summary.md; ``accuracy``: graph 4's file name, when the results have an accuracy sweep."""
    rows = results.rows
    statuses = ("ok", "refused", "wrong", "skipped", "error")
    if results.kind == "sidecars":
        # A sidecar row pools the jobs of one case (``repeats`` of them): count the jobs, then the cases.
        counts = {s: sum(r["repeats"] or 1 for r in rows if r["status"] == s) for s in statuses}
        tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        out = ["# mmd benchmark report", "", f"Source: `{results.source}` (job sidecars; "
               f"{sum(counts.values())} jobs: {tally}, in {len(rows)} cases.)"]  # fmt: skip
    else:
        counts = {s: sum(1 for r in rows if r["status"] == s) for s in statuses}
        tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        out = ["# mmd benchmark report", "", f"Source: `{results.source}` (mmd bench); {tally}."]
    out.append("")
    failing = [r for r in rows if r["status"] in ("wrong", "error")]
    if failing:
        out += [
            "## FAILED: wrong results and errors",
            "",
            "These cases returned a wrong product; their times are not graphed.",
            "",
        ]
        out += _table(
            ["kernel", "tile", "shape", "status", "reason"],
            [
                [r["kernel"], r["tile"] or "", f"{r['m']}×{r['k']}×{r['n']}", r["status"].upper(), r["reason"] or ""]
                for r in failing
            ],
        )
    if results.environment:
        out += ["## Environment", ""]
        out += _table(["", ""], [[k, "" if v is None else v] for k, v in results.environment.items()])
    names = kernel_order({r["kernel"] for r in rows if r["kernel"]})
    out += ["## Kernels", ""]
    out += _table(
        ["kernel", "what it is"],
        [[n, registry.REGISTRY[n].description if n in registry.REGISTRY else "?"] for n in names],
    )
    out += [
        "## Definitions",
        "",
        "- **overall**: in memory, the wall time of one multiply call; through files (and in sidecars), "
        "read + parse + CUDA phases + emit + write, from the start of the job to the committed output.",
        "- **cuda**: malloc + h2d + kernel + d2h + free, timed with CUDA events (the course's CUDA time). "
        "The cpu backend has no CUDA phases: its kernel time stands in, marked (kernel).",
        "- **kernel**: the kernel (or cuBLAS, or numpy) alone. GFLOP/s = 2·M·K·N / kernel time.",
        "- Cells are the median [min–max] in ms over the timed repeats.",
        "",
    ]
    size = sweep.size
    out += [f"## Graph 1: overall time at {size}×{size} (ms)", "", f"![graph 1]({graphs[0]})", ""]
    out += _sweep_table(sweep, "overall")
    out += [f"## Graph 2: CUDA time at {size}×{size} (ms)", "", f"![graph 2]({graphs[1]})", ""]
    out += _sweep_table(sweep, "cuda", fallback_kernel=True)
    where = f"tile {tile}" if tile is not None else "any tile"
    out += [f"## Graph 3: kernel time and GFLOP/s against size ({where})", "", f"![graph 3]({graphs[2]})", ""]
    sizes = sorted({sized(r) for rs in sweeps.values() for r in rs})
    out += ["Kernel time (ms, median):", ""]
    out += _table(
        ["kernel", *map(str, sizes)],
        [[n, *[_ms({sized(r): r["kernel_median_ms"] for r in rs}.get(s)) for s in sizes]] for n, rs in sweeps.items()],
    )
    out += ["GFLOP/s:", ""]
    out += _table(
        ["kernel", *map(str, sizes)],
        [
            [n, *[("" if (g := {sized(r): r["gflops"] for r in rs}.get(s)) is None else f"{g:.1f}") for s in sizes]]
            for n, rs in sweeps.items()
        ],
    )

    def base(kernel: str, phase: str) -> dict[int, float]:
        return {sized(r): r[f"{phase}_median_ms"] for r in sweeps.get(kernel, []) if r[f"{phase}_median_ms"]}

    out += _kernel_table(sweeps, base("cublas", "kernel"))

    out += ["## Speed-up over the cpu backend", ""]
    if "cpu" in sweeps:
        for phase in ("overall", "kernel"):
            out += [f"{phase} time: cpu {phase} / kernel {phase} (higher is faster):", ""]
            out += _ratio_table(sweeps, base("cpu", phase), functools.partial(_phase_ms, phase=phase))
    else:
        out += ["No cpu results to compare with.", ""]
    out += ["## Speed-up over naive", ""]
    if "naive" in sweeps:
        out += ["kernel time: naive kernel / kernel (higher is faster):", ""]
        out += _ratio_table(sweeps, base("naive", "kernel"), lambda r: r["kernel_median_ms"])
    else:
        out += ["No naive results to compare with.", ""]
    out += ["## Efficiency", ""]
    if "cublas" in sweeps:
        out += ["Against cuBLAS: cuBLAS kernel time / kernel time (100% = as fast as cuBLAS):", ""]
        out += _ratio_table(sweeps, base("cublas", "kernel"), lambda r: r["kernel_median_ms"], fmt="{:.1%}")
    else:
        out += ["No cuBLAS results to compare with.", ""]
    if peak is not None:
        tflops, label = peak
        peak_gflops = {s: tflops * 1000 for s in sizes}
        out += [f"Against the fp32 peak of the {label} ({tflops:g} TFLOP/s): GFLOP/s / peak:", ""]
        out += _ratio_table(sweeps, peak_gflops, lambda r: r["gflops"], invert=True, fmt="{:.1%}")
    else:
        out += ["The GPU's fp32 peak is not known for this device (give --peak-tflops).", ""]
    if accuracy:
        out += _accuracy_section(results.accuracy, accuracy)
    others = [r for r in _ok(rows) if size_of(r) is None]
    if others:
        # The graphs and the tables above hold N×N×N cases only: the other shapes' times are here.
        out += ["## Other shapes", "", "Cases that are not N×N×N (not graphed), median [min–max] in ms:", ""]
        out += _table(
            ["kernel", "tile", "shape", "jobs" if results.kind == "sidecars" else "repeats", "overall", "kernel"],
            [
                [
                    r["kernel"],
                    "" if r["tile"] is None else r["tile"],
                    f"{r['m']}×{r['k']}×{r['n']}",
                    str(r["repeats"] or 1),
                    _cell(r, "overall"),
                    _cell(r, "kernel"),
                ]
                for r in others
            ],
        )
    refused = [r for r in rows if r["status"] == "refused"]
    out += ["## Refused cases", ""]
    if refused:
        out += _table(
            ["kernel", "tile", "shape", "times", "reason"],
            [
                [
                    r["kernel"] or "",
                    "" if r["tile"] is None else r["tile"],
                    "?" if r["m"] is None else f"{r['m']}×{r['k']}×{r['n']}",
                    str(r["repeats"] or 1),
                    r["reason"] or "",
                ]
                for r in refused
            ],
        )
    else:
        out += ["None.", ""]
    skipped = [r for r in rows if r["status"] == "skipped"]
    if skipped:
        out += ["## Skipped cases", ""]
        out += _table(
            ["kernel", "tile", "shape", "reason"],
            [
                [r["kernel"], "" if r["tile"] is None else r["tile"], f"{r['m']}×{r['k']}×{r['n']}", r["reason"] or ""]
                for r in skipped
            ],
        )
    return "\n".join(out).rstrip() + "\n"


def _kernel_table(sweeps: dict[str, list[dict[str, Any]]], cublas: dict[int, float]) -> list[str]:
    """Every kernel at every size: median ± noise, TFLOP/s, cuBLAS SGEMM's time over its own, error, SM clock."""
    out = ["## Every kernel by size", ""]
    out += [
        "Kernel time (median ± its noise: half the 95 % interval of the median), TFLOP/s, "
        "× cuBLAS = cuBLAS SGEMM's kernel time / the kernel's (above 1: faster), "
        "error = ‖C − ref‖ / ‖ref‖ against float64 on the case's inputs, the SM clock during the timed calls.",
        "",
    ]
    body = []
    for name, rs in sweeps.items():
        for r in rs:
            ms, size = r["kernel_median_ms"], sized(r)
            noise = "–" if r.get("kernel_noise") is None else f"±{r['kernel_noise']:.1%}"
            ratio = f"{cublas[size] / ms:.2f}×" if ms and size in cublas else ""
            tflops = "" if r["gflops"] is None else f"{r['gflops'] / 1000:.2f}"
            error = "" if r["rel_error"] is None else f"{r['rel_error']:.1e}"
            clock = "" if r.get("sm_clock_mhz") is None else f"{r['sm_clock_mhz']:.0f}"
            if r.get("throttled"):
                clock += f" THROTTLED ({r.get('throttle_reasons') or '?'})"
            body.append([name, str(size), _ms(ms), noise, str(r["repeats"]), tflops, ratio, error, clock])
    header = ["kernel", "size", "kernel ms", "noise", "calls", "TFLOP/s", "× cuBLAS", "error vs float64", "SM MHz"]
    return out + _table(header, body)


def _accuracy_section(rows: list[dict[str, Any]], graph: str) -> list[str]:
    sweep = accuracy_sweep(rows)
    ks = sorted({r["k"] for rs in sweep.values() for r in rs})
    mn = sorted({(r["m"], r["n"]) for rs in sweep.values() for r in rs})
    where = ", ".join(f"M = {m}, N = {n}" for m, n in mn) or "no results"
    out = [f"## Graph 4: accuracy against float64 ({where}, inputs uniform in [−1, 1])", ""]
    out += [f"![graph 4]({graph})", ""]
    out += [
        "max = max|C − ref| / max|ref|, RMS = ‖C − ref‖ / ‖ref‖ (Frobenius), ref the float64 product. "
        "fp32's tolerance: every element within 4·sqrt(K)·eps·(|A|·|B|), the bar mmd checks fp32 kernels "
        "against (TF32 kernels are checked against their own).",
        "",
    ]
    for label, column in (("Max relative error", "max_rel_error"), ("RMS relative error", "rms_rel_error")):
        out += [f"{label}:", ""]
        out += _table(
            ["kernel", *map(str, ks)],
            [
                [n, *[("" if (v := {r["k"]: r[column] for r in rs}.get(k)) is None else f"{v:.1e}") for k in ks]]
                for n, rs in sweep.items()
            ],
        )
    body = []
    for name, rs in sweep.items():
        outside = [str(r["k"]) for r in rs if r["within_fp32_tolerance"] is False]
        body.append([name, f"outside at K = {', '.join(outside)}" if outside else "within at every K"])
    out += ["Within fp32's tolerance:", ""]
    out += _table(["kernel", "fp32's tolerance"], body)
    others = [r for r in rows if r["status"] != "ok"]
    if others:
        out += _table(
            ["kernel", "K", "status", "reason"],
            [[r["kernel"], str(r["k"]), r["status"], r["reason"] or ""] for r in others],
        )
    return out


# -- rendering -----------------------------------------------------------------


@dataclass
class Rendered:
    """What :func:`render` wrote."""

    folder: Path
    files: list[Path]
    summary: Path
    size: int | None
    tile: int | None


def render(
    source: Path | Results,
    out: Path | None = None,
    *,
    log: bool = False,
    size: int | None = None,
    peak_tflops: float | None = None,
) -> Rendered:
    """Render graphs 1-3 (and 4 where there is an accuracy sweep; PNG and SVG) and summary.md from ``source``.

    ``out`` defaults to ``report/`` beside the results (inside a sidecar folder). Raises MissingExtra,
    before any work, where matplotlib (the ``report`` extra) is not installed.
    """
    require_matplotlib()
    results = source if isinstance(source, Results) else load(Path(source))
    if out is None:
        base = results.source if results.source.is_dir() else results.source.parent
        out = base / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot make the folder {out}: {exc.strerror}") from None
    rows = results.rows
    shown = graph_size(rows, size)
    sweep = tile_sweep(rows, shown)
    tile = sweep_tile(rows)
    sweeps = size_sweep(rows, tile)
    if peak_tflops is not None:
        peak: tuple[float, str] | None = (peak_tflops, "GPU (given)")
    else:
        devices = [results.environment.get("device")] + [r["device"] for r in rows if r.get("backend") != "cpu"]
        peak = next((p for p in map(peak_for, devices) if p is not None), None)

    where = f"{shown}×{shown}" if shown is not None else "no size"
    files: list[Path] = []
    fig = _bars(
        sweep,
        lambda r: (r["overall_median_ms"], r["overall_min_ms"], r["overall_max_ms"], False),
        f"Graph 1: overall time at {where}",
        "overall time (ms, median; bars: min–max)",
        log,
    )
    files += _save(fig, out, "graph1_overall")
    fig = _bars(
        sweep,
        cuda_or_kernel,
        f"Graph 2: CUDA time (malloc + h2d + kernel + d2h + free) at {where}",
        "CUDA time (ms, median; bars: min–max)",
        log,
    )
    files += _save(fig, out, "graph2_cuda")
    fig = _size_figure(sweeps, tile, peak)
    files += _save(fig, out, "graph3_sizes")
    accuracy = None
    if results.accuracy:
        mn = sorted({f"M = {r['m']}, N = {r['n']}" for r in results.accuracy})
        files += _save(_accuracy_figure(accuracy_sweep(results.accuracy), "; ".join(mn)), out, "graph4_accuracy")
        accuracy = "graph4_accuracy.png"
    summary = out / "summary.md"
    text = summary_markdown(
        results, sweep, tile, sweeps, peak, ["graph1_overall.png", "graph2_cuda.png", "graph3_sizes.png"], accuracy
    )
    summary.write_text(text, encoding="utf-8")
    files.append(summary)
    return Rendered(out, files, summary, shown, tile)
