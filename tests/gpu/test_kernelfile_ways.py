"""A kernel file every way in, on a real GPU: `mmd bench --kernel-file` (the course's plan in small, beside mmd's own
naive), the daemon's kernel folders (a job's name picking a file, a spinning one stopped while the worker goes on),
and a `mmd submit --slurm --kernel-file` task run as slurmd runs it.

Run with ``pytest -m gpu tests/gpu/test_kernelfile_ways.py``; skipped where pycuda or a GPU is missing.
tests/test_kernelfile_ways.py and tests/test_slurm.py run the same over the stand-in GPU.
"""

from __future__ import annotations

import csv
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmd import slurm, textformat
from mmd.generate import input_chunks

from ..conftest import ROOT, wait_for
from ..test_daemon import Served
from .test_kernelfile import NAIVE, SPIN, TILED

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _gpu(cuda_backend) -> None:
    """Skip without pycuda or a GPU (the session's backend says which)."""


def integer_input(path: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Whole numbers: every sum is exact in float32, in any order, so every right kernel prints the same bytes."""
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-4, 5, (n, n)).astype(np.float32) for _ in range(2))
    path.write_bytes(b"".join(input_chunks(a, b, square=True)))
    return a, b


def env(**extra: str) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MMD_")}
    full["PYTHONPATH"] = f"{ROOT}{os.pathsep}{full.get('PYTHONPATH', '')}"
    return {**full, "MMD_CONFIG": os.devnull, "MMD_LOG_FORMAT": "json", **extra}


def course_files(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "p1.cu").write_text(NAIVE, encoding="utf-8")
    (folder / "p2.cu").write_text(TILED, encoding="utf-8")
    return folder / "p1.cu", folder / "p2.cu"


def test_bench_runs_kernel_files_beside_mmds_naive_and_refuses_tile_64(tmp_path: Path) -> None:
    p1, p2 = course_files(tmp_path / "hw")
    argv = [
        sys.executable, "-m", "mmd", "bench", "--backend", "cuda", "--kernel-file", str(p1), "--kernel-file", str(p2),
        "--kernels", "naive", "--sizes", "32", "256", "--tiles", "4", "8", "16", "32", "64", "--repeats", "3",
        "--max-repeats", "10", "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    # an empty kernel cache, so that each file's first call compiles (a warm cache records no compile time)
    done = subprocess.run(
        argv, env=env(MMD_KERNEL_CACHE=str(tmp_path / "cache")), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    folder = next((tmp_path / "out").iterdir())
    with open(folder / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    by = {(r["kernel"], r["tile"], r["m"]): r for r in rows}
    for name, path in (("p1.cu", p1), ("p2.cu", p2)):
        for tile in ("4", "8", "16", "32"):
            row = by[(name, tile, "256")]
            assert row["status"] == "ok", row["reason"]
            assert row["kernel_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
            assert float(row["rel_error"]) < 1e-6 and "Fake" not in row["device"]
            assert float(row["cuda_median_ms"]) > 0
            # each (file, tile) is compiled once, by its first case (size 32 comes first): that row has the time
            assert any(r["compile_median_ms"] != "" for r in rows if (r["kernel"], r["tile"]) == (name, tile))
        refused = by[(name, "64", "256")]
        assert refused["status"] == "refused" and "tile 64 needs 4096 threads per block" in refused["reason"]
    assert by[("naive", "64", "256")]["status"] == "refused"
    # the same course kernel built in and from a file: CUDA phases of one size (the 5 % is at 4096)
    built, filed = by[("naive", "32", "256")], by[("p1.cu", "32", "256")]
    print("naive built in vs p1.cu, kernel ms:", built["kernel_median_ms"], filed["kernel_median_ms"])
    print(done.stderr[-3000:])


def test_the_daemon_runs_a_kernel_folders_file_in_a_process_of_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "kernels"
    p1, _ = course_files(folder)
    (folder / "spin.cu").write_text(SPIN, encoding="utf-8")
    d = Served(
        tmp_path, MMD_BACKEND="cuda", MMD_WORKERS_PER_DEVICE="1", MMD_DEVICES="0", MMD_KERNEL_FOLDERS=str(folder),
        MMD_KERNEL_FILE_LAUNCH_TIMEOUT_S="2",
    )  # fmt: skip
    try:
        d.wait_serving()
        inputs = {}
        for stem in ("a@kernel=p1,tile=16", "b@kernel=naive,tile=16", "s@kernel=spin", "c@kernel=p2,tile=8"):
            inputs[stem] = integer_input(tmp_path / f"{stem}.src", 100, len(inputs))
            os.replace(tmp_path / f"{stem}.src", d.inbox / f"{stem}.txt")
            if stem.startswith("s@"):
                spun = time.time()
        wait_for(lambda: len(list(d.outbox.glob("*.yaml"))) == 4, 120, "four sidecars")
        for stem in ("a@kernel=p1,tile=16", "b@kernel=naive,tile=16", "c@kernel=p2,tile=8"):
            a, b = inputs[stem]
            out = d.outbox / f"{stem}.out"
            assert out.read_bytes() == b"".join(textformat.emit_chunks(np.matmul(a, b))), stem
        rec = yaml.safe_load((d.outbox / "a@kernel=p1,tile=16.timing.yaml").read_text())
        assert (rec["kernel"], rec["backend"], rec["tile"]) == ("p1.cu", "cuda", 16)
        assert rec["kernel_file"]["sha256"] == hashlib.sha256(p1.read_bytes()).hexdigest()
        error = yaml.safe_load((d.outbox / "s@kernel=spin.error.yaml").read_text())["error"]
        assert error["kind"] == "kernel-launch" and "ran past its time limit, 2 s" in error["reason"]
        after = (d.outbox / "c@kernel=p2,tile=8.timing.yaml").stat().st_mtime - spun
        print(f"the job dropped after the spinning one was done {after:.2f} s after the spinning one was dropped")
        assert d.stop() == 0, d.logs()
    finally:
        d.kill()


def test_a_slurm_task_runs_the_kernel_files_copy(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    a, b = integer_input(jobs / "m.txt", 257, 1)
    p1, _ = course_files(tmp_path / "hw")
    options = slurm.ArrayOptions(mmd=(sys.executable, "-m", "mmd"), settings=(("tile", "16"),), kernel_file=p1)
    plan, _ = slurm.make_plan(jobs, tmp_path / "out", options, tmp_path / "s" / "job.sbatch")
    plan = slurm.write(plan).plan
    done = subprocess.run(
        ["bash", str(plan.script)], env=env(SLURM_ARRAY_TASK_ID="0"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    out = plan.tasks[0].output
    assert out.read_bytes() == b"".join(textformat.emit_chunks(np.matmul(a, b)))
    rec = yaml.safe_load(out.with_name(out.stem + ".timing.yaml").read_text())
    assert rec["kernel"] == "p1.cu" and rec["kernel_file"]["padded"] == {"m": 272, "k": 272, "n": 272}


def test_other_workers_serve_the_next_job_while_a_kernel_spins(tmp_path: Path) -> None:
    """A kernel that never ends holds one worker until its time limit; a 32×32 job dropped meanwhile is served by
    another within a second."""
    folder = tmp_path / "kernels"
    course_files(folder)
    (folder / "spin.cu").write_text(SPIN, encoding="utf-8")
    d = Served(
        tmp_path, MMD_BACKEND="cuda", MMD_WORKERS_PER_DEVICE="2", MMD_DEVICES="0", MMD_KERNEL_FOLDERS=str(folder),
        MMD_KERNEL_FILE_LAUNCH_TIMEOUT_S="3",
    )  # fmt: skip
    try:
        d.wait_serving()
        for stem in ("w1", "w2"):  # both workers warm
            integer_input(tmp_path / f"{stem}.src", 32, 1)
            os.replace(tmp_path / f"{stem}.src", d.inbox / f"{stem}.txt")
        wait_for(lambda: len(list(d.outbox.glob("w*.timing.yaml"))) == 2, 120, "the warm-up jobs")
        integer_input(tmp_path / "s.src", 64, 2)
        os.replace(tmp_path / "s.src", d.inbox / "s@kernel=spin.txt")
        time.sleep(1.0)  # the spinning kernel is launched (its process started, compiled, copied in)
        served = []
        for i in range(3):
            a, b = integer_input(tmp_path / f"n{i}.src", 32, 10 + i)
            dropped = time.time()
            os.replace(tmp_path / f"n{i}.src", d.inbox / f"n{i}.txt")
            wait_for(lambda i=i: (d.outbox / f"n{i}.timing.yaml").exists(), 10, f"job n{i}")
            served.append(time.time() - dropped)
            assert (d.outbox / f"n{i}.out").read_bytes() == b"".join(textformat.emit_chunks(np.matmul(a, b)))
        spinning = not (d.outbox / "s@kernel=spin.error.yaml").exists()
        print(f"\n32x32 jobs while a kernel spun: drop->sidecar {', '.join(f'{s * 1e3:.1f}' for s in served)} ms "
              f"(spinning still at the last: {spinning})")  # fmt: skip
        assert spinning and max(served) <= 1.0
        wait_for(lambda: (d.outbox / "s@kernel=spin.error.yaml").exists(), 30, "the spinning job's refusal")
        assert d.stop() == 0, d.logs()
    finally:
        d.kill()
