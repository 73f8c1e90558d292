"""The CUDA backend: the registry's kernels (and cuBLAS) on one GPU, phase by phase.

Each job runs five timed phases on one stream (CUDA events): ``malloc``,
``h2d``, ``kernel``, ``d2h`` and ``free``; ``cuda`` is their sum, the course's
"CUDA time". ``compile`` is added when the kernel had to be built for this job
(the first use of a kernel/tile pair in this backend). The tile is checked
against the device's limits before anything is allocated, device memory is
freed on every path, and driver failures become :class:`~mmd.errors.CudaError`.

Everything that touches pycuda lives in :mod:`mmd.cuda`; this module holds the
job's logic and sees the GPU only through a :class:`Session` (the real one is
:class:`mmd.cuda.session.GpuSession`; tests give it a fake). Create, use and close a
backend in one thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import math
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from .. import kernels as registry
from ..config import MEMORY_MODES
from ..cuda.compiler import Compiled
from ..cuda.libcuda import HostMemory
from ..cuda.memory import DeviceMatrix
from ..cuda.text import Multiply, TextResult, Timer, fits
from ..errors import CudaError, KernelError, MmdError
from ..hostbuffers import INPUT_SLOT, input_bytes, text_bytes
from ..record import TextFacts
from ..textformat import Header
from .base import CUDA_PHASES, Backend, DeviceText, MultiplyRequest, Product, TextProduct

_MIB = 1024 * 1024
#: How many shapes :class:`CudaBackend` keeps its checks for (a worker sees few; the bound is for a flood of odd ones).
READY_SHAPES = 256
T = TypeVar("T")


def prepared_size(budget: int) -> int:
    """The largest n whose n×n job's buffers (input, C, text) fit ``budget`` bytes."""
    per_n2 = input_bytes(1) + 4 + text_bytes(1, 1)  # input, C (float32), text
    return math.isqrt(max(budget, 0) // per_n2)


class TextEngine(Protocol):
    """The GPU text path of a session (:class:`mmd.cuda.text.GpuText`)."""

    def functions(self) -> tuple[dict[str, Any], dict[str, Any], float | None]: ...
    def prepare(self, n: int) -> None: ...
    def multiply_text(self, data: bytes | memoryview, header: Header, multiply: Multiply) -> TextResult: ...


class SessionDevice(Protocol):
    """What the backend needs of a session's device facts (:class:`mmd.cuda.device.Device`)."""

    @property
    def limits(self) -> registry.DeviceLimits: ...
    def name(self) -> str: ...
    def versions(self) -> dict[str, str]: ...
    def mem_info(self) -> tuple[int, int]: ...


class SessionModules(Protocol):
    """What the backend needs of a session's modules (:class:`mmd.cuda.modules.Modules`)."""

    def compile(self, spec: registry.KernelSpec, tile: int) -> tuple[Compiled, bool]: ...


class SessionMemory(Protocol):
    """What the backend needs of a session's memory (:class:`mmd.cuda.memory.Memory`)."""

    def keep_device_memory(self) -> None: ...
    def keeps(self, mode: str, rows: int, cols: int) -> bool: ...
    def alloc(self, mode: str, rows: int, cols: int) -> DeviceMatrix: ...
    def free(self, matrix: DeviceMatrix) -> None: ...
    def upload(self, matrix: DeviceMatrix, host: np.ndarray, slot: str) -> None: ...
    def download(self, matrix: DeviceMatrix, slot: str = "c") -> np.ndarray: ...
    def flush_l2(self) -> None: ...
    def host_empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32, slot: str = "host") -> np.ndarray: ...
    def reserve_host(self, slot: str, nbytes: int) -> None: ...
    def adopt_host(self, slot: str, memory: HostMemory) -> None: ...
    def pinned_bytes(self) -> int: ...


class SessionStream(Protocol):
    """What the backend needs of a session's stream (:class:`mmd.cuda.stream.Stream`)."""

    def multiply(
        self, kernel: Compiled | None, a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix, *, tf32: bool = False
    ) -> None: ...
    def phase_timer(self) -> Timer: ...
    def synchronize(self) -> None: ...
    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...


