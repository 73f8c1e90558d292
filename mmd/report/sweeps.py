"""What the graphs and tables read out of a run's rows: the tile sweep at one size, the size sweep at one
tile, the accuracy sweep over K, the kernels' order and the GPU's fp32 peak."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .. import kernels as registry
from ..bench.rows import AccuracyRow, BenchRow

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


def sized(row: BenchRow) -> int:
    """N of a row already known to be an N×N×N case (the sweeps hold only those)."""
    if row.size is None:
        raise ValueError(f"not a square case: {row.m}x{row.k}x{row.n}")
    return row.size


def uses_tile(kernel: str | None) -> bool:
    """Whether the tile matters for ``kernel`` (unknown names are taken to use one)."""
    spec = registry.REGISTRY.get(kernel or "")
    return spec.uses_tile if spec is not None else True


def kernel_order(names: Iterable[str]) -> list[str]:
    """Registry order (naive ... cpu), unknown names after, alphabetically."""
    order = {name: i for i, name in enumerate(registry.NAMES)}
    return sorted(set(names), key=lambda n: (order.get(n, len(order)), n))


def kernel_files(rows: Iterable[BenchRow]) -> dict[str, BenchRow]:
    """The kernels that are kernel files (``mmd bench --kernel-file``), by name, in the order their rows come (the
    order they were given), each with its first row."""
    found: dict[str, BenchRow] = {}
    for r in rows:
        if r.kernel is not None and r.kernel_sha256 is not None:
            found.setdefault(r.kernel, r)
    return found


def peak_for(device: str | None) -> tuple[float, str] | None:
    """(fp32 peak in TFLOP/s, GPU label) for a known device name."""
    for pattern, tflops, label in PEAK_FP32_TFLOPS:
        if device and re.search(pattern, device):
            return tflops, label
    return None


def ok_rows(rows: Iterable[BenchRow]) -> list[BenchRow]:
    return [r for r in rows if r.status == "ok"]


def graph_size(rows: list[BenchRow], size: int | None = None) -> int | None:
    """The size graphs 1-2 show: ``size``, else the largest square size of a case that ran (a refusal's size is
    only what its header asked: a 100000×100000 refused unread would give graphs with no bar)."""
    if size is not None:
        return size
    sizes = [r.size for r in ok_rows(rows) if r.size is not None]
    return max(sizes) if sizes else None


def sweep_tile(rows: list[BenchRow]) -> int | None:
    """The tile graph 3 reads: 32 when present, else the tile with the most sizes."""
    tiled = [r for r in ok_rows(rows) if r.tile is not None and uses_tile(r.kernel) and r.size]
    tiles = [r.tile for r in tiled if r.tile is not None]
    if not tiles:
        return None
    if SWEEP_TILE in tiles:
        return SWEEP_TILE
    return max(sorted(set(tiles)), key=lambda t: len({sized(r) for r in tiled if r.tile == t}))


@dataclass
class TileSweep:
    """The rows behind graphs 1-2: one size, kernels by tile."""

    size: int | None
    tiles: list[int]
    tiled_kernels: list[str]
    untiled_kernels: list[str]
    cells: dict[tuple[str, int | None], BenchRow]  # (kernel, tile) → row (ok or refused)


def tile_sweep(rows: list[BenchRow], size: int | None) -> TileSweep:
    at = [r for r in rows if r.status in ("ok", "refused") and size is not None and r.size == size and r.kernel]
    cells: dict[tuple[str, int | None], BenchRow] = {}
    for r in at:
        assert r.kernel is not None
        key = (r.kernel, r.tile if uses_tile(r.kernel) else None)
        if key not in cells or (cells[key].status != "ok" and r.status == "ok"):
            cells[key] = r
    tiled = kernel_order(k for k, t in cells if t is not None)
    untiled = kernel_order(k for k, t in cells if t is None)
    tiles = sorted({t for _, t in cells if t is not None})
    return TileSweep(size, tiles, tiled, untiled, cells)


def size_sweep(rows: list[BenchRow], tile: int | None) -> dict[str, list[BenchRow]]:
    """kernel → ok rows by ascending size: tiled kernels at ``tile``, untiled ones at any tile."""
    out: dict[str, list[BenchRow]] = {}
    for r in ok_rows(rows):
        if r.kernel is None or r.size is None or (uses_tile(r.kernel) and r.tile != tile):
            continue
        out.setdefault(r.kernel, []).append(r)
    return {k: sorted(out[k], key=sized) for k in kernel_order(out)}


def cuda_or_kernel(row: BenchRow) -> tuple[str, bool]:
    """(the phase, is_kernel_time): CUDA time, or kernel time where the row has no CUDA phases."""
    if row.spread("cuda") is not None:
        return "cuda", False
    return "kernel", True


def accuracy_sweep(rows: list[AccuracyRow]) -> dict[str, list[AccuracyRow]]:
    """kernel → its ok accuracy rows by ascending K, kernels in registry order."""
    out: dict[str, list[AccuracyRow]] = {}
    for r in rows:
        if r.status == "ok":
            out.setdefault(r.kernel, []).append(r)
    return {k: sorted(out[k], key=lambda r: r.k) for k in kernel_order(out)}
