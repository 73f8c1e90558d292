"""cuBLAS through ctypes: SGEMM (the ``cublas`` and ``cublas_tf32`` kernels) and DGEMM (float64 references).

Every call runs on the session's stream. ``cublas_tf32`` is the same SGEMM
with the handle's math mode set to TF32 tensor-core math for the call.

pycuda does not wrap cuBLAS; ctypes does the job with no build step, and
the library is found where CUDA, the nvidia-cublas wheel or ``MMD_CUBLAS``
put it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import os
import sys
from typing import Any

from ..errors import BackendUnavailable, CudaError
from .driver import one_line
from .memory import DeviceMatrix


def cublas_candidates() -> list[str]:
    """Paths (or sonames) where libcublas may be, most specific first."""
    found: list[str] = []
    env = os.environ.get("MMD_CUBLAS")
    if env:
        found.append(env)
    name = ctypes.util.find_library("cublas")
    if name:
        found.append(name)
    roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    roots += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for root in filter(None, roots):
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            found += sorted(glob.glob(os.path.join(root, sub, "libcublas.so*")), reverse=True)
    # The nvidia-cublas wheel (what PyTorch and CuPy bring): site-packages/nvidia/cublas/lib.
    for entry in sys.path:
        for pattern in ("nvidia/cublas/lib/libcublas.so*", "nvidia/cu*/lib/libcublas.so*"):
            found += sorted(glob.glob(os.path.join(entry, pattern)), reverse=True)
    found += ["libcublas.so", "libcublas.so.13", "libcublas.so.12"]
    unique: list[str] = []
    for path in found:
        if path not in unique and "Lt" not in os.path.basename(path):
            unique.append(path)
    return unique


class Cublas:
    """cuBLAS SGEMM and DGEMM through ctypes, on the session's stream."""

    #: cublasOperation_t CUBLAS_OP_N.
    OP_N = 0
    #: cublasMath_t: CUBLAS_DEFAULT_MATH (SGEMM on the fp32 FMA units; what cuBLAS does unless told).
    DEFAULT_MATH = 0
    #: cublasMath_t: CUBLAS_TF32_TENSOR_OP_MATH (single-precision routines may round to TF32 on tensor cores).
    TF32_TENSOR_OP_MATH = 3

    def __init__(self, stream_handle: int) -> None:
        self.lib, self.path = self._load()
        self._handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self._handle)), "cublasCreate")
        self._check(self.lib.cublasSetStream_v2(self._handle, ctypes.c_void_p(stream_handle)), "cublasSetStream")
        self._math = self.DEFAULT_MATH  # a new handle's mode

    @staticmethod
    def _load() -> tuple[ctypes.CDLL, str]:
        tried = []
        for candidate in cublas_candidates():
            try:
                folder = os.path.dirname(candidate)
                if folder:  # cublas needs cublasLt from the same folder
                    for lt in sorted(glob.glob(os.path.join(folder, "libcublasLt.so*"))):
                        with contextlib.suppress(OSError):
                            ctypes.CDLL(lt, mode=ctypes.RTLD_GLOBAL)
                            break
                lib = ctypes.CDLL(candidate)
                lib.cublasSgemm_v2.restype = lib.cublasDgemm_v2.restype = lib.cublasSetMathMode.restype = ctypes.c_int
                return lib, candidate
            except (OSError, AttributeError) as exc:
                tried.append(f"{candidate}: {one_line(exc)}")
        raise BackendUnavailable(
            "libcublas cannot be loaded (set MMD_CUBLAS to its path); tried "
            + "; ".join(tried[:4])
            + (" ..." if len(tried) > 4 else "")
        )

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CudaError(f"{what} failed with cuBLAS status {status}", details={"status": status})

    def sgemm(self, a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix, *, tf32: bool = False) -> None:
        """C = A·B for row-major float32 A (m×k), B (k×n), C (m×n); ``tf32``: on the TF32 tensor cores."""
        self._set_math(self.TF32_TENSOR_OP_MATH if tf32 else self.DEFAULT_MATH)
        self._gemm(
            self.lib.cublasSgemm_v2, ctypes.c_float, a.rows, a.cols, b.cols, (a.ptr, a.ld), (b.ptr, b.ld), (c.ptr, c.ld)
        )

    def dgemm(self, m: int, k: int, n: int, a: int, b: int, c: int) -> None:
        """C = A·B for packed row-major float64 matrices at device addresses ``a``, ``b``, ``c``."""
        self._set_math(self.DEFAULT_MATH)  # TF32 mode leaves DGEMM alone, but a reference must not depend on it
        self._gemm(self.lib.cublasDgemm_v2, ctypes.c_double, m, k, n, (a, k), (b, n), (c, n))

    def _set_math(self, mode: int) -> None:
        """The handle's math mode for the next calls (a host-side setting: set only when it changes)."""
        if mode != self._math:
            self._check(self.lib.cublasSetMathMode(self._handle, ctypes.c_int(mode)), "cublasSetMathMode")
            self._math = mode

    def _gemm(
        self,
        call: Any,
        scalar: Any,
        m: int,
        k: int,
        n: int,
        a: tuple[int, int],
        b: tuple[int, int],
        c: tuple[int, int],
    ) -> None:
        """One GEMM call on row-major operands, each given as (device address, leading dimension).

        cuBLAS is column-major: a row-major matrix is its transpose in column
        major, so C^T = B^T·A^T is asked for, B first and no transposes.
        """
        alpha, beta = scalar(1.0), scalar(0.0)
        status = call(
            self._handle, self.OP_N, self.OP_N,
            ctypes.c_int(n), ctypes.c_int(m), ctypes.c_int(k),
            ctypes.byref(alpha),
            ctypes.c_void_p(b[0]), ctypes.c_int(b[1]),
            ctypes.c_void_p(a[0]), ctypes.c_int(a[1]),
            ctypes.byref(beta),
            ctypes.c_void_p(c[0]), ctypes.c_int(c[1]),
        )  # fmt: skip
        self._check(status, call.__name__)

    def close(self) -> None:
        if self._handle:
            self.lib.cublasDestroy_v2(self._handle)
            self._handle = ctypes.c_void_p()
