"""Kernel files on a real GPU: course kernels written for these tests, in the course's style (no bounds checks).

Run with ``pytest -m gpu tests/gpu/test_kernelfile.py``; skipped where pycuda or a GPU is missing. Each job
runs in a launch process of its own (mmd.kernelfile.launch); compiles go to a kernel cache of the session's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mmd import textformat
from mmd.backends.base import CUDA_PHASES, MultiplyRequest
from mmd.backends.kernelfile import KernelFileBackend, KernelFileSettings
from mmd.check.tolerance import model_factor
from mmd.errors import KernelLaunchError, TileError

from ..conftest import ROOT, run_mmd

pytestmark = pytest.mark.gpu

#: The lecture's kernel: one thread per output, straight from global memory.
NAIVE = """\
#include <cuda_runtime.h>
__global__ void MatrixMulKernel(float* M, float* N, float* P, int Width) {
    int Row = blockIdx.y * blockDim.y + threadIdx.y;
    int Col = blockIdx.x * blockDim.x + threadIdx.x;
    float Pvalue = 0;
    for (int k = 0; k < Width; ++k)
        Pvalue += M[Row * Width + k] * N[k * Width + Col];
    P[Row * Width + Col] = Pvalue;
}
"""

#: The lecture's shared-memory kernel.
TILED = """\
#include <cuda_runtime.h>
#ifndef TILE_WIDTH
#define TILE_WIDTH 16
#endif
__global__ void MatrixMulKernel(float* Md, float* Nd, float* Pd, int Width) {
    __shared__ float Mds[TILE_WIDTH][TILE_WIDTH];
    __shared__ float Nds[TILE_WIDTH][TILE_WIDTH];
    int bx = blockIdx.x, by = blockIdx.y, tx = threadIdx.x, ty = threadIdx.y;
    int Row = by * TILE_WIDTH + ty;
    int Col = bx * TILE_WIDTH + tx;
    float Pvalue = 0;
    for (int m = 0; m < Width / TILE_WIDTH; ++m) {
        Mds[ty][tx] = Md[Row * Width + (m * TILE_WIDTH + tx)];
        Nds[ty][tx] = Nd[(m * TILE_WIDTH + ty) * Width + Col];
        __syncthreads();
        for (int k = 0; k < TILE_WIDTH; ++k)
            Pvalue += Mds[ty][k] * Nds[k][tx];
        __syncthreads();
    }
    Pd[Row * Width + Col] = Pvalue;
}
"""

#: The notebook's kernel, rectangular and adding into C.
ADDING = """\
__global__ void mm(const float* A, const float* B, float* C, int M, int K, int N) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = 0; i < K; i++)
        C[row * N + col] += A[row * K + i] * B[i * N + col];
}
"""

#: Never ends: the loop reads a volatile, so the compiler must keep it.
SPIN = """\
__global__ void MatrixMulKernel(float* M, float* N, float* P, int Width) {
    // P is zeroed before the launch and nothing writes it: a read the compiler must repeat, forever
    volatile int *flag = (volatile int *)P;
    while (flag[0] == 0) { }
    P[0] = M[0] * N[0];
}
"""

#: Writes four terabytes past P.
OUT_OF_BOUNDS = """\
__global__ void MatrixMulKernel(float* M, float* N, float* P, int Width) {
    P[threadIdx.x + 1000000000000LL] = M[0] * N[0];
}
"""

TILES = (4, 8, 16, 32)
#: (M, K, N): rectangular, 1×1, prime-sized, not a multiple of any tile, a multiple of every tile.
SHAPES = [(48, 80, 16), (1, 1, 1), (37, 53, 29), (100, 70, 130), (64, 64, 64)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("pycuda", reason="pycuda is not installed")
    return tmp_path_factory.mktemp("kernel-cache")


def backend(folder: Path, name: str, source: str, cache: Path, launch_timeout_s: float = 5.0) -> KernelFileBackend:
    path = folder / name
    path.write_text(source, encoding="utf-8")
    return KernelFileBackend(path, KernelFileSettings(kernel_cache=cache, launch_timeout_s=launch_timeout_s))


@pytest.fixture
def made() -> Iterator[list[KernelFileBackend]]:
    """Backends a test made, closed after it (a launch process left unused is killed)."""
    held: list[KernelFileBackend] = []
    yield held
    for b in held:
        b.close()


def run(b: KernelFileBackend, a: np.ndarray, m: np.ndarray, tile: int = 16) -> np.ndarray:
    product = b.multiply(a, m, MultiplyRequest(tile=tile))
    assert all(product.timings_ms[p] >= 0 for p in CUDA_PHASES)
    return product.c


def operands(m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(-10, 10, (m, k)).astype(np.float32), rng.uniform(-10, 10, (k, n)).astype(np.float32)


def assert_right(c: np.ndarray, a: np.ndarray, b: np.ndarray, what: str) -> None:
    """Every value within mmd check's fp32 model of the float64 product (and finite: none left unwritten)."""
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert c.shape == ref.shape and np.isfinite(c).all(), what
    allowed = model_factor(a.shape[1]) * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    worst = float(np.max(np.abs(c - ref) - allowed))
    assert worst <= 0, f"{what}: {worst:.3g} past the fp32 model"


