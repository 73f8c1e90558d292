"""The backend interface: multiply two float32 matrices and say how long each phase took.

A backend object belongs to the thread that created it: the CUDA backend's
context is bound to that thread, so the daemon creates, uses and closes its
backends inside its worker threads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..record import KernelFileFacts, TextFacts
from ..textformat import Header

if TYPE_CHECKING:
    from ..cuda.libcuda import HostMemory

#: Every phase a backend may time, in the order they happen. ``cuda`` is the
#: course's "CUDA time": malloc + h2d + kernel + d2h + free.
CUDA_PHASES: tuple[str, ...] = ("malloc", "h2d", "kernel", "d2h", "free")


@dataclass(frozen=True)
class MultiplyRequest:
    """What to run: the kernel, its tile, the device memory mode, the text path, and the bench's L2 flush."""

    kernel: str = "tiled"
    tile: int = 32
    memory: str = "device"
    #: One of :data:`mmd.config.TEXT_PATHS`.
    text_path: str = "auto"
    #: Evict the GPU's L2 cache between h2d and the kernel phase, untimed, so the kernel starts
    #: cold, as nvbench times it (``mmd bench`` in memory). Backends without one ignore it, and so
    #: does the device text path (jobs through files time what a job costs, caches and all).
    flush_l2: bool = False


@dataclass
class Product:
    """A backend's result: C = A·B with the timings of every phase (ms).

    ``timings_ms`` holds ``kernel`` always; the CUDA backend adds the
    :data:`CUDA_PHASES`, ``cuda`` (their sum) and ``compile`` when the kernel
    had to be compiled for this job. Phases a backend does not have are absent
    (the sidecar writes them as null).
    """

    c: np.ndarray
    kernel: str
    tile: int | None
    memory: str | None
    device: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    #: Free-form facts for the sidecar (requested kernel when it was replaced ...).
    notes: list[str] = field(default_factory=list)
    #: The kernel file that made it, for the sidecar (None: one of mmd's own kernels).
    kernel_file: KernelFileFacts | None = None


@dataclass
class TextProduct(Product):
    """A device text path's result: the output file's bytes in ``chunks`` (header line first).

    ``c`` is the product in page-locked memory, valid until the backend's next
    job. ``timings_ms`` holds the course's phases (here ``h2d`` and ``d2h``
    move text); ``stage_ms`` the wall-clock ``parse`` and ``emit`` stages;
    ``text`` the GPU parts and what fell back to the host.
    """

    chunks: Sequence[Any] = ()
    stage_ms: dict[str, float] = field(default_factory=dict)
    text: TextFacts = field(default_factory=lambda: TextFacts("gpu"))


class DeviceText(ABC):
    """A backend's own text path: parse, multiply and format on the device (the cuda backend's)."""

    @abstractmethod
    def accepts(self, header: Header, nbytes: int, request: MultiplyRequest) -> bool:
        """Whether :meth:`multiply_text` takes this job (else the pipeline's host path does)."""

    @abstractmethod
    def multiply_text(self, data: bytes | memoryview, header: Header, request: MultiplyRequest) -> TextProduct:
        """Parse ``data`` (the whole file; ``header`` already parsed), multiply and format.

        Raises InputFormatError exactly as ``textformat.parse`` would, and the
        same errors as :meth:`Backend.multiply` otherwise.
        """


class Backend(ABC):
    """A place to multiply: the CPU through numpy, or a GPU through pycuda."""

    #: ``"cpu"`` or ``"cuda"``.
    name: str

    @abstractmethod
    def multiply(self, a: np.ndarray, b: np.ndarray, request: MultiplyRequest) -> Product:
        """Return A·B for float32 C-contiguous ``a`` (m×k) and ``b`` (k×n).

        Raises a :class:`mmd.errors.MmdError` subclass (``TileError``,
        ``KernelError``, ``CudaError``) for anything the job should be refused
        for; device memory is freed before it returns or raises.
        """

    @abstractmethod
    def device_name(self) -> str:
        """A human name of the device ("NVIDIA H100 80GB HBM3", "cpu (numpy 2.1)")."""

    @abstractmethod
    def close(self) -> None:
        """Release the device (pop the CUDA context). Idempotent."""

    def versions(self) -> dict[str, str]:
        """Driver and library versions, for benchmark records (none on the CPU)."""
        return {}

    def memory_used(self) -> int | None:
        """Bytes of device memory in use now, for the metrics (None: no device)."""
        return None

    def host_array(self, shape: int | tuple[int, ...], dtype: Any, slot: str) -> np.ndarray:
        """Host memory for one of a job's buffers (``slot``: ``input`` for the file's bytes, ``operands``
        for A and B): plain memory here; page-locked and reused on a GPU, so h2d needs no staging copy."""
        return np.empty(shape, dtype)

    def adopt_host(self, slot: str, memory: HostMemory) -> None:
        """Take page-locked ``memory``, made while the job was starting, as ``slot``'s buffer
        (:meth:`host_array`); a backend with no use for page-locked memory frees it now."""
        memory.free()

    def prepare(self, budget: int) -> int:
        """Make ready, while idle, what a first job would otherwise pay for, holding at most ``budget`` bytes
        of memory for it; returns the bytes held. Nothing to make ready here."""
        return 0

    def device_text(self) -> DeviceText | None:
        """This backend's own text path, or None (the pipeline parses and formats on the host)."""
        return None
