"""The accuracy sweep (``mmd bench --accuracy``): error against float64 over K, its files, table and graph."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
import yaml

from mmd import bench, report
from mmd.backends import CpuBackend
from mmd.check.product import reference
from mmd.cli import main
from mmd.report.sweeps import accuracy_sweep

from .fakes import cuda_backend, fake_gpu_opener
from .test_bench import fake_gpu, read_csv

KS = (8, 32, 128)


def sweep_plan(**kw) -> bench.Plan:
    values = dict(
        kernels=("tiled", "tc1", "tc3", "cublas"),
        sizes=(16,),
        tiles=(32,),
        repeats=2,
        accuracy=True,
        accuracy_mn=24,
        accuracy_ks=KS,
    )
    values.update(kw)
    return bench.Plan(**values)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    backend, _ = fake_gpu()
    folder = tmp_path_factory.mktemp("acc") / "run"
    run = bench.run_plan(sweep_plan(), backend, folder=folder, env={"device": backend.device_name()})
    assert run.ok and run.complete
    return run


def test_accuracy_csv_and_yaml(swept):
    header, rows = read_csv(swept.accuracy_csv_path)
    assert tuple(header) == bench.ACCURACY_COLUMNS
    # The chosen kernels and cuBLAS in both modes, at every K, in registry order.
    assert [(r["kernel"], r["k"]) for r in rows] == [
        (name, str(k)) for k in KS for name in ("tiled", "tc1", "tc3", "cublas", "cublas_tf32")
    ]
    assert all(r["m"] == r["n"] == "24" and r["status"] == "ok" for r in rows)
    by = {(r["kernel"], int(r["k"])): r for r in rows}
    for k in KS:
        sgemm, tf32 = by[("cublas", k)], by[("cublas_tf32", k)]
        assert float(sgemm["rms_rel_error"]) < 1e-6 and sgemm["within_fp32_tolerance"] == "True"
        # The fake rounds cuBLAS's TF32 operands: TF32's ~3e-4, outside fp32's tolerance.
        assert 1e-4 < float(tf32["rms_rel_error"]) < 1e-3 and tf32["within_fp32_tolerance"] == "False"
        assert float(tf32["max_rel_error"]) >= float(tf32["rms_rel_error"]) * 0.5
    doc = yaml.safe_load(swept.accuracy_yaml_path.read_text())
    assert doc["complete"] is True and doc["columns"] == list(bench.ACCURACY_COLUMNS)
    assert doc["plan"]["accuracy_ks"] == list(KS) and doc["plan"]["accuracy_mn"] == 24
    assert [r["max_rel_error"] for r in doc["rows"]] == [float(r["max_rel_error"]) for r in rows]


def test_error_stats_definitions():
    a, b = bench.accuracy_inputs(20, 50, 30, seed=4)
    assert a.dtype == b.dtype == np.float32 and a.min() >= -1 and a.max() <= 1 and a.min() < -0.9
    ref = reference(a, b)
    c = (ref + 1e-3 * np.abs(ref).max()).astype(np.float32)  # every element off by 1e-3 of the largest
    got = bench.error_stats(c, ref)
    assert got["max_rel_error"] == pytest.approx(1e-3, rel=1e-3)
    diff = c.astype(np.float64) - ref
    assert got["rms_rel_error"] == pytest.approx(np.linalg.norm(diff) / np.linalg.norm(ref), rel=1e-3)
    assert got["max_abs_error"] == pytest.approx(np.abs(diff).max(), rel=1e-3)


def test_on_the_cpu_backend_cpu_only_and_refusals_are_rows(tmp_path):
    run = bench.run_plan(sweep_plan(kernels=("cpu",)), CpuBackend(), folder=tmp_path / "cpu", env={})
    assert [r.kernel for r in run.accuracy] == ["cpu"] * len(KS)  # no cuBLAS rows on the cpu backend
    assert all(r.status == "ok" and r.within_fp32_tolerance for r in run.accuracy)
    run = bench.run_plan(sweep_plan(kernels=("tiled", "cpu")), CpuBackend(), folder=tmp_path / "skip", env={})
    assert {(r.kernel, r.status) for r in run.accuracy} == {("tiled", "skipped"), ("cpu", "ok")}
    backend, _ = cuda_backend(fail_at="launch")
    run = bench.run_plan(sweep_plan(kernels=("tiled",), accuracy_ks=(8,)), backend, folder=tmp_path / "r", env={})
    assert [(r.kernel, r.status) for r in run.accuracy] == [
        ("tiled", "refused"),
        ("cublas", "ok"),
        ("cublas_tf32", "ok"),
    ]
    assert "CUDA failed" in run.accuracy[0].reason


def test_without_accuracy_no_files(tmp_path):
    run = bench.run_plan(sweep_plan(accuracy=False), fake_gpu()[0], folder=tmp_path, env={})
    assert not run.accuracy and not run.accuracy_csv_path.exists() and not run.accuracy_yaml_path.exists()
    with pytest.raises(ValueError):
        sweep_plan(accuracy_ks=())


def test_cli_accuracy(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("mmd.logs.configure", lambda *args, **kwargs: None)
    # mmd bench imports open_backend when it runs
    monkeypatch.setattr("mmd.backends.open_backend", fake_gpu_opener())
    out = tmp_path / "r"
    argv = ["bench", "--plan", "ladder", "--sizes", "16", "--repeats", "2", "--out", str(out)]
    assert main([*argv, "--accuracy", "--accuracy-mn", "12", "--accuracy-ks", "8", "64"]) == 0
    (folder,) = out.iterdir()
    printed = capsys.readouterr()
    assert str(folder / "accuracy.csv") in printed.out
    assert "accuracy tc3" in printed.err and "fp32's tolerance" in printed.err
    _, rows = read_csv(folder / "accuracy.csv")
    assert {r["kernel"] for r in rows} == set(bench.LADDER_KERNELS)
    assert {(r["m"], r["k"]) for r in rows} == {("12", "8"), ("12", "64")}


# -- the report: graph 4 and the tables ------------------------------------------------------------


@pytest.mark.integration  # matplotlib: left out of `make quick`
def test_report_renders_graph4_and_the_accuracy_tables(swept, tmp_path):
    rendered = report.render(swept.folder, tmp_path / "rep")
    png, svg = tmp_path / "rep" / "graph4_accuracy.png", tmp_path / "rep" / "graph4_accuracy.svg"
    assert png in rendered.files and svg in rendered.files and len(rendered.files) == 10
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list(ET.parse(svg).getroot().iter())) > 50  # drawn, not an empty canvas
    # The figure itself: log-log, per kernel an RMS line (solid) and a max line (dashed) of one colour.
    fig = report.figures.accuracy_figure(accuracy_sweep(report.load(swept.folder).accuracy), "M = N = 24")
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = ax.get_lines()
    assert len(lines) == 2 * 5
    for solid, dashed in zip(lines[::2], lines[1::2], strict=True):
        assert (solid.get_linestyle(), dashed.get_linestyle()) == ("-", "--")
        assert solid.get_color() == dashed.get_color()
        assert list(solid.get_xdata()) == list(KS)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "tiled",
        "tc1",
        "tc3",
        "cublas",
        "cublas_tf32",
        "RMS: ‖C − ref‖ / ‖ref‖",
        "max: max|C − ref| / max|ref|",
    ]
    summary = rendered.summary.read_text()
    assert "## Graph 4: accuracy against float64 (M = 24, N = 24, inputs uniform in [−1, 1])" in summary
    assert "![graph 4](graph4_accuracy.png)" in summary
    from .test_report import table

    _, rows = read_csv(swept.accuracy_csv_path)
    max_rel = table(summary, "Max relative error:")
    rms_rel = table(summary, "RMS relative error:")
    for r in rows:
        assert max_rel[r["kernel"]][r["k"]] == f"{float(r['max_rel_error']):.1e}"
        assert rms_rel[r["kernel"]][r["k"]] == f"{float(r['rms_rel_error']):.1e}"
    tolerance = table(summary, "Within fp32's tolerance:")
    assert tolerance["cublas"]["fp32's tolerance"] == "within at every K"
    assert tolerance["cublas_tf32"]["fp32's tolerance"] == "outside at K = 8, 32, 128"


@pytest.mark.integration
def test_report_every_kernel_by_size(swept, tmp_path):
    from .test_report import table

    summary = report.render(swept.csv_path, tmp_path).summary.read_text()
    by = table(summary, "## Every kernel by size")
    _, rows = read_csv(swept.csv_path)
    cublas = next(float(r["kernel_median_ms"]) for r in rows if r["kernel"] == "cublas")
    assert set(by) == {"tiled", "tc1", "tc3", "cublas"}
    for r in rows:
        cells = by[r["kernel"]]
        assert cells["size"] == r["m"] and cells["kernel ms"] == f"{float(r['kernel_median_ms']):.3f}"
        assert cells["TFLOP/s"] == f"{float(r['gflops']) / 1000:.2f}"
        assert cells["× cuBLAS"] == f"{cublas / float(r['kernel_median_ms']):.2f}×"
        assert cells["error vs float64"] == f"{float(r['rel_error']):.1e}"
        assert cells["noise"] == "±0.0%" and cells["calls"] == r["repeats"]
