"""The session's stream: the kernels queued on it (a registry build, cuBLAS, a kernel file's, the text
kernels), its events and phase timers, and waiting for it.

Every CUDA phase of a job (malloc, h2d, kernel, d2h, free) is timed with CUDA events on the stream
(:class:`PhaseTimer`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..kernels import KernelSpec
from . import libcuda
from .compiler import Compiled
from .cublas import Cublas
from .driver import Context
from .memory import DeviceMatrix, Memory
from .modules import Modules


def launch_build(spec: KernelSpec, a: DeviceMatrix, b: DeviceMatrix) -> KernelSpec:
    """The build :meth:`Stream.multiply` launches for A·B: a TMA build where the copy engine can read both
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


class Stream:
    """``session.stream``: launches, cuBLAS and events on the session's one stream. A registry kernel's builds
    come from ``modules``; the float64 reference's buffers from ``memory``."""

    def __init__(self, context: Context, modules: Modules, memory: Memory) -> None:
        self._context = context
        self._modules = modules
        self._memory = memory
        #: Events the phase timers have finished with, recorded again by the next.
        self._spare_events: list[Any] = []
        self._cublas: Cublas | None = None

    def phase_timer(self) -> PhaseTimer:
        """A fresh event timer on the session's stream (its events are the session's, reused)."""
        return PhaseTimer(self._context.cuda, self._context.stream, self._spare_events)

    def synchronize(self) -> None:
        """Wait for everything queued on the session's stream."""
        with self._context.converting("waiting for the device"):
            self._context.stream.synchronize()

    def record_event(self) -> Any:
        """A CUDA event recorded now on the session's stream (``.synchronize()`` waits for it)."""
        with self._context.converting("recording an event"):
            event = self._context.cuda.Event()
            event.record(self._context.stream)
        return event

    def launch(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple[Any, ...], shared: int
    ) -> None:
        """Queue a function from :meth:`~mmd.cuda.modules.Modules.load_cubin` on the session's stream with
        ``args`` as its signature says."""
        self._context.check()
        with self._context.converting("launching the kernel"):
            function.prepared_async_call(grid, block, self._context.stream, *args, shared_size=shared)

    def call(self, function: Any, blocks: int, threads: int, *args: Any) -> None:
        """Launch a prepared 1-D ``function`` with ``blocks`` × ``threads`` on the session's stream."""
        if blocks <= 0:
            return
        with self._context.converting("launching a text kernel"):
            function.prepared_async_call((int(blocks), 1), (int(threads), 1, 1), self._context.stream, *args)

    def multiply(
        self, kernel: Compiled | None, a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix, *, tf32: bool = False
    ) -> None:
        """C = A·B on the session's stream with a compiled registry kernel, or cuBLAS when ``kernel`` is None.

        ``tf32`` (cuBLAS only): in its TF32 tensor-core math mode (``cublas_tf32``).
        """
        self._context.check()
        if kernel is None:
            self._blas().sgemm(a, b, c, tf32=tf32)
            return
        m, k, n = a.rows, a.cols, b.cols
        if m == 0 or n == 0:
            return
        spec = launch_build(kernel.spec, a, b)
        if spec is not kernel.spec:
            kernel, _ = self._modules.compile(spec, kernel.tile)  # built with the TMA build: from the modules' cache
        tile = kernel.tile
        grid, block = spec.grid(m, n, tile), spec.block(tile)
        if spec.tensor_maps is not None:
            self._launch_tma(kernel, a, b, c, grid, block)
            return
        with self._context.converting(f"launching {spec.name} at tile {tile}"):
            kernel.function.prepared_async_call(
                grid[:2], block, self._context.stream, a.ptr, b.ptr, c.ptr, m, k, n, a.ld, b.ld, c.ld,
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
        driver = self._context.driver()
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
            stream=int(self._context.stream.handle), cluster=(spec.cluster_x, 1, 1),
        )  # fmt: skip

    def _blas(self) -> Cublas:
        """cuBLAS on the session's stream, made on first use."""
        if self._cublas is None:
            self._cublas = Cublas(int(self._context.stream.handle))
        return self._cublas

    def reference(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """A·B in float64 through cuBLAS DGEMM (the reference results are checked against)."""
        self._context.check()
        a = np.ascontiguousarray(a, dtype=np.float64)
        b = np.ascontiguousarray(b, dtype=np.float64)
        (m, k), n = a.shape, b.shape[1]
        c = np.empty((m, n), np.float64)
        held = [self._memory.mem_alloc(x.nbytes) for x in (a, b, c)]
        try:
            with self._context.converting("a float64 reference product"):
                self._context.cuda.memcpy_htod(held[0], a)
                self._context.cuda.memcpy_htod(held[1], b)
                self._blas().dgemm(m, k, n, int(held[0]), int(held[1]), int(held[2]))
                self._context.stream.synchronize()
                self._context.cuda.memcpy_dtoh(c, held[2])
        finally:
            for handle in held:
                self._memory.mem_free(handle)
        return c

    def close(self) -> list[BaseException]:
        """Drop cuBLAS and the spare events (the session is closing); what failed."""
        problems: list[BaseException] = []
        if self._cublas is not None:
            try:
                self._cublas.close()
            except Exception as exc:
                problems.append(exc)
            self._cublas = None
        self._spare_events.clear()  # destroyed here, in the context's thread, as the stream after them
        return problems
