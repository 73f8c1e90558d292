"""The one fake GPU: a session that stands in for :class:`mmd.cuda.session.GpuSession` with numpy, part for
part (``device``, ``modules``, ``memory``, ``stream``, ``text``), counting what they did on the session.

The real :class:`mmd.backends.cuda.CudaBackend` runs on it, so the tests on
a CPU-only machine exercise the backend's own logic: phase accounting,
compile-once, the tile check before any allocation, freeing on every error
path, the text path, the device cache (the real :class:`~mmd.cuda.pools.DeviceCache`
over numpy blocks) and the conversion of driver errors. ``fail_at`` names a
step that raises a driver error; ``fault`` decides, per product, whether the
"kernel" faults (an illegal address: the backend must reopen). cuBLAS's TF32
mode rounds the operands to TF32 (:func:`tf32_round`), so its error is TF32's;
``flush_l2`` is counted and logged in ``events`` beside the products.

:class:`FakeNvml` stands in for NVML (nvidia-ml-py's ``pynvml``), which the
benchmark reads the GPU's clocks and processes through.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from mmd import kernels as registry
from mmd import textformat
from mmd.backends.cuda import CudaBackend
from mmd.cuda.compiler import Compiled
from mmd.cuda.libcuda import HostMemory
from mmd.cuda.memory import DeviceMatrix, device_bytes
from mmd.cuda.pools import DEVICE_CACHE_CAP_BYTES, DeviceCache
from mmd.cuda.stream import launch_build
from mmd.cuda.text import Multiply, TextResult
from mmd.hostbuffers import kept_buffers

LIMITS = registry.DeviceLimits(
    max_threads_per_block=1024,
    max_shared_per_block=48 * 1024,
    max_registers_per_block=64 * 1024,
    name="Fake GPU",
    compute_capability=(9, 0),
    total_memory=80 * 2**30,
    multiprocessors=132,
    max_shared_optin=227 * 1024,
    l2_cache_bytes=50 * 2**20,
)

#: Milliseconds the fake timer reports for each phase.
PHASE_MS = {"malloc": 1.0, "h2d": 2.0, "kernel": 3.0, "d2h": 4.0, "free": 5.0, "parse_gpu": 0.5, "emit_gpu": 0.25}
#: What the fake compiler takes to build a kernel, and the text kernels.
COMPILE_MS, TEXT_BUILD_MS = 42.0, 12.0


class DriverError(Exception):
    """Stands in for pycuda._driver.Error."""


def tf32_round(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to TF32 (10 stored mantissa bits, ties away from zero, as ``cvt.rna.tf32.f32``), as float32.

    Adding half of the 13 dropped bits' weight to the bit pattern carries into
    the kept bits exactly when the dropped part is at least half a unit.
    """
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded: np.ndarray = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return rounded


