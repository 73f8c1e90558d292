"""The report: every graph as PNG and SVG, summary numbers equal to the CSV's, sidecar folders, CLI."""

from __future__ import annotations

import itertools
import re
import struct
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from mmd import bench, report, resources
from mmd.backends import CpuBackend, MultiplyRequest
from mmd.bench.rows import AccuracyRow
from mmd.cli import main
from mmd.generate import input_chunks, random_matrix
from mmd.report.sweeps import size_sweep

from .conftest import ROOT, run_file
from .fakes import cuda_backend
from .test_bench import fake_gpu, read_csv

#: matplotlib renders every graph: left out of `make quick`, run by `make test`.
pytestmark = pytest.mark.integration

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
    assert len(rendered.files) == 8  # and report.html


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
    assert rendered.folder == tmp_path / "out.report"
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
    assert err.endswith(f": {resources.install_hint('report')}\n") and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


# -- the graphs: readable axes, and the data they show ------------------------------------------------


def labelled_ticks(ax, which: str = "y") -> list[float]:
    """The major ticks of ``ax``'s axis that are drawn with a label, as the figure shows them."""
    ax.figure.canvas.draw()
    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if which == "y" else ax.get_xlim())
    return [
        tick.get_loc()
        for tick in axis.get_major_ticks()
        if lo <= tick.get_loc() <= hi and tick.label1.get_visible() and tick.label1.get_text()
    ]


def assert_log_axis_reads(ax, data) -> None:
    """A log axis: at least 3 labelled ticks, spread over the data's range, and every value inside the view."""
    data = [v for v in data if v is not None and v > 0]
    assert ax.get_yscale() == "log"
    ticks = labelled_ticks(ax)
    assert len(ticks) >= report.figures.MIN_LABELS, (ticks, min(data), max(data))
    assert min(ticks) <= max(data) and max(ticks) >= min(data)
    # the labels spread over at least half of the data's span (in decades)
    assert np.log10(max(ticks) / min(ticks)) >= 0.5 * np.log10(max(data) / min(data)) - 1e-9
    lo, hi = ax.get_ylim()
    assert lo < min(data) and max(data) < hi


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(1e-7, 7e-7), (130.0, 190.0), (100.0, 200.0), (0.017, 23.0), (2.6e4, 3.6e5), (1e-7, 1e-3), (5.0, 5.5)],
)
def test_log_ticks_label_any_span(lo, hi):
    """graph 4's errors from 1e-7 to 7e-7 had one label (10⁻⁷), graph 3's GFLOP/s two (10², 2×10²)."""
    ticks = report.figures.log_ticks(lo, hi)
    assert sum(lo <= t <= hi for t in ticks) >= report.figures.MIN_LABELS, ticks
    assert all(t > 0 for t in ticks)


def test_tick_labels_read_as_numbers():
    label = report.figures.tick_label
    assert [label(v) for v in (0.05, 1, 250, 4096, 50_000, 200_000)] == [
        "0.05",
        "1",
        "250",
        "4096",
        "50,000",
        "200,000",
    ]
    assert label(2e-7) == r"$2\times10^{-7}$" and label(1e-7) == "$10^{-7}$" and label(3e8) == r"$3\times10^{8}$"


def test_every_log_axis_has_labels_for_its_data(gpu_results):
    loaded = report.load(gpu_results.folder)
    shown = report.sections(loaded)
    fig = report.figures.size_figure(shown.sweeps, shown.tile, shown.peak)
    ax_t, ax_g = fig.axes
    rows = [r for rs in shown.sweeps.values() for r in rs]
    assert_log_axis_reads(ax_t, [r.median("kernel") for r in rows])
    assert_log_axis_reads(ax_g, [r.gflops for r in rows] + [67_000.0])  # the H100's peak line is drawn too
    assert [t.get_text() for t in ax_t.get_xticklabels()] == ["8", "16", "32"]
    fig = report.figures.bars_figure(shown.sweep, lambda r: ("overall", False), "t", "ms", log=True)
    (ax,) = fig.axes
    cells = [r.quartiles["overall"] for r in shown.sweep.cells.values() if r.status == "ok"]
    assert_log_axis_reads(ax, [q.q1 for q in cells] + [q.q3 for q in cells])
    # errors within one decade, as a cpu-only accuracy sweep has them
    narrow = [
        bench.AccuracyRow(kernel="cpu", backend="cpu", m=64, k=k, n=64, max_rel_error=e * 1.8, rms_rel_error=e)
        for k, e in ((32, 1.0e-7), (64, 1.4e-7), (128, 2.0e-7), (256, 2.8e-7), (512, 3.9e-7))
    ]
    (ax,) = report.figures.accuracy_figure(report.accuracy_sweep(narrow), "M = 64, N = 64").axes
    assert_log_axis_reads(ax, [r.rms_rel_error for r in narrow] + [r.max_rel_error for r in narrow])


