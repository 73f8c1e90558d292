"""The kernel-file backend: a ``.cu`` file anyone wrote (``mmd run --kernel-file``), run as mmd's own kernels are.

The file is read and guarded by :mod:`mmd.kernelfile`; each job checks the tile (against every CUDA GPU's
limits first, so tile 64 is refused on any machine, then against the device's), works out the padding the
kernel needs (refusing padded sizes past ``max_dim`` or ``max_memory_bytes`` before allocating them),
compiles through NVRTC and the kernel cache, and launches in a process of its own
(:class:`~mmd.kernelfile.launch.LaunchProcess`), which times the course's five phases with CUDA events as
the cuda backend does. A large input goes through that process's GPU text path, as the cuda backend's does
(:class:`~mmd.backends.base.DeviceText`): the file's bytes are read into memory the process maps, and the
output's bytes come back the same way. The process is started when the backend is made, so its imports
and CUDA context are made while the first job's input is read; it is kept for this backend's next job
(one kernel file, one submitter) while it is sound, and replaced after a fault or a time limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import kernels as registry
from ..cuda.text import fits
from ..errors import KernelError, KernelFileError
from ..hostbuffers import INPUT_SLOT
from ..kernelfile.exchange import Shared
from ..kernelfile.launch import Launch, LaunchProcess, Ran, arguments
from ..kernelfile.nvrtc import CompileLimits, compile_kernel
from ..kernelfile.padding import check_padded, crop, pad_operands, padded_shape
from ..kernelfile.reading import read_kernel_file
from ..record import KernelFileFacts, Shape, TextFacts
from ..textformat import Header
from .base import CUDA_PHASES, Backend, DeviceText, MultiplyRequest, Product, TextProduct

#: Compiler warnings a job's sidecar notes at most.
MAX_WARNING_NOTES = 5


@dataclass(frozen=True)
class KernelFileSettings:
    """What the backend needs of a job's settings."""

    device: int = 0
    #: Where compiled kernels are kept (None: no disk cache).
    kernel_cache: Path | None = None
    #: The longest one launch may run: the smaller of ``kernel_file_launch_timeout_s`` and ``job_timeout_s``.
    launch_timeout_s: float = 5.0
    max_dim: int | None = None
    max_memory_bytes: int | None = None


@dataclass
class _Prepared:
    """A job made ready to launch: its process, the launch, the compile's warnings and time."""

    process: LaunchProcess
    device: str
    launch: Launch
    warnings: list[str]
    timings: dict[str, float]