@pytest.mark.parametrize("source", [NAIVE, TILED], ids=["naive", "tiled"])
def test_course_kernels_are_exact_on_i_times_m_and_right_on_every_shape(
    source: str, tmp_path: Path, cache: Path, made: list[KernelFileBackend]
) -> None:
    b = backend(tmp_path, "p.cu", source, cache)  # each multiply has a launch process of its own
    made.append(b)
    for tile in TILES:
        for m, k, n in SHAPES:
            a, right = operands(m, k, n, seed=m * 7 + n)
            identity = np.eye(m, k, dtype=np.float32)
            c = run(b, identity, right, tile)  # I·B is B's first rows (zeros past K): exact in any order
            exact = np.zeros((m, n), np.float32)
            rows = min(m, k)
            exact[:rows] = right[:rows]
            got = b"".join(textformat.emit_chunks(c))
            assert got == b"".join(textformat.emit_chunks(exact)), f"tile {tile} {m}x{k}x{n}: I·B not exact"
            assert np.array_equal(c.view(np.uint32), exact.view(np.uint32)), "a bit (a sign) changed by padding"
            assert_right(run(b, a, right, tile), a, right, f"tile {tile} {m}x{k}x{n}")


def test_tile_64_is_refused_before_launch(tmp_path: Path, cache: Path, made: list[KernelFileBackend]) -> None:
    b = backend(tmp_path, "p.cu", TILED, cache)
    made.append(b)
    a, m = operands(64, 64, 64, 1)
    with pytest.raises(TileError, match="tile 64 needs 4096 threads per block"):
        b.multiply(a, m, MultiplyRequest(tile=64))


def test_a_kernel_adding_into_c_is_right_twice_in_a_row(
    tmp_path: Path, cache: Path, made: list[KernelFileBackend]
) -> None:
    b = backend(tmp_path, "add.cu", ADDING, cache)
    made.append(b)
    a, m = operands(37, 53, 29, 5)
    for _ in range(2):
        assert_right(run(b, a, m, 8), a, m, "+= kernel")


def test_a_kernel_that_never_ends_is_stopped_and_the_next_job_is_right(
    tmp_path: Path, cache: Path, made: list[KernelFileBackend]
) -> None:
    limit = 2.0
    spin = backend(tmp_path, "spin.cu", SPIN, cache, launch_timeout_s=limit)
    made.append(spin)
    a, m = operands(64, 64, 64, 2)
    start = time.monotonic()
    with pytest.raises(KernelLaunchError, match="ran past its time limit, 2 s") as caught:
        spin.multiply(a, m, MultiplyRequest(tile=16))
    stopped = caught.value.details["stopped_after_s"]
    assert stopped <= limit + 2, f"stopped {stopped:.2f} s after the launch"
    print(f"\nspin: stopped {stopped:.3f} s after its launch ({time.monotonic() - start:.3f} s in all)")
    start = time.monotonic()
    good = backend(tmp_path, "p.cu", TILED, cache)
    made.append(good)
    assert_right(run(good, a, m, 16), a, m, "the job after a killed kernel")
    print(f"next job right, {time.monotonic() - start:.3f} s after it was started")


def test_a_kernel_writing_far_out_of_bounds_is_refused_by_cudas_name(
    tmp_path: Path, cache: Path, made: list[KernelFileBackend]
) -> None:
    bad = backend(tmp_path, "oob.cu", OUT_OF_BOUNDS, cache)
    made.append(bad)
    a, m = operands(32, 32, 32, 3)
    with pytest.raises(KernelLaunchError, match="CUDA_ERROR_ILLEGAL_ADDRESS") as caught:
        bad.multiply(a, m, MultiplyRequest(tile=16))
    assert caught.value.details["cuda_error"] == "CUDA_ERROR_ILLEGAL_ADDRESS"
    good = backend(tmp_path, "p.cu", NAIVE, cache)
    made.append(good)
    assert_right(run(good, a, m, 16), a, m, "the job after a fault")


