"""One GPU in the calling thread: context, stream, compiled modules, memory, copies, launches, timers.

A :class:`GpuSession` belongs to the thread that opened it: it retains the
device's primary context and pushes it onto that thread's context stack (the
context cuBLAS, through the runtime API, uses too), and :meth:`GpuSession.close`
pops it again. Open, use and close a session in one thread.

Driver failures become :class:`~mmd.errors.CudaError` with a one-line reason
(:meth:`GpuSession.converting`); a missing pycuda, driver or device is
:class:`~mmd.errors.BackendUnavailable`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import BackendUnavailable, CudaError, KernelError
from ..kernels import FLOAT_BYTES, DeviceLimits, KernelSpec
from ..resources import kernels_dir
from . import libcuda
from .compiler import Compiled, KernelCache, Module, macro_options
from .cublas import Cublas
from .driver import load, one_line
from .libcuda import HostMemory
from .memory import DEVICE_CACHE_CAP_BYTES, DeviceCache, DeviceMatrix, PinnedPool, device_bytes
from .text import GpuText

_MIB = 1024 * 1024
#: flush_l2 writes at least this much, should a device report no L2 size.
_MIN_FLUSH_BYTES = 64 * _MIB

#: pycuda's argument signature of every matmul kernel: A, B, C, M, K, N, lda, ldb, ldc.
MATMUL_SIGNATURE = "PPPiiiiii"

T = TypeVar("T")


def launch_build(spec: KernelSpec, a: DeviceMatrix, b: DeviceMatrix) -> KernelSpec:
    """The build :meth:`GpuSession.multiply` launches for A·B: a TMA build where the copy engine can read both
    operands (base and row stride 16-byte multiples, K at least 1), else the build it falls back to."""
    if spec.tensor_maps is None or spec.fallback is None:
        return spec
    if a.cols >= 1 and libcuda.tma_ok(a.ptr, a.ld) and libcuda.tma_ok(b.ptr, b.ld):
        return spec
    return spec.fallback


class PhaseTimer:
    """CUDA events on the session's stream around each named phase.

    ``with timer.phase("h2d"): ...`` records an event before and after the
    block; :meth:`elapsed_ms` waits for the last event and returns each
    phase's milliseconds, several phases of one name summed. Host-synchronous
    calls (allocation, free) inside a phase are measured too: an event
    recorded on an idle stream is stamped when it is recorded.

    A phase that ``follows`` the one before starts at that phase's end
    event: back-to-back phases record one event each, not two (what the host
    does between them counts toward the later one).

    Events come from ``spare`` (the session's, shared by its timers) and go
    back there once :meth:`elapsed_ms` has waited for them, so a job records
    events without creating and destroying them; a new one is made when none
    is spare.
    """

    def __init__(self, cuda: Any, stream: Any, spare: list[Any]) -> None:
        self._cuda = cuda
        self._stream = stream
        self._spare = spare
        self._marks: list[tuple[str, Any, Any]] = []
        self._last: Any = None  # the last phase's end event

    def _event(self) -> Any:
        event = self._spare.pop() if self._spare else self._cuda.Event()
        event.record(self._stream)
        return event

    @contextlib.contextmanager
    def phase(self, name: str, *, follows: bool = False) -> Iterator[None]:
        start = self._last if follows and self._last is not None else self._event()
        self._last = None  # a phase that fails ends nothing another may follow
        yield
        self._last = end = self._event()
        self._marks.append((name, start, end))

    def elapsed_ms(self) -> dict[str, float]:
        """Milliseconds per phase name (waits for the device)."""
        if not self._marks:
            return {}
        self._marks[-1][2].synchronize()
        out: dict[str, float] = {}
        for name, start, end in self._marks:
            out[name] = out.get(name, 0.0) + float(start.time_till(end))
        # Every event is complete (the stream ran past the last): they can be recorded again, each once.
        last = None
        for _, start, end in self._marks:
            if start is not last:
                self._spare.append(start)
            self._spare.append(end)
            last = end
        self._marks.clear()
        self._last = None
        return out


class GpuSession:
    """One device, in the calling thread: compile, allocate, copy, launch, time.

    ``kernel_cache``: the folder of compiled kernels (None: no disk cache), or
    a :class:`KernelCache`.
    """

    def __init__(self, device: int = 0, kernel_cache: Path | KernelCache | None = None) -> None:
        self.kernel_cache = kernel_cache if isinstance(kernel_cache, KernelCache) else KernelCache(kernel_cache)
        cuda = load()
        self._cuda = cuda
        #: Exception classes the driver raises, for callers' nets.
        self.errors: tuple[type[BaseException], ...] = (cuda.Error, MemoryError)
        try:
            cuda.init()
            count = cuda.Device.count()
        except cuda.Error as exc:
            raise BackendUnavailable(f"no CUDA device: {one_line(exc)}") from exc
        if count == 0:
            raise BackendUnavailable("no CUDA device: the driver sees no GPU")
        if not 0 <= device < count:
            raise BackendUnavailable(f"no CUDA device {device}: this machine has {count} (0..{count - 1})")
        self._thread = threading.get_ident()
        self._device = cuda.Device(device)
        self._context = self._device.retain_primary_context()
        self._context.push()
        self._closed = False
        self._modules: dict[tuple[Any, ...], Module] = {}
        self._compiled: dict[tuple[Any, ...], Compiled] = {}
        #: libcuda beside pycuda, for the builds pycuda cannot launch (tensor maps), made on first use.
        self._libcuda: libcuda.Driver | None = None
        self._driver_modules: list[int] = []  # CUmodules loaded through it, unloaded in close()
        self._pinned = PinnedPool(lambda nbytes: cuda.pagelocked_empty(nbytes, np.uint8), _free_host)
        #: Small device allocations kept from job to job; None until :meth:`keep_device_memory`.
        self._device_cache: DeviceCache[Any] | None = None
        #: Events the phase timers have finished with, recorded again by the next.
        self._spare_events: list[Any] = []
        self._cublas: Cublas | None = None
        self._text: GpuText | None = None
        self._flush: Any = None  # flush_l2's scratch buffer
        #: The session's one stream; dropped in close() while the context is current, as pycuda needs.
        self._stream: Any = None
        try:
            self._stream = cuda.Stream()
            self.limits = self._read_limits()
        except cuda.Error as exc:
            self.close()
            raise CudaError(f"opening CUDA device {device} failed: {one_line(exc)}") from exc

    # -- facts ---------------------------------------------------------------

    def _read_limits(self) -> DeviceLimits:
        attr = self._cuda.device_attribute
        dev = self._device
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

    def device_name(self) -> str:
        """``"NVIDIA H100 80GB HBM3 (sm_90)"``."""
        return f"{self.limits.name} ({self.limits.arch})"

    def versions(self) -> dict[str, str]:
        """Driver, toolkit (as pycuda was built) and pycuda versions."""
        import pycuda

        def dotted(v: int) -> str:
            return f"{v // 1000}.{v % 1000 // 10}"

        return {
            "driver": dotted(self._cuda.get_driver_version()),
            "pycuda_built_for": ".".join(map(str, self._cuda.get_version())),
            "pycuda": str(getattr(pycuda, "VERSION_TEXT", "?")),
        }

    def mem_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes."""
        with self.converting("reading free device memory"):
            free, total = self._cuda.mem_get_info()
        return int(free), int(total)

    # -- compile: one path for every source -------------------------------------

    def module(
        self, source: Path, defines: Mapping[str, int], entries: Mapping[str, str], arch: str | None = None
    ) -> tuple[Module, bool]:
        """``source`` built with ``defines`` for ``arch`` (default: this device's), its ``entries`` prepared.

        ``entries`` maps each entry symbol to its pycuda argument signature.
        Returns the module and whether it was loaded just now (else it came
        from this session's cache). mmd's disk cache (:class:`KernelCache`)
        sits beneath; a cached cubin the driver refuses is rebuilt once.
        """
        self._check_thread()
        arch = arch or self.limits.arch
        options = macro_options(defines)
        key = (str(source), options, arch, tuple(sorted(entries.items())))
        cached = self._modules.get(key)
        if cached is not None:
            return cached, False
        start = time.perf_counter()
        try:
            loaded = self._loaded(source, options, arch, self._cuda.module_from_buffer, self._cuda.Error)
            functions = {}
            for name, signature in entries.items():
                function = loaded.get_function(name)
                function.prepare(signature)
                functions[name] = function
        except KernelError as exc:
            raise KernelError(f"{source.name} does not compile: {exc.reason}", dict(exc.details)) from exc
        except self._cuda.Error as exc:
            raise CudaError(f"loading {source.name} failed: {one_line(exc)}") from exc
        module = Module(functions, (time.perf_counter() - start) * 1e3)
        self._modules[key] = module
        return module, True

    def _loaded(
        self,
        source: Path,
        options: tuple[str, ...],
        arch: str,
        load_cubin: Callable[[bytes], T],
        refused: type[BaseException] | tuple[type[BaseException], ...],
    ) -> T:
        """``source``'s cubin from mmd's disk cache (built there if missing), loaded by ``load_cubin``; a cached
        cubin the driver refuses (``refused``) is rebuilt once."""
        text = source.read_text(encoding="utf-8")
        include = [str(kernels_dir())]
        cubin, built = self.kernel_cache.get(text, options, arch, include)
        try:
            return load_cubin(cubin)
        except refused:
            if built:
                raise
        cubin, _ = self.kernel_cache.get(text, options, arch, include, refresh=True)
        return load_cubin(cubin)

    def _driver(self) -> libcuda.Driver:
        """libcuda through ctypes, acting on this thread's current context (the session's)."""
        if self._libcuda is None:
            self._libcuda = libcuda.Driver()
        return self._libcuda

    def compile(self, spec: KernelSpec, tile: int) -> tuple[Compiled, bool]:
        """Registry kernel ``spec``, as built for this device (:meth:`KernelSpec.for_arch`), at ``tile``; and whether
        it was built just now.

        Kernels with a fixed block ignore the tile: one build serves every
        tile. A TMA build is loaded through libcuda, and the build it falls back
        to is built with it, so that :meth:`multiply` never compiles.
        """
        if spec.source is None or spec.entry is None:
            raise KernelError(f"kernel {spec.name} has no CUDA source to compile")
        spec = spec.for_arch(self.limits.arch)
        tile = tile if spec.uses_tile else 0
        key = (spec.name, spec.variant, tile)
        cached = self._compiled.get(key)
        if cached is not None:
            return cached, False
        fallback_ms = 0.0
        if spec.fallback is not None:
            fallback, built = self.compile(spec.fallback, tile)
            fallback_ms = fallback.compile_ms if built else 0.0
        try:
            if spec.tensor_maps is not None:
                compiled = self._compile_tma(spec, tile)
            else:
                compiled = self._compile_pycuda(spec, tile)
        except KernelError as exc:
            raise KernelError(
                f"kernel {spec.name} does not compile at tile {tile}: {exc.reason}",
                details={"kernel": spec.name, "tile": tile},
            ) from exc
        compiled.compile_ms += fallback_ms
        self._compiled[key] = compiled
        return compiled, True

    def load_cubin(self, cubin: bytes, symbol: str, signature: str, dynamic_shared: int = 0) -> Any:
        """Function ``symbol`` of a cubin built elsewhere (a kernel file's, by NVRTC), loaded into this session's
        context, prepared with its pycuda argument ``signature`` and allowed ``dynamic_shared`` bytes of dynamic
        shared memory; launch it with :meth:`launch`."""
        self._check_thread()
        with self.converting(f"loading {symbol}"):
            function = self._cuda.module_from_buffer(cubin).get_function(symbol)
            function.prepare(signature)
            if dynamic_shared:
                function.set_attribute(self._cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_shared)
        return function

    def launch(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple[Any, ...], shared: int
    ) -> None:
        """Queue a function from :meth:`load_cubin` on the session's stream with ``args`` as its signature says."""
        self._check_thread()
        with self.converting("launching the kernel"):
            function.prepared_async_call(grid, block, self._stream, *args, shared_size=shared)

    def _compile_pycuda(self, spec: KernelSpec, tile: int) -> Compiled:
        """A build with the common argument list, loaded and launched through pycuda."""
        assert spec.source is not None and spec.entry is not None  # compile() checked
        module, _ = self.module(
            spec.source, spec.defines(tile), {spec.entry: MATMUL_SIGNATURE}, spec.arch_for(self.limits.arch)
        )
        function = module.functions[spec.entry]
        if spec.dynamic_shared_bytes:
            with self.converting(f"allowing {spec.name} {spec.dynamic_shared_bytes} bytes of shared memory"):
                function.set_attribute(
                    self._cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, spec.dynamic_shared_bytes
                )
        return Compiled(
            spec=spec,
            tile=tile,
            function=function,
            registers=int(function.num_regs),
            shared_bytes=int(function.shared_size_bytes),
            local_bytes=int(function.local_size_bytes),
            compile_ms=module.load_ms,
        )

    def _compile_tma(self, spec: KernelSpec, tile: int) -> Compiled:
        """A TMA build: its CUfunction (an int) through libcuda, which alone can pass it tensor maps."""
        assert spec.source is not None and spec.entry is not None  # compile() checked
        start = time.perf_counter()
        driver = self._driver()
        arch = spec.arch_for(self.limits.arch)
        try:
            module = self._loaded(spec.source, macro_options(spec.defines(tile)), arch, driver.load_module, CudaError)
        except KernelError as exc:
            raise KernelError(f"{spec.source.name} does not compile: {exc.reason}", dict(exc.details)) from exc
        self._driver_modules.append(module)
        function = driver.function(module, spec.entry, spec.dynamic_shared_bytes)
        used = driver.resources(function)
        return Compiled(
            spec=spec,
            tile=tile,
            function=function,
            registers=used.registers,
            shared_bytes=used.shared_bytes,
            local_bytes=used.local_bytes,
            compile_ms=(time.perf_counter() - start) * 1e3,
        )

    # -- device matrices -------------------------------------------------------

    def keep_device_memory(self, cap_bytes: int = DEVICE_CACHE_CAP_BYTES) -> None:
        """From now on keep small ``device`` allocations for the next job instead of freeing them
        (:class:`~mmd.cuda.memory.DeviceCache`, holding at most ``cap_bytes``; freed at :meth:`close`).

        For a process that runs job after job (a daemon's worker): its small jobs' ``malloc`` and ``free``
        then time the cache, not cuMemAlloc and cuMemFree. A session that runs one job gains nothing."""
        self._check_thread()
        if self._device_cache is None:
            self._device_cache = DeviceCache(self._cuda.mem_alloc, _free_device, cap_bytes=cap_bytes)

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
        self._check_thread()
        nbytes = rows * cols * FLOAT_BYTES
        with self.converting(f"allocating {nbytes / _MIB:.1f} MiB of {mode} memory"):
            cuda = self._cuda
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
        self._check_thread()
        with self.converting(f"freeing {matrix.mode} memory"):
            if matrix.cached and self._device_cache is not None:
                self._device_cache.give(device_bytes(matrix.rows, matrix.cols), matrix.handle)
            elif matrix.mode == "managed":
                matrix.handle.base.free()
            else:
                matrix.handle.free()

    def upload(self, matrix: DeviceMatrix, host: np.ndarray, slot: str) -> None:
        """Copy ``host`` (rows×cols float32) into ``matrix`` on the session's stream."""
        self._check_thread()
        if host.size == 0:
            return
        with self.converting(f"copying {host.nbytes / _MIB:.1f} MiB to the device"):
            if matrix.mode == "managed":
                self._stream.synchronize()
                np.copyto(matrix.handle[: matrix.rows, : matrix.cols], host)
                return
            if self.is_pinned(host) and host.flags.c_contiguous:
                staging = host  # already page-locked (host_empty): copy straight from it
            else:
                staging = self._pinned.get(f"stage:{slot}", (matrix.rows, matrix.cols))
                np.copyto(staging, host)
            if matrix.mode == "device":
                self._cuda.memcpy_htod_async(matrix.handle, staging, self._stream)
            else:
                copy = self._cuda.Memcpy2D()
                copy.set_src_host(staging)
                copy.src_pitch = matrix.cols * FLOAT_BYTES
                copy.set_dst_device(matrix.handle)
                copy.dst_pitch = matrix.ld * FLOAT_BYTES
                copy.width_in_bytes = matrix.cols * FLOAT_BYTES
                copy.height = matrix.rows
                copy(self._stream)

    def download(self, matrix: DeviceMatrix, slot: str = "c", out: np.ndarray | None = None) -> np.ndarray:
        """``matrix``'s contents in ``out`` (else a new host array), waiting for the stream. An ``out`` from
        :meth:`host_empty` of a device matrix without padding is copied into straight, with no staging copy."""
        self._check_thread()
        if out is None:
            out = np.empty((matrix.rows, matrix.cols), np.float32)
        if out.shape != (matrix.rows, matrix.cols):
            raise ValueError(f"download: out is {out.shape}, the matrix {matrix.rows}x{matrix.cols}")
        if out.size == 0:
            return out
        with self.converting(f"copying {out.nbytes / _MIB:.1f} MiB from the device"):
            if matrix.mode == "managed":
                self._stream.synchronize()
                np.copyto(out, matrix.handle[: matrix.rows, : matrix.cols])
                return out
            if matrix.mode == "device" and self.is_pinned(out) and out.flags.c_contiguous:
                self._cuda.memcpy_dtoh_async(out, matrix.handle, self._stream)
                self._stream.synchronize()
                return out
            staging = self._pinned.get(f"stage:{slot}", (matrix.rows, matrix.cols))
            if matrix.mode == "device":
                self._cuda.memcpy_dtoh_async(staging, matrix.handle, self._stream)
            else:
                copy = self._cuda.Memcpy2D()
                copy.set_src_device(matrix.handle)
                copy.src_pitch = matrix.ld * FLOAT_BYTES
                copy.set_dst_host(staging)
                copy.dst_pitch = matrix.cols * FLOAT_BYTES
                copy.width_in_bytes = matrix.cols * FLOAT_BYTES
                copy.height = matrix.rows
                copy(self._stream)
            self._stream.synchronize()
            np.copyto(out, staging)
        return out

    def fill(self, matrix: DeviceMatrix, value: float) -> None:
        """Set every element (padding included) to ``value``: poison for tests."""
        self._check_thread()
        with self.converting("filling device memory"):
            word = int(np.array(value, np.float32).view(np.uint32))
            if matrix.mode == "managed":
                self._stream.synchronize()
                matrix.handle.fill(value)
            else:
                self._cuda.memset_d32_async(matrix.ptr, word, matrix.rows * matrix.ld, self._stream)

    def copy_matrix(self, dst: DeviceMatrix, src: DeviceMatrix) -> None:
        """``src``'s rows×cols into ``dst``'s top-left corner, device to device on the session's stream (a kernel
        file's padding: ``dst`` at least as big)."""
        self._check_thread()
        if src.rows == 0 or src.cols == 0:
            return
        with self.converting("copying device memory"):
            copy = self._cuda.Memcpy2D()
            copy.set_src_device(src.ptr)
            copy.src_pitch = src.ld * FLOAT_BYTES
            copy.set_dst_device(dst.ptr)
            copy.dst_pitch = dst.ld * FLOAT_BYTES
            copy.width_in_bytes = src.cols * FLOAT_BYTES
            copy.height = src.rows
            copy(self._stream)

    # -- page-locked host memory and raw buffers (the text path) -------------

    def host_empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32, slot: str = "host") -> np.ndarray:
        """A page-locked array of ``shape``, reused by ``slot`` (valid until the slot's next use).

        Arrays from here go to the device without a staging copy
        (:meth:`upload` checks :meth:`is_pinned`); the host parser can write
        into one directly (``textformat.parse(..., out=...)``).
        """
        self._check_thread()
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        with self.converting(f"allocating {nbytes / _MIB:.1f} MiB of page-locked memory"):
            return self._pinned.get(f"host:{slot}", shape, dtype)

    def adopt_host(self, slot: str, memory: HostMemory) -> None:
        """Make page-locked ``memory`` made through the driver (:class:`~mmd.cuda.libcuda.ContextWarmer`)
        :meth:`host_empty`'s ``slot``; it is freed when the session closes."""
        self._check_thread()
        view = (ctypes.c_uint8 * memory.nbytes).from_address(memory.address)
        self._pinned.adopt(f"host:{slot}", np.ctypeslib.as_array(view), memory.free)

    def adopt_mapped(self, slot: str, host: np.ndarray) -> None:
        """Page-lock ``host`` (bytes mapped from a memory file another process maps too: a kernel file's input)
        where it lies, and make it :meth:`host_empty`'s ``slot``; it is unlocked when the session closes."""
        self._check_thread()
        unlock = self._driver().host_register(host.ctypes.data, host.nbytes)  # pycuda's wrapper fails on mmap'd arrays
        self._pinned.adopt(f"host:{slot}", host, unlock)

    def reserve_host(self, slot: str, nbytes: int) -> None:
        """Allocate :meth:`host_empty`'s ``slot`` now, and keep at least ``nbytes`` for it from now on."""
        self._check_thread()
        with self.converting(f"allocating {nbytes / _MIB:.1f} MiB of page-locked memory"):
            self._pinned.reserve(f"host:{slot}", nbytes)

    def pinned_bytes(self) -> int:
        """Page-locked host memory this session holds now."""
        return self._pinned.held_bytes

    def is_pinned(self, host: np.ndarray) -> bool:
        """Whether ``host`` lies inside one of this session's page-locked buffers."""
        return self._pinned.holds(host)

    def mem_alloc(self, nbytes: int) -> Any:
        """Raw device memory (``int(handle)`` is its address); free with :meth:`mem_free`."""
        self._check_thread()
        with self.converting(f"allocating {nbytes / _MIB:.1f} MiB of device memory"):
            return self._cuda.mem_alloc(max(int(nbytes), 1))

    def mem_free(self, handle: Any) -> None:
        """Release raw device memory now."""
        self._check_thread()
        with self.converting("freeing device memory"):
            handle.free()

    def memset8(self, ptr: int, value: int, nbytes: int) -> None:
        """Set ``nbytes`` bytes at ``ptr`` to ``value`` on the session's stream."""
        if nbytes > 0:
            with self.converting("setting device memory"):
                self._cuda.memset_d8_async(int(ptr), int(value), int(nbytes), self._stream)

    def copy_htod(self, ptr: int, host: np.ndarray) -> None:
        """Copy ``host`` (page-locked for an asynchronous copy) to ``ptr`` on the stream."""
        if host.nbytes:
            with self.converting(f"copying {host.nbytes / _MIB:.1f} MiB to the device"):
                self._cuda.memcpy_htod_async(int(ptr), host, self._stream)

    def copy_dtoh(self, host: np.ndarray, ptr: int) -> None:
        """Copy ``host.nbytes`` bytes from ``ptr`` into ``host`` on the stream (page-locked: asynchronous)."""
        if host.nbytes:
            with self.converting(f"copying {host.nbytes / _MIB:.1f} MiB from the device"):
                self._cuda.memcpy_dtoh_async(host, int(ptr), self._stream)

    def record_event(self) -> Any:
        """A CUDA event recorded now on the session's stream (``.synchronize()`` waits for it)."""
        with self.converting("recording an event"):
            event = self._cuda.Event()
            event.record(self._stream)
        return event

    # -- run -----------------------------------------------------------------

    def call(self, function: Any, blocks: int, threads: int, *args: Any) -> None:
        """Launch a prepared 1-D ``function`` with ``blocks`` × ``threads`` on the session's stream."""
        if blocks <= 0:
            return
        with self.converting("launching a text kernel"):
            function.prepared_async_call((int(blocks), 1), (int(threads), 1, 1), self._stream, *args)

    def multiply(
        self, kernel: Compiled | None, a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix, *, tf32: bool = False
    ) -> None:
        """C = A·B on the session's stream with a compiled registry kernel, or cuBLAS when ``kernel`` is None.

        ``tf32`` (cuBLAS only): in its TF32 tensor-core math mode (``cublas_tf32``).
        """
        self._check_thread()
        if kernel is None:
            self._blas().sgemm(a, b, c, tf32=tf32)
            return
        m, k, n = a.rows, a.cols, b.cols
        if m == 0 or n == 0:
            return
        spec = launch_build(kernel.spec, a, b)
        if spec is not kernel.spec:
            kernel, _ = self.compile(spec, kernel.tile)  # built beside it by compile(): from the session's cache
        tile = kernel.tile
        grid, block = spec.grid(m, n, tile), spec.block(tile)
        if spec.tensor_maps is not None:
            self._launch_tma(kernel, a, b, c, grid, block)
            return
        with self.converting(f"launching {spec.name} at tile {tile}"):
            kernel.function.prepared_async_call(
                grid[:2], block, self._stream, a.ptr, b.ptr, c.ptr, m, k, n, a.ld, b.ld, c.ld,
                shared_size=spec.dynamic_shared_bytes,
            )  # fmt: skip

    def _launch_tma(
        self,
        kernel: Compiled,
        a: DeviceMatrix,
        b: DeviceMatrix,
        c: DeviceMatrix,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
    ) -> None:
        """A TMA build's launch through libcuda: A's and B's tensor maps by value, then C, M, K, N, ldc."""
        spec = kernel.spec
        maps = spec.tensor_maps
        assert maps is not None  # multiply() launches only TMA builds here
        m, k, n = a.rows, a.cols, b.cols
        driver = self._driver()
        map_a = libcuda.matrix_map(m, k, a.ld, *maps.a_box, maps.swizzle, maps.tf32)
        map_b = libcuda.matrix_map(k, n, b.ld, *maps.b_box, maps.swizzle, maps.tf32)
        args: list[libcuda.Arg] = [
            driver.encode(a.ptr, map_a),
            driver.encode(b.ptr, map_b),
            libcuda.Pointer(c.ptr),
            *(libcuda.Int(v) for v in (m, k, n, c.ld)),
        ]
        driver.launch(
            kernel.function, grid, block, args, shared=spec.dynamic_shared_bytes,
            stream=int(self._stream.handle), cluster=(spec.cluster_x, 1, 1),
        )  # fmt: skip

    def _blas(self) -> Cublas:
        """cuBLAS on the session's stream, made on first use."""
        if self._cublas is None:
            self._cublas = Cublas(int(self._stream.handle))
        return self._cublas

    def flush_l2(self) -> None:
        """Evict the L2 cache, as nvbench does before each timed launch: write a scratch buffer twice its size.

        Twice, because the L2 is not a strict LRU: writing only its size can leave
        lines of the operands behind. The buffer is made on first use and kept;
        the memset is queued on the session's stream, so it lands between the
        phases around it without being timed by them.
        """
        self._check_thread()
        nbytes = max(2 * self.limits.l2_cache_bytes, _MIN_FLUSH_BYTES)
        if self._flush is None:
            self._flush = self.mem_alloc(nbytes)
        self.memset8(int(self._flush), 0, nbytes)

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """A·B in float64 through cuBLAS DGEMM (the reference results are checked against)."""
        self._check_thread()
        a = np.ascontiguousarray(a, dtype=np.float64)
        b = np.ascontiguousarray(b, dtype=np.float64)
        (m, k), n = a.shape, b.shape[1]
        c = np.empty((m, n), np.float64)
        held = [self.mem_alloc(x.nbytes) for x in (a, b, c)]
        try:
            with self.converting("a float64 reference product"):
                self._cuda.memcpy_htod(held[0], a)
                self._cuda.memcpy_htod(held[1], b)
                self._blas().dgemm(m, k, n, int(held[0]), int(held[1]), int(held[2]))
                self._stream.synchronize()
                self._cuda.memcpy_dtoh(c, held[2])
        finally:
            for handle in held:
                self.mem_free(handle)
        return c

    def text(self) -> GpuText:
        """The GPU text path on this session, made on first use."""
        if self._text is None:
            self._text = GpuText(self)
        return self._text

    def phase_timer(self) -> PhaseTimer:
        """A fresh event timer on the session's stream (its events are the session's, reused)."""
        return PhaseTimer(self._cuda, self._stream, self._spare_events)

    def synchronize(self) -> None:
        """Wait for everything queued on the session's stream."""
        with self.converting("waiting for the device"):
            self._stream.synchronize()

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Free staging buffers, drop modules and cuBLAS, pop the context. Idempotent."""
        if self._closed:
            return
        self._closed = True
        problems: list[BaseException] = []
        with contextlib.suppress(Exception):
            if self._stream is not None:
                self._stream.synchronize()
        if self._cublas is not None:
            try:
                self._cublas.close()
            except Exception as exc:
                problems.append(exc)
            self._cublas = None
        with contextlib.suppress(Exception):
            self._pinned.free_all()
        if self._flush is not None:
            with contextlib.suppress(Exception):
                self._flush.free()
            self._flush = None
        if self._device_cache is not None:
            with contextlib.suppress(Exception):  # as the flush buffer: nothing to do about a failed free
                self._device_cache.close()
            self._device_cache = None
        self._spare_events.clear()  # destroyed here, in the context's thread, as the stream below
        self._modules.clear()
        self._compiled.clear()
        while self._driver_modules and self._libcuda is not None:
            try:
                self._libcuda.unload_module(self._driver_modules.pop())
            except CudaError as exc:
                problems.append(exc)
        self._text = None
        # Freed here, in the context's thread: left to the garbage collector it would be freed at exit in
        # another thread, out of its context ("stream in out-of-thread context could not be cleaned up").
        self._stream = None
        try:
            self._context.pop()
        except self._cuda.Error as exc:
            problems.append(exc)
        if problems:
            raise CudaError(f"closing the CUDA device: {one_line(problems[0])}")

    def _check_thread(self) -> None:
        if self._closed:
            raise CudaError("the CUDA session is closed")
        if threading.get_ident() != self._thread:
            raise CudaError("the CUDA session was opened in another thread; open, use and close it in one thread")

    def converting(self, doing: str) -> _Converting:
        """Turn driver errors raised while ``doing`` into CudaError."""
        return _Converting(doing, (self._cuda.Error, MemoryError))


class _Converting:
    """:meth:`GpuSession.converting`'s context: a class, not a generator, since every driver call of a job
    goes through one and a generator's costs several times more to enter and leave."""

    __slots__ = ("doing", "errors")

    def __init__(self, doing: str, errors: tuple[type[BaseException], ...]) -> None:
        self.doing = doing
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and isinstance(exc, self.errors):
            doing = self.doing
            raise CudaError(f"{doing} failed: {one_line(exc)}", details={"during": doing}) from exc


def _free_device(handle: Any) -> None:
    """Release device memory now (a pycuda DeviceAllocation)."""
    handle.free()


def _free_host(buffer: np.ndarray) -> None:
    """Release a page-locked buffer now (pycuda's HostAllocation behind the array)."""
    allocation: Any = buffer.base
    allocation.free()
