"""The benchmark loop on the CPU: plans, statuses (ok, wrong, refused, skipped, error), CSV/YAML, progress, CLI."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
import yaml

from mmd import bench
from mmd import kernels as registry
from mmd.backends import CpuBackend
from mmd.cli import main

from .fakes import COMPILE_MS, cuda_backend, fake_gpu_opener

GPU_NAME = "NVIDIA H100 80GB HBM3 (sm_90)"


@pytest.fixture
def quiet_logs(monkeypatch):
    """In-process CLI calls must not point structlog at pytest's captured (later closed) stderr."""
    monkeypatch.setattr("mmd.logs.configure", lambda *args, **kwargs: None)


def fake_gpu(wrong: str | None = None, crash: str | None = None):
    """The CUDA backend on the fake GPU, named like an H100, kernel times ranked down the ladder.

    ``wrong`` names a kernel whose results are off by one in C[0, 0];
    ``crash`` names one that raises a plain exception (a bug).
    """

    def tamper(kernel: str, c: np.ndarray) -> None:
        if kernel == crash:
            raise RuntimeError("boom")
        if kernel == wrong:
            c[0, 0] += 1.0

    def kernel_ms(kernel: str, tile: int | None, n: int) -> float:
        rank = registry.NAMES.index(kernel) + 1
        return 1e-4 * n * n / rank * (1 + 4 / (tile or 32))

    return cuda_backend(tamper=tamper, kernel_ms=kernel_ms, name=GPU_NAME)


def read_csv(path):
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return reader.fieldnames, list(reader)


def plan(**kw) -> bench.Plan:
    values = dict(kernels=("cpu",), sizes=(8, 16, 33), tiles=(32,), repeats=2)
    values.update(kw)
    return bench.Plan(**values)


def test_cpu_run_writes_csv_and_yaml_with_every_column(tmp_path):
    run = bench.run_plan(plan(), CpuBackend(), folder=tmp_path / "r")
    assert run.ok and run.complete
    header, rows = read_csv(run.csv_path)
    assert tuple(header) == bench.COLUMNS
    for phase in bench.PHASES:
        assert {f"{phase}_median_ms", f"{phase}_min_ms", f"{phase}_max_ms"} <= set(header)
    assert [(r["kernel"], r["m"], r["k"], r["n"], r["status"]) for r in rows] == [
        ("cpu", str(s), str(s), str(s), "ok") for s in (8, 16, 33)
    ]
    for r in rows:
        assert r["mode"] == "memory" and r["repeats"] == "2" and r["backend"] == "cpu"
        assert r["tile"] == "" and r["memory"] == ""  # no tile and no device memory on the CPU
        for phase in ("kernel", "overall"):
            lo, med, hi = (float(r[f"{phase}_{s}_ms"]) for s in ("min", "median", "max"))
            assert 0 <= lo <= med <= hi
        assert r["cuda_median_ms"] == "" and r["parse_median_ms"] == ""
        assert float(r["gflops"]) > 0
        assert float(r["rel_error"]) < 1e-6

    doc = yaml.safe_load(run.yaml_path.read_text())
    assert doc["complete"] is True
    assert doc["columns"] == list(bench.COLUMNS)
    for key in (
        "device",
        "driver_version",
        "cuda_version",
        "pycuda_version",
        "mmd_version",
        "numpy_version",
        "host",
        "date",
    ):
        assert key in doc["environment"]
    assert doc["plan"]["sizes"] == [8, 16, 33]
    assert len(doc["rows"]) == 3
    for yrow, crow in zip(doc["rows"], rows, strict=True):
        assert set(yrow) == set(bench.COLUMNS)
        assert yrow["kernel_median_ms"] == float(crow["kernel_median_ms"])


