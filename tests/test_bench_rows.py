"""The bench's typed rows: their columns, the CSV and YAML they write, reading them back (old files too),
and the docs' column tables generated from them."""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mmd import bench, report
from mmd.bench import rows

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


def test_the_columns_are_the_fields_in_order():
    assert bench.COLUMNS[:16] == (
        "kernel", "backend", "tile", "m", "k", "n", "memory", "mode", "text_path", "status", "reason",
        "repeats", "warmup", "device", "max_abs_error", "rel_error",
    )  # fmt: skip
    phases = [f"{p}_{s}_ms" for p in rows.PHASES for s in ("median", "min", "max")]
    assert bench.COLUMNS[16 : 16 + len(phases)] == tuple(phases)
    quartiles = tuple(f"{p}_{s}_ms" for p in rows.PHASES for s in ("q1", "q3"))
    assert bench.COLUMNS[16 + len(phases) :] == (
        "gflops", "kernel_noise", "overall_noise", "converged", "sm_clock_mhz", "throttled", "throttle_reasons",
        "load_avg", "gpu_processes", "busy", "busy_reasons", *quartiles, "kernel_file", "kernel_sha256",
    )  # fmt: skip
    assert tuple(f.name for f in dataclasses.fields(bench.AccuracyRow)) == bench.ACCURACY_COLUMNS


ROW = bench.BenchRow(
    kernel="tiled", backend="cuda", tile=32, m=8, k=8, n=8, memory="device", status="ok", repeats=3, warmup=1,
    device="GPU, with a comma", rel_error=1.5e-7, phases={"kernel": bench.Spread(0.25, 0.125, 0.5)},
    gflops=4.096, converged=True, throttled=False,
)  # fmt: skip


def test_csv_bytes():
    text = bench.to_csv(bench.BenchRow, [ROW])
    header, line = text.splitlines()
    assert header == ",".join(bench.COLUMNS)
    cells = dict(zip(bench.COLUMNS, next(csv.reader([line])), strict=True))
    assert cells["device"] == "GPU, with a comma" and line.count('"GPU, with a comma"') == 1
    assert (cells["kernel_median_ms"], cells["kernel_min_ms"], cells["kernel_max_ms"]) == ("0.25", "0.125", "0.5")
    assert cells["overall_median_ms"] == "" and cells["reason"] == "" and cells["converged"] == "True"
    assert text.endswith("\n") and "\r" not in text


def test_round_trip_through_csv_and_yaml():
    (cells,) = csv.DictReader(io.StringIO(bench.to_csv(bench.BenchRow, [ROW])))
    assert bench.from_cells(bench.BenchRow, cells) == ROW
    assert bench.from_cells(bench.BenchRow, yaml.safe_load(yaml.safe_dump(bench.to_cells(ROW)))) == ROW


spreads = st.lists(st.floats(0, 1e6, allow_nan=False), min_size=3, max_size=3).map(
    lambda xs: bench.Spread(median=sorted(xs)[1], min=min(xs), max=max(xs))
)


@settings(max_examples=60, deadline=None)
@given(
    phases=st.dictionaries(st.sampled_from(rows.PHASES), spreads),
    tile=st.none() | st.integers(1, 64),
    reason=st.none() | st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1),
    noise=st.none() | st.floats(0, 10, allow_nan=False),
    converged=st.none() | st.booleans(),
)
def test_any_row_reads_back_equal(phases, tile, reason, noise, converged):
    row = bench.BenchRow(
        kernel="fast", tile=tile, m=3, k=5, n=2, reason=reason, phases=phases, kernel_noise=noise, converged=converged
    )
    (cells,) = csv.DictReader(io.StringIO(bench.to_csv(bench.BenchRow, [row])))
    back = bench.from_cells(bench.BenchRow, cells)
    assert back == row


def test_malformed_cells_are_refused_naming_the_column():
    with pytest.raises(ValueError, match="row 3: tile is not an integer"):
        bench.from_cells(bench.BenchRow, {"kernel": "x", "tile": 3.5}, "row 3")
    with pytest.raises(ValueError, match="kernel has a median but not its min and max"):
        bench.from_cells(bench.BenchRow, {"kernel": "x", "kernel_median_ms": "1"})
    with pytest.raises(ValueError, match="converged is not true or false"):
        bench.from_cells(bench.BenchRow, {"kernel": "x", "converged": "maybe"})
    with pytest.raises(ValueError, match="m is empty"):
        bench.from_cells(bench.AccuracyRow, {"kernel": "x", "backend": "cpu", "m": "", "k": 1, "n": 1})


@pytest.mark.parametrize("folder", ["course", "ladder"])
def test_the_results_the_docs_cite_still_load(folder):
    """docs/results/course was written before the timing's rigor columns: they read as None."""
    from_csv = report.load(RESULTS / folder / "results.csv")
    from_yaml = report.load(RESULTS / folder / "results.yaml")
    assert from_csv.rows and from_csv.rows == from_yaml.rows
    header = (RESULTS / folder / "results.csv").read_text().splitlines()[0].split(",")
    with open(RESULTS / folder / "results.csv", newline="") as fh:
        for row, cells in zip(from_csv.rows, csv.DictReader(fh), strict=True):
            assert row.kernel == cells["kernel"] and str(row.m) == cells["m"]
            kernel = row.median("kernel")
            assert (kernel is None) == (cells["kernel_median_ms"] == "")
            if kernel is not None:
                assert kernel == float(cells["kernel_median_ms"])
            if "kernel_noise" not in header:
                assert row.kernel_noise is None and row.converged is None
    if folder == "ladder":
        assert from_yaml.accuracy and from_yaml.accuracy == report.load(RESULTS / folder / "results.csv").accuracy
        assert {r.kernel for r in from_yaml.accuracy} >= set(bench.LADDER_KERNELS)


def test_the_docs_column_tables_are_current():
    text = (ROOT / "docs" / "bench.md").read_text(encoding="utf-8")
    assert rows.with_tables(text) == text, "run: python -m mmd.bench docs/bench.md"
    for name in rows.TABLES:
        assert rows.BEGIN.format(name=name) in text
