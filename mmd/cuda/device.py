"""The GPU a session runs on: what it allows a launch, its name and versions, and its free memory."""

from __future__ import annotations

from typing import Any

from ..kernels import DeviceLimits
from .driver import Context


class Device:
    """``session.device``: the facts of the device a :class:`~mmd.cuda.driver.Context` is on, its limits read
    once."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self.limits = read_limits(context.cuda, context.device)

    def name(self) -> str:
        """``"NVIDIA H100 80GB HBM3 (sm_90)"``."""
        return f"{self.limits.name} ({self.limits.arch})"

    def versions(self) -> dict[str, str]:
        """Driver, toolkit (as pycuda was built) and pycuda versions."""
        import pycuda

        cuda = self._context.cuda

        def dotted(v: int) -> str:
            return f"{v // 1000}.{v % 1000 // 10}"

        return {
            "driver": dotted(cuda.get_driver_version()),
            "pycuda_built_for": ".".join(map(str, cuda.get_version())),
            "pycuda": str(getattr(pycuda, "VERSION_TEXT", "?")),
        }

    def mem_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes."""
        with self._context.converting("reading free device memory"):
            free, total = self._context.cuda.mem_get_info()
        return int(free), int(total)


def read_limits(cuda: Any, dev: Any) -> DeviceLimits:
    """pycuda Device ``dev``'s limits."""
    attr = cuda.device_attribute
    major, minor = dev.compute_capability()
    return DeviceLimits(
        max_threads_per_block=dev.get_attribute(attr.MAX_THREADS_PER_BLOCK),
        max_shared_per_block=dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK),
        max_registers_per_block=dev.get_attribute(attr.MAX_REGISTERS_PER_BLOCK),
        name=dev.name(),
        compute_capability=(int(major), int(minor)),
        total_memory=dev.total_memory(),
        max_grid_x=dev.get_attribute(attr.MAX_GRID_DIM_X),
        max_grid_y=dev.get_attribute(attr.MAX_GRID_DIM_Y),
        multiprocessors=dev.get_attribute(attr.MULTIPROCESSOR_COUNT),
        max_shared_optin=dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        l2_cache_bytes=dev.get_attribute(attr.L2_CACHE_SIZE),
        pci_bus_id=str(dev.pci_bus_id()),
    )
