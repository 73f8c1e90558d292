"""The two text paths: how a job's text becomes matrices, and its product becomes text again.

* :class:`HostTextPath`: :mod:`mmd.textformat` parses on the CPU (the C
  accelerator where it is built), the backend multiplies, textformat formats
  the output chunk by chunk while it is written;
* :class:`DeviceTextPath`: the backend's :class:`~mmd.backends.base.DeviceText`
  does parse, multiply and format on the GPU (docs/textpath.md), and hands the
  job to the host path when it does not take it (other memory modes, offsets
  beyond int32).

Both give the same bytes and the same refusals; :func:`choose` picks one.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import textformat
from ..backends.base import Backend, DeviceText, MultiplyRequest, Product
from ..hostbuffers import INPUT_SLOT
from ..record import TextFacts
from ..textformat import Header


@dataclass
class Computed:
    """A job's middle, done: the output's bytes (produced as they are written) and what made them."""

    #: The output file's pieces, header line first; a lazy iterable on the host path.
    chunks: Iterable[Any]
    product: Product
    text: TextFacts
    #: How big the output is: the pipeline judges it by its limits before a byte is written.
    size: textformat.OutputSize
    #: Wall-clock ``parse`` and, once the chunks are consumed, ``emit`` (ms).
    stage_ms: dict[str, float] = field(default_factory=dict)


class TextPath(ABC):
    """One way through parse → multiply → emit."""

    def input_buffer(self) -> Callable[[int], np.ndarray] | None:
        """Where the job's bytes are read: page-locked memory for the device path (None: plain bytes)."""
        return None

    @abstractmethod
    def compute(
        self, data: bytes | memoryview, header: Header, request: MultiplyRequest, phase: Callable[[str], None]
    ) -> Computed:
        """Parse ``data`` (``header`` already parsed and checked), multiply, and return the output's chunks.

        ``phase`` hears each phase it enters (parse, multiply, emit). Raises
        InputFormatError as :func:`mmd.textformat.parse` does, and the
        backend's errors.
        """


class HostTextPath(TextPath):
    """Parse and format on the CPU; multiply on ``backend``."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def compute(
        self, data: bytes | memoryview, header: Header, request: MultiplyRequest, phase: Callable[[str], None]
    ) -> Computed:
        t0 = time.perf_counter()
        out = self.backend.host_array(header.m * header.k + header.k * header.n, np.float32, "operands")
        matrices = textformat.parse(data, header, out=out)
        stage = {"parse": (time.perf_counter() - t0) * 1e3}
        del data  # the text is no longer needed; keep peak memory near one copy
        phase("multiply")
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused, worded, just below
            product = self.backend.multiply(matrices.a, matrices.b, request)
        del matrices
        size = textformat.check_product(product.c)
        phase("emit")
        return Computed(_timed(textformat.emit_chunks(product.c), stage), product, TextFacts("host"), size, stage)


class DeviceTextPath(TextPath):
    """Parse, multiply and format on the backend's device; the host path takes what it does not accept."""

    def __init__(self, backend: Backend, device: DeviceText) -> None:
        self.backend = backend
        self.device = device

    def input_buffer(self) -> Callable[[int], np.ndarray] | None:
        return lambda nbytes: self.backend.host_array(nbytes, np.uint8, INPUT_SLOT)

    def compute(
        self, data: bytes | memoryview, header: Header, request: MultiplyRequest, phase: Callable[[str], None]
    ) -> Computed:
        if not self.device.accepts(header, len(data), request):
            return HostTextPath(self.backend).compute(data, header, request, phase)
        phase("multiply")  # the device parses, multiplies and formats in one go
        product = self.device.multiply_text(data, header, request)
        phase("emit")
        stage = {"parse": product.stage_ms.get("parse", 0.0), "emit": product.stage_ms.get("emit", 0.0)}
        made = textformat.OutputSize(sum(memoryview(chunk).nbytes for chunk in product.chunks))  # in memory, unwritten
        return Computed(product.chunks, product, product.text, made, stage)


#: With ``text_path: auto``, an input smaller than this is parsed and formatted on the host: the GPU
#: text path's fixed cost (its launches, events and staging; docs/textpath.md gives it) is more than the C
#: accelerator needs for the whole of such a file.
GPU_TEXT_MIN_BYTES = 256 * 1024


def device_wanted(text_path: str, nbytes: int) -> bool:
    """Whether an input of ``nbytes`` goes through a backend's device path (where it has one) with
    ``text_path``: asked for, or (``auto``) not small."""
    return text_path == "gpu" or (text_path == "auto" and nbytes >= GPU_TEXT_MIN_BYTES)


def choose(backend: Backend, request: MultiplyRequest, nbytes: int) -> TextPath:
    """The path for an input of ``nbytes``: the device path when the request allows it, the backend has one and
    (with ``text_path: auto``) the input is not small, else the host path. A small input then never goes
    through the device path's page-locked buffer, which only the device's parser needs."""
    if not device_wanted(request.text_path, nbytes):
        return HostTextPath(backend)
    device = backend.device_text()
    return DeviceTextPath(backend, device) if device is not None else HostTextPath(backend)


def _timed(chunks: Iterator[bytes], stage: dict[str, float]) -> Iterator[bytes]:
    """Yield ``chunks`` and charge the time spent producing them to ``stage["emit"]``."""
    spent = 0.0
    while True:
        t0 = time.perf_counter()
        try:
            chunk = next(chunks)
        except StopIteration:
            break
        finally:
            spent += time.perf_counter() - t0
        yield chunk
    stage["emit"] = spent * 1e3