def test_mmd_run_with_the_course_kernel_prints_what_the_built_in_kernel_prints(tmp_path: Path) -> None:
    """The course's naive kernel and mmd's own naive are one FMA chain over k per output: the same bytes,
    through padding and cropping; the sidecar names the file, its sha256 and the padding."""
    pytest.importorskip("pycuda", reason="pycuda is not installed")
    src = tmp_path / "a.txt"
    done = run_mmd("gen", "--shape", "37", "53", "29", "--seed", "7", "-o", str(src), "-q")
    assert done.returncode == 0, done.stderr
    k = tmp_path / "p1.cu"
    k.write_text(NAIVE, encoding="utf-8")
    env = {"MMD_BACKEND": "cuda"}
    mine = run_mmd("run", str(src), "--kernel-file", str(k), "--tile", "16", "-o", str(tmp_path / "f.out"), env=env)
    assert mine.returncode == 0, mine.stderr
    own = run_mmd("run", str(src), "--kernel", "naive", "--tile", "16", "-o", str(tmp_path / "o.out"), env=env)
    assert own.returncode == 0, own.stderr
    assert (tmp_path / "f.out").read_bytes() == (tmp_path / "o.out").read_bytes()
    import yaml

    rec = yaml.safe_load((tmp_path / "f.timing.yaml").read_text(encoding="utf-8"))
    assert rec["kernel"] == "p1.cu" and rec["kernel_file"]["padded"] == {"m": 64, "k": 64, "n": 64}
    assert rec["kernel_file"]["sha256"] and all(rec["timings_ms"][p] is not None for p in CUDA_PHASES)
    checked = run_mmd("check", str(tmp_path / "f.out"), "--input", str(src))
    assert checked.returncode == 0, checked.stdout


def test_the_worked_examples_run(tmp_path: Path, cache: Path, made: list[KernelFileBackend]) -> None:
    a, m = operands(100, 70, 130, 11)
    for path in sorted((ROOT / "docs" / "examples").glob("*.cu")):
        b = KernelFileBackend(path, KernelFileSettings(kernel_cache=cache))
        made.append(b)
        assert_right(run(b, a, m, 16), a, m, path.name)


@pytest.mark.parametrize(
    ("shape", "values"),
    [((512, 512, 512), ("-10", "10")), ((300, 257, 190), ("-10", "10")), ((512, 512, 512), ("9000", "9999"))],
    ids=["square", "padded", "wide"],
)
def test_a_large_input_takes_the_gpu_text_path_in_the_launch_process(
    tmp_path: Path, shape: tuple[int, ...], values: tuple[str, str]
) -> None:
    """An input past the text path's threshold is parsed, multiplied (padded on the device where the kernel needs it)
    and formatted in the launch process: the bytes of mmd's own naive kernel and of the host text path. Wide
    values (fields of 13 bytes) make an answer larger than the memory the launch process made for it ahead."""
    pytest.importorskip("pycuda", reason="pycuda is not installed")
    src = tmp_path / "a.txt"
    done = run_mmd("gen", "--shape", *map(str, shape), "--seed", "5", "--range", *values, "-o", str(src), "-q")
    assert done.returncode == 0, done.stderr
    k = tmp_path / "p1.cu"
    k.write_text(NAIVE, encoding="utf-8")
    outs = {}
    for name, how, extra in (
        ("file-gpu", ["--kernel-file", str(k)], {}),
        ("file-host", ["--kernel-file", str(k)], {"MMD_TEXT_PATH": "host"}),
        ("own", ["--kernel", "naive"], {}),
    ):
        out = tmp_path / f"{name}.out"
        ran = run_mmd("run", str(src), *how, "--tile", "16", "-o", str(out), env={"MMD_BACKEND": "cuda", **extra})
        assert ran.returncode == 0, ran.stderr
        outs[name] = out.read_bytes()
    assert outs["file-gpu"] == outs["own"] == outs["file-host"]
    import yaml

    rec = yaml.safe_load((tmp_path / "file-gpu.timing.yaml").read_text(encoding="utf-8"))
    assert rec["text"]["path"] == "gpu" and not rec["text"].get("host_parse")
    padded = rec["kernel_file"].get("padded")
    assert (padded is None) == (shape[0] == 512), padded
    assert all(rec["timings_ms"][p] is not None for p in CUDA_PHASES)
