"""`mmd run`'s one-shot start (mmd.oneshot): the GPU's context, or a kernel file's launch process, started
before numpy and the pipeline are imported, in a real `mmd run` process; the page-locked buffers made beside
it, sized from the input's header (bounded by its size), and adopted into their slots."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mmd.config import Settings
from mmd.cuda import libcuda
from mmd.hostbuffers import C_SLOT, INPUT_SLOT, TEXT_SLOT
from mmd.oneshot import OneShot, host_buffers

from .conftest import mmd_env
from .fakes import FakeSession, fake_gpu_opener
from .test_cuda_libcuda import counter, fake_libcuda
from .test_kernelfile_run import fake_gpu, integer_input, kernel

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


@pytest.mark.integration
@pytest.mark.parametrize("exiting", [False, True])
def test_the_gpu_context_is_started_before_numpy_and_the_pipeline_are_imported(tmp_path: Path, exiting: bool) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 5, 6, 7)
    # without a GPU here the warmer's thread just ends, and the job runs on the cpu (backend auto)
    (start,) = starts([str(src), "-f"], exiting, tmp_path)
    assert start["start"] == "ContextWarmer" and start["loaded"] == []
    # the input's buffer, and C's and the text's of its 5×7 product (header "5 6 7")
    assert start["kwargs"] == {"host": {"input": src.stat().st_size, "c": 4 * 5 * 7, "text_out": 5 * (8 * 7 + 1)}}
    assert (tmp_path / "a.out").exists()


@pytest.mark.integration
def test_nothing_is_started_for_the_cpu(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 5, 6, 7)
    assert starts([str(src), "--backend", "cpu"], False, tmp_path) == []
    assert (tmp_path / "a.out").exists()


@pytest.mark.integration
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


# -- the page-locked buffers made beside the start: sized from the header, bounded by the file's size -------------


def values_file(path: Path, header: str, values: int, value: str = "1.50", lead: str = "") -> Path:
    """An input of ``header`` and ``values`` copies of ``value``, one space apart, eight to a line."""
    rows = [" ".join([value] * min(8, values - i)) for i in range(0, values, 8)]
    path.write_text(lead + header + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_a_square_header_sizes_c_and_the_text_of_its_product(tmp_path: Path) -> None:
    src = values_file(tmp_path / "a.txt", "64", 2 * 64 * 64)
    size = src.stat().st_size
    assert host_buffers(src) == {INPUT_SLOT: size, C_SLOT: 4 * 64 * 64, TEXT_SLOT: 64 * (8 * 64 + 1)}
    # a BOM and blank lines before the header, as the parser takes them
    src = values_file(tmp_path / "b.txt", "3", 18, lead="\ufeff\n \n")
    assert host_buffers(src) == {INPUT_SLOT: src.stat().st_size, C_SLOT: 4 * 9, TEXT_SLOT: 3 * 25}


def test_a_rectangular_header_sizes_c_and_the_text_of_its_m_by_n_product(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 30, 20, 10)
    assert host_buffers(src) == {INPUT_SLOT: src.stat().st_size, C_SLOT: 4 * 30 * 10, TEXT_SLOT: 30 * (8 * 10 + 1)}


@pytest.mark.parametrize(
    "header, values",
    [
        ("100000", 3),  # a huge square product in a file of three values
        ("4 1000000 4", 40),  # A and B need far more values than the file can hold
        ("9" * 40, 2),  # a header no memory could hold
        ("2000 1 2000", 4000),  # its values fit, but C and the text would be thousands of times the file
    ],
)
def test_a_header_the_file_s_size_does_not_bear_out_gets_only_the_input_s_buffer(
    tmp_path: Path, header: str, values: int
) -> None:
    src = values_file(tmp_path / "a.txt", header, values, value="0")
    assert host_buffers(src) == {INPUT_SLOT: src.stat().st_size}


@pytest.mark.parametrize(
    "text", ["", "  \n\n", "hello\n1 2 3\n", "3 3\n1 2\n", "-4\n1\n", "4 0 4\n", "\xff\xfe\n", "9" * 5000 + "\n1 2\n"]
)
def test_no_header_gets_only_the_input_s_buffer(tmp_path: Path, text: str) -> None:
    src = tmp_path / "a.txt"
    src.write_bytes(text.encode("latin-1"))
    assert host_buffers(src) == {INPUT_SLOT: len(text)}


def test_an_input_that_cannot_be_read_gets_only_its_size_s_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = values_file(tmp_path / "a.txt", "4", 32)

    def failing(fd: int, n: int, offset: int) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "pread", failing)
    assert host_buffers(src) == {INPUT_SLOT: src.stat().st_size}


def test_an_input_this_user_may_not_open_gets_only_its_size_s_buffer(tmp_path: Path, monkeypatch) -> None:
    # the open refused as for a file of mode 0 (root, as CI runs, opens any file: the refusal is injected)
    src = values_file(tmp_path / "a.txt", "4", 32)
    opened = os.open

    def refused(path, flags, *args):
        if Path(path) == src:
            raise PermissionError(13, "Permission denied")
        return opened(path, flags, *args)

    monkeypatch.setattr(os, "open", refused)
    assert host_buffers(src) == {INPUT_SLOT: src.stat().st_size}


def test_a_pipe_is_not_read_for_its_header(tmp_path: Path) -> None:
    # its bytes are the job's, and opening it to read would wait for a writer
    src = tmp_path / "a.txt"
    os.mkfifo(src)
    got: list[dict[str, int]] = []
    sizing = threading.Thread(target=lambda: got.append(host_buffers(src)), daemon=True)
    sizing.start()
    sizing.join(timeout=30)
    assert got == [{INPUT_SLOT: 0}]


def test_a_one_shot_adopts_every_buffer_made_beside_its_start_into_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = fake_libcuda(tmp_path)
    monkeypatch.setattr(
        libcuda, "ContextWarmer", functools.partial(libcuda.ContextWarmer, driver=lambda: libcuda.Driver(lib))
    )
    monkeypatch.setattr("mmd.backends.open_backend", fake_gpu_opener())
    src = tmp_path / "a.txt"
    integer_input(src, 5, 6, 7)
    size = src.stat().st_size
    settings = Settings()
    with OneShot(settings, src) as shot:
        job = shot.describe(tmp_path / "a.out", settings, {})
        result = shot.run(job, lambda *phase: None)
    assert result.error is None and (tmp_path / "a.out").exists()
    adopted = FakeSession.made[-1].adopted
    assert {slot: memory.nbytes for slot, memory in adopted.items()} == {INPUT_SLOT: size, C_SLOT: 140, TEXT_SLOT: 285}
    # each made once, in the context, and none freed at the one-shot's close: the backend took them all
    assert (counter(lib, "allocated"), counter(lib, "freed")) == (size + 140 + 285, 0)
    for memory in adopted.values():
        memory.free()
