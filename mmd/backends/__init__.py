"""Backends: where the multiply runs. ``open_backend`` is the one place that picks one."""

from __future__ import annotations

from .base import CUDA_PHASES, MEMORY_MODES, Backend, MultiplyRequest, Product
from .cpu import CpuBackend

__all__ = ["CUDA_PHASES", "MEMORY_MODES", "Backend", "CpuBackend", "MultiplyRequest", "Product", "open_backend"]


def open_backend(name: str, device: int = 0) -> tuple[Backend, str | None]:
    """Open backend ``name`` (auto, cpu, cuda) in the calling thread.

    Returns the backend and a note when ``auto`` fell back to the CPU (the
    reason the GPU could not be used). ``cuda`` raises BackendUnavailable
    where there is no usable GPU.
    """
    from ..errors import BackendUnavailable

    if name == "cpu":
        return CpuBackend(), None
    try:
        from .cuda import CudaBackend

        return CudaBackend(device=device), None
    except BackendUnavailable as exc:
        if name == "cuda":
            raise
        return CpuBackend(), f"no usable GPU ({exc.reason}); using the cpu backend"
    except ImportError as exc:  # the cuda backend module itself is missing
        if name == "cuda":
            raise BackendUnavailable(f"the cuda backend cannot be loaded: {exc}") from None
        return CpuBackend(), f"no usable GPU ({exc}); using the cpu backend"