def test_through_files_times_the_grader_phases(tmp_path):
    run = bench.run_plan(plan(sizes=(8, 33), through_files=True), CpuBackend(), folder=tmp_path, env={})
    assert run.ok
    _, rows = read_csv(run.csv_path)
    for r in rows:
        assert r["mode"] == "files" and r["status"] == "ok"
        for phase in ("read", "parse", "kernel", "emit", "write", "overall"):
            assert float(r[f"{phase}_median_ms"]) >= 0
        assert float(r["overall_median_ms"]) >= float(r["parse_median_ms"]) + float(r["kernel_median_ms"])


def test_wrong_result_fails_the_case_loudly(tmp_path, capsys):
    run = bench.run_plan(
        plan(kernels=("tiled", "coarse"), sizes=(16,)),
        fake_gpu(wrong="coarse")[0],
        folder=tmp_path,
        env={},
        progress=bench.Progress(io.StringIO(), tty=False),
    )
    by_kernel = {r["kernel"]: r for r in run.rows}
    assert by_kernel["tiled"]["status"] == "ok"
    wrong = by_kernel["coarse"]
    assert wrong["status"] == "wrong" and "MISMATCH" in wrong["reason"] and "row 1 col 1" in wrong["reason"]
    assert wrong["kernel_median_ms"] is None  # a wrong kernel is not timed
    assert not run.ok and run.failures == [wrong]
    _, rows = read_csv(run.csv_path)
    assert [r["status"] for r in rows] == ["ok", "wrong"]


def test_refused_tile_is_recorded_with_its_reason(tmp_path):
    backend, session = fake_gpu()
    run = bench.run_plan(plan(kernels=("tiled",), sizes=(16,), tiles=(32, 64)), backend, folder=tmp_path, env={})
    assert run.ok  # a refusal is the graceful failure the course asks for
    refused = [r for r in run.rows if r["status"] == "refused"]
    assert len(refused) == 1
    assert refused[0]["tile"] == 64 and "4096 threads per block" in refused[0]["reason"]
    assert session.products == 3  # warmup + 2 repeats at tile 32; tile 64 never reached the device
    ok = run.rows[0]
    assert ok["status"] == "ok" and ok["cuda_median_ms"] is not None
    assert ok["compile_median_ms"] == COMPILE_MS  # built in the warm-up, still recorded
    assert ok["overall_max_ms"] < COMPILE_MS  # ... and not in the timed repeats


def test_unexpected_exception_is_an_error_and_the_run_goes_on(tmp_path):
    run = bench.run_plan(
        plan(kernels=("naive", "tiled"), sizes=(8,)), fake_gpu(crash="naive")[0], folder=tmp_path, env={}
    )
    assert [r["status"] for r in run.rows] == ["error", "ok"]
    assert "RuntimeError: boom" in run.rows[0]["reason"]
    assert not run.ok


def test_gpu_kernels_are_skipped_on_the_cpu_backend(tmp_path):
    run = bench.run_plan(plan(kernels=("tiled", "cpu"), sizes=(8,)), CpuBackend(), folder=tmp_path, env={})
    assert [(r["kernel"], r["status"]) for r in run.rows] == [("tiled", "skipped"), ("cpu", "ok")]
    assert "GPU backend" in run.rows[0]["reason"]
    assert run.ok
    assert bench.default_kernels(CpuBackend()) == ("cpu",)
    assert bench.default_kernels(fake_gpu()[0]) == registry.NAMES


