"""Backends: where the multiply runs. ``open_backend`` is the one place that picks one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import CUDA_PHASES, MEMORY_MODES, Backend, MultiplyRequest, Product
from .cpu import CpuBackend

__all__ = [
    "CUDA_PHASES",
    "MEMORY_MODES",
    "Backend",
    "CpuBackend",
    "MultiplyRequest",
    "Product",
    "open_backend",
    "worker_devices",
]

_DEFAULT: Any = object()


def open_backend(name: str, device: int = 0, kernel_cache: Path | None = _DEFAULT) -> tuple[Backend, str | None]:
    """Open backend ``name`` (auto, cpu, cuda) in the calling thread.

    Returns the backend and a note when ``auto`` fell back to the CPU (the
    reason the GPU could not be used). ``cuda`` raises BackendUnavailable
    where there is no usable GPU. ``kernel_cache``: the folder of compiled
    kernels (None: none; left out: the default, see :mod:`mmd.gpu`).
    """
    from ..errors import BackendUnavailable

    if name == "cpu":
        return CpuBackend(), None
    try:
        from .cuda import CudaBackend

        if kernel_cache is _DEFAULT:
            return CudaBackend(device=device), None
        from ..gpu import GpuSession

        return CudaBackend(device=device, session_factory=lambda d: GpuSession(d, kernel_cache=kernel_cache)), None
    except BackendUnavailable as exc:
        if name == "cuda":
            raise
        return CpuBackend(), f"no usable GPU ({exc.reason}); using the cpu backend"
    except ImportError as exc:  # the cuda backend module itself is missing
        if name == "cuda":
            raise BackendUnavailable(f"the cuda backend cannot be loaded: {exc}") from None
        return CpuBackend(), f"no usable GPU ({exc}); using the cpu backend"


def worker_devices(backend: str, devices: tuple[int, ...] | list[int] | None) -> list[int]:
    """The device ordinals ``mmd serve`` runs one worker each on.

    ``devices`` as configured; None (``all``): every GPU the driver shows
    (after CUDA_VISIBLE_DEVICES), or one worker where there is none or the
    backend is ``cpu``. On the cpu backend a list asks for that many CPU workers.
    """
    if devices is not None:
        return list(devices)
    if backend == "cpu":
        return [0]
    from ..gpu import device_count

    return list(range(device_count())) or [0]
