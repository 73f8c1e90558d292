"""The report: every graph as PNG and SVG, summary numbers equal to the CSV's, sidecar folders, CLI."""

from __future__ import annotations

import re
import struct
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from mmd import bench, report
from mmd.backends import CpuBackend, MultiplyRequest
from mmd.cli import main
from mmd.generate import input_chunks, random_matrix

from .conftest import run_file
from .fakes import cuda_backend
from .test_bench import fake_gpu, read_csv

#: matplotlib renders every graph: left out of `make quick`, run by `make test`.
pytestmark = pytest.mark.process

GRAPHS = ("graph1_overall", "graph2_cuda", "graph3_sizes")


@pytest.fixture
def quiet_logs(monkeypatch):
    """In-process CLI calls must not point structlog at pytest's captured (later closed) stderr."""
    monkeypatch.setattr("mmd.logs.configure", lambda *args, **kwargs: None)


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory):
    """A fake-GPU run: every kernel, sizes 8/16/32 at tile 32, tiles 4..64 at 32 (64 refused)."""
    folder = tmp_path_factory.mktemp("gpu") / "run"
    plan = bench.course_plan(sizes=(8, 16, 32), tiles=(4, 8, 16, 32, 64), tiles_at_size=32, repeats=2)
    backend, _ = fake_gpu()
    run = bench.run_plan(plan, backend, folder=folder, env={"device": backend.device_name()})
    assert run.ok
    return run


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def assert_graphs(folder):
    for stem in GRAPHS:
        png, svg = folder / f"{stem}.png", folder / f"{stem}.svg"
        width, height = png_size(png)
        assert width >= 600 and height >= 300
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg")
        assert len(list(root.iter())) > 50  # drawn, not an empty canvas


def table(summary: str, heading: str) -> dict[str, dict[str, str]]:
    """The first markdown table after ``heading``: row name → column → cell."""
    text = summary[summary.index(heading) :]
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(header):
            break
        out[cells[0]] = dict(zip(header[1:], cells[1:], strict=True))
        if not text[text.index(line) + len(line) :].lstrip(" ").startswith("\n|"):
            break
    return out


def first_number(cell: str) -> float:
    return float(re.match(r"[\d.]+", cell).group(0))


def test_renders_every_graph_and_summary(gpu_results, tmp_path):
    rendered = report.render(gpu_results.folder, tmp_path / "rep")
    assert rendered.size == 32 and rendered.tile == 32
    assert_graphs(tmp_path / "rep")
    assert png_size(tmp_path / "rep" / "graph1_overall.png") == (900, 500)
    assert png_size(tmp_path / "rep" / "graph3_sizes.png") == (1200, 500)
    assert rendered.summary.read_text().startswith("# mmd benchmark report")
    assert len(rendered.files) == 7