class KernelFileBackend(Backend, DeviceText):
    """Run the kernel of the file at ``path`` on a GPU, in a child process kept for this backend's jobs."""

    name = "cuda"

    def __init__(self, path: Path, settings: KernelFileSettings, process: LaunchProcess | None = None) -> None:
        self.kernel = read_kernel_file(path)
        self.settings = settings
        self._device_name: str | None = None
        #: ``process``: one started for this backend beforehand (``mmd run`` starts it before its imports)
        self._process: LaunchProcess | None = process or self._fresh()
        #: The memory the current job's input was read into (:meth:`host_array`), shared with the process.
        self._input: Shared | None = None
        #: Seconds the launch processes this backend closed or replaced held the GPU (:attr:`launched_s`).
        self._spent = 0.0

    def _fresh(self) -> LaunchProcess:
        return LaunchProcess(self.settings.device, self.kernel.name, self.settings.kernel_cache)

    def _live(self) -> LaunchProcess:
        """The launch process: the kept one while it is sound, else a fresh one."""
        if self._process is None or not self._process.alive:
            if self._process is not None:
                self._spent += self._process.launched_s
            self._process = self._fresh()
        return self._process

    @property
    def launched_s(self) -> float:
        """Seconds this backend's kernels held the GPU, every launch counted (a fault's and a kill's too)."""
        return self._spent + (self._process.launched_s if self._process is not None else 0.0)

    def _check_shapes(self, m: int, k: int, n: int, request: MultiplyRequest) -> None:
        kf = self.kernel
        if request.memory != "device":
            raise KernelFileError(
                f"{kf.name}: a kernel file runs in device memory only, not {request.memory}",
                {"kernel_file": kf.name, "memory": request.memory},
            )
        kf.check_launch(request.tile, registry.COMMON_LIMITS)  # tile 64 is refused on any machine, before anything
        need = kf.declaration.requirement(request.tile)
        check_padded(m, k, n, need, self.settings.max_dim, self.settings.max_memory_bytes)

    def _prepare(self, m: int, k: int, n: int, tile: int) -> _Prepared:
        """The launch process (the kept one while it is sound), the tile checked against its device, the
        kernel compiled (or taken from the cache) and its launch for the padded sizes."""
        kf, decl = self.kernel, self.kernel.declaration
        process = self._live()
        device, limits = process.ready()
        self._device_name = device
        kf.check_launch(tile, limits)
        mp, kp, np_ = padded_shape(m, k, n, decl.requirement(tile))
        grid = decl.grid_dims(mp, np_, tile)
        registry.check_grid_dims(kf.name, mp, np_, tile, grid, limits)
        timings: dict[str, float] = {}
        start = time.perf_counter()
        built = compile_kernel(kf, tile, limits.arch, self.settings.kernel_cache, CompileLimits())
        if built.compiled:
            timings["compile"] = (time.perf_counter() - start) * 1e3
        launch = Launch(
            cubin=built.cubin,
            symbol=built.symbol,
            arguments=arguments(kf.roles, mp, kp, np_),
            grid=grid,
            block=decl.block_dims(tile),
            dynamic_shared=decl.dynamic_shared(tile),
            padded=(mp, kp, np_),
        )
        return _Prepared(process, device, launch, list(built.warnings[:MAX_WARNING_NOTES]), timings)

    def _product(self, job: _Prepared, ran: Ran, m: int, k: int, n: int, tile: int) -> dict[str, Any]:
        """What a Product of this job holds beyond C: its kernel, timings, notes and facts."""
        kf = self.kernel
        timings = {**job.timings, **ran.timings_ms}
        timings["cuda"] = sum(timings.get(phase, 0.0) for phase in CUDA_PHASES)
        notes = [*job.warnings, *ran.notes]
        if ran.printf_bytes:
            shown = ran.printf.decode("utf-8", "replace")
            kept = "" if len(ran.printf) == ran.printf_bytes else f", the first {len(ran.printf)} kept"
            notes.append(f"device printf wrote {ran.printf_bytes} bytes{kept}:\n{shown}")
        mp, kp, np_ = job.launch.padded
        padded = (mp, kp, np_) != (m, k, n)
        return {
            "kernel": kf.name,
            "tile": tile if kf.declaration.uses_tile else None,
            "memory": "device",
            "device": job.device,
            "timings_ms": timings,
            "notes": notes,
            "kernel_file": KernelFileFacts(
                name=kf.name,
                sha256=kf.sha256,
                entry=kf.kernel.name,
                signature=kf.signature,
                precision=kf.declaration.precision,
                padded=Shape(mp, kp, np_) if padded else None,
            ),
        }

    def multiply(self, a: np.ndarray, b: np.ndarray, request: MultiplyRequest) -> Product:
        """A·B by the file's kernel at ``request.tile``, padded and cropped; every phase timed (ms)."""
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise KernelError(
                f"cannot multiply a {'×'.join(map(str, a.shape))} matrix by a {'×'.join(map(str, b.shape))} one",
                {"a_shape": list(a.shape), "b_shape": list(b.shape)},
            )
        (m, k), n = a.shape, b.shape[1]
        self._check_shapes(m, k, n, request)
        job = self._prepare(m, k, n, request.tile)
        need = self.kernel.declaration.requirement(request.tile)
        pa, pb = pad_operands(np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32), need)
        ran = job.process.run(job.launch, pa, pb, self.settings.launch_timeout_s)
        return Product(c=crop(ran.c, m, n), **self._product(job, ran, m, k, n, request.tile))

    # -- the GPU text path, in the launch process ---------------------------------------------------------

    def host_array(self, shape: int | tuple[int, ...], dtype: Any, slot: str) -> np.ndarray:
        """The input's bytes go in memory the launch process made and page-locked for them (no copy on the way
        there); other buffers are plain memory."""
        if slot != INPUT_SLOT:
            return np.empty(shape, dtype)
        if self._input is not None:
            self._input.close()
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        # a one-shot's: made and page-locked by the launch process as it started; else made (its pages faulted
        # in) and read into here, while the launch process starts, which page-locks it
        self._input = self._live().input_memory(nbytes) or Shared(nbytes, populate=True)
        return self._input.array(0, shape, dtype)

    def device_text(self) -> DeviceText:
        return self

    def accepts(self, header: Header, nbytes: int, request: MultiplyRequest) -> bool:
        """Device memory, and offsets within the text kernels' int32."""
        return request.memory == "device" and fits(header, nbytes)

    def multiply_text(self, data: bytes | memoryview, header: Header, request: MultiplyRequest) -> TextProduct:
        """Parse ``data`` on the GPU, multiply by the file's kernel (padded on the device where it needs it),
        format the product there: all in the launch process."""
        m, k, n = header.m, header.k, header.n
        self._check_shapes(m, k, n, request)
        job = self._prepare(m, k, n, request.tile)
        shared, self._input = self._input, None
        try:
            ran = job.process.run_text(
                job.launch, memoryview(data).cast("B"), header, self.settings.launch_timeout_s, shared
            )
        finally:
            if shared is not None:
                shared.close()
        text = ran.text
        return TextProduct(
            c=ran.c,
            **self._product(job, ran, m, k, n, request.tile),
            chunks=ran.chunks,
            stage_ms=ran.stage_ms,
            text=TextFacts(
                path="gpu",
                parse_gpu=text.get("parse_gpu"),
                emit_gpu=text.get("emit_gpu"),
                host_parse=text.get("host_parse"),
                exotic_runs=text.get("exotic_runs"),
            ),
        )

    def start(self) -> None:
        """Have the launch process started and ready (its imports and CUDA context made), and wait for it: a
        benchmark calls this before it times a call, so that the call's time is the job's and not a process's
        start, as a built-in kernel's context is made before its calls are timed. BackendUnavailable where it
        cannot have a GPU."""
        if self._process is None or not self._process.alive:
            self._process = self._fresh()
        try:
            self._device_name = self._process.ready()[0]
        except BaseException:
            self.close()
            raise

    def device_name(self) -> str:
        """The GPU, as the launch process's driver names it (once one has started)."""
        return self._device_name or "a CUDA GPU"

    def close(self) -> None:
        """Kill the launch process and drop the shared input. Idempotent."""
        if self._process is not None:
            self._process.close()
            self._spent += self._process.launched_s
            self._process = None
        if self._input is not None:
            self._input.close()
            self._input = None
