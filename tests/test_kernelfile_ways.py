"""A kernel file every way in, on a machine without a GPU: `mmd bench --kernel-file`, the daemon's kernel folders
(`kernel_folders`, a job's name picking `NAME.cu`), and the pipeline's routing of a kernel file's job to a process of
its own. `mmd submit --slurm --kernel-file` is in tests/test_slurm.py.

The launches run in their own real processes over the stand-in driver (tests/fakegpu, as tests/test_kernelfile_run.py
does): the protocol, the routing, the rows, the graphs and the sidecars are real; tests/gpu/test_kernelfile_ways.py
runs the same on a GPU.
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmd import bench, config, jobname, record, textformat
from mmd.backends.base import Backend
from mmd.config import Settings
from mmd.errors import ConfigError, KernelError
from mmd.job import describe
from mmd.kernelchoice import KernelChoice, in_folders
from mmd.pipeline import run_job
from mmd.record import reader

from .conftest import ROOT, run_mmd, wait_for
from .fakes import FakeNvml, cuda_backend
from .test_daemon import Served, check_ok, error_of
from .test_kernelfile_run import FAKE_GPU, fake_gpu, integer_input, kernel

pytestmark = pytest.mark.integration

EXAMPLES = ROOT / "docs" / "examples"


def course_files(folder: Path) -> list[Path]:
    """The course's P1 and P2 (docs/examples' naive and tiled kernels) under the course's names."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for source, name in (("naive.cu", "p1.cu"), ("tiled.cu", "p2.cu")):
        shutil.copyfile(EXAMPLES / source, folder / name)
        out.append(folder / name)
    return out


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# -- a job's name picks a kernel folder's file ----------------------------------------------------------------


