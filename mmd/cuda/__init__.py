"""Everything in mmd that talks to the CUDA driver, through pycuda: the only package that imports it.

* :mod:`.driver`: pycuda imported lazily, device count, error text;
* :mod:`.compiler`: nvcc and mmd's disk cache of compiled kernels;
* :mod:`.memory`: device matrices and page-locked host buffers;
* :mod:`.cublas`: SGEMM and DGEMM through ctypes;
* :mod:`.text`: parsing and formatting the text formats on the GPU;
* :mod:`.session`: :class:`GpuSession`, one device in one thread, which ties them together.

The backend (:mod:`mmd.backends.cuda`) holds the job's logic and sees only a
session; tests give it a fake one (tests/fakes.py).
"""

from .compiler import Compiled, KernelCache, Module
from .driver import device_count
from .memory import DeviceMatrix
from .session import GpuSession, PhaseTimer

__all__ = ["Compiled", "DeviceMatrix", "GpuSession", "KernelCache", "Module", "PhaseTimer", "device_count"]
