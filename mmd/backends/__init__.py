"""Backends: where the multiply runs. ``open_backend`` is the one place that picks one."""

from __future__ import annotations

from pathlib import Path

from ..config import Settings, kernel_cache_dir
from ..cpus import usable_cores
from ..errors import BackendUnavailable
from ..logs import get_logger
from .base import CUDA_PHASES, Backend, MultiplyRequest, Product
from .cpu import CpuBackend

__all__ = [
    "BackendPool",
    "CUDA_PHASES",
    "Backend",
    "CpuBackend",
    "MultiplyRequest",
    "Product",
    "open_backend",
    "worker_devices",
]


def open_backend(name: str, device: int = 0, kernel_cache: Path | None = None) -> tuple[Backend, str | None]:
    """Open backend ``name`` (auto, cpu, cuda) in the calling thread.

    Returns the backend and, when ``auto`` fell back to the CPU, why the GPU
    could not be used (a normal outcome on a machine without one, said at
    info level by callers). ``cuda`` raises BackendUnavailable where there is
    no usable GPU. ``kernel_cache``: the folder of compiled kernels (None: none).
    """
    if name == "cpu":
        return CpuBackend(), None
    try:
        from .cuda import CudaBackend

        return CudaBackend(device, kernel_cache), None
    except BackendUnavailable as exc:
        if name == "cuda":
            raise
        return CpuBackend(), f"no usable GPU ({exc.reason}); using the cpu backend"


def worker_devices(backend: str, devices: tuple[int, ...] | list[int] | None, per_device: int = 1) -> list[int]:
    """The device of each worker process ``mmd serve`` runs (one entry per worker).

    ``devices`` as configured, ``per_device`` workers on each GPU; None
    (``all``): every GPU the driver shows (after CUDA_VISIBLE_DEVICES). On the
    cpu backend, and for ``auto`` where there is no GPU, one worker per usable
    core (a list of devices asks for that many CPU workers instead).
    """
    if backend == "cpu":
        return list(devices) if devices is not None else [0] * usable_cores()
    if devices is not None:
        return [d for d in devices for _ in range(per_device)]
    from ..cuda.driver import device_count

    count = device_count()
    if not count:
        return [0] * usable_cores() if backend == "auto" else [0]
    return [d for d in range(count) for _ in range(per_device)]


class BackendPool:
    """The backends one thread has opened, by setting: a job asks for one by its settings, all close together.

    A backend belongs to the thread that opened it (a CUDA context), so each
    worker thread, and `mmd run` (:class:`mmd.oneshot.OneShot`), has its own pool.
    """

    def __init__(self, device: int | None = None, *, log_fallback: bool = True) -> None:
        #: The device every backend opens on (None: each job's ``device`` setting).
        self.device = device
        self._open: dict[tuple[str, int], Backend] = {}
        #: Why ``auto`` fell back to the cpu, when it did (for status lines).
        self.notes: list[str] = []
        #: Log each fallback as it happens (a daemon's worker tells its own to the daemon instead).
        self.log_fallback = log_fallback

    def get(self, settings: Settings) -> Backend:
        """The backend ``settings`` ask for, opened on first use (BackendUnavailable when it cannot be)."""
        device = settings.device if self.device is None else self.device
        key = (settings.backend, device)
        backend = self._open.get(key)
        if backend is None:
            backend = next((b for (_, d), b in self._open.items() if d == device and b.name == settings.backend), None)
        if backend is None:
            backend, note = open_backend(settings.backend, device, kernel_cache_dir(settings))
            if note:
                self.notes.append(note)
                if self.log_fallback:
                    get_logger().info("backend fallback", note=note, device_index=device)
        self._open[key] = backend
        return backend

    @property
    def opened(self) -> list[Backend]:
        return list(dict.fromkeys(self._open.values()))

    def close(self) -> None:
        """Close every backend; a failure to close is logged, never raised (it must not hide why we stop)."""
        for backend in self.opened:
            try:
                backend.close()
            except Exception as exc:
                get_logger().warning("backend close failed", error=repr(exc))
        self._open.clear()
