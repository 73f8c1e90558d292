"""The benchmark loop on the CPU: plans, statuses (ok, wrong, refused, skipped, error), CSV/YAML, progress, CLI."""

from __future__ import annotations

import csv
import io
import itertools
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmd import bench, cpus
from mmd import kernels as registry
from mmd.backends import CpuBackend
from mmd.bench.stats import median_rank
from mmd.cli import main

from .fakes import COMPILE_MS, FakeNvml, cuda_backend, fake_gpu_opener

GPU_NAME = "NVIDIA H100 80GB HBM3 (sm_90)"
ROOT = Path(__file__).resolve().parent.parent


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
    # Exactly 2 timed calls (the cpu's timings are noisy): the noise loop has its own tests below.
    values = dict(kernels=("cpu",), sizes=(8, 16, 33), tiles=(32,), repeats=2, max_repeats=2)
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
    by_kernel = {r.kernel: r for r in run.rows}
    assert by_kernel["tiled"].status == "ok"
    wrong = by_kernel["coarse"]
    assert wrong.status == "wrong" and "MISMATCH" in wrong.reason and "row 1 col 1" in wrong.reason
    assert wrong.median("kernel") is None and not wrong.phases  # a wrong kernel is not timed
    assert not run.ok and run.failures == [wrong]
    _, rows = read_csv(run.csv_path)
    assert [r["status"] for r in rows] == ["ok", "wrong"]


def test_refused_tile_is_recorded_with_its_reason(tmp_path):
    backend, session = fake_gpu()
    run = bench.run_plan(plan(kernels=("tiled",), sizes=(16,), tiles=(32, 64)), backend, folder=tmp_path, env={})
    assert run.ok  # a refusal is the graceful failure the course asks for
    refused = [r for r in run.rows if r.status == "refused"]
    assert len(refused) == 1
    assert refused[0].tile == 64 and "4096 threads per block" in refused[0].reason
    assert session.products == 3  # warmup + 2 repeats at tile 32; tile 64 never reached the device
    ok = run.rows[0]
    assert ok.status == "ok" and ok.median("cuda") is not None
    assert ok.median("compile") == COMPILE_MS  # built in the warm-up, still recorded
    assert ok.phases["overall"].max < COMPILE_MS  # ... and not in the timed repeats


def test_unexpected_exception_is_an_error_and_the_run_goes_on(tmp_path):
    run = bench.run_plan(
        plan(kernels=("naive", "tiled"), sizes=(8,)), fake_gpu(crash="naive")[0], folder=tmp_path, env={}
    )
    assert [r.status for r in run.rows] == ["error", "ok"]
    assert "RuntimeError: boom" in run.rows[0].reason
    assert not run.ok


def test_gpu_kernels_are_skipped_on_the_cpu_backend(tmp_path):
    run = bench.run_plan(plan(kernels=("tiled", "cpu"), sizes=(8,)), CpuBackend(), folder=tmp_path, env={})
    assert [(r.kernel, r.status) for r in run.rows] == [("tiled", "skipped"), ("cpu", "ok")]
    assert "GPU backend" in run.rows[0].reason
    assert run.ok
    assert bench.default_kernels(CpuBackend()) == ("cpu",)
    assert bench.default_kernels(fake_gpu()[0]) == registry.COURSE_KERNELS
    assert set(registry.COURSE_KERNELS) == set(registry.NAMES) - {"tc1", "tc3", "cublas_tf32"}


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
    quiet = dict(load=lambda: 0.0)  # a machine other tests may load: the busy warning has a test of its own
    bench.run_plan(
        plan(sizes=(8, 16)), CpuBackend(), folder=tmp_path / "a", env={}, progress=bench.Progress(plain, tty=False),
        **quiet,
    )  # fmt: skip
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
        progress=bench.Progress(tty, tty=True, width=80),
        **quiet,
    )
    import re

    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", tty.getvalue())  # the terminal's control sequences
    assert "[1/2] tiled" in text and "[2/2] tiled" in text, text  # every result kept, above the bar
    assert "refused  tile 64 needs" in text
    assert text.rstrip().splitlines()[-1].startswith("mmd bench: 1 ok, 1 refused")
    drawn = text.replace("\r", "\n").splitlines()[1:-1]  # rich's: the first and last lines are plain ones
    assert all(len(line) <= 80 for line in drawn), "wider than the terminal"


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

    # mmd bench imports open_backend when it runs
    monkeypatch.setattr("mmd.backends.open_backend", fake_gpu_opener(tamper=_wrong("tiled")))
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


# -- timing rigor: L2 flush, repeat until the median is known, the SM clock ------------------------


