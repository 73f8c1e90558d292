"""`mmd run --kernel-file` and `mmd kernels FILE` on a machine without a GPU.

The refusals that need no device are real end to end. The launch itself runs in its own real process
through the real GpuSession, over a stand-in driver (tests/fakegpu/pycuda: device memory is host memory,
a kernel is run by its name), so the protocol between the job and its launch process, the padding, the
time limit, the faults, printf and the sidecar are tested here; tests/gpu/test_kernelfile.py runs the
same on a GPU.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmd import record, textformat
from mmd.check.jobs import precision_of
from mmd.check.pairing import read_sidecar
from mmd.record import reader

from .conftest import ROOT, run_mmd

pytestmark = pytest.mark.integration

FAKE_GPU = str(ROOT / "tests" / "fakegpu")

#: The course's square kernel, as the fake driver runs it (by its name): C += A·B.
SQUARE = """\
__global__ void square(float* M, float* N, float* P, int Width) {
    int Row = blockIdx.y * blockDim.y + threadIdx.y;
    int Col = blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < Width; ++k) P[Row * Width + Col] += M[Row * Width + k] * N[k * Width + Col];
}
"""


def kernel(folder: Path, name: str, entry: str = "square", head: str = "") -> Path:
    path = folder / name
    path.write_text(head + SQUARE.replace("square", entry), encoding="utf-8")
    return path


def integer_input(path: Path, m: int, k: int, n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Small whole numbers: every sum is exact in float32, in any order, so any right kernel prints the same bytes."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 5, (m, k)).astype(np.float32)
    b = rng.integers(-4, 5, (k, n)).astype(np.float32)
    rows = [" ".join(f"{v:.2f}" for v in row) for row in (*a, *b)]
    path.write_text(f"{m} {k} {n}\n" + "\n".join(rows) + "\n", encoding="ascii")
    return a, b


def fake_gpu(**env: str) -> dict[str, str]:
    return {"PYTHONPATH": FAKE_GPU + os.pathsep + str(ROOT), **env}


def sidecar(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# -- refused before any device is asked ----------------------------------------------------------------------


def test_flags_that_contradict_a_kernel_file_are_usage_errors(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 4, 4, 4)
    k = kernel(tmp_path, "p1.cu")
    both = run_mmd("run", str(src), "--kernel-file", str(k), "--kernel", "fast", cwd=tmp_path)
    assert both.returncode == 2 and "not both" in both.stderr
    cpu = run_mmd("run", str(src), "--kernel-file", str(k), "--backend", "cpu", cwd=tmp_path)
    assert cpu.returncode == 2 and "runs on a GPU" in cpu.stderr
    missing = run_mmd("run", str(src), "--kernel-file", str(tmp_path / "none.cu"), cwd=tmp_path)
    assert missing.returncode == 2 and "--kernel-file" in missing.stderr and "no such file" in missing.stderr
    assert not list(tmp_path.glob("*.yaml"))


def test_a_file_name_cannot_name_a_kernel_file(tmp_path: Path) -> None:
    kernel(tmp_path, "p1.cu")
    src = tmp_path / "a@kernel=p1.cu.txt"
    integer_input(src, 4, 4, 4)
    done = run_mmd("run", str(src), cwd=tmp_path, env=fake_gpu())
    assert done.returncode == 1 and "cannot name a kernel file" in done.stderr
    assert sidecar(tmp_path / "a@kernel=p1.cu.error.yaml")["error"]["kind"] == "jobname"
    named = tmp_path / "b@kernel=fast.txt"
    integer_input(named, 4, 4, 4)
    both = run_mmd("run", str(named), "--kernel-file", str(tmp_path / "p1.cu"), cwd=tmp_path, env=fake_gpu())
    assert both.returncode == 1 and "drop one" in both.stderr


def test_tile_64_is_refused_before_launch_on_any_machine(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 4, 4, 4)
    done = run_mmd("run", str(src), "--kernel-file", str(kernel(tmp_path, "p1.cu")), "--tile", "64", cwd=tmp_path)
    assert done.returncode == 1
    error = sidecar(tmp_path / "a.error.yaml")["error"]
    assert error["kind"] == "tile" and error["threads"] == 4096 and error["kernel_file"] == "p1.cu"
    assert error["reason"] == "tile 64 needs 4096 threads per block; no CUDA GPU allows more than 1024"


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [("MMD_MAX_DIM", "1010", "past the largest size allowed, 1010"), ("MMD_MAX_MEMORY_BYTES", "8000000", "8000000")],
)
def test_padded_sizes_count_against_the_limits(tmp_path: Path, setting: str, value: str, says: str) -> None:
    """1×1000 · 1000×1 through a square kernel at tile 32 is 1024³: refused, not allocated."""
    src = tmp_path / "a.txt"
    integer_input(src, 1, 1000, 1)
    done = run_mmd("run", str(src), "--kernel-file", str(kernel(tmp_path, "p1.cu")), cwd=tmp_path, env={setting: value})
    assert done.returncode == 1 and says in done.stderr
    error = sidecar(tmp_path / "a.error.yaml")["error"]
    assert error["kind"] == "limit" and error["padded"] == [1024, 1024, 1024]


def test_without_a_gpu_the_job_is_refused_as_the_cuda_backend_would_be(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 4, 4, 4)
    done = run_mmd("run", str(src), "--kernel-file", str(kernel(tmp_path, "p1.cu")), cwd=tmp_path)
    assert done.returncode == 1
    assert sidecar(tmp_path / "a.error.yaml")["error"]["kind"] == "backend"


def test_a_broken_kernel_file_is_a_refused_job_with_the_authors_line(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 4, 4, 4)
    bad = tmp_path / "bad.cu"
    bad.write_text('#include "../secret.h"\n' + SQUARE, encoding="utf-8")
    done = run_mmd("run", str(src), "--kernel-file", str(bad), cwd=tmp_path)
    assert done.returncode == 1 and "bad.cu:1:" in done.stderr
    assert sidecar(tmp_path / "a.error.yaml")["error"]["kind"] == "kernel-file"


# -- mmd kernels FILE -----------------------------------------------------------------------------------------


def test_mmd_kernels_file_says_what_mmd_understood_and_compiles_it(tmp_path: Path) -> None:
    k = ROOT / "docs" / "examples" / "tiled.cu"
    done = run_mmd("kernels", str(k), "--cache", str(tmp_path / "cache"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("tiled.cu  sha256 ")
    assert lines[1] == "entry: MatrixMulKernel (line 21), square (M, N, P, Width): Md A, Nd B, Pd C, Width width"
    assert "declared in: nowhere (the defaults)" in lines
    assert "tile: -DTILE_WIDTH=T" in lines
    assert "geometry: block [T, T, 1] threads, grid x over columns and y over rows" in lines
    assert any(line.startswith("no GPU here") for line in lines)
    for tile in (4, 8, 16, 32):
        assert f"tile {tile}: block {tile}x{tile}x1, block tile {tile}x{tile} (K step {tile}), 1 per thread; " \
            f"compiled for sm_90 as _Z15MatrixMulKernelPfS_S_i" in lines  # fmt: skip
    assert "tile 64: refused: tile 64 needs 4096 threads per block; no CUDA GPU allows more than 1024" in lines
    again = run_mmd("kernels", str(k), "--cache", str(tmp_path / "cache"), "--tiles", "32", cwd=tmp_path)
    assert again.stdout.splitlines()[-1].endswith("cached for sm_90 as _Z15MatrixMulKernelPfS_S_i")


def test_mmd_kernels_file_refused_says_why_and_fails(tmp_path: Path) -> None:
    bad = tmp_path / "two.cu"
    bad.write_text(SQUARE + SQUARE.replace("square", "other"), encoding="utf-8")
    done = run_mmd("kernels", str(bad), cwd=tmp_path)
    assert done.returncode == 1 and done.stdout.startswith("refused: two.cu: 2 __global__ functions")


# -- the launch process, over the stand-in driver -----------------------------------------------------------


def test_a_kernel_file_runs_padded_and_cropped_as_the_cpu_prints_it(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    a, b = integer_input(src, 37, 53, 29)
    k = kernel(tmp_path, "p1.cu")
    done = run_mmd("run", str(src), "--kernel-file", str(k), "--tile", "8", cwd=tmp_path, env=fake_gpu())
    assert done.returncode == 0, done.stderr
    expected = b"".join(textformat.emit_chunks(np.matmul(a, b)))
    assert (tmp_path / "a.out").read_bytes() == expected
    rec = reader.read(tmp_path / "a.timing.yaml")
    assert isinstance(rec, record.TimingRecord)
    assert rec.kernel == "p1.cu" and rec.tile == 8 and rec.backend == "cuda" and rec.device.startswith("Fake GPU")
    facts = rec.kernel_file
    assert facts is not None and facts.sha256 == hashlib.sha256(k.read_bytes()).hexdigest()
    assert (facts.entry, facts.signature, facts.precision) == ("square", "square (M, N, P, Width)", "fp32")
    assert facts.padded == record.Shape(56, 56, 56)
    t = rec.timings_ms
    phases = [p for p in (t.malloc, t.h2d, t.kernel, t.d2h, t.free) if p is not None and p >= 0]
    assert len(phases) == 5 and t.cuda == pytest.approx(sum(phases), abs=0.01)


def test_a_kernel_adding_into_c_is_right_twice_in_a_row(tmp_path: Path) -> None:
    """C is zeroed before each launch, and each job has a fresh process."""
    src = tmp_path / "a.txt"
    a, b = integer_input(src, 16, 16, 16, seed=3)
    k = kernel(tmp_path, "p1.cu")
    for _ in range(2):
        done = run_mmd("run", str(src), "--kernel-file", str(k), "-f", cwd=tmp_path, env=fake_gpu())
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "a.out").read_bytes() == b"".join(textformat.emit_chunks(np.matmul(a, b)))


def test_a_kernel_that_never_ends_is_killed_at_its_time_limit(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 8, 8, 8)
    spin = kernel(tmp_path, "spin.cu", entry="spin")
    start = time.monotonic()
    done = run_mmd(
        "run", str(src), "--kernel-file", str(spin), cwd=tmp_path,
        env=fake_gpu(MMD_KERNEL_FILE_LAUNCH_TIMEOUT_S="1"),
    )  # fmt: skip
    took = time.monotonic() - start
    assert done.returncode == 1 and "ran past its time limit, 1 s" in done.stderr
    error = sidecar(tmp_path / "a.error.yaml")["error"]
    assert error["kind"] == "kernel-launch" and error["limit_s"] == 1
    assert took < 1 + 2 + 5  # the limit, the 2 s it may take more, and two processes' starts on a slow box
    ok = run_mmd("run", str(src), "--kernel-file", str(kernel(tmp_path, "p1.cu")), "-f", cwd=tmp_path, env=fake_gpu())
    assert ok.returncode == 0, ok.stderr


def test_a_fault_is_the_jobs_error_and_the_next_job_runs(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 8, 8, 8)
    done = run_mmd("run", str(src), "--kernel-file", str(kernel(tmp_path, "f.cu", entry="fault")), env=fake_gpu())
    assert done.returncode == 1 and "f.cu failed on the GPU" in done.stderr
    assert "an illegal memory access was encountered" in done.stderr
    assert sidecar(tmp_path / "a.error.yaml")["error"]["kind"] == "kernel-launch"
    ok = run_mmd("run", str(src), "--kernel-file", str(kernel(tmp_path, "p1.cu")), "-f", cwd=tmp_path, env=fake_gpu())
    assert ok.returncode == 0, ok.stderr


def test_device_printf_is_captured_and_capped(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    a, b = integer_input(src, 8, 8, 8)
    done = run_mmd("run", str(src), "--kernel-file", str(kernel(tmp_path, "n.cu", entry="noisy")), env=fake_gpu())
    assert done.returncode == 0, done.stderr
    assert "x" * 99 not in done.stdout  # the kernel's output is the sidecar's, not the command's
    notes = sidecar(tmp_path / "a.timing.yaml")["notes"]
    said = [n for n in notes if n.startswith("device printf")]
    assert said and said[0].startswith("device printf wrote 100000 bytes, the first 4096 kept:\n" + "x" * 99 + "\n")
    assert (tmp_path / "a.out").read_bytes() == b"".join(textformat.emit_chunks(np.matmul(a, b)))


def test_mmd_check_holds_a_kernel_file_to_its_declared_precision(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    integer_input(src, 8, 8, 8)
    declared = kernel(tmp_path, "t.cu", head="// mmd: {precision: tf32, exact: false}\n")
    done = run_mmd("run", str(src), "--kernel-file", str(declared), cwd=tmp_path, env=fake_gpu())
    assert done.returncode == 0, done.stderr
    found = read_sidecar(tmp_path / "a.out")
    assert found is not None and found.kernel == "t.cu" and found.precision == "tf32"
    assert precision_of(found.kernel, found.precision) == "tf32"
    assert precision_of("t.cu", None) == "fp32"  # a kernel file that declares nothing: fp32's tolerance
    checked = run_mmd("check", str(tmp_path / "a.out"), "--input", str(src), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "(0.005 + (2^-9 + 4·sqrt(K)·eps)·|A||B|)" in checked.stdout  # held to TF32's tolerance


# -- one backend, one kept launch process ---------------------------------------------------------------------


def launch_children() -> set[int]:
    """The pids of this process's kernel-file launch processes that are alive (not zombies)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == os.getpid() and state != "Z" and b"mmd.kernelfile.launch_child" in command:
            found.add(int(entry.name))
    return found


