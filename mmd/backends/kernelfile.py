"""The kernel-file backend: a ``.cu`` file anyone wrote (``mmd run --kernel-file``), run as mmd's own kernels are.

The file is read and guarded by :mod:`mmd.kernelfile`; each job checks the tile (against every CUDA GPU's
limits first, so tile 64 is refused on any machine, then against the device's), pads the operands to what
the kernel needs (refusing padded sizes past ``max_dim`` or ``max_memory_bytes`` before allocating them),
compiles through NVRTC and the kernel cache, and launches in a process of its own
(:class:`~mmd.kernelfile.launch.LaunchProcess`), which times the course's five phases with CUDA events as
the cuda backend does. That process is started when the backend is made, so its imports and CUDA context
are made while the job's input is read, and it serves one job: the next gets a fresh one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import kernels as registry
from ..errors import KernelError, KernelFileError
from ..kernelfile.launch import Launch, LaunchProcess, arguments
from ..kernelfile.nvrtc import CompileLimits, compile_kernel
from ..kernelfile.padding import check_padded, crop, pad_operands, padded_shape
from ..kernelfile.reading import read_kernel_file
from ..record import KernelFileFacts, Shape
from .base import CUDA_PHASES, Backend, MultiplyRequest, Product

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


class KernelFileBackend(Backend):
    """Run the kernel of the file at ``path`` on a GPU, one child process per job."""

    name = "cuda"

    def __init__(self, path: Path, settings: KernelFileSettings) -> None:
        self.kernel = read_kernel_file(path)
        self.settings = settings
        self._device_name: str | None = None
        self._process: LaunchProcess | None = LaunchProcess(settings.device, self.kernel.name)

    def multiply(self, a: np.ndarray, b: np.ndarray, request: MultiplyRequest) -> Product:
        """A·B by the file's kernel at ``request.tile``, padded and cropped; every phase timed (ms)."""
        kf, decl = self.kernel, self.kernel.declaration
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise KernelError(
                f"cannot multiply a {'×'.join(map(str, a.shape))} matrix by a {'×'.join(map(str, b.shape))} one",
                {"a_shape": list(a.shape), "b_shape": list(b.shape)},
            )
        if request.memory != "device":
            raise KernelFileError(
                f"{kf.name}: a kernel file runs in device memory only, not {request.memory}",
                {"kernel_file": kf.name, "memory": request.memory},
            )
        tile = request.tile
        (m, k), n = a.shape, b.shape[1]
        kf.check_launch(tile, registry.COMMON_LIMITS)  # tile 64 is refused on any machine, before anything starts
        need = decl.requirement(tile)
        settings = self.settings
        check_padded(m, k, n, need, settings.max_dim, settings.max_memory_bytes)
        process = self._process or LaunchProcess(settings.device, kf.name)
        self._process = None  # one job per process: the next job gets a fresh one
        try:
            device, limits = process.ready()
            self._device_name = device
            kf.check_launch(tile, limits)
            mp, kp, np_ = padded_shape(m, k, n, need)
            grid = decl.grid_dims(mp, np_, tile)
            registry.check_grid_dims(kf.name, mp, np_, tile, grid, limits)
            timings: dict[str, float] = {}
            start = time.perf_counter()
            built = compile_kernel(kf, tile, limits.arch, settings.kernel_cache, CompileLimits())
            if built.compiled:
                timings["compile"] = (time.perf_counter() - start) * 1e3
            pa, pb = pad_operands(np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32), need)
            launch = Launch(
                cubin=built.cubin,
                symbol=built.symbol,
                arguments=arguments(kf.roles, mp, kp, np_),
                grid=grid,
                block=decl.block_dims(tile),
                dynamic_shared=decl.dynamic_shared(tile),
            )
            ran = process.run(launch, np.ascontiguousarray(pa), np.ascontiguousarray(pb), settings.launch_timeout_s)
        finally:
            process.close()
        timings.update(ran.timings_ms)
        timings["cuda"] = sum(timings[phase] for phase in CUDA_PHASES)
        notes = [warning for warning in built.warnings[:MAX_WARNING_NOTES]]
        if ran.printf_bytes:
            shown = ran.printf.decode("utf-8", "replace")
            kept = "" if len(ran.printf) == ran.printf_bytes else f", the first {len(ran.printf)} kept"
            notes.append(f"device printf wrote {ran.printf_bytes} bytes{kept}:\n{shown}")
        padded = (mp, kp, np_) != (m, k, n)
        return Product(
            c=crop(ran.c, m, n),
            kernel=kf.name,
            tile=tile if decl.uses_tile else None,
            memory=request.memory,
            device=device,
            timings_ms=timings,
            notes=notes,
            kernel_file=KernelFileFacts(
                name=kf.name,
                sha256=kf.sha256,
                entry=kf.kernel.name,
                signature=kf.signature,
                precision=decl.precision,
                padded=Shape(mp, kp, np_) if padded else None,
            ),
        )

    def start(self) -> None:
        """Have the next job's launch process started and ready (its imports and CUDA context made), and wait for
        it: a benchmark calls this before it times a call, so that the call's time is the job's and not a process's
        start, as a built-in kernel's context is made before its calls are timed. BackendUnavailable where it
        cannot have a GPU."""
        process = self._process or LaunchProcess(self.settings.device, self.kernel.name)
        self._process = None
        try:
            self._device_name = process.ready()[0]
        except BaseException:
            process.close()
            raise
        self._process = process

    def device_name(self) -> str:
        """The GPU, as the launch process's driver names it (once one has started)."""
        return self._device_name or "a CUDA GPU"

    def close(self) -> None:
        """Kill a launch process no job used. Idempotent."""
        if self._process is not None:
            self._process.close()
            self._process = None