def sequence_ms(values, then: float | None = None):
    """A fake kernel timer: ``values`` in turn (warm-ups included), then ``then`` for ever (else cycle)."""
    calls = iter(values)

    def kernel_ms(kernel: str, tile: int | None, n: int) -> float:
        return next(calls, then) if then is not None else next(calls)

    return kernel_ms


def test_new_columns_come_after_the_old_ones():
    """The course's columns (a results.csv written before the timing's rigor) keep their places."""
    course = (ROOT / "docs/results/course/results.csv").read_text().splitlines()[0].split(",")
    assert bench.COLUMNS[: len(course)] == tuple(course)
    assert course[-1] == "gflops" and len(bench.COLUMNS) > len(course)
    assert len(set(bench.COLUMNS)) == len(bench.COLUMNS)


def test_l2_is_flushed_before_every_kernel_call_in_memory_only(tmp_path):
    backend, session = fake_gpu()
    fixed = dict(kernels=("tiled",), sizes=(16,), repeats=3, max_repeats=3)
    run = bench.run_plan(plan(**fixed), backend, folder=tmp_path / "a", env={})
    assert run.rows[0].repeats == 3
    assert session.events == ["flush_l2", "product"] * 4  # the warm-up too: it runs as the timed calls do
    backend, session = fake_gpu()
    bench.run_plan(plan(**fixed, flush_l2=False), backend, folder=tmp_path / "b", env={})
    assert session.flushes == 0 and session.products == 4
    backend, session = fake_gpu()
    bench.run_plan(plan(**fixed, through_files=True), backend, folder=tmp_path / "c", env={})
    assert session.flushes == 0  # a job through files is timed as a grader meets it


def test_repeats_until_the_noisy_start_drops_out_of_the_medians_interval(tmp_path):
    # warm-up 9.0, then three slow calls (a cold clock), then steady at 1 ms.
    backend, session = cuda_backend(kernel_ms=sequence_ms([9.0, 4.0, 3.0, 2.0], then=1.0))
    run = bench.run_plan(plan(kernels=("tiled",), sizes=(16,), max_repeats=100), backend, folder=tmp_path, env={})
    row = run.rows[0]
    # With n samples, the 95 % interval of the median spans ranks j..n-1-j; the three slow ones fall
    # outside it once j >= 3, first at n = 15 (P(Bin(15, 1/2) <= 3) = 1.8 % <= 2.5 %).
    assert row.repeats == 15 and session.products == 16
    assert row.kernel_noise == 0.0 and row.converged is True
    assert row.phases["kernel"] == bench.Spread(median=1.0, min=1.0, max=4.0)
    assert row.overall_noise is not None


def test_the_cap_and_the_minimum(tmp_path):
    backend, _ = cuda_backend(kernel_ms=sequence_ms(itertools.cycle([1.0, 2.0])))
    capped = bench.run_plan(
        plan(kernels=("tiled",), sizes=(16,), repeats=5, max_repeats=12), backend, folder=tmp_path / "a", env={}
    ).rows[0]
    # Never settles: 6 calls at 1 ms and 6 at 2 ms, the median 1.5, its interval [1, 2].
    assert capped.repeats == 12 and capped.converged is False
    assert capped.kernel_noise == pytest.approx(1 / 3, abs=1e-4)
    backend, _ = cuda_backend(kernel_ms=sequence_ms([], then=2.5))
    steady = bench.run_plan(
        plan(kernels=("tiled",), sizes=(16,), repeats=7, max_repeats=100), backend, folder=tmp_path / "b", env={}
    ).rows[0]
    assert steady.repeats == 7 and steady.kernel_noise == 0.0 and steady.converged is True
    # Through files: exactly --repeats, whatever the noise; converged is for the loop in memory.
    backend, _ = cuda_backend(kernel_ms=sequence_ms(itertools.cycle([1.0, 2.0])))
    files = bench.run_plan(
        plan(kernels=("tiled",), sizes=(8,), repeats=3, max_repeats=100, through_files=True),
        backend,
        folder=tmp_path / "c",
        env={},
    ).rows[0]
    assert files.repeats == 3 and files.converged is None and files.kernel_noise is not None


def test_median_noise():
    assert bench.median_noise([]) is None
    assert bench.median_noise([3.0]) == 0.0
    assert bench.median_noise([1.0, 2.0, 3.0]) == pytest.approx(1 / 2)  # up to 5 samples: the whole range
    # The distribution-free 95 % ranks: n = 10 → 2nd..9th, n = 20 → 6th..15th, n = 100 → 40th..61st.
    assert [median_rank(n) for n in (5, 6, 10, 20, 100)] == [0, 0, 1, 5, 39]
    values = [float(v) for v in range(1, 21)]  # median 10.5, interval [6, 15]
    assert bench.median_noise(values) == pytest.approx((15 - 6) / (2 * 10.5))
    # It shrinks with more samples of the same spread (the spread itself does not).
    rng = np.random.default_rng(0)
    noisy = list(1.0 + 0.05 * rng.standard_normal(400))
    assert bench.median_noise(noisy[:400]) < bench.median_noise(noisy[:25]) / 2