def test_the_graphs_show_the_rows_values(gpu_results):
    """Bar heights, error bars and line points are the results' medians, minima, maxima and GFLOP/s."""
    loaded = report.load(gpu_results.csv_path)
    shown = report.sections(loaded)
    fig = report.figures.bars_figure(shown.sweep, lambda r: ("overall", False), "t", "ms", log=False)
    (ax,) = fig.axes
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    ok = [r for r in shown.sweep.cells.values() if r.status == "ok"]
    assert heights == sorted(round(r.median("overall"), 6) for r in ok)
    # each error bar runs over the interquartile range, which one slow call cannot stretch
    spans = sorted((round(lo, 6), round(hi, 6)) for c in ax.collections for (_, lo), (_, hi) in c.get_segments())
    assert spans == sorted((round(r.quartiles["overall"].q1, 6), round(r.quartiles["overall"].q3, 6)) for r in ok)
    assert ax.get_ylabel() == "ms; bars: interquartile range)"
    fig = report.figures.size_figure(shown.sweeps, shown.tile, shown.peak)
    ax_t, ax_g = fig.axes
    for line_t, line_g, (name, rows) in zip(ax_t.get_lines(), ax_g.get_lines(), shown.sweeps.items(), strict=False):
        assert line_t.get_label() == line_g.get_label() == name
        assert list(line_t.get_xdata()) == [r.size for r in rows]
        assert list(line_t.get_ydata()) == [r.median("kernel") for r in rows]
        assert list(line_g.get_ydata()) == [r.gflops for r in rows]
    assert ax_g.get_lines()[-1].get_ydata()[0] == 67_000.0  # the fp32 peak of an H100 SXM


def test_results_without_quartiles_show_their_min_max_and_say_so():
    """docs/results/course is from before the quartiles were recorded."""
    loaded = report.load(ROOT / "docs" / "results" / "course" / "results.yaml")
    sweep = report.sections(loaded).sweep
    (ax,) = report.figures.bars_figure(sweep, lambda r: ("overall", False), "t", "time (ms, median", log=False).axes
    assert ax.get_ylabel() == "time (ms, median; bars: min–max, these results have no quartiles)"
    ok = [r for r in sweep.cells.values() if r.status == "ok"]
    spans = sorted((round(lo, 6), round(hi, 6)) for c in ax.collections for (_, lo), (_, hi) in c.get_segments())
    assert spans == sorted((round(r.spread("overall").min, 6), round(r.spread("overall").max, 6)) for r in ok)


def test_every_series_of_the_course_s_graphs_has_a_color_of_its_own():
    """The course's results hold ten kernels and the cpu: prefetch and cpu were both green in graph 3."""
    loaded = report.load(ROOT / "docs" / "results" / "course" / "results.yaml")
    shown = report.sections(loaded)
    (ax_t, _) = report.figures.size_figure(shown.sweeps, shown.tile, shown.peak).axes
    colors = [str(line.get_color()) for line in ax_t.get_lines()]
    assert len(shown.sweeps) >= 10 and len(set(colors)) == len(colors), colors


