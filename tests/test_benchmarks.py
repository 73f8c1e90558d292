"""Every script under benchmarks/ runs to its end in a tiny mode, so that a benchmark cannot rot unseen.

Sizes are tiny and the backend is the CPU's; what is checked is that a script starts, drives mmd as it is
today and ends with status 0, never its figures. A script that cannot run here is skipped with its reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, mmd_env

# A benchmark times what it runs and starts daemons and workers of its own: alone on the machine.
pytestmark = [pytest.mark.integration, pytest.mark.serial]

BENCHMARKS = ROOT / "benchmarks"

#: Each script's tiny mode; ``{tmp}`` is a fresh folder for what it writes.
TINY: dict[str, list[str]] = {
    "bench_check.py": ["--size", "32", "--folder", "2", "16", "--repeat", "1", "--workdir", "{tmp}/work"],
    "bench_daemon.py": [
        *("--burst", "4", "--rounds", "1", "--drops", "2", "--flood", "4", "--backlog", "20", "--big", "32"),
        *("--repeat", "1"),
        *("--timeouts", "1", "--timeout-size", "64", "--backend", "cpu", "--work", "{tmp}/work", "--out", "{tmp}"),
    ],
    "bench_first_job.py": [
        *("--workers", "1", "--caches", "empty", "--rounds", "1", "--backend", "cpu"),
        *("--work", "{tmp}/work", "--out", "{tmp}"),
    ],
    "bench_devices.py": ["--n", "32", "--jobs", "2", "--devices", "0", "--backend", "cpu", "--kernel", "cpu"],
    "bench_textformat.py": ["--sizes", "16", "--repeat", "1"],
    "bench_wholejob.py": [
        *("--sizes", "32", "--repeat", "1", "--small", "4", "--bursts", "1", "--drops", "2", "--first", "1"),
        *("--backend", "cpu", "--kernel", "cpu", "--work", "{tmp}/work", "--out", "{tmp}"),
    ],
    "grade_class.py": ["--students", "1", "--sizes", "32", "--workdir", "{tmp}/work"],
    "crash.py": ["--rounds", "1", "--jobs", "2", "--size", "8", "--min", "0.1", "--max", "0.2"],
    "kernelfile_vs_builtin.py": ["--size", "64", "--repeat", "1", "--workdir", "{tmp}/work"],
    "lone_steps.py": ["--rounds", "1", "--drops", "2", "--work", "{tmp}/work", "--out", "{tmp}"],
    "quick_detection.py": ["--big", "64", "--seeds", "2"],
    "ncu_summary.py": [str(ROOT / "tests" / "data" / "ncu-raw-sample.csv")],
    "reference_gpu.py": ["--sizes", "32", "--repeat", "1", "--workdir", "{tmp}/work"],
    "sgemm_ncu.py": ["--size", "64", "--launches", "3", "--results", "{tmp}/none.json"],
    "soak.py": ["--minutes", "0.05", "--rate", "20", "--every", "1"],
    # the ladders time on a GPU through CuPy; compiling and reading ptxas's report needs only nvcc
    "sgemm_ladder.py": ["--quick", "--compile-only", "--out", "{tmp}"],
    "tc_ladder.py": ["--quick", "--compile-only", "--out", "{tmp}"],
}

#: Modules the scripts import, not scripts: run through those that import them.
MODULES = {
    # inputs, timing, tables, --tree, the ladders' builds and matrices (docs/bench.md, "The scripts")
    "harness.py": (
        "bench_check.py",
        "bench_daemon.py",
        "bench_devices.py",
        "bench_first_job.py",
        "bench_textformat.py",
        "bench_wholejob.py",
        "crash.py",
        "lone_steps.py",
        "reference_gpu.py",
        "sgemm_ladder.py",
        "sgemm_ncu.py",
        "soak.py",
        "tc_ladder.py",
    ),
    # the environment of every mmd process a benchmark starts (the served trees': harness.tree_env's)
    "child_env.py": (
        "bench_check.py",
        "bench_devices.py",
        "crash.py",
        "grade_class.py",
        "harness.py",
        "kernelfile_vs_builtin.py",
        "reference_gpu.py",
        "soak.py",
    ),
}

#: What a script needs beyond this Python and mmd, when it needs something.
NEEDS = {
    "sgemm_ladder.py": "nvcc",
    "tc_ladder.py": "nvcc",
    # a GPU (the driver's nvidia-smi stands for one): they time the GPU against itself or the CPU
    "reference_gpu.py": "nvidia-smi",
    "kernelfile_vs_builtin.py": "nvidia-smi",
    "grade_class.py": "nvidia-smi",
    "sgemm_ncu.py": "nvidia-smi",
}


def test_every_script_has_a_tiny_mode():
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    assert scripts == set(TINY) | set(MODULES), "a new benchmark gets a tiny mode here"
    for module, users in MODULES.items():
        for user in users:
            assert module.removesuffix(".py") in (BENCHMARKS / user).read_text()


def runs_in_its_tiny_mode(script: str, tmp_path: Path, env: dict[str, str]) -> None:
    """Run ``script``'s tiny mode in ``tmp_path`` with ``env`` (plus where what it keeps goes): it ends with 0,
    no traceback; skipped where it needs what is not here."""
    need = NEEDS.get(script)
    if need is not None and shutil.which(need) is None:
        pytest.skip(f"{script} needs {need}, which is not on PATH here")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in TINY[script]]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *argv],
        cwd=tmp_path,
        env={**env, "OUT": str(tmp_path), "TMPDIR": str(tmp_path)},  # what a script keeps goes with the test
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("script", sorted(TINY))
def test_the_benchmark_runs_in_its_tiny_mode(script: str, tmp_path: Path) -> None:
    """On a host whose config would stop every mmd command: a benchmark measures mmd as shipped, so the
    mmd processes it starts read no config of the host's (they read a class box's /etc/mmd/mmd.yaml and
    failed; tests/test_service_config.py runs one beside a real one)."""
    host = tmp_path / "host-config"
    (host / "mmd").mkdir(parents=True)
    (host / "mmd" / "mmd.yaml").write_text('tile: "16"  # a wrong type: any mmd that reads this exits 78\n')
    env = mmd_env(XDG_CONFIG_HOME=str(host))
    del env["MMD_CONFIG"]  # the script's own environment keeps its processes off the host's config
    runs_in_its_tiny_mode(script, tmp_path, env)


def test_bench_textformat_measures_each_cases_peak_memory(tmp_path: Path) -> None:
    """--rss runs each case in a process of its own: every row has its peak RSS growth (the child once lacked an
    import, and every row said "-")."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_textformat.py"), "--sizes", "16", "--repeat", "1", "--rss"],
        cwd=tmp_path,
        env=mmd_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    header, *rows = done.stdout.splitlines()
    assert header.endswith("peak RSS +MB")
    assert len(rows) >= 4
    for row in rows:
        assert row.split()[-1].isdigit(), row
