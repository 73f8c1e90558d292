"""`mmd run`'s one-shot start (mmd.oneshot): the GPU's context, or a kernel file's launch process, started
before numpy and the pipeline are imported, in a real `mmd run` process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import mmd_env
from .test_kernelfile_run import fake_gpu, integer_input, kernel

pytestmark = pytest.mark.integration

#: What the start must come before: the imports it is made to run beside.
LATER = ("numpy", "pycuda", "mmd.pipeline", "mmd.backends", "mmd.job", "mmd.textformat")

#: Runs ``mmd.cli.main(ARGS, exiting=EXITING)`` in a process of its own, printing a line as each start is
#: made: which of LATER was imported by then, and the arguments it was given.
PROBE = """
import json, sys
from mmd import cli
from mmd.cuda.libcuda import ContextWarmer
from mmd.kernelfile.launch import LaunchProcess

later = tuple(json.loads(sys.argv[2]))

def probed(cls):
    real = cls.__init__
    def init(self, *args, **kwargs):
        loaded = sorted(m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in later))
        print(json.dumps({"start": cls.__name__, "loaded": loaded, "kwargs": kwargs}), flush=True)
        real(self, *args, **kwargs)
    cls.__init__ = init

probed(ContextWarmer)
probed(LaunchProcess)
sys.exit(cli.main(sys.argv[3:], exiting=sys.argv[1] == "exiting"))
"""


def starts(args: list[str], exiting: bool, cwd: Path, env: dict[str, str] | None = None) -> list[dict]:
    """The starts ``mmd run ARGS`` made, in order; the run must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "exiting" if exiting else "returning", json.dumps(LATER), "run", *args],
        cwd=cwd,
        env=mmd_env({"MMD_LOG_FORMAT": "json"}, **(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"start"')]


@pytest.mark.parametrize("exiting", [False, True])
def test_the_gpu_context_is_started_before_numpy_and_the_pipeline_are_imported(tmp_path: Path, exiting: bool) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 5, 6, 7)
    # without a GPU here the warmer's thread just ends, and the job runs on the cpu (backend auto)
    (start,) = starts([str(src), "-f"], exiting, tmp_path)
    assert start["start"] == "ContextWarmer" and start["loaded"] == []
    assert start["kwargs"] == {"host_bytes": src.stat().st_size}
    assert (tmp_path / "a.out").exists()


def test_nothing_is_started_for_the_cpu(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 5, 6, 7)
    assert starts([str(src), "--backend", "cpu"], False, tmp_path) == []
    assert (tmp_path / "a.out").exists()


@pytest.mark.parametrize("exiting", [False, True])
def test_a_kernel_files_launch_process_is_started_before_numpy_and_the_pipeline_are_imported(
    tmp_path: Path, exiting: bool
) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 5, 6, 7)
    k = kernel(tmp_path, "p1.cu")
    (start,) = starts([str(src), "--kernel-file", str(k), "--tile", "4"], exiting, tmp_path, fake_gpu())
    assert start["start"] == "LaunchProcess" and start["loaded"] == []
    # a process that ends with the job leaves its killed launch process to the system; the launch process makes
    # the input's memory (its size) as it starts, as the context warmer does
    assert start["kwargs"] == {"reap": not exiting, "host_bytes": src.stat().st_size}
    assert (tmp_path / "a.out").exists()
