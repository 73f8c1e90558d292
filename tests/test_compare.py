"""``mmd bench --compare RUN_A RUN_B``: per-case ratios B/A with the two runs' noise, and a verdict."""

from __future__ import annotations

import math

import pytest

from mmd import bench, report
from mmd.cli import main


def row(kernel: str, size: int, kernel_ms: float | None, noise: float | None = 0.01, **more) -> bench.BenchRow:
    """A results row of an N×N×N case; kernel time ``kernel_ms``, overall twice it, both with ``noise``."""
    phases = {}
    if kernel_ms is not None:
        phases = {
            p: bench.Spread(ms, 0.9 * ms, 1.3 * ms) for p, ms in (("kernel", kernel_ms), ("overall", 2 * kernel_ms))
        }
        more = {"kernel_noise": noise, "overall_noise": noise, **more}
    values = dict(
        kernel=kernel, backend="cuda", tile=None, m=size, k=size, n=size, memory="device", mode="memory",
        status="ok", repeats=10, warmup=1, device="Fake GPU", phases=phases,
    )  # fmt: skip
    return bench.BenchRow(**{**values, **more})


def write(folder, rows) -> None:
    folder.mkdir()
    (folder / "results.csv").write_text(bench.to_csv(bench.BenchRow, rows))


@pytest.fixture
def runs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write(
        a,
        [
            row("fast", 1024, 2.0),
            row("tc1", 1024, 1.0, noise=0.02),
            row("tc3", 1024, 1.0, noise=0.02),
            row("cublas", 1024, 1.5),
            row("tc1", 2048, 4.0),
            row("tc3", 2048, 8.0, noise=None),  # a run from before the noise columns
            row("cublas_tf32", 2048, 1.0),
        ],
    )
    write(
        b,
        [
            row("fast", 1024, 1.0),  # twice as fast
            row("tc1", 1024, 1.1, noise=0.02, throttled=True),  # 10 % slower, ±2.8 %
            row("tc3", 1024, 1.02, noise=0.02),  # 2 % slower, ±2.8 %: noise
            row("cublas", 1024, None, status="refused", reason="no cuBLAS"),
            row("tc1", 2048, 4.0),
            row("tc3", 2048, 9.0, noise=None),
            row("tc1", 4096, 16.0),
        ],
    )
    return a, b


def test_ratios_noise_and_verdicts(runs):
    cmp = report.compare(*runs)
    by = {(c.key[0], c.key[2]): c for c in cmp.cases}
    fast = by[("fast", 1024)]
    assert fast.kernel.value == 0.5 and fast.overall.value == 0.5
    assert fast.kernel.noise == pytest.approx(math.hypot(0.01, 0.01))
    assert fast.verdict == "faster" and fast.kernel.measured
    tc1 = by[("tc1", 1024)]
    assert tc1.kernel.value == pytest.approx(1.1) and tc1.kernel.noise == pytest.approx(math.hypot(0.02, 0.02))
    assert tc1.verdict == "slower" and tc1.throttled == "B"
    assert by[("tc3", 1024)].verdict == "within noise"
    assert by[("tc1", 2048)].kernel.value == 1.0 and by[("tc1", 2048)].verdict == "within noise"
    old = by[("tc3", 2048)]  # no noise columns: half the min–max range, (1.3 - 0.9) / 2 = 20 % each
    assert not old.kernel.measured and old.kernel.noise == pytest.approx(math.hypot(0.2, 0.2))
    assert old.kernel.value == 1.125 and old.verdict == "within noise"
    assert by[("cublas", 1024)].verdict == "not compared (A ok, B refused)" and by[("cublas", 1024)].kernel is None
    assert by[("cublas_tf32", 2048)].verdict == "only in A"
    assert by[("tc1", 4096)].verdict == "only in B"
    assert [c.key[0] for c in cmp.cases][-1] == "tc1"  # B's own cases come last
    assert cmp.counts() == {
        "faster": 1,
        "slower": 1,
        "within noise": 3,
        "not compared (A ok, B refused)": 1,
        "only in A": 1,
        "only in B": 1,
    }


def test_the_printed_table(runs):
    text = report.compare(*runs).text()
    lines = text.splitlines()
    assert lines[0] == f"A = {runs[0] / 'results.csv'}"
    assert lines[2].startswith("B/A of the medians (under 1: B takes less time)")
    header = lines[3].split()
    assert header[:3] == ["kernel", "tile", "shape"] and "verdict" in header
    fast = next(line for line in lines if line.startswith("fast "))
    assert "2.000 → 1.000" in fast and "0.500 ±1.4%" in fast and fast.endswith("faster")
    tc1 = next(line for line in lines if line.startswith("tc1 ") and "1024x" in line)
    assert "1.100 ±2.8%" in tc1 and tc1.endswith("slower (throttled in B)")
    old = next(line for line in lines if line.startswith("tc3 ") and "2048x" in line)
    assert "1.125 ±28.3%~" in old
    assert lines[-2] == "8 cases: 1 faster, 1 slower, 3 within noise, 1 not compared (A ok, B refused), " + (
        "1 only in A, 1 only in B"
    )
    assert lines[-1].startswith("~: a run without noise columns")


def test_cli_compare_exits_0_and_runs_nothing(runs, capsys, monkeypatch):
    def no_backend(*args, **kwargs):
        raise AssertionError("--compare must not open a backend")

    # mmd bench imports open_backend when it runs
    monkeypatch.setattr("mmd.backends.open_backend", no_backend)
    a, b = runs
    assert main(["bench", "--compare", str(a), str(b / "results.csv")]) == 0
    out = capsys.readouterr().out
    assert out == report.compare(a, b / "results.csv").text()
    assert main(["bench", "--compare", str(a), str(a.parent / "nothing")]) == 2  # a path that cannot be used
    assert "nothing: no such file or folder" in capsys.readouterr().err


def test_a_real_run_against_itself_is_within_noise(tmp_path):
    """Two fake-GPU runs of the same plan: every case compared, none faster or slower."""
    from .test_bench import fake_gpu

    plan = bench.Plan(kernels=("tiled", "cublas"), sizes=(16, 32), tiles=(32,), repeats=3)
    one = bench.run_plan(plan, fake_gpu()[0], folder=tmp_path / "one", env={})
    two = bench.run_plan(plan, fake_gpu()[0], folder=tmp_path / "two", env={})
    cmp = report.compare(one.folder, two.yaml_path)
    assert len(cmp.cases) == 4
    assert all(c.kernel is not None and c.kernel.value == 1.0 and c.verdict == "within noise" for c in cmp.cases)
