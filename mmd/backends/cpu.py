"""The CPU backend: numpy's float32 matmul (BLAS sgemm) — works everywhere."""

from __future__ import annotations

import platform
import time

import numpy as np

from .base import Backend, MultiplyRequest, Product

#: The kernel name the CPU backend reports; CUDA kernel names asked of it are
#: recorded as a note, since tiles and kernels mean nothing on the CPU.
CPU_KERNEL = "cpu"


class CpuBackend(Backend):
    """Multiply with numpy in float32 on the host."""

    name = "cpu"

    def multiply(self, a: np.ndarray, b: np.ndarray, request: MultiplyRequest) -> Product:
        """Return A·B computed by numpy; ``request.kernel`` other than cpu is noted, not run."""
        notes = []
        if request.kernel != CPU_KERNEL:
            notes.append(f"kernel {request.kernel} needs the cuda backend; ran numpy on the cpu")
        start = time.perf_counter()
        c = np.matmul(a, b)
        elapsed = (time.perf_counter() - start) * 1e3
        return Product(
            c=np.ascontiguousarray(c, dtype=np.float32),
            kernel=CPU_KERNEL,
            tile=None,
            memory=None,
            device=self.device_name(),
            timings_ms={"kernel": elapsed},
            notes=notes,
        )

    def device_name(self) -> str:
        """The host CPU and numpy version."""
        cpu = platform.processor() or platform.machine()
        return f"cpu {cpu} (numpy {np.__version__})"

    def close(self) -> None:
        """Nothing to release."""