def test_summary_numbers_match_the_csv(gpu_results, tmp_path):
    rendered = report.render(gpu_results.csv_path, tmp_path)
    summary = rendered.summary.read_text()
    _, rows = read_csv(gpu_results.csv_path)
    at32 = {(r["kernel"], r["tile"]): r for r in rows if r["m"] == "32"}

    overall = table(summary, "## Graph 1")
    cuda = table(summary, "## Graph 2")
    for kernel, cells in overall.items():
        for col, cell in cells.items():
            if not cell:
                continue
            tile = col.removeprefix("tile ") if col != "no tile" else ""
            row = at32[(kernel, tile)]
            if row["status"] == "refused":
                assert cell == "refused" and cuda[kernel][col] == "refused"
                continue
            assert first_number(cell) == pytest.approx(float(row["overall_median_ms"]), abs=5e-4)
            lo, hi = map(float, re.search(r"\[([\d.]+)–([\d.]+)\]", cell).groups())
            assert (lo, hi) == pytest.approx((float(row["overall_min_ms"]), float(row["overall_max_ms"])), abs=5e-4)
            want = row["cuda_median_ms"] or row["kernel_median_ms"]
            assert first_number(cuda[kernel][col]) == pytest.approx(float(want), abs=5e-4)
    assert set(overall["tiled"]) == {"tile 4", "tile 8", "tile 16", "tile 32", "tile 64", "no tile"}
    assert overall["tiled"]["tile 64"] == "refused"
    assert cuda["cpu"]["no tile"].endswith("(kernel)")

    gflops = table(summary, "GFLOP/s:")
    for r in rows:
        if r["status"] == "ok" and (r["tile"] in ("32", "")):
            assert gflops[r["kernel"]][r["m"]] == f"{float(r['gflops']):.1f}"

    naive = table(summary, "## Speed-up over naive")
    t = {(r["kernel"], r["m"]): float(r["kernel_median_ms"]) for r in rows if r["tile"] in ("32", "") and r["m"]}
    assert naive["tiled"]["16"] == f"{t[('naive', '16')] / t[('tiled', '16')]:.2f}×"
    eff = table(summary, "Against cuBLAS")
    assert eff["tiled"]["32"] == f"{t[('cublas', '32')] / t[('tiled', '32')]:.1%}"
    assert "H100 SXM (67 TFLOP/s)" in summary

    refused = table(summary, "## Refused cases")
    assert len(refused) == len([r for r in rows if r["status"] == "refused"]) >= 5
    assert all("4096 threads per block" in r["reason"] for r in refused.values())


def test_csv_and_yaml_read_the_same(gpu_results):
    assert report.load(gpu_results.csv_path).rows == report.load(gpu_results.yaml_path).rows
    assert report.load(gpu_results.folder).environment["device"].startswith("NVIDIA H100")


def test_cpu_only_results_render(tmp_path):
    run = bench.run_plan(
        bench.Plan(kernels=("cpu",), sizes=(8, 16, 33), tiles=(32,), repeats=2),
        CpuBackend(),
        folder=tmp_path / "run",
        env={},
    )
    rendered = report.render(run.folder, log=True)
    assert rendered.folder == run.folder / "report" and rendered.size == 33
    assert_graphs(rendered.folder)
    summary = rendered.summary.read_text()
    assert "(kernel)" in summary and "--peak-tflops" in summary
    assert "Graph 1: overall time at 33×33" in summary


def test_size_option_and_cli(gpu_results, tmp_path, capsys, quiet_logs):
    code = main(
        ["report", str(gpu_results.folder), "--out", str(tmp_path), "--log", "--size", "16", "--peak-tflops", "10"]
    )
    assert code == 0
    assert str(tmp_path / "summary.md") in capsys.readouterr().out
    summary = (tmp_path / "summary.md").read_text()
    assert "Graph 1: overall time at 16×16" in summary
    assert "GPU (given) (10 TFLOP/s)" in summary
    assert_graphs(tmp_path)
    assert main(["report", str(tmp_path / "nothing-here")]) == 2  # a path that cannot be used: usage


def _job(folder, name, n, backend, request, seed):
    rng = np.random.default_rng(seed)
    src = folder / "in" / f"{name}.txt"
    src.parent.mkdir(exist_ok=True)
    src.write_bytes(b"".join(input_chunks(random_matrix(rng, n, n), random_matrix(rng, n, n), square=True)))
    return run_file(src, folder / "out" / f"{name}.out", backend, request)