class FakeClock:
    def __init__(self, *samples: bench.ClockSample) -> None:
        self.samples = list(samples)
        self.reads = 0

    def read(self) -> bench.ClockSample | None:
        self.reads += 1
        return self.samples[min(self.reads, len(self.samples)) - 1]


def test_sm_clock_is_recorded_and_throttling_flagged(tmp_path):
    steady = FakeClock(bench.ClockSample(1980.0, 1980.0, 0x1))  # idle between calls is not throttling
    # The reasons of every reading count (whatever the thread's timing adds between the first and last).
    hot = FakeClock(bench.ClockSample(1650.0, 1980.0, 0x4), bench.ClockSample(1650.0, 1980.0, 0x20 | 0x1))
    kernels = dict(kernels=("tiled", "cpu"), sizes=(8,))
    rows = bench.run_plan(plan(**kernels), fake_gpu()[0], folder=tmp_path / "a", env={}, clock=steady).rows
    by = {r.kernel: r for r in rows}
    assert (by["tiled"].sm_clock_mhz, by["tiled"].throttled, by["tiled"].throttle_reasons) == (
        1980.0,
        False,
        None,
    )
    assert steady.reads >= 2  # at the start and at the end of the timed calls at least
    assert by["cpu"].sm_clock_mhz is None and by["cpu"].throttled is None  # the host's kernel: no GPU clock
    row = bench.run_plan(plan(kernels=("tiled",), sizes=(8,)), fake_gpu()[0], folder=tmp_path / "b", env={}, clock=hot)
    flagged = row.rows[0]
    assert flagged.throttled is True
    assert flagged.throttle_reasons == "sw_power_cap,sw_thermal,sm_clock_1650_of_1980_mhz"
    assert "THROTTLED (sw_power_cap" in bench.describe_row(flagged)
    _, csv_rows = read_csv(row.csv_path)
    assert csv_rows[0]["throttled"] == "True" and csv_rows[0]["sm_clock_mhz"] == "1650.0"
    # Without a reader (no NVML): null, and the case runs as before.
    none = bench.run_plan(plan(kernels=("tiled",), sizes=(8,)), fake_gpu()[0], folder=tmp_path / "c", env={})
    assert none.rows[0].sm_clock_mhz is None and none.rows[0].throttled is None


def test_the_gpu_is_read_through_nvml_found_by_its_bus_id_never_by_a_process():
    """nvidia-smi was a process every 0.25 s while a case ran (on the CPU the case shares): NVML is a call."""
    nvml = FakeNvml(
        FakeNvml.Gpu("00000000:18:00.0"),
        FakeNvml.Gpu("00000000:65:00.0", sm_mhz=1755, reasons=0x4, pids=(os.getpid(), 4242)),
    )
    reader = bench.Nvml.find(0, "0000:65:00.0", lib=nvml)
    assert reader is not None
    assert reader.read() == bench.ClockSample(1755.0, 1980.0, 0x4, processes=2)  # by bus id, not by ordinal
    assert bench.Nvml.find(1, "", lib=nvml).read().sm_mhz == 1755.0  # no bus id: CUDA's ordinal
    older = FakeNvml(broken=("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses"))
    assert bench.Nvml.find(0, "", lib=older).read() == bench.ClockSample(1980.0, 1980.0, None, processes=None)
    assert bench.Nvml.find(0, "", lib=FakeNvml(present=False)) is None  # no driver: no reader, the case runs
    clock = bench.Nvml.find(0, "", lib=nvml)
    with bench.ClockSampler(clock, interval=0.01):
        pass
    assert "nvmlShutdown" not in nvml.calls
    import inspect

    assert "subprocess" not in inspect.getsource(bench.clock), "no process is started to read the GPU"


