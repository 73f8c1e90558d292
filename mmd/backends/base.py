"""The backend interface: multiply two float32 matrices and say how long each phase took.

A backend object belongs to the thread that created it: the CUDA backend's
context is bound to that thread, so the daemon creates, uses and closes its
backend inside its one worker thread. Nothing else in mmd imports pycuda.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

#: Every phase a backend may time, in the order they happen. ``cuda`` is the
#: course's "CUDA time": malloc + h2d + kernel + d2h + free.
CUDA_PHASES: tuple[str, ...] = ("malloc", "h2d", "kernel", "d2h", "free")

MEMORY_MODES: tuple[str, ...] = ("device", "pitched", "managed")

#: Where a job's text is parsed and formatted: ``host`` (textformat on the
#: CPU), ``gpu`` (a backend with :class:`TextBackend`), ``auto`` (gpu when the
#: backend offers it for the job, else host).
TEXT_PATHS: tuple[str, ...] = ("auto", "host", "gpu")


@dataclass(frozen=True)
class MultiplyRequest:
    """What to run: the kernel, its tile and the device memory mode."""

    kernel: str = "tiled"
    tile: int = 32
    memory: str = "device"
    #: One of :data:`TEXT_PATHS`.
    text_path: str = "auto"


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


@runtime_checkable
class Backend(Protocol):
    """A place to multiply: the CPU through numpy, or a GPU through pycuda."""

    #: ``"cpu"`` or ``"cuda"``.
    name: str

    def multiply(self, a: np.ndarray, b: np.ndarray, request: MultiplyRequest) -> Product:
        """Return A·B for float32 C-contiguous ``a`` (m×k) and ``b`` (k×n).

        Raises a :class:`mmd.errors.MmdError` subclass (``TileError``,
        ``KernelError``, ``CudaError``) for anything the job should be refused
        for; device memory is freed before it returns or raises.
        """
        ...

    def device_name(self) -> str:
        """A human name of the device ("NVIDIA H100 80GB HBM3", "cpu (numpy 2.1)")."""
        ...

    def close(self) -> None:
        """Release the device (pop the CUDA context). Idempotent."""
        ...


@dataclass
class TextProduct(Product):
    """A text backend's result: the output file's bytes in ``chunks`` (header line first).

    ``c`` is the product in page-locked memory, valid until the backend's next
    job. ``timings_ms`` holds the course's phases (here ``h2d`` and ``d2h``
    move text); ``stage_ms`` the wall-clock ``parse``, ``multiply`` and
    ``emit`` stages; ``text`` the GPU parts (``parse_gpu``, ``emit_gpu``) and
    what fell back to the host.
    """

    chunks: list = field(default_factory=list)
    stage_ms: dict[str, float] = field(default_factory=dict)
    text: dict = field(default_factory=dict)


@runtime_checkable
class TextBackend(Protocol):
    """A backend that also parses and formats the text itself (optional; the cuda backend)."""

    def accepts_text(self, header: object, nbytes: int, request: MultiplyRequest) -> bool:
        """Whether :meth:`multiply_text` takes this job (else the pipeline parses on the host)."""
        ...

    def host_bytes(self, nbytes: int) -> np.ndarray:
        """Writable page-locked memory of ``nbytes`` for the pipeline to read the input into."""
        ...

    def multiply_text(self, data: bytes | memoryview, header: object, request: MultiplyRequest) -> TextProduct:
        """Parse ``data`` (the whole file; ``header`` already parsed), multiply and format.

        Raises InputFormatError exactly as ``textformat.parse`` would, and the
        same errors as :meth:`Backend.multiply` otherwise.
        """
        ...