def test_report_from_job_sidecars(tmp_path):
    (tmp_path / "out").mkdir()
    cpu = MultiplyRequest(kernel="cpu", tile=32)
    results = [_job(tmp_path, f"a{i}", n, CpuBackend(), cpu, i) for i, n in enumerate((8, 8, 8, 16, 16))]
    assert all(r.ok for r in results)
    gpu, _ = cuda_backend()
    refused = _job(tmp_path, "big", 16, gpu, MultiplyRequest(kernel="tiled", tile=64), 9)
    assert not refused.ok and refused.sidecar.name == "big.error.yaml"

    rendered = report.render(tmp_path / "out")
    assert rendered.folder == tmp_path / "out" / "report"
    assert_graphs(rendered.folder)
    loaded = report.load(tmp_path / "out")
    ok = {r.m: r for r in loaded.rows if r.status == "ok"}
    assert ok[8].repeats == 3 and ok[16].repeats == 2
    assert ok[8].mode == "files" and ok[8].kernel == "cpu"
    kernels = sorted(x.record.timings_ms.kernel for x in results[:3])
    assert ok[8].median("kernel") == kernels[1]
    assert ok[8].median("parse") is not None and ok[8].median("write") is not None

    summary = rendered.summary.read_text()
    # Jobs are counted, not the cases they are pooled into (2 ok cases here).
    assert "job sidecars; 6 jobs: 5 ok, 1 refused, in 3 cases." in summary
    refusals = table(summary, "## Refused cases")
    assert refusals["tiled"]["tile"] == "64"
    assert refusals["tiled"]["reason"].startswith("tile 64 needs 4096 threads per block")
    overall = table(summary, "## Graph 1")
    assert first_number(overall["cpu"]["no tile"]) == pytest.approx(ok[16].median("overall"), abs=5e-4)


def test_report_of_an_outbox_counts_every_job_and_shows_the_rectangular_one(tmp_path):
    """An outbox of 7 ok jobs, one of them 3×5 by 5×2: "7 ok", and the 3×5×2 case is in the summary."""
    (tmp_path / "out").mkdir()
    cpu = MultiplyRequest(kernel="cpu", tile=32)
    results = [_job(tmp_path, f"a{i}", n, CpuBackend(), cpu, i) for i, n in enumerate((8, 8, 8, 16, 16, 16))]
    rng = np.random.default_rng(7)
    src = tmp_path / "in" / "rect.txt"
    src.write_bytes(b"".join(input_chunks(random_matrix(rng, 3, 5), random_matrix(rng, 5, 2), square=False)))
    results.append(run_file(src, tmp_path / "out" / "rect.out", CpuBackend(), cpu))
    assert all(r.ok for r in results)

    summary = report.render(tmp_path / "out").summary.read_text()
    assert "7 jobs: 7 ok, in 3 cases." in summary
    others = table(summary, "## Other shapes")
    assert others["cpu"]["shape"] == "3×5×2" and others["cpu"]["jobs"] == "1"
    rect = next(r for r in report.load(tmp_path / "out").rows if r.m == 3)
    assert first_number(others["cpu"]["overall"]) == pytest.approx(rect.median("overall"), abs=5e-4)


def test_environment_names_no_cuda_version_for_the_cpu_backend(monkeypatch):
    """A machine with the CUDA toolkit (nvcc) but no GPU: the cpu backend's numbers ran on no CUDA."""
    nvcc = "Cuda compilation tools, release 13.0, V13.0.88"
    monkeypatch.setattr("mmd.bench.machine.command_output", lambda argv: nvcc if argv[0] == "nvcc" else None)
    env = bench.environment(CpuBackend())
    assert env["cuda_version"] is None and env["cuda_toolkit"] == "13.0"


@pytest.mark.parametrize(
    ("device", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3 (sm_90)", 67.0),
        ("NVIDIA H100 PCIe", 51.2),
        ("NVIDIA H200 (sm_90)", 67.0),
        ("NVIDIA A100-SXM4-40GB", 19.5),
        ("cpu x86_64 (numpy 2.1)", None),
        (None, None),
    ],
)
def test_peak_table(device, tflops):
    found = report.peak_for(device)
    assert (found[0] if found else None) == tflops


def test_without_matplotlib_the_report_says_how_to_add_it_before_any_work(tmp_path, monkeypatch, capsys):
    """matplotlib is the `report` extra: an install without it (a service's) gets one line and status 78,
    and nothing is written."""
    import sys

    from mmd.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    results = tmp_path / "results.csv"
    results.write_text("x\n")
    assert main(["report", str(results), "--out", str(tmp_path / "r")]) == 78
    err = capsys.readouterr().err
    assert "pip install 'mmd[report]'" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()
