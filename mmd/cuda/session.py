"""One GPU in the calling thread: its context and stream, and the parts that do the work.

A :class:`GpuSession` belongs to the thread that opened it: it retains the
device's primary context and pushes it onto that thread's context stack
(:class:`~mmd.cuda.driver.Context`), and :meth:`GpuSession.close` pops it
again. Open, use and close a session in one thread.

The session is its parts, each a module of its own; call them directly:

* ``session.device`` (:class:`~mmd.cuda.device.Device`): the device's limits, name, versions, free memory;
* ``session.memory`` (:class:`~mmd.cuda.memory.Memory`): device matrices and raw buffers, page-locked host
  buffers, the copies between them, fills, the L2 flush, the device cache a worker keeps;
* ``session.modules`` (:class:`~mmd.cuda.modules.Modules`): registry kernels built for the device, the text
  kernels' modules, kernel files' cubins, over the disk cache (``session.modules.cache``);
* ``session.stream`` (:class:`~mmd.cuda.stream.Stream`): launches (registry builds, cuBLAS, kernel files',
  the text kernels), events and phase timers, waiting, the float64 reference product;
* ``session.text`` (:class:`~mmd.cuda.text.GpuText`): the GPU text path.

Driver failures become :class:`~mmd.errors.CudaError` with a one-line reason
(:meth:`~mmd.cuda.driver.Context.converting`); a missing pycuda, driver or
device is :class:`~mmd.errors.BackendUnavailable`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..errors import CudaError
from .compiler import KernelCache
from .device import Device
from .driver import Context, one_line
from .memory import Memory
from .modules import Modules
from .stream import Stream
from .text import GpuText


class GpuSession:
    """One device, in the calling thread: its parts compile, allocate, copy, launch and time.

    ``kernel_cache``: the folder of compiled kernels (None: no disk cache), or
    a :class:`KernelCache`.
    """

    def __init__(self, device: int = 0, kernel_cache: Path | KernelCache | None = None) -> None:
        cache = kernel_cache if isinstance(kernel_cache, KernelCache) else KernelCache(kernel_cache)
        context = Context(device)
        self._context = context
        #: Exception classes the driver raises, for callers' nets.
        self.errors = context.errors
        try:
            self.device = Device(context)
        except context.cuda.Error as exc:
            context.close()
            raise CudaError(f"opening CUDA device {device} failed: {one_line(exc)}") from exc
        limits = self.device.limits
        self.memory = Memory(context, limits.l2_cache_bytes)
        self.modules = Modules(context, cache, limits.arch)
        self.stream = Stream(context, self.modules, self.memory)
        self.text = GpuText(self.modules, self.memory, self.stream)

    def close(self) -> None:
        """Free what the parts hold (buffers, modules, cuBLAS), drop the stream, pop the context. Idempotent."""
        context = self._context
        if context.closed:
            return
        context.closed = True
        with contextlib.suppress(Exception):
            if context.stream is not None:
                context.stream.synchronize()
        problems = self.stream.close()
        self.memory.close()
        problems += self.modules.close()
        problems += context.close()
        if problems:
            raise CudaError(f"closing the CUDA device: {one_line(problems[0])}")