class FakeTimer:
    """Phases of :data:`PHASE_MS`; the kernel phase from the session's ``kernel_ms`` when it has one."""

    def __init__(self, session: FakeSession) -> None:
        self.session = session
        self.names: list[str] = []

    @contextlib.contextmanager
    def phase(self, name: str, *, follows: bool = False) -> Iterator[None]:
        yield
        self.names.append(name)

    def elapsed_ms(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in self.names:
            ms = PHASE_MS[name]
            if name == "kernel" and self.session.kernel_ms is not None and self.session.last is not None:
                ms = self.session.kernel_ms(*self.session.last)
            out[name] = out.get(name, 0.0) + ms
        return out


class FakeText:
    """The GPU text path done by textformat and numpy: what the real kernels must equal."""

    def __init__(self, session: FakeSession) -> None:
        self.session = session
        self.built = False
        self.calls = 0

    def functions(self) -> tuple[dict[str, Any], dict[str, Any], float | None]:
        self.session.maybe_fail("text_build")
        first = not self.built
        self.built = True
        return {}, {}, (TEXT_BUILD_MS if first else None)

    def prepare(self, n: int) -> None:
        self.functions()
        for slot, nbytes in kept_buffers(n, n).items():
            self.session.memory.reserve_host(slot, nbytes)

    def multiply_text(self, data: bytes | memoryview, header: textformat.Header, multiply: Multiply) -> TextResult:
        self.calls += 1
        matrices = textformat.parse(data, header)
        s = self.session
        a, b = (DeviceMatrix("device", *x.shape, x.shape[1], 0, x) for x in (matrices.a, matrices.b))
        c = DeviceMatrix("device", header.m, header.n, header.n, 0, np.full((header.m, header.n), np.nan, np.float32))
        timer = FakeTimer(s)
        multiply(a, b, c, timer)
        product: np.ndarray = c.handle
        return TextResult(
            chunks=list(textformat.emit_chunks(product)),
            c=product,
            phases_ms={k: PHASE_MS[k] for k in ("malloc", "h2d", "parse_gpu", "kernel", "emit_gpu", "d2h", "free")},
            stage_ms={"parse": 7.0, "multiply": 3.0, "emit": 8.0},
        )


class FakeDevice:
    """``session.device``: :data:`LIMITS` (a test may set others), the fake's name, its free memory."""

    def __init__(self, session: FakeSession) -> None:
        self.session = session
        self.limits = LIMITS

    def name(self) -> str:
        s = self.session
        return f"{s.name} {s.ordinal} (sm_90)" if s.name == "Fake GPU" else s.name

    def versions(self) -> dict[str, str]:
        return {"driver": "0.0", "pycuda_built_for": "0.0", "pycuda": "fake"}

    def mem_info(self) -> tuple[int, int]:
        return self.session.free_bytes, LIMITS.total_memory


class FakeModules:
    """``session.modules``: registry kernels "built" once each, counted."""

    def __init__(self, session: FakeSession) -> None:
        self.session = session

    def compile(self, spec: registry.KernelSpec, tile: int) -> tuple[Compiled, bool]:
        """Like Modules.compile: built (True) the first time, cached after."""
        s = self.session
        s.maybe_fail("compile")
        spec = spec.for_arch(s.device.limits.arch)  # as Modules.compile: tc1's TMA build on sm_90
        key = (spec.name, tile if spec.uses_tile else 0, spec.macros)
        built = key not in s.built
        if built:
            s.compiles += 1  # a TMA build and its fallback are built together: one compile
            s.built[key] = Compiled(spec, tile, None, s.registers, 0, 0, COMPILE_MS)
        return s.built[key], built


class FakeMemory:
    """``session.memory``: device matrices as numpy arrays (the device cache the real one over numpy blocks),
    page-locked memory as plain arrays; every call counted on the session."""

    def __init__(self, session: FakeSession) -> None:
        self.session = session

    def keep_device_memory(self, cap_bytes: int = DEVICE_CACHE_CAP_BYTES) -> None:
        s = self.session
        if s.device_cache is None:
            s.device_cache = DeviceCache(self._make_block, self._free_block, cap_bytes=cap_bytes)

    def keeps(self, mode: str, rows: int, cols: int) -> bool:
        cache = self.session.device_cache
        return mode == "device" and cache is not None and cache.holds_size(device_bytes(rows, cols))

    def _make_block(self, nbytes: int) -> np.ndarray:
        block = np.full(nbytes // 4, np.nan, np.float32)
        self.session.live_blocks[id(block)] = block
        return block

    def _free_block(self, block: np.ndarray) -> None:
        del self.session.live_blocks[id(block)]

    def alloc(self, mode: str, rows: int, cols: int) -> DeviceMatrix:
        s = self.session
        if s.fail_at == "alloc" and s.allocs == 1:  # the second allocation fails
            raise MemoryError("cuMemAlloc failed: out of memory")
        s.allocs += 1
        if s.device_cache is not None and self.keeps(mode, rows, cols):
            block, reused = s.device_cache.take(device_bytes(rows, cols))
            view = block[: rows * cols].reshape(rows, cols)  # its .base is the block, given back by free
            return DeviceMatrix(mode, rows, cols, cols, 0, view, cached=True, reused=reused)
        return DeviceMatrix(mode, rows, cols, cols, 0, np.full((rows, cols), np.nan, np.float32))

    def free(self, matrix: DeviceMatrix) -> None:
        s = self.session
        s.frees += 1
        s.maybe_fail("free")
        if matrix.cached and s.device_cache is not None:
            s.device_cache.give(device_bytes(matrix.rows, matrix.cols), matrix.handle.base)

    def upload(self, matrix: DeviceMatrix, host: np.ndarray, slot: str) -> None:
        self.session.maybe_fail("upload")
        matrix.handle[...] = host

    def download(self, matrix: DeviceMatrix, slot: str = "c") -> np.ndarray:
        self.session.maybe_fail("download")
        out: np.ndarray = matrix.handle.copy()
        return out

    def flush_l2(self) -> None:
        s = self.session
        s.maybe_fail("flush_l2")
        s.flushes += 1
        s.events.append("flush_l2")

    def host_empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32, slot: str = "host") -> np.ndarray:
        return np.empty(shape, dtype)

    def adopt_host(self, slot: str, memory: HostMemory) -> None:
        self.session.adopted[slot] = memory

    def reserve_host(self, slot: str, nbytes: int) -> None:
        s = self.session
        s.maybe_fail("reserve_host")
        s.reserved[slot] = max(nbytes, s.reserved.get(slot, 0))

    def pinned_bytes(self) -> int:
        return sum(self.session.reserved.values())


class FakeStream:
    """``session.stream``: products by numpy (cuBLAS's TF32 mode rounding its operands), fake timers."""

    def __init__(self, session: FakeSession) -> None:
        self.session = session

    def multiply(
        self, kernel: Compiled | None, a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix, *, tf32: bool = False
    ) -> None:
        s = self.session
        s.maybe_fail("sgemm" if kernel is None else "launch")
        if kernel is not None:
            s.launched.append(launch_build(kernel.spec, a, b))
        c.handle[...] = s.product(a.handle, b.handle, kernel, tf32)

    def phase_timer(self) -> FakeTimer:
        return FakeTimer(self.session)

    def synchronize(self) -> None:
        self.session.maybe_fail("synchronize")

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        s = self.session
        s.maybe_fail("reference")
        if threading.get_ident() != s.thread:
            raise DriverError("used from another thread than the one that opened it")
        out: np.ndarray = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
        return out


class FakeSession:
    """numpy behind the session's parts the CUDA backend uses; what they did is counted here."""

    errors = (DriverError, MemoryError)
    #: Every session made, in order (per test: see the ``fake_gpu`` fixture).
    made: ClassVar[list[FakeSession]] = []

    def __init__(
        self,
        device: int = 0,
        kernel_cache: Path | None = None,
        *,
        fail_at: str | None = None,
        registers: int = 32,
        fault: Callable[[np.ndarray, np.ndarray], bool] | None = None,
        tamper: Callable[[str, np.ndarray], None] | None = None,
        kernel_ms: Callable[[str, int | None, int], float] | None = None,
        name: str = "Fake GPU",
    ) -> None:
        self.ordinal = device
        self.thread = threading.get_ident()
        self.fail_at = fail_at
        #: Page-locked bytes set aside by slot (reserve_host).
        self.reserved: dict[str, int] = {}
        #: Page-locked memory made elsewhere and given to the session, by slot (adopt_host).
        self.adopted: dict[str, HostMemory] = {}
        self.registers = registers
        self.fault = fault
        #: Called with the kernel's name and C after each product: may change C (a wrong kernel) or raise (a bug).
        self.tamper = tamper
        #: The kernel phase's milliseconds from (kernel, tile, m) (default: PHASE_MS's).
        self.kernel_ms = kernel_ms
        self.last: tuple[str, int | None, int] | None = None
        self.name = name
        #: alloc and free calls (cached or not).
        self.allocs = 0
        self.frees = 0
        #: The device cache once keep_device_memory was called, and the blocks it made and has not freed.
        self.device_cache: DeviceCache[np.ndarray] | None = None
        self.live_blocks: dict[int, np.ndarray] = {}
        self.products = 0
        self.compiles = 0
        self.flushes = 0
        #: "product" and "flush_l2", in the order they happened.
        self.events: list[str] = []
        self.built: dict[Any, Compiled] = {}
        #: The build each registry kernel's product ran with (Stream.multiply's choice: TMA build or fallback).
        self.launched: list[registry.KernelSpec] = []
        self.closed = False
        self.free_bytes = 10 * 2**30
        self.device = FakeDevice(self)
        self.modules = FakeModules(self)
        self.memory = FakeMemory(self)
        self.stream = FakeStream(self)
        self.text = FakeText(self)
        FakeSession.made.append(self)

    def maybe_fail(self, step: str) -> None:
        if self.fail_at == step:
            raise DriverError(f"cuFake failed: {step}\n(second line)")

    def product(self, a: np.ndarray, b: np.ndarray, kernel: Compiled | None = None, tf32: bool = False) -> np.ndarray:
        """A·B (``tf32``: of the operands rounded to TF32), or the fault a kernel with an illegal address raises."""
        self.products += 1
        self.events.append("product")
        if self.fault is not None and self.fault(a, b):
            raise DriverError("an illegal memory access was encountered (fake)")
        if tf32:
            a, b = tf32_round(a), tf32_round(b)
        c = np.ascontiguousarray(a @ b, dtype=np.float32)
        name = ("cublas_tf32" if tf32 else "cublas") if kernel is None else kernel.spec.name
        self.last = (name, None if kernel is None or not kernel.spec.uses_tile else kernel.tile, a.shape[0])
        if self.tamper is not None:
            self.tamper(name, c)
        return c

    def close(self) -> None:
        self.closed = True
        if self.device_cache is not None:
            self.device_cache.close()


def cuda_backend(device: int = 0, **session: Any) -> tuple[CudaBackend, FakeSession]:
    """The real CUDA backend on a fake session (``session``: FakeSession's options)."""
    made: list[FakeSession] = []

    def open_session(dev: int, kernel_cache: Path | None) -> FakeSession:
        made.append(FakeSession(dev, kernel_cache, **session))
        return made[0]

    backend = CudaBackend(device, open_session=open_session)
    return backend, made[0]


def fake_gpu_opener(**session: Any) -> Callable[[str, int, Path | None], tuple[CudaBackend, None]]:
    """An ``open_backend`` replacement: every backend a CUDA backend on a fake session (to monkeypatch)."""

    def open_backend(name: str, device: int = 0, kernel_cache: Path | None = None) -> tuple[CudaBackend, None]:
        backend, _ = cuda_backend(device, **session)
        return backend, None

    return open_backend


class FakeNvml:
    """NVML as nvidia-ml-py's ``pynvml`` module shows it, for the benchmark's GPU readings: one or more GPUs by
    PCI bus id, each with an SM clock, its maximum, a clock event reasons mask and the compute processes on it.
    ``broken`` names functions that raise :class:`NVMLError` (a field this driver does not know); ``calls``
    records every call by name."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    @dataclasses.dataclass
    class Process:
        pid: int
        usedGpuMemory: int = 0  # pynvml's name

    @dataclasses.dataclass
    class Gpu:
        bus_id: str
        sm_mhz: int = 1980
        max_sm_mhz: int = 1980
        reasons: int = 0
        pids: tuple[int, ...] = ()

    def __init__(self, *gpus: FakeNvml.Gpu, broken: tuple[str, ...] = (), present: bool = True) -> None:
        self.gpus = list(gpus) or [FakeNvml.Gpu("00000000:65:00.0")]
        self.broken = set(broken)
        self.present = present  # False: no driver library (nvmlInit fails)
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.broken or not self.present:
            raise FakeNvml.NVMLError(name)

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> FakeNvml.Gpu:
        self._call("nvmlDeviceGetHandleByPciBusId")
        for gpu in self.gpus:
            if gpu.bus_id.lower().endswith(bus_id.lower().split(":", 1)[-1]):
                return gpu
        raise FakeNvml.NVMLError("not found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeNvml.Gpu:
        self._call("nvmlDeviceGetHandleByIndex")
        return self.gpus[index]

    def nvmlDeviceGetClockInfo(self, gpu: FakeNvml.Gpu, clock: int) -> int:
        self._call("nvmlDeviceGetClockInfo")
        assert clock == self.NVML_CLOCK_SM
        return gpu.sm_mhz

    def nvmlDeviceGetMaxClockInfo(self, gpu: FakeNvml.Gpu, clock: int) -> int:
        self._call("nvmlDeviceGetMaxClockInfo")
        assert clock == self.NVML_CLOCK_SM
        return gpu.max_sm_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeNvml.Gpu) -> int:
        self._call("nvmlDeviceGetCurrentClocksEventReasons")
        return gpu.reasons

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeNvml.Gpu) -> list[FakeNvml.Process]:
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return [FakeNvml.Process(pid) for pid in gpu.pids]