def test_course_plan_cases():
    cases = bench.course_plan().cases()
    keys = [(c.kernel, c.m, c.tile) for c in cases]
    assert len(keys) == len(set(keys))
    assert {c.m for c in cases} == {32, 256, 512, 1024, 2048, 4096}
    assert all(c.m == c.k == c.n for c in cases)
    tiled = [c for c in cases if registry.get(c.kernel).uses_tile]
    assert {c.kernel for c in tiled} == {n for n in registry.NAMES if registry.get(n).uses_tile}
    for name in {c.kernel for c in tiled}:
        assert sorted(c.tile for c in tiled if c.kernel == name and c.m == 4096) == [4, 8, 16, 32, 64]
        assert sorted(c.m for c in tiled if c.kernel == name and c.tile == 32) == [32, 256, 512, 1024, 2048, 4096]
        assert {c.tile for c in tiled if c.kernel == name and c.m < 4096} == {32}
    untiled = [c for c in cases if not registry.get(c.kernel).uses_tile]
    assert all(c.tile is None for c in untiled)
    assert sorted(c.m for c in untiled if c.kernel == "cublas") == [32, 256, 512, 1024, 2048, 4096]
    cpu = {c.m: c.skip for c in cases if c.kernel == "cpu"}
    assert cpu[2048] is None and cpu[4096] is not None
    assert "--cpu-max-size" in cpu[4096], "the skip names the flag that lifts it (there is no such setting)"
    assert [c.m for c in cases] == sorted(c.m for c in cases)  # grouped by size
    assert all(c.skip is None for c in bench.course_plan(cpu_max_size=None).cases())


def test_grid_plan_and_validation():
    grid = plan(kernels=("tiled",), sizes=(8, 16), tiles=(4, 8), grid=True)
    assert [(c.m, c.tile) for c in grid.cases()] == [(8, 4), (8, 8), (16, 4), (16, 8)]
    with pytest.raises(Exception, match="unknown kernel"):
        plan(kernels=("nope",))
    with pytest.raises(ValueError):
        plan(repeats=0)
    with pytest.raises(ValueError):
        plan(memory="flash")


def test_progress_plain_lines_and_terminal_bar(tmp_path):
    plain, tty = io.StringIO(), io.StringIO()
    bench.run_plan(
        plan(sizes=(8, 16)), CpuBackend(), folder=tmp_path / "a", env={}, progress=bench.Progress(plain, tty=False)
    )
    lines = plain.getvalue().splitlines()
    assert lines[0].startswith("mmd bench: 2 cases")
    assert lines[1].startswith("[1/2] cpu") and " ok " in lines[1]
    assert lines[2].startswith("[2/2] cpu")
    assert lines[-1].startswith("mmd bench: 2 ok")
    assert "\r" not in plain.getvalue()
    bench.run_plan(
        plan(kernels=("tiled",), sizes=(8,), tiles=(32, 64)),
        fake_gpu()[0],
        folder=tmp_path / "b",
        env={},
        progress=bench.Progress(tty, tty=True),
    )
    text = tty.getvalue()
    assert "\r[" in text and "2/2" in text
    assert "refused  tile 64 needs" in text  # a refusal stays on its own line


def test_cli_bench_on_the_cpu(tmp_path, capsys, quiet_logs):
    out = tmp_path / "bench"
    code = main(["bench", "--backend", "cpu", "--sizes", "8", "16", "--repeats", "2", "--out", str(out)])
    assert code == 0
    (folder,) = out.iterdir()
    assert (folder / "results.csv").is_file() and (folder / "results.yaml").is_file()
    _, rows = read_csv(folder / "results.csv")
    assert [(r["kernel"], r["m"], r["status"]) for r in rows] == [("cpu", "8", "ok"), ("cpu", "16", "ok")]
    assert str(folder / "results.csv") in capsys.readouterr().out


def test_cli_bench_exits_1_on_a_wrong_result(tmp_path, monkeypatch, capsys, quiet_logs):
    import mmd.cli.bench_cmd as bench_cmd

    monkeypatch.setattr(bench_cmd, "open_backend", fake_gpu_opener(tamper=_wrong("tiled")))
    code = main(
        ["bench", "--kernels", "tiled", "--sizes", "8", "--tiles", "32", "--repeats", "1", "--out", str(tmp_path)]
    )
    assert code == 1
    assert "FAILED" in capsys.readouterr().err


def _wrong(name: str):
    def tamper(kernel: str, c: np.ndarray) -> None:
        if kernel == name:
            c[0, 0] += 1.0

    return tamper
