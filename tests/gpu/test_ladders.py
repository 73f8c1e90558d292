"""The kernel ladders (benchmarks/sgemm_ladder.py, tc_ladder.py) and sgemm_ncu.py run end to end on the GPU:
compile, check, time through benchmarks/harness.py (CUDA events, the SM clock through mmd.bench.clock).

Elsewhere tests/test_benchmarks.py runs the ladders' --compile-only mode; these need CuPy, nvcc and a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.gpu

BENCHMARKS = ROOT / "benchmarks"


def run(script: str, *args: str, out: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("cupy", reason="the ladders time through CuPy")
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("no nvcc")
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=out,
        env={**os.environ, "OUT": str(out), "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_sgemm_ladder_checks_and_times_every_variant(tmp_path):
    done = run("sgemm_ladder.py", "--quick", "--out", str(tmp_path), out=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "FAIL" not in done.stdout, done.stdout[-4000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {r["kernel"] for r in rows} >= {"cublas", "tiled", "blocktile2d", "vectorized", "fast"}
    assert all(r["ms"] > 0 and r["err"] < 1e-3 and "sm_clock_mhz" in r for r in rows)
    assert (tmp_path / "fast.tune.yaml").is_file()
    assert "(* = autotune's best spill-free fast set" in done.stdout


def test_the_tensor_core_ladder_checks_and_times_every_build(tmp_path):
    done = run("tc_ladder.py", "--quick", "--out", str(tmp_path), out=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert all(status["ok"] for status in results["check_summary"].values()), results["check_summary"]
    timed = {r["kernel"] for r in results["timing"]}
    assert timed >= {"cublas_sgemm", "cublas_tf32", "tc1", "tc3", "fast"}, timed
    assert all("sm_clock_mhz" in r and "throttled" in r for r in results["timing"])
    assert "accuracy vs float64" in done.stdout and "x SGEMM" in done.stdout


def test_sgemm_ncu_launches_fast_and_cublas(tmp_path):
    done = run(
        "sgemm_ncu.py", "--size", "512", "--launches", "4", "--results", str(tmp_path / "none.json"), out=tmp_path
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "cublas sgemm:" in done.stdout and "fast 256x128x8_reg_t16x8_w8:" in done.stdout
