"""Every finite float32 product written as printf writes it, on a GPU: fields of up to 39 digits before the
point (FLT_MAX) through every exact fp32 kernel at every tile, by the GPU text path and by the host one.

The inputs are I·M, whose product is M exactly in any order of summation (each element is one value of M
plus products by 0), so the output must be C printf's ``%6.2f`` of M's float32 values, byte for byte
(``c_printf``, a compiled C program), and ``mmd check`` must read each field back as the decimal printed.
M holds no -0.0 (+0 + -0 is +0) and nothing that is not finite.
"""

from __future__ import annotations

import numpy as np
import pytest

from mmd import kernels as registry
from mmd import textoutput
from mmd.backends import CpuBackend
from mmd.backends.base import MultiplyRequest
from mmd.record import as_dict

from ..conftest import run_file

pytestmark = pytest.mark.gpu

FLT_MAX = float(np.finfo(np.float32).max)
#: The exact fp32 kernels (KernelSpec.exact), each at every tile it takes (a fixed-block kernel at one).
EXACT = [name for name in registry.GPU_KERNELS if registry.get(name).exact and registry.get(name).precision == "fp32"]
RUNS = [(name, tile) for name in EXACT for tile in (registry.TILES if registry.get(name).uses_tile else (16,))]
#: Where the GPU's own formatter stops (|x| from 10^16 on: kernels/text_emit.cu's FAST_LIMIT); the host formats.
HOST_FORMATS = "values beyond the gpu formatter's digits: the host formatted the output"


def widest_2x2() -> np.ndarray:
    return np.array([[FLT_MAX, -FLT_MAX], [1e13, 123456789012345.0]], np.float32)


def within_the_gpu_formatter() -> np.ndarray:
    """Fields of 14 to 16 digits, which the GPU formats itself."""
    return np.array([[1e13, -123456789012345.0], [9.999999e15, -5e15]], np.float32)


def wide_48() -> np.ndarray:
    """48×48: random float32 bit patterns (every magnitude, FLT_MAX's neighbours), ordinary values and ties."""
    rng = np.random.default_rng(48)
    bits = rng.integers(0, 2**32, 48 * 48, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
    bits[~np.isfinite(bits) | (np.abs(bits) < np.finfo(np.float32).tiny)] = 1.0  # no subnormal: FTZ is not the question
    m = bits.reshape(48, 48)
    m[::3] = (rng.standard_normal((16, 48)) * 1000).astype(np.float32)
    m[1::7, ::5] = np.float32(FLT_MAX)
    m[2::7, 1::5] = -np.float32(FLT_MAX)
    m[5, :] = (rng.integers(-800, 800, 48) / 8).astype(np.float32)  # ties: 0.125 prints 0.12
    m[m == 0] = 0.0  # no -0.0
    return m


MATRICES = {"widest-2x2": widest_2x2, "gpu-digits-2x2": within_the_gpu_formatter, "wide-48x48": wide_48}


def identity_times(tmp_path, mat: np.ndarray, name: str):
    m = mat.shape[0]
    eye = " ".join("1" if i == j else "0" for i in range(m) for j in range(m))
    body = " ".join(repr(float(v)) for v in mat.reshape(-1))
    src = tmp_path / f"{name}.txt"
    src.write_text(f"{m} {m} {mat.shape[1]}\n{eye}\n{body}\n")
    return src


def printf_output(mat: np.ndarray, c_printf) -> bytes:
    header = b"%d\n" % mat.shape[0] if mat.shape[0] == mat.shape[1] else b"%d %d\n" % mat.shape
    return header + b"".join(c_printf(row) for row in mat)


@pytest.mark.parametrize("text_path", ["gpu", "host"])
@pytest.mark.parametrize("which", list(MATRICES))
@pytest.mark.parametrize(("kernel", "tile"), RUNS, ids=[f"{k}-{t}" for k, t in RUNS])
def test_every_finite_float32_is_printf_s_through_every_exact_kernel(
    cuda_backend, tmp_path, c_printf, kernel, tile, which, text_path
):
    mat = MATRICES[which]()
    src = identity_times(tmp_path, mat, which)
    out = tmp_path / f"{which}.out"
    request = MultiplyRequest(kernel=kernel, tile=tile, memory="device", text_path=text_path)
    result = run_file(src, out, cuda_backend, request)
    if result.error is not None and result.error.kind == "tile":
        pytest.skip(f"{kernel} at tile {tile} does not launch here: {result.error}")
    assert result.ok, result.error
    rec = as_dict(result.record)
    assert rec["text"]["path"] == text_path
    assert np.array_equal(np.array(result.product.c).view(np.uint32), mat.view(np.uint32)), "I·M is not M"
    text = out.read_bytes()
    assert text == printf_output(mat, c_printf)
    assert textoutput.parse_output(text).tolist() == [[float(b"%.2f" % float(v)) for v in row] for row in mat]
    host_formatted = any(HOST_FORMATS in note for note in rec.get("notes") or [])
    assert host_formatted == (text_path == "gpu" and bool((np.abs(mat) >= 1e16).any()))


def test_the_gpu_path_and_the_cpu_give_the_same_bytes_and_refuse_only_what_is_not_finite(cuda_backend, tmp_path):
    mat = wide_48()
    src = identity_times(tmp_path, mat, "same")
    gpu = run_file(src, tmp_path / "gpu.out", cuda_backend, MultiplyRequest(kernel="tiled", tile=16, text_path="gpu"))
    cpu = run_file(src, tmp_path / "cpu.out", CpuBackend(), MultiplyRequest(kernel="cpu", text_path="host"))
    assert gpu.ok and cpu.ok
    assert (tmp_path / "gpu.out").read_bytes() == (tmp_path / "cpu.out").read_bytes()
    (tmp_path / "inf.txt").write_text("2\n1 1 0 1\n3e38 3e38 3e38 -3e38\n")  # finite inputs; 3e38 + 3e38 is inf
    bad = run_file(tmp_path / "inf.txt", tmp_path / "inf.out", cuda_backend, MultiplyRequest(text_path="gpu"))
    assert not bad.ok and bad.error.kind == "overflow" and not (tmp_path / "inf.out").exists()
