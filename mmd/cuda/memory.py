"""Device and page-locked host memory: device matrices, raw device buffers, the copies between them, and
what a session keeps from job to job (:mod:`.pools`)."""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import KernelError
from ..kernels import FLOAT_BYTES
from .driver import Context
from .libcuda import HostMemory
from .pools import DEVICE_CACHE_CAP_BYTES, DeviceCache, PinnedPool

_MIB = 1024 * 1024
#: flush_l2 writes at least this much, should a device report no L2 size.
_MIN_FLUSH_BYTES = 64 * _MIB


@dataclass
class DeviceMatrix:
    """A row-major float32 matrix in device memory (any of the three modes)."""

    mode: str
    rows: int
    cols: int
    #: Row stride in elements (cols, or the pitch / 4 for pitched memory).
    ld: int
    #: Device address, for kernel arguments and cuBLAS.
    ptr: int
    #: The pycuda object that owns the memory (DeviceAllocation, or the
    #: managed ndarray); None for a view of memory owned elsewhere.
    handle: Any = field(default=None, repr=False)
    #: Its memory is a block of the session's :class:`DeviceCache`: freeing it gives the block back there.
    cached: bool = False
    #: The block was taken from the cache (an earlier job's), not allocated for this matrix.
    reused: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes this allocation holds, padding included."""
        return self.rows * self.ld * FLOAT_BYTES


def device_bytes(rows: int, cols: int) -> int:
    """What a rows×cols float32 matrix in ``device`` memory is allocated (an empty one gets one float)."""
    return max(rows * cols, 1) * FLOAT_BYTES


class Memory:
    """``session.memory``: every allocation, copy and fill of a session, on its stream, and the memory it keeps
    (page-locked buffers by slot; small device allocations once :meth:`keep_device_memory` is called), freed
    at :meth:`close`."""

    def __init__(self, context: Context, l2_cache_bytes: int) -> None:
        self._context = context
        self._l2_cache_bytes = l2_cache_bytes
        cuda = context.cuda
        self._pinned = PinnedPool(lambda nbytes: cuda.pagelocked_empty(nbytes, np.uint8), _free_host)
        #: Small device allocations kept from job to job; None until :meth:`keep_device_memory`.
        self._device_cache: DeviceCache[Any] | None = None
        self._flush: Any = None  # flush_l2's scratch buffer

    # -- device matrices -------------------------------------------------------

    def keep_device_memory(self, cap_bytes: int = DEVICE_CACHE_CAP_BYTES) -> None:
        """From now on keep small ``device`` allocations for the next job instead of freeing them
        (:class:`~mmd.cuda.pools.DeviceCache`, holding at most ``cap_bytes``; freed at :meth:`close`).

        For a process that runs job after job (a daemon's worker): its small jobs' ``malloc`` and ``free``
        then time the cache, not cuMemAlloc and cuMemFree. A session that runs one job gains nothing."""
        self._context.check()
        if self._device_cache is None:
            self._device_cache = DeviceCache(self._context.cuda.mem_alloc, _free_device, cap_bytes=cap_bytes)

    def keeps(self, mode: str, rows: int, cols: int) -> bool:
        """Whether :meth:`alloc` takes a rows×cols matrix in ``mode`` memory from the session's cache."""
        cache = self._device_cache
        return mode == "device" and cache is not None and cache.holds_size(device_bytes(rows, cols))

    def cached_device_bytes(self) -> int:
        """Device memory the session's cache holds now (0 when it keeps none)."""
        return 0 if self._device_cache is None else self._device_cache.held_bytes

    def alloc(self, mode: str, rows: int, cols: int) -> DeviceMatrix:
        """A rows×cols float32 matrix in device, pitched or managed memory (small device ones from the
        session's cache, when it keeps one: :meth:`keep_device_memory`)."""
        self._context.check()
        nbytes = rows * cols * FLOAT_BYTES
        with self._context.converting(f"allocating {nbytes / _MIB:.1f} MiB of {mode} memory"):
            cuda = self._context.cuda
            if mode == "device":
                if self._device_cache is not None and self.keeps(mode, rows, cols):
                    handle, reused = self._device_cache.take(device_bytes(rows, cols))
                    return DeviceMatrix(mode, rows, cols, cols, int(handle), handle, cached=True, reused=reused)
                handle = cuda.mem_alloc(device_bytes(rows, cols))
                return DeviceMatrix(mode, rows, cols, cols, int(handle), handle)
            if mode == "pitched":
                handle, pitch = cuda.mem_alloc_pitch(max(cols, 1) * FLOAT_BYTES, max(rows, 1), FLOAT_BYTES)
                return DeviceMatrix(mode, rows, cols, pitch // FLOAT_BYTES, int(handle), handle)
            if mode == "managed":
                array = cuda.managed_empty((max(rows, 1), max(cols, 1)), np.float32, "C", cuda.mem_attach_flags.GLOBAL)
                ptr = int(array.base.get_device_pointer())
                return DeviceMatrix(mode, rows, cols, max(cols, 1), ptr, array)
        raise KernelError(f"unknown memory mode {mode!r}; choose device, pitched or managed")

    def free(self, matrix: DeviceMatrix) -> None:
        """Release a matrix's memory now (not at garbage collection); one from the session's cache goes back
        there."""
        self._context.check()
        with self._context.converting(f"freeing {matrix.mode} memory"):
            if matrix.cached and self._device_cache is not None:
                self._device_cache.give(device_bytes(matrix.rows, matrix.cols), matrix.handle)
            elif matrix.mode == "managed":
                matrix.handle.base.free()
            else:
                matrix.handle.free()

    def upload(self, matrix: DeviceMatrix, host: np.ndarray, slot: str) -> None:
        """Copy ``host`` (rows×cols float32) into ``matrix`` on the session's stream."""
        self._context.check()
        if host.size == 0:
            return
        with self._context.converting(f"copying {host.nbytes / _MIB:.1f} MiB to the device"):
            if matrix.mode == "managed":
                self._context.stream.synchronize()
                np.copyto(matrix.handle[: matrix.rows, : matrix.cols], host)
                return
            if self.is_pinned(host) and host.flags.c_contiguous:
                staging = host  # already page-locked (host_empty): copy straight from it
            else:
                staging = self._pinned.get(f"stage:{slot}", (matrix.rows, matrix.cols))
                np.copyto(staging, host)
            if matrix.mode == "device":
                self._context.cuda.memcpy_htod_async(matrix.handle, staging, self._context.stream)
            else:
                copy = self._context.cuda.Memcpy2D()
                copy.set_src_host(staging)
                copy.src_pitch = matrix.cols * FLOAT_BYTES
                copy.set_dst_device(matrix.handle)
                copy.dst_pitch = matrix.ld * FLOAT_BYTES
                copy.width_in_bytes = matrix.cols * FLOAT_BYTES
                copy.height = matrix.rows
                copy(self._context.stream)

    def download(self, matrix: DeviceMatrix, slot: str = "c", out: np.ndarray | None = None) -> np.ndarray:
        """``matrix``'s contents in ``out`` (else a new host array), waiting for the stream. An ``out`` from
        :meth:`host_empty` of a device matrix without padding is copied into straight, with no staging copy."""
        self._context.check()
        if out is None:
            out = np.empty((matrix.rows, matrix.cols), np.float32)
        if out.shape != (matrix.rows, matrix.cols):
            raise ValueError(f"download: out is {out.shape}, the matrix {matrix.rows}x{matrix.cols}")
        if out.size == 0:
            return out
        with self._context.converting(f"copying {out.nbytes / _MIB:.1f} MiB from the device"):
            if matrix.mode == "managed":
                self._context.stream.synchronize()
                np.copyto(out, matrix.handle[: matrix.rows, : matrix.cols])
                return out
            if matrix.mode == "device" and self.is_pinned(out) and out.flags.c_contiguous:
                self._context.cuda.memcpy_dtoh_async(out, matrix.handle, self._context.stream)
                self._context.stream.synchronize()
                return out
            staging = self._pinned.get(f"stage:{slot}", (matrix.rows, matrix.cols))
            if matrix.mode == "device":
                self._context.cuda.memcpy_dtoh_async(staging, matrix.handle, self._context.stream)
            else:
                copy = self._context.cuda.Memcpy2D()
                copy.set_src_device(matrix.handle)
                copy.src_pitch = matrix.ld * FLOAT_BYTES
                copy.set_dst_host(staging)
                copy.dst_pitch = matrix.cols * FLOAT_BYTES
                copy.width_in_bytes = matrix.cols * FLOAT_BYTES
                copy.height = matrix.rows
                copy(self._context.stream)
            self._context.stream.synchronize()
            np.copyto(out, staging)
        return out

    def fill(self, matrix: DeviceMatrix, value: float) -> None:
        """Set every element (padding included) to ``value``: poison for tests."""
        self._context.check()
        with self._context.converting("filling device memory"):
            word = int(np.array(value, np.float32).view(np.uint32))
            if matrix.mode == "managed":
                self._context.stream.synchronize()
                matrix.handle.fill(value)
            else:
                self._context.cuda.memset_d32_async(matrix.ptr, word, matrix.rows * matrix.ld, self._context.stream)

    def copy_matrix(self, dst: DeviceMatrix, src: DeviceMatrix) -> None:
        """``src``'s rows×cols into ``dst``'s top-left corner, device to device on the session's stream (a kernel
        file's padding: ``dst`` at least as big)."""
        self._context.check()
        if src.rows == 0 or src.cols == 0:
            return
        with self._context.converting("copying device memory"):
            copy = self._context.cuda.Memcpy2D()
            copy.set_src_device(src.ptr)
            copy.src_pitch = src.ld * FLOAT_BYTES
            copy.set_dst_device(dst.ptr)
            copy.dst_pitch = dst.ld * FLOAT_BYTES
            copy.width_in_bytes = src.cols * FLOAT_BYTES
            copy.height = src.rows
            copy(self._context.stream)

    # -- page-locked host memory and raw buffers (the text path) -------------

    def host_empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32, slot: str = "host") -> np.ndarray:
        """A page-locked array of ``shape``, reused by ``slot`` (valid until the slot's next use).

        Arrays from here go to the device without a staging copy
        (:meth:`upload` checks :meth:`is_pinned`); the host parser can write
        into one directly (``textformat.parse(..., out=...)``).
        """
        self._context.check()
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        with self._context.converting(f"allocating {nbytes / _MIB:.1f} MiB of page-locked memory"):
            return self._pinned.get(f"host:{slot}", shape, dtype)

    def adopt_host(self, slot: str, memory: HostMemory) -> None:
        """Make page-locked ``memory`` made through the driver (:class:`~mmd.cuda.libcuda.ContextWarmer`)
        :meth:`host_empty`'s ``slot``; it is freed when the session closes."""
        self._context.check()
        view = (ctypes.c_uint8 * memory.nbytes).from_address(memory.address)
        self._pinned.adopt(f"host:{slot}", np.ctypeslib.as_array(view), memory.free)

    def adopt_mapped(self, slot: str, host: np.ndarray) -> None:
        """Page-lock ``host`` (bytes mapped from a memory file another process maps too: a kernel file's input)
        where it lies, and make it :meth:`host_empty`'s ``slot``; it is unlocked when the session closes."""
        self._context.check()
        # libcuda's, not pycuda's: pycuda's wrapper fails on mmap'd arrays
        unlock = self._context.driver().host_register(host.ctypes.data, host.nbytes)
        self._pinned.adopt(f"host:{slot}", host, unlock)

    def drop_host(self, slot: str) -> None:
        """Free (or unlock, where adopted) :meth:`host_empty`'s ``slot`` now: no view of it is in use any more."""
        self._context.check()
        self._pinned.drop(f"host:{slot}")

    def reserve_host(self, slot: str, nbytes: int) -> None:
        """Allocate :meth:`host_empty`'s ``slot`` now, and keep at least ``nbytes`` for it from now on."""
        self._context.check()
        with self._context.converting(f"allocating {nbytes / _MIB:.1f} MiB of page-locked memory"):
            self._pinned.reserve(f"host:{slot}", nbytes)

    def pinned_bytes(self) -> int:
        """Page-locked host memory this session holds now."""
        return self._pinned.held_bytes

    def is_pinned(self, host: np.ndarray) -> bool:
        """Whether ``host`` lies inside one of this session's page-locked buffers."""
        return self._pinned.holds(host)

    def mem_alloc(self, nbytes: int) -> Any:
        """Raw device memory (``int(handle)`` is its address); free with :meth:`mem_free`."""
        self._context.check()
        with self._context.converting(f"allocating {nbytes / _MIB:.1f} MiB of device memory"):
            return self._context.cuda.mem_alloc(max(int(nbytes), 1))

    def mem_free(self, handle: Any) -> None:
        """Release raw device memory now."""
        self._context.check()
        with self._context.converting("freeing device memory"):
            handle.free()

    def memset8(self, ptr: int, value: int, nbytes: int) -> None:
        """Set ``nbytes`` bytes at ``ptr`` to ``value`` on the session's stream."""
        if nbytes > 0:
            with self._context.converting("setting device memory"):
                self._context.cuda.memset_d8_async(int(ptr), int(value), int(nbytes), self._context.stream)

    def copy_htod(self, ptr: int, host: np.ndarray) -> None:
        """Copy ``host`` (page-locked for an asynchronous copy) to ``ptr`` on the stream."""
        if host.nbytes:
            with self._context.converting(f"copying {host.nbytes / _MIB:.1f} MiB to the device"):
                self._context.cuda.memcpy_htod_async(int(ptr), host, self._context.stream)

    def copy_dtoh(self, host: np.ndarray, ptr: int) -> None:
        """Copy ``host.nbytes`` bytes from ``ptr`` into ``host`` on the stream (page-locked: asynchronous)."""
        if host.nbytes:
            with self._context.converting(f"copying {host.nbytes / _MIB:.1f} MiB from the device"):
                self._context.cuda.memcpy_dtoh_async(host, int(ptr), self._context.stream)

    def flush_l2(self) -> None:
        """Evict the L2 cache, as nvbench does before each timed launch: write a scratch buffer twice its size.

        Twice, because the L2 is not a strict LRU: writing only its size can leave
        lines of the operands behind. The buffer is made on first use and kept;
        the memset is queued on the session's stream, so it lands between the
        phases around it without being timed by them.
        """
        self._context.check()
        nbytes = max(2 * self._l2_cache_bytes, _MIN_FLUSH_BYTES)
        if self._flush is None:
            self._flush = self.mem_alloc(nbytes)
        self.memset8(int(self._flush), 0, nbytes)

    def close(self) -> None:
        """Free the page-locked buffers, the flush buffer and the device cache (the session is closing: what
        was handed out is invalid after this). Nothing is to be done about a failed free, here."""
        with contextlib.suppress(Exception):
            self._pinned.free_all()
        if self._flush is not None:
            with contextlib.suppress(Exception):
                self._flush.free()
            self._flush = None
        if self._device_cache is not None:
            with contextlib.suppress(Exception):
                self._device_cache.close()
            self._device_cache = None


def _free_device(handle: Any) -> None:
    """Release device memory now (a pycuda DeviceAllocation)."""
    handle.free()


def _free_host(buffer: np.ndarray) -> None:
    """Release a page-locked buffer now (pycuda's HostAllocation behind the array)."""
    allocation: Any = buffer.base
    allocation.free()