def _overlaps(fig) -> list[tuple[str, str]]:
    """Neighbouring x tick labels of each of ``fig``'s axes whose drawn boxes overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        shown = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in shown]
        found += [(a, b) for (a, box_a), (b, box_b) in itertools.pairwise(boxes) if box_a.overlaps(box_b)]
    return found


#: The sizes of an outbox of students' jobs: powers of two, and the round numbers beside them.
CROWDED = (8, 16, 32, 64, 100, 128, 200, 256, 300, 500, 512, 1000, 1024, 2000, 2048, 3000, 4096, 8192)


def test_graph_3_labels_no_size_over_another_and_the_largest_always():
    """An outbox's sizes crowd graph 3's axis (1000 beside 1024): its labels overlapped, unreadable."""
    spread = bench.Spread(1.0, 1.0, 1.0)
    rows = [
        bench.BenchRow(kernel="cpu", backend="cpu", m=n, k=n, n=n, phases={"kernel": spread}, gflops=2.0 * n)
        for n in CROWDED
    ]
    fig = report.figures.size_figure(size_sweep(rows, None), None, None)
    assert _overlaps(fig) == []
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_xticklabels() if t.get_text()][-1] == "8192"
        assert list(ax.get_xticks()) == list(CROWDED), "a tick at every size, labelled or not"
    narrow = [bench.AccuracyRow(kernel="cpu", backend="cpu", m=64, k=k, n=64, max_rel_error=2e-7, rms_rel_error=1e-7)
              for k in CROWDED]  # fmt: skip
    assert _overlaps(report.figures.accuracy_figure(report.accuracy_sweep(narrow), "M = 64, N = 64")) == []


def _refused_huge_header(out):
    """An error sidecar whose header (100000×100000) promised more than its file held: refused before any work."""
    src = out.parent / "in" / "huge.txt"
    src.parent.mkdir(exist_ok=True)
    src.write_text("100000\n1.00 2.00\n")
    result = run_file(src, out / "huge.out", CpuBackend(), MultiplyRequest(kernel="cpu", tile=32))
    assert not result.ok and result.record.shape.m == 100000


def test_an_outbox_with_a_refused_job_graphs_the_jobs_that_ran(tmp_path):
    """Graphs 1-2 showed 100000×100000, the refused header's size, empty but for its label."""
    out = tmp_path / "out"
    out.mkdir()
    cpu = MultiplyRequest(kernel="cpu", tile=32)
    assert all(_job(tmp_path, f"a{i}", n, CpuBackend(), cpu, i).ok for i, n in enumerate((8, 16, 16)))
    _refused_huge_header(out)
    rendered = report.render(out)
    assert rendered.size == 16
    summary = rendered.summary.read_text()
    assert "Graph 1: overall time at 16×16" in summary and "100000×100000" not in summary.split("## Refused")[0]
    assert "100000" in table(summary, "## Refused cases")["cpu"]["reason"], "listed with the refusals"
    texts = [t.get_text() for t in report.figures.bars_figure(
        report.sections(report.load(out)).sweep, lambda r: ("overall", False), "t", "ms", log=False
    ).axes[0].texts]  # fmt: skip
    assert "refused" not in texts


def test_the_report_of_an_outbox_goes_beside_it_never_into_it(tmp_path, capsys, quiet_logs):
    """A live outbox's readers (graders, the daemon's sweeps) see results only: the report is ``<outbox>.report``
    beside it, or where -o says."""
    out = tmp_path / "out"  # _job's outbox
    out.mkdir()
    assert _job(tmp_path, "a", 8, CpuBackend(), MultiplyRequest(kernel="cpu", tile=32), 1).ok
    before = sorted(p.name for p in out.iterdir())
    rendered = report.render(out)
    assert rendered.folder == tmp_path / "out.report" and (tmp_path / "out.report" / "summary.md").is_file()
    assert sorted(p.name for p in out.iterdir()) == before
    assert main(["report", str(out), "-o", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "summary.md").is_file() and sorted(p.name for p in out.iterdir()) == before
    assert str(tmp_path / "elsewhere" / "summary.md") in capsys.readouterr().out


#: Names with characters the graphs' font (DejaVu Sans) lacks: CJK (drawn in a font that has them where one is
#: installed, else escaped), and a private use character that one of matplotlib's own fonts (STIX) draws.
UNDRAWN = ("行列.cu", "田中 由紀", "\ue000x")


def test_a_name_of_characters_the_font_lacks_is_drawn_without_a_warning():
    """matplotlib warns "Glyph ... missing from font(s)" (an error under -W error) and draws a box for each
    character its font lacks. A kernel's or a student's name is drawn in a font that has its characters where
    one is installed, else with those characters as escapes (``\\u884c``), never as boxes."""
    from matplotlib import font_manager, ft2font

    from mmd.report import figures

    by_tile, by_size = figures.student_figures({n: ({8: 2.0, 16: 1.0}, {64: 1.0, 128: 6.0}) for n in UNDRAWN}, 128, 16)
    for fig in (by_tile, by_size):
        figures.png_bytes(fig, 72)
        (legend,) = [a.get_legend() for a in fig.axes if a.get_legend() is not None]
        for text, name in zip(legend.get_texts(), UNDRAWN, strict=True):
            shown = text.get_text()
            files = [font_manager.findfont(font_manager.FontProperties(family=[f])) for f in text.get_fontfamily()]
            has = set().union(*(ft2font.FT2Font(f).get_charmap() for f in files))
            assert all(ord(c) in has for c in shown), (name, shown)
            assert all(c in shown or f"\\u{ord(c):04x}" in shown for c in name), (name, shown)
    sweep = {n: [AccuracyRow(kernel=n, backend="cuda", m=8, k=k, n=8, rms_rel_error=1e-7, max_rel_error=1e-6)
                 for k in (8, 16)] for n in UNDRAWN}  # fmt: skip
    figures.png_bytes(figures.accuracy_figure(sweep, "M = 16"), 72)