def test_a_name_picks_a_kernel_folders_file_and_never_shadows_mmds_own(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        kernel(folder, "p1.cu")
    kernel(second, "p2.cu")
    kernel(first, "tiled.cu")  # a built-in's name: never looked up
    folders = (first, second)
    assert in_folders("p1", folders) == first / "p1.cu"  # the first folder that holds one
    assert in_folders("p2", folders) == second / "p2.cu"
    assert in_folders("tiled", folders) is None
    for name in ("../first/p1", "p1.cu", ".p1", "-p1", "p 1", ""):
        assert in_folders(name, folders) is None
    parsed = jobname.parse("m@kernel=p1,tile=8.txt", folders)
    assert parsed.kernel_file == first / "p1.cu" and parsed.overrides == {"kernel": "p1", "tile": 8}
    assert jobname.parse("m@kernel=tiled.txt", folders).kernel_file is None
    with pytest.raises(Exception, match=r"unknown kernel 'p9'.*no kernel folder \(kernel_folders\) holds p9\.cu"):
        jobname.parse("m@kernel=p9.txt", folders)
    with pytest.raises(Exception, match=r"unknown kernel 'p1'; choose one of naive"):
        jobname.parse("m@kernel=p1.txt")  # no kernel folders: names pick mmd's own only


def test_a_jobs_kernel_file_is_the_jobs_own_not_its_kernel_setting(tmp_path: Path) -> None:
    kernel(tmp_path, "p1.cu")
    base = Settings().with_values({"kernel_folders": [str(tmp_path)]}, "test")
    job = describe(tmp_path / "m@kernel=p1.txt", tmp_path / "m.out", base)
    assert job.refusal is None and job.kernel_file == tmp_path / "p1.cu"
    assert job.settings.kernel == base.kernel and job.name_settings == {"kernel": "p1"}
    both = describe(tmp_path / "m@kernel=p1.txt", tmp_path / "m.out", base, kernel_file=tmp_path / "p1.cu")
    assert both.refusal is not None and "drop one" in both.refusal.reason
    picked = base.with_values({"name_settings": ["kernel=tiled"]}, "test")  # names may pick tiled only
    refused = describe(tmp_path / "m@kernel=p1.txt", tmp_path / "m.out", picked)
    assert refused.refusal is not None and "kernel p1 is not allowed here" in refused.refusal.reason


def test_kernel_folders_are_off_by_default_and_never_in_the_inbox_or_outbox(tmp_path: Path) -> None:
    assert Settings().kernel_folders == ()
    loaded = config.load(None, environ={"MMD_KERNEL_FOLDERS": f"/srv/a{os.pathsep}/srv/b"})
    assert loaded.kernel_folders == (Path("/srv/a"), Path("/srv/b"))
    for inside in ("inbox", "inbox/kernels", "outbox/x"):
        with pytest.raises(ConfigError, match=r"kernel_folders: .* is in the (inbox|outbox)"):
            Settings().with_values({"kernel_folders": [inside]}, "test")
    with pytest.raises(ConfigError, match="must be a list of folders"):
        Settings().with_values({"kernel_folders": 3}, "test")


def test_mmd_run_runs_the_file_a_name_picks(tmp_path: Path) -> None:
    folder = tmp_path / "kernels"
    folder.mkdir()
    k = kernel(folder, "p1.cu")
    src = tmp_path / "a@kernel=p1,tile=8.txt"
    a, b = integer_input(src, 9, 7, 5)
    done = run_mmd("run", str(src), cwd=tmp_path, env=fake_gpu(MMD_KERNEL_FOLDERS=str(folder)))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a@kernel=p1,tile=8.out").read_bytes() == b"".join(textformat.emit_chunks(np.matmul(a, b)))
    rec = reader.read(tmp_path / "a@kernel=p1,tile=8.timing.yaml")
    assert isinstance(rec, record.TimingRecord)
    assert rec.kernel == "p1.cu" and rec.tile == 8 and rec.device.startswith("Fake GPU")
    assert rec.kernel_file is not None and rec.kernel_file.sha256 == hashlib.sha256(k.read_bytes()).hexdigest()
    assert rec.context.name_settings == {"kernel": "p1", "tile": 8}


# -- the pipeline: a kernel file's job never runs on the caller's backend ---------------------------------


def test_the_pipeline_runs_a_kernel_files_job_in_a_process_of_its_own(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", FAKE_GPU + os.pathsep + str(ROOT))  # the launch process's driver
    src = tmp_path / "m.txt"
    a, b = integer_input(src, 6, 6, 6)

    def never(settings: Settings) -> Backend:
        raise AssertionError("a kernel file's job asked for the caller's backend")

    job = describe(src, tmp_path / "m.out", Settings(), kernel_file=kernel(tmp_path, "p1.cu"))
    result = run_job(job, never)
    assert result.ok, result.error
    assert (tmp_path / "m.out").read_bytes() == b"".join(textformat.emit_chunks(np.matmul(a, b)))
    assert isinstance(result.record, record.TimingRecord) and result.record.kernel == "p1.cu"
    tile64 = describe(
        src, tmp_path / "t.out", Settings().with_values({"tile": 64}, "test"), kernel_file=job.kernel_file
    )
    refused = run_job(tile64, never)
    assert refused.error is not None and refused.error.kind == "tile"
    assert yaml.safe_load(refused.sidecar.read_text())["requested"]["kernel"] == "p1.cu"


# -- the daemon where the admin allows it ------------------------------------------------------------------


def test_the_daemon_runs_a_kernel_folders_file_beside_its_own_backend(tmp_path: Path) -> None:
    """The worker's backend is the cpu's; a job whose name picks p1.cu runs on the (stand-in) GPU in a process of
    its own, a kernel that faults is its job's error alone, and the next jobs are served."""
    folder = tmp_path / "kernels"
    folder.mkdir()
    kernel(folder, "p1.cu")
    kernel(folder, "bad.cu", entry="fault")
    d = Served(tmp_path, MMD_KERNEL_FOLDERS=str(folder), PYTHONPATH=FAKE_GPU + os.pathsep + str(ROOT))
    try:
        _serve_kernel_folder_jobs(tmp_path, d.wait_serving())
    finally:
        d.kill()


def _serve_kernel_folder_jobs(tmp_path: Path, d: Served) -> None:
    inputs = {}
    for stem in ("a@kernel=p1,tile=4", "b@kernel=bad", "c@kernel=nope", "d"):
        inputs[stem] = integer_input(tmp_path / f"{stem}.src", 8, 8, 8, seed=len(inputs))
        os.replace(tmp_path / f"{stem}.src", d.inbox / f"{stem}.txt")
    wait_for(lambda: len(list(d.outbox.glob("*.yaml"))) == 4, 60, "four sidecars")
    picked = check_ok(d.outbox, "a@kernel=p1,tile=4", *inputs["a@kernel=p1,tile=4"])
    assert (picked["kernel"], picked["backend"], picked["tile"]) == ("p1.cu", "cuda", 4)
    assert picked["device"].startswith("Fake GPU") and picked["kernel_file"]["entry"] == "square"
    own = check_ok(d.outbox, "d", *inputs["d"])
    assert own["backend"] == "cpu"  # the worker's own backend, untouched by the kernel file's jobs
    fault = error_of(d.outbox, "b@kernel=bad")["error"]
    assert fault["kind"] == "kernel-launch" and "illegal memory access" in fault["reason"]
    unknown = error_of(d.outbox, "c@kernel=nope")["error"]
    assert unknown["kind"] == "jobname" and "no kernel folder (kernel_folders) holds nope.cu" in unknown["reason"]
    assert d.stop() == 0, d.logs()


# -- mmd bench --kernel-file --------------------------------------------------------------------------------


def test_bench_runs_the_course_plan_through_kernel_files_and_draws_the_course_graphs(tmp_path: Path) -> None:
    p1, p2 = course_files(tmp_path / "hw")
    done = run_mmd(
        "bench", "--kernel-file", str(p1), "--kernel-file", str(p2), "--sizes", "8", "16", "--tiles", "4", "8",
        "64", "--tiles-at-size", "16", "--warmup", "0", "--repeats", "1", "--max-repeats", "1", "--report",
        "--out", "out", cwd=tmp_path, env=fake_gpu(MMD_BACKEND="auto"), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    folder = next((tmp_path / "out").iterdir())
    rows = read_rows(folder / "results.csv")
    # only the kernel files (no --kernels): per size, P1 then P2, as given
    assert [(r["kernel"], r["tile"], r["m"], r["status"]) for r in rows] == [
        ("p1.cu", "32", "8", "ok"), ("p2.cu", "32", "8", "ok"),
        ("p1.cu", "4", "16", "ok"), ("p2.cu", "4", "16", "ok"),
        ("p1.cu", "8", "16", "ok"), ("p2.cu", "8", "16", "ok"),
        ("p1.cu", "32", "16", "ok"), ("p2.cu", "32", "16", "ok"),
        ("p1.cu", "64", "16", "refused"), ("p2.cu", "64", "16", "refused"),
    ]  # fmt: skip
    for r in rows:
        path = Path(r["kernel_file"])
        assert path.name == r["kernel"] and r["kernel_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        if r["status"] == "ok":
            assert r["device"].startswith("Fake GPU") and float(r["rel_error"]) < 1e-6
            assert float(r["cuda_median_ms"]) > 0 and float(r["overall_median_ms"]) > 0
        else:
            assert r["reason"] == "tile 64 needs 4096 threads per block; no CUDA GPU allows more than 1024"
    plan = yaml.safe_load((folder / "results.yaml").read_text())["plan"]
    assert plan["kernels"] == ["p1.cu", "p2.cu"] and [f["name"] for f in plan["kernel_files"]] == ["p1.cu", "p2.cu"]
    report = folder / "report"
    for graph in ("graph1_overall", "graph2_cuda"):
        assert (report / f"{graph}.png").stat().st_size > 0
        svg = (report / f"{graph}.svg").read_text()
        assert "p1.cu" in svg and "p2.cu" in svg  # one bar per kernel, labelled by file name
    summary = (report / "summary.md").read_text()
    assert "| p1.cu | kernel file " in summary and f"sha256 {rows[0]['kernel_sha256']}" in summary
    assert "## Speed-up over p1.cu" in summary and "| p2.cu |" in summary.split("## Speed-up over p1.cu")[1]
    assert "| p1.cu | 64 | 16×16×16 | 1 | tile 64 needs 4096 threads per block" in summary


def test_bench_kernel_files_beside_mmds_own_and_through_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", FAKE_GPU + os.pathsep + str(ROOT))
    (p1,) = course_files(tmp_path / "hw")[:1]
    choice = KernelChoice.of_file(p1)
    plan = bench.Plan(kernels=(choice, "cpu"), sizes=(8,), tiles=(8,), repeats=1, max_repeats=1, through_files=True)
    assert [c.kernel for c in plan.cases()] == ["cpu", "p1.cu", "p1.cu"]  # mmd's own first, then the files
    run = bench.run_plan(plan, cuda_backend()[0], folder=tmp_path / "r", env={})
    assert run.ok, [r.reason for r in run.rows]
    by = {(r.kernel, r.tile): r for r in run.rows}
    assert by[("p1.cu", 8)].mode == "files" and by[("p1.cu", 8)].device.startswith("Fake GPU")
    assert by[("p1.cu", 8)].text_path == "host" and by[("p1.cu", 8)].median("parse") is not None
    assert by[("cpu", None)].kernel_sha256 is None and by[("p1.cu", 8)].kernel_sha256 == choice.sha256


def test_a_kernel_files_launch_process_is_the_benchs_own_not_anothers_on_the_gpu(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", FAKE_GPU + os.pathsep + str(ROOT))
    p1 = KernelChoice.of_file(course_files(tmp_path / "hw")[0])
    plan = bench.Plan(kernels=(p1,), sizes=(8,), tiles=(8,), repeats=1, max_repeats=1)
    for pids, busy in (((os.getpid(), 4242), False), ((os.getpid(), 4242, 4343), True)):
        clock = bench.Nvml.find(0, "", lib=FakeNvml(FakeNvml.Gpu("00000000:65:00.0", pids=pids)))
        run = bench.run_plan(plan, cuda_backend()[0], folder=tmp_path / str(len(pids)), env={}, clock=clock,
                             load=lambda: 0.0)  # fmt: skip
        assert [(r.gpu_processes, r.busy) for r in run.rows] == [(len(pids), busy)] * 2


def test_a_kernel_file_that_faults_fails_the_bench(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", FAKE_GPU + os.pathsep + str(ROOT))
    bad = KernelChoice.of_file(kernel(tmp_path, "bad.cu", entry="fault"))
    plan = bench.Plan(kernels=(bad,), sizes=(8,), tiles=(8,), repeats=1, max_repeats=1)
    run = bench.run_plan(plan, cuda_backend()[0], folder=tmp_path / "r", env={})
    assert not run.ok and {r.status for r in run.rows} == {"error"}
    assert "bad.cu failed on the GPU" in run.rows[0].reason


def test_bench_kernel_file_refusals(tmp_path: Path) -> None:
    (p1,) = course_files(tmp_path / "hw")[:1]
    cpu = run_mmd("bench", "--kernel-file", str(p1), "--backend", "cpu", cwd=tmp_path)
    assert cpu.returncode == 2 and "a kernel file runs on a GPU" in cpu.stderr
    missing = run_mmd("bench", "--kernel-file", "none.cu", cwd=tmp_path)
    assert missing.returncode == 2 and "--kernel-file" in missing.stderr and "no such file" in missing.stderr
    bad = tmp_path / "bad.cu"
    bad.write_text('#include "../secret.h"\n' + p1.read_text(), encoding="utf-8")
    refused = run_mmd("bench", "--kernel-file", str(bad), cwd=tmp_path)
    assert refused.returncode == 1 and "bad.cu:1:" in refused.stderr
    (tmp_path / "other").mkdir()
    shutil.copyfile(p1, tmp_path / "other" / "p1.cu")
    twice = run_mmd("bench", "--kernel-file", str(p1), "--kernel-file", "other/p1.cu", cwd=tmp_path)
    assert twice.returncode == 2 and "two kernel files are called p1.cu" in twice.stderr
    assert not (tmp_path / "bench").exists()  # nothing ran


def test_plans_name_and_order_their_kernels(tmp_path: Path) -> None:
    p1, p2 = course_files(tmp_path / "hw")
    plan = bench.Plan(kernels=(KernelChoice.of_file(p2), "tiled", KernelChoice.of_file(p1), "naive"), sizes=(8,),
                      tiles=(32,))  # fmt: skip
    assert [c.kernel for c in plan.cases()] == ["naive", "tiled", "p2.cu", "p1.cu"]
    with pytest.raises(KernelError, match="unknown kernel 'nope'"):
        bench.Plan(kernels=("nope",), sizes=(8,), tiles=(32,))
    assert KernelChoice.builtin("tiled") == KernelChoice("tiled", spec=KernelChoice.builtin("tiled").spec)
    assert not KernelChoice.of_file(p1).on_host and KernelChoice.of_file(p1).precision == "fp32"