class Session(Protocol):
    """What the backend needs of one GPU (:class:`mmd.cuda.session.GpuSession`): its parts."""

    errors: tuple[type[BaseException], ...]

    @property
    def device(self) -> SessionDevice: ...
    @property
    def modules(self) -> SessionModules: ...
    @property
    def memory(self) -> SessionMemory: ...
    @property
    def stream(self) -> SessionStream: ...
    @property
    def text(self) -> TextEngine: ...
    def close(self) -> None: ...


def open_session(device: int, kernel_cache: Path | None) -> Session:
    """The real session on ``device`` (BackendUnavailable where there is no pycuda or GPU)."""
    from ..cuda.session import GpuSession

    return GpuSession(device, kernel_cache=kernel_cache)


SessionFactory = Callable[[int, Path | None], Session]


class CudaBackend(Backend, DeviceText):
    """Multiply on GPU ``device`` with a registered kernel or cuBLAS; parse and format the text there too."""

    name = "cuda"

    def __init__(
        self, device: int = 0, kernel_cache: Path | None = None, *, open_session: SessionFactory = open_session
    ) -> None:
        self._session = open_session(device, kernel_cache)
        self._device = device
        self._thread = threading.get_ident()
        self._closed = False
        self._warm: set[tuple[int, int, int, bool]] = set()  # shapes (and math modes) cuBLAS has run here
        #: What :meth:`_prepare` found for a request and shape whose matrices the session's cache keeps (the
        #: kernel's variant, built, its launch checked): a small job of that shape again skips the checks.
        self._ready: dict[tuple[MultiplyRequest, int, int, int], tuple[registry.KernelSpec, Compiled | None]] = {}

    @property
    def session(self) -> Session:
        """The session underneath (for scripts and tests)."""
        return self._session

    @property
    def limits(self) -> registry.DeviceLimits:
        """The device's launch limits."""
        return self._session.device.limits

    def device_name(self) -> str:
        """``"NVIDIA H100 80GB HBM3 (sm_90)"``."""
        return self._session.device.name()

    def versions(self) -> dict[str, str]:
        """Driver, toolkit (as pycuda was built) and pycuda versions."""
        return self._session.device.versions()

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """A·B in float64 on the device (cuBLAS DGEMM): the reference `mmd check` compares with."""
        self._check_usable()
        return self._guarded(functools.partial(self._session.stream.reference, a, b))

    def memory_used(self) -> int | None:
        """Bytes of the device's memory in use (by every process on it)."""
        try:
            free, total = self._session.device.mem_info()
        except self._session.errors:
            return None
        return total - free

    def multiply(self, a: np.ndarray, b: np.ndarray, request: MultiplyRequest) -> Product:
        """Return A·B computed on the GPU with every phase timed (ms)."""
        self._check_usable()
        a, b = self._operands(a, b)
        m, k = a.shape
        n = b.shape[1]
        spec, compiled, timings = self._prepare(request, m, k, n)
        notes: list[str] = []
        c = self._guarded(lambda: self._run(compiled, spec, a, b, request, timings, notes))
        timings["cuda"] = sum(timings[phase] for phase in CUDA_PHASES)
        return Product(
            c=c,
            kernel=spec.name,
            tile=request.tile if spec.uses_tile else None,
            memory=request.memory,
            device=self.device_name(),
            timings_ms=timings,
            notes=notes,
        )

    def _prepare(
        self, request: MultiplyRequest, m: int, k: int, n: int
    ) -> tuple[registry.KernelSpec, Compiled | None, dict[str, float]]:
        """Check the kernel, memory mode, tile and grid; build the kernel; check free memory."""
        ready = self._ready.get((request, m, k, n))
        if ready is not None:
            return ready[0], ready[1], {}
        spec = registry.get(request.kernel)
        if not spec.on_gpu:
            raise KernelError(
                f"kernel {spec.name} does not run on the cuda backend; choose one of {', '.join(registry.GPU_KERNELS)}",
                details={"kernel": spec.name},
            )
        if request.memory not in MEMORY_MODES:
            raise KernelError(
                f"unknown memory mode {request.memory!r}; choose one of {', '.join(MEMORY_MODES)}",
                details={"memory": request.memory},
            )
        limits = self._session.device.limits
        spec = spec.for_shape(m, n, limits)  # fixed-block kernels: the variant tuned for this shape
        registry.check_launch(spec, request.tile, limits)
        registry.check_grid(spec, m, n, request.tile, limits)
        timings: dict[str, float] = {}
        compiled = None
        if spec.compiled:
            compiled, built_now = self._guarded(lambda: self._session.modules.compile(spec, request.tile))
            if built_now:
                timings["compile"] = compiled.compile_ms
            registry.check_launch(spec, request.tile, limits, registers_per_thread=compiled.registers)
        kept = self._kept(request.memory, m, k, n)
        if not kept:
            self._check_memory(request.memory, m, k, n)
        if spec.kind == registry.LIBRARY:
            self._warm_library(m, k, n, _tf32(spec), timings)
        if kept:
            if len(self._ready) >= READY_SHAPES:
                self._ready.clear()
            self._ready[(request, m, k, n)] = (spec, compiled)
        return spec, compiled, timings

    def _warm_library(self, m: int, k: int, n: int, tf32: bool, timings: dict[str, float]) -> None:
        """Run cuBLAS once on scratch buffers the first time a shape comes, outside the timed phases.

        Its first call creates the handle and loads the kernel it picks for the
        shape (a large share of a small job's time), which is
        set-up, not the product: it is recorded as ``compile``, like a kernel
        built for its first job.
        """
        if (m, k, n, tf32) in self._warm:
            return
        session = self._session
        start = time.perf_counter()
        held: list[DeviceMatrix] = []
        try:
            for rows, cols in ((m, k), (k, n), (m, n)):
                held.append(self._guarded(functools.partial(session.memory.alloc, "device", rows, cols)))
            self._guarded(lambda: session.stream.multiply(None, *held, tf32=tf32))
            self._guarded(session.stream.synchronize)
        finally:
            self._release(held)
        self._warm.add((m, k, n, tf32))
        timings["compile"] = timings.get("compile", 0.0) + (time.perf_counter() - start) * 1e3

    # -- the text path (mmd.cuda.text) -----------------------------------------

    def host_array(self, shape: int | tuple[int, ...], dtype: Any, slot: str) -> np.ndarray:
        """Page-locked memory, one buffer per slot reused from job to job: h2d copies straight from it."""
        self._check_usable()
        return self._session.memory.host_empty(shape, dtype, slot=slot)

    def adopt_host(self, slot: str, memory: HostMemory) -> None:
        """``memory`` becomes the session's page-locked ``slot``, freed when the backend closes."""
        self._check_usable()
        self._session.memory.adopt_host(slot, memory)

    def prepare(self, budget: int) -> int:
        """The text kernels loaded, and the page-locked buffers of the largest square job whose input, C and
        text fit ``budget`` bytes allocated and kept: a first job of that size or less then runs as the tenth
        does. Small jobs' device memory is kept from job to job from now on (the session's cache, outside
        ``budget``). Returns the page-locked bytes held."""
        self._check_usable()
        n = prepared_size(budget)

        def step() -> int:
            session = self._session
            session.memory.keep_device_memory()
            session.text.prepare(n)
            if n:
                session.memory.reserve_host(INPUT_SLOT, input_bytes(n))
            return session.memory.pinned_bytes()

        return self._guarded(step)

    def device_text(self) -> DeviceText:
        return self

    def accepts(self, header: Header, nbytes: int, request: MultiplyRequest) -> bool:
        """Device memory, and offsets within the text kernels' int32."""
        return request.memory == "device" and fits(header, nbytes)

    def multiply_text(self, data: bytes | memoryview, header: Header, request: MultiplyRequest) -> TextProduct:
        """Parse ``data`` on the GPU, multiply with the requested kernel, format the text there."""
        self._check_usable()
        m, k, n = header.m, header.k, header.n
        spec, compiled, timings = self._prepare(request, m, k, n)
        text = self._session.text
        _parse, _emit, built_ms = self._guarded(text.functions)
        if built_ms is not None:
            timings["compile"] = timings.get("compile", 0.0) + built_ms
        stream, tf32 = self._session.stream, _tf32(spec)

        def multiply(a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix, timer: Timer) -> None:
            with timer.phase("kernel"):
                stream.multiply(compiled, a, b, c, tf32=tf32)

        result = self._guarded(lambda: text.multiply_text(data, header, multiply))
        phases = result.phases_ms
        for phase in CUDA_PHASES:
            timings[phase] = phases.get(phase, 0.0)
        timings["cuda"] = sum(timings[phase] for phase in CUDA_PHASES)
        return TextProduct(
            c=result.c,
            kernel=spec.name,
            tile=request.tile if spec.uses_tile else None,
            memory=request.memory,
            device=self.device_name(),
            timings_ms=timings,
            notes=list(result.notes),
            chunks=result.chunks,
            stage_ms=dict(result.stage_ms),
            text=TextFacts(
                path="gpu",
                parse_gpu=round(phases.get("parse_gpu", 0.0), 3),
                emit_gpu=round(phases.get("emit_gpu", 0.0), 3),
                host_parse=result.host_parse,
                exotic_runs=result.exotic_runs,
            ),
        )

    def _run(
        self,
        compiled: Compiled | None,
        spec: registry.KernelSpec,
        a: np.ndarray,
        b: np.ndarray,
        request: MultiplyRequest,
        timings: dict[str, float],
        notes: list[str],
    ) -> np.ndarray:
        """The five timed phases; ``timings`` gets their milliseconds, ``notes`` what they timed when the
        session's cache served them."""
        memory, stream = self._session.memory, self._session.stream
        m, k = a.shape
        n = b.shape[1]
        timer = stream.phase_timer()
        held: list[DeviceMatrix] = []
        try:
            with timer.phase("malloc"):
                for rows, cols in ((m, k), (k, n), (m, n)):
                    held.append(memory.alloc(request.memory, rows, cols))
            da, db, dc = held
            cache_note = _cache_note(held)
            # Back to back, each phase starting at the last one's end event, but for the L2's flush.
            with timer.phase("h2d", follows=True):
                memory.upload(da, a, "a")
                memory.upload(db, b, "b")
            if request.flush_l2:  # between the phases: the copies just left A and B in the L2
                memory.flush_l2()
            with timer.phase("kernel", follows=not request.flush_l2):
                stream.multiply(compiled, da, db, dc, tf32=_tf32(spec))
            with timer.phase("d2h", follows=True):
                c = memory.download(dc, "c")
            with timer.phase("free", follows=True):
                while held:
                    memory.free(held.pop())
            timings.update(timer.elapsed_ms())
            if cache_note:
                notes.append(cache_note)
            return c
        finally:
            self._release(held)

    def _release(self, held: list[DeviceMatrix]) -> None:
        """Free whatever a failed job still holds; the first error wins."""
        while held:
            matrix = held.pop()
            # the job's own error is the one to report
            with contextlib.suppress(Exception):
                self._session.memory.free(matrix)

    def _guarded(self, step: Callable[[], T]) -> T:
        """Run ``step``, turning stray driver errors into CudaError."""
        try:
            return step()
        except MmdError:
            raise
        except self._session.errors as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise CudaError(f"CUDA failed: {reason}") from exc

    def _kept(self, memory: str, m: int, k: int, n: int) -> bool:
        """Whether the session's cache serves all three matrices of an m×k×n job."""
        return all(self._session.memory.keeps(memory, rows, cols) for rows, cols in ((m, k), (k, n), (m, n)))

    def _check_memory(self, memory: str, m: int, k: int, n: int) -> None:
        """Refuse a job whose three matrices cannot fit in free device memory.

        Not asked (a cuMemGetInfo saved) for a job whose matrices the session's cache serves (:meth:`_kept`):
        they take at most a few hundred KiB, mostly memory the cache already holds, and a failed allocation is
        refused as clearly.
        """
        need = (m * k + k * n + m * n) * registry.FLOAT_BYTES
        free, _total = self._guarded(self._session.device.mem_info)
        if need > free:
            raise CudaError(
                f"the job needs {need / _MIB:.0f} MiB of {memory} memory; "
                f"{free / _MIB:.0f} MiB of device memory is free",
                details={"needed_bytes": need, "free_bytes": free},
            )

    @staticmethod
    def _operands(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise KernelError(
                f"cannot multiply a {'×'.join(map(str, a.shape))} matrix by a "
                f"{'×'.join(map(str, b.shape))} one: A's columns must equal B's rows",
                details={"a_shape": list(a.shape), "b_shape": list(b.shape)},
            )
        return (np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32))

    def _check_usable(self) -> None:
        if self._closed:
            raise CudaError("the cuda backend is closed")
        if threading.get_ident() != self._thread:
            raise CudaError("the cuda backend was created in another thread; use and close it there")

    def close(self) -> None:
        """Release the device (pop the CUDA context). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._session.close()


def _cache_note(held: list[DeviceMatrix]) -> str | None:
    """The sidecar's note for a job some of whose matrices the session's cache served (else None): malloc and
    free then time the cache, not cuMemAlloc and cuMemFree, and a student reading them must know.

    Worded to fit one line of the sidecar that mmd.record writes itself (it is on every small GPU job; a
    longer one, or one with a quote or ": ", sent the whole sidecar through PyYAML)."""
    kept = sum(matrix.cached for matrix in held)
    if not kept:
        return None
    reused = sum(matrix.reused for matrix in held)
    return f"malloc/free timed the device cache, not cuMemAlloc (reused {reused}/{len(held)}, kept {kept}/{len(held)})"


def _tf32(spec: registry.KernelSpec) -> bool:
    """Whether ``spec`` is cuBLAS in its TF32 tensor-core mode (the session's ``tf32`` flag)."""
    return spec.kind == registry.LIBRARY and spec.precision == "tf32"


class DeviceReference:
    """A float64 GEMM on the GPU for ``mmd check``, callable from any thread.

    A CUDA backend belongs to the thread that opened it, and the checks of a
    folder run on a pool of threads: one thread of its own owns the backend
    and takes the products in turn (a product of 4096 takes milliseconds
    there). Use as a context manager; BackendUnavailable where there is no GPU.
    """

    def __init__(self, device: int = 0, open_session: SessionFactory = open_session) -> None:
        self._requests: queue.SimpleQueue[tuple[np.ndarray, np.ndarray, concurrent.futures.Future[np.ndarray]] | None]
        self._requests = queue.SimpleQueue()
        opened: concurrent.futures.Future[CudaBackend] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(device, open_session, opened), daemon=True)
        self._thread.start()
        self.backend = opened.result()  # BackendUnavailable is raised here, in the caller's thread

    def _serve(self, device: int, factory: SessionFactory, opened: concurrent.futures.Future[CudaBackend]) -> None:
        try:
            backend = CudaBackend(device, open_session=factory)
        except BaseException as exc:
            opened.set_exception(exc)
            return
        opened.set_result(backend)
        try:
            while (item := self._requests.get()) is not None:
                a, b, result = item
                try:
                    result.set_result(backend.reference(a, b))
                except BaseException as exc:
                    result.set_exception(exc)
        finally:
            backend.close()

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        result: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        self._requests.put((a, b, result))
        return result.result()

    def close(self) -> None:
        self._requests.put(None)
        self._thread.join()

    def __enter__(self) -> DeviceReference:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