@pytest.fixture
def on_fake_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launch processes started by this test process run over the fake driver."""
    monkeypatch.setenv("PYTHONPATH", fake_gpu()["PYTHONPATH"])


def test_one_backend_keeps_its_launch_process_until_a_fault(tmp_path: Path, on_fake_gpu: None) -> None:
    from mmd.backends.base import MultiplyRequest
    from mmd.backends.kernelfile import KernelFileBackend, KernelFileSettings
    from mmd.errors import KernelLaunchError

    rng = np.random.default_rng(3)
    a, b = rng.integers(-4, 5, (8, 8)).astype(np.float32), rng.integers(-4, 5, (8, 8)).astype(np.float32)
    backend = KernelFileBackend(kernel(tmp_path, "p1.cu"), KernelFileSettings())
    try:
        first = backend.multiply(a, b, MultiplyRequest(tile=4))
        (kept,) = launch_children()
        second = backend.multiply(a + 1, b, MultiplyRequest(tile=8))
        assert launch_children() == {kept}
        assert np.array_equal(first.c, a @ b) and np.array_equal(second.c, (a + 1) @ b)
    finally:
        backend.close()
    assert launch_children() == set()

    faulty = KernelFileBackend(kernel(tmp_path, "f.cu", entry="fault"), KernelFileSettings())
    try:
        (before,) = launch_children()
        with pytest.raises(KernelLaunchError, match="illegal memory access"):
            faulty.multiply(a, b, MultiplyRequest(tile=4))
        assert launch_children() == set()  # a fault ends the process: its context is unusable
        with pytest.raises(KernelLaunchError, match="illegal memory access"):
            faulty.multiply(a, b, MultiplyRequest(tile=4))  # a fresh process took the next launch
        assert before not in launch_children()
    finally:
        faulty.close()


def test_a_backend_counts_the_seconds_its_kernels_held_the_gpu_a_killed_one_s_included(
    tmp_path: Path, on_fake_gpu: None
) -> None:
    """What a student's GPU time is charged by: every launch from its start to its end, its fault or its kill,
    over every launch process the backend used (a killed one's too)."""
    from mmd.backends.base import MultiplyRequest
    from mmd.backends.kernelfile import KernelFileBackend, KernelFileSettings
    from mmd.errors import KernelLaunchError

    a = np.ones((4, 4), np.float32)
    backend = KernelFileBackend(kernel(tmp_path, "s.cu", entry="spin"), KernelFileSettings(launch_timeout_s=0.5))
    try:
        assert backend.launched_s == 0.0
        for _ in range(2):
            with pytest.raises(KernelLaunchError, match="ran past its time limit"):
                backend.multiply(a, a, MultiplyRequest(tile=4))
        assert 1.0 <= backend.launched_s < 2.0  # two launches killed at 0.5 s, each in a process of its own
    finally:
        backend.close()
    assert 1.0 <= backend.launched_s < 2.0  # closing keeps the count

    fine = KernelFileBackend(kernel(tmp_path, "p1.cu"), KernelFileSettings())
    try:
        fine.multiply(a, a, MultiplyRequest(tile=4))
        assert 0.0 < fine.launched_s < 0.5
    finally:
        fine.close()


def test_a_kept_process_counts_each_jobs_printf_alone(tmp_path: Path, on_fake_gpu: None) -> None:
    from mmd.backends.base import MultiplyRequest
    from mmd.backends.kernelfile import KernelFileBackend, KernelFileSettings

    a = np.ones((4, 4), np.float32)
    backend = KernelFileBackend(kernel(tmp_path, "n.cu", entry="noisy"), KernelFileSettings())
    try:
        for _ in range(2):
            notes = backend.multiply(a, a, MultiplyRequest(tile=4)).notes
            assert [n[:36] for n in notes if n.startswith("device printf")] == ["device printf wrote 100000 bytes, th"]
    finally:
        backend.close()


def test_each_error_kind_crosses_from_the_launch_process_as_its_own_type() -> None:
    from mmd import errors

    classes: list[type[errors.MmdError]] = []
    todo: list[type[errors.MmdError]] = [errors.MmdError]
    while todo:
        classes.append(todo.pop())
        todo.extend(classes[-1].__subclasses__())
    kinds = [cls.kind for cls in classes]
    assert len(kinds) == len(set(kinds)), "one kind per error type"
    sent = errors.InputFormatError("line 3: not a number", line=3, value="x1")
    got = errors.MmdError.from_dict(sent.as_dict())
    assert type(got) is errors.InputFormatError and got.as_dict() == sent.as_dict()
    assert type(errors.MmdError.from_dict({"kind": "no such kind", "reason": "r"})) is errors.MmdError


def test_shared_memory_holds_what_one_side_wrote_for_the_other(tmp_path: Path) -> None:
    from mmd.kernelfile.exchange import Shared

    one = Shared(64)
    view = one.array(16, (4, 2))
    view[:] = 7.0
    other = Shared(fd=os.dup(one.fd), writable=False)  # as the launch process maps what it was sent
    assert np.array_equal(other.array(16, (4, 2)), np.full((4, 2), 7.0, np.float32))
    assert one.holds(view) and one.offset_of(view) == 16 and not one.holds(np.ones(4, np.float32))
    assert one.address() + 16 == view.ctypes.data  # where a driver page-locks it
    with pytest.raises(ValueError, match="past the shared memory"):
        one.array(60, 2)
    one.close()
    other.close()
    assert view[0, 0] == 7.0  # an array outlives the descriptor: the mapping stays while it is used


def test_operands_made_in_the_launch_layout_go_to_the_launch_as_they_lie(tmp_path: Path, on_fake_gpu: None) -> None:
    """A and B made in an Operands are sent without a copy, and the product comes back in its own room for C;
    arrays made elsewhere (a copy of them too) are copied into a fresh memory file."""
    from mmd.backends.base import MultiplyRequest
    from mmd.backends.kernelfile import KernelFileBackend, KernelFileSettings
    from mmd.kernelfile.exchange import Operands

    ops = Operands(8, 8, 8)
    ops.a[:] = np.arange(64, dtype=np.float32).reshape(8, 8) % 5
    ops.b[:] = np.arange(64, dtype=np.float32).reshape(8, 8) % 3 - 1
    assert Operands.of(ops.a, ops.b) is ops
    assert Operands.of(ops.a.copy(), ops.b) is None and Operands.of(ops.a[:4], ops.b) is None
    want = ops.a.astype(np.float64) @ ops.b
    backend = KernelFileBackend(kernel(tmp_path, "p1.cu"), KernelFileSettings())
    try:
        laid = backend.multiply(ops.a, ops.b, MultiplyRequest(tile=4))
        copied = backend.multiply(ops.a.copy(), ops.b.copy(), MultiplyRequest(tile=4))
    finally:
        backend.close()
        ops.close()
    assert laid.c is ops.c or np.shares_memory(laid.c, ops.c)
    assert not np.shares_memory(copied.c, ops.c)
    assert np.array_equal(laid.c, want) and np.array_equal(copied.c, want)