def test_a_case_on_a_busy_machine_is_recorded_as_busy_and_warned_of(tmp_path):
    """A 256³ case 100× slow on a shared box read as ±0.5 %: the noise of a steady slowdown. The load and the
    GPU's other processes go with each case, and a busy one is said so on its line and at the end."""
    gpu = FakeNvml(FakeNvml.Gpu("00000000:65:00.0", pids=(os.getpid(), 4242, 4343)))
    cores = cpus.usable_cores()
    load = cores + 5.5  # more runnable than cores, beyond the benchmark's own
    out = io.StringIO()
    run = bench.run_plan(
        plan(kernels=("tiled", "cpu"), sizes=(8,)), fake_gpu()[0], folder=tmp_path / "busy", env={},
        clock=bench.Nvml.find(0, "", lib=gpu), load=lambda: load, progress=bench.Progress(out, tty=False),
    )  # fmt: skip
    by = {r.kernel: r for r in run.rows}
    assert (by["tiled"].load_avg, by["tiled"].gpu_processes, by["tiled"].busy) == (load, 3, True)
    assert by["tiled"].busy_reasons == f"load {load:g} on {cores} cores,3 processes on the GPU"
    assert (by["cpu"].gpu_processes, by["cpu"].busy) == (None, True)  # the host's kernel: no GPU reading
    assert by["cpu"].busy_reasons == f"load {load:g} on {cores} cores"
    assert f"BUSY (load {load:g}" in bench.describe_row(by["tiled"])
    assert "2 cases ran on a busy machine" in out.getvalue()
    _, csv_rows = read_csv(run.csv_path)
    assert csv_rows[0]["busy"] == "True" and csv_rows[0]["gpu_processes"] == "3"
    quiet = bench.run_plan(
        plan(kernels=("tiled",), sizes=(8,)), fake_gpu()[0], folder=tmp_path / "quiet", env={},
        clock=bench.Nvml.find(0, "", lib=FakeNvml(FakeNvml.Gpu("00000000:65:00.0", pids=(os.getpid(),)))),
        load=lambda: 0.2,
    )  # fmt: skip
    row = quiet.rows[0]
    assert (row.load_avg, row.gpu_processes, row.busy, row.busy_reasons) == (0.2, 1, False, None)


def test_a_phase_s_quartiles_are_recorded_and_one_slow_call_cannot_stretch_them():
    calls = [{"kernel": 1.0 + 0.01 * i} for i in range(9)] + [{"kernel": 100.0}]  # one call 100× slow
    quartiles = bench.phase_quartiles(calls)["kernel"]
    assert quartiles.q3 < 1.1 and quartiles.q1 > 1.0
    assert bench.phase_stats(calls)["kernel"].max == 100.0  # the min–max is stretched by it
    assert bench.phase_quartiles([{"kernel": 2.0}])["kernel"] == bench.Quartiles(2.0, 2.0)


def test_cli_noise_options(tmp_path, monkeypatch, quiet_logs):

    # mmd bench imports open_backend when it runs
    monkeypatch.setattr("mmd.backends.open_backend", fake_gpu_opener())
    out = tmp_path / "r"
    args = ["bench", "--kernels", "tiled", "--sizes", "8", "--tiles", "32", "--out", str(out)]
    assert main([*args, "--repeats", "3", "--max-repeats", "4", "--noise", "1.5%", "--no-flush-l2"]) == 0
    (folder,) = out.iterdir()
    doc = yaml.safe_load((folder / "results.yaml").read_text())
    assert (doc["plan"]["noise"], doc["plan"]["max_repeats"], doc["plan"]["flush_l2"]) == (0.015, 4, False)
    assert doc["rows"][0]["repeats"] == 3
    with pytest.raises(SystemExit):
        main([*args, "--noise", "lots"])


# -- the ladder's plan -------------------------------------------------------------------------------


def test_ladder_plan_cases():
    cases = bench.ladder_plan().cases()
    assert [(c.kernel, c.m) for c in cases] == [
        (k, s) for s in (1024, 2048, 4096, 8192) for k in ("fast", "tc1", "tc3", "cublas", "cublas_tf32")
    ]
    assert all(c.tile is None and c.skip is None and c.m == c.k == c.n for c in cases)
    assert bench.default_kernels(fake_gpu()[0], "ladder") == bench.LADDER_KERNELS
    assert bench.default_kernels(CpuBackend(), "ladder") == ("cpu",)
    # The course's plan is unchanged by the ladder's kernels: none of them there but fast and cublas.
    assert not {c.kernel for c in bench.course_plan().cases()} & {"tc1", "tc3", "cublas_tf32"}


def test_cli_bench_ladder_on_the_fake_gpu(tmp_path, monkeypatch, quiet_logs):

    # mmd bench imports open_backend when it runs
    monkeypatch.setattr("mmd.backends.open_backend", fake_gpu_opener())
    out = tmp_path / "r"
    assert main(["bench", "--plan", "ladder", "--sizes", "16", "40", "--repeats", "2", "--out", str(out)]) == 0
    (folder,) = out.iterdir()
    _, rows = read_csv(folder / "results.csv")
    assert [(r["kernel"], r["m"], r["status"]) for r in rows] == [
        (k, s, "ok") for s in ("16", "40") for k in ("fast", "tc1", "tc3", "cublas", "cublas_tf32")
    ]
    assert yaml.safe_load((folder / "results.yaml").read_text())["plan"]["kernels"] == list(bench.LADDER_KERNELS)
