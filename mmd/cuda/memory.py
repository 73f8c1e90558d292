"""Device matrices and the session's page-locked host buffers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kernels import FLOAT_BYTES

#: A cached page-locked buffer is reused for a request down to this fraction
#: of its size; smaller requests get a fresh, smaller buffer.
PINNED_REUSE_FRACTION = 0.25


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

    @property
    def nbytes(self) -> int:
        """Bytes this allocation holds, padding included."""
        return self.rows * self.ld * FLOAT_BYTES


class PinnedPool:
    """Page-locked host buffers kept by slot name and reused from job to job.

    Allocating page-locked memory costs milliseconds per hundred megabytes,
    so a buffer stays with its slot while requests fit it; a request much
    smaller than the buffer gets a fresh one (a huge buffer is not held
    for small jobs), except down to what :meth:`reserve` set aside for the
    slot. ``allocate(nbytes)`` is pycuda's ``pagelocked_empty`` for bytes,
    ``release(buffer)`` frees one now. A buffer made elsewhere
    (:meth:`adopt`) is freed its own way, when the pool is.
    """

    def __init__(self, allocate: Callable[[int], np.ndarray], release: Callable[[np.ndarray], None]) -> None:
        self._allocate = allocate
        self._release = release
        self._buffers: dict[str, np.ndarray] = {}
        self._reserved: dict[str, int] = {}
        #: Buffers made elsewhere, by their address: how each is freed (kept after its slot drops it, since a
        #: view of it may still be in use, until free_all).
        self._adopted: dict[int, tuple[np.ndarray, Callable[[], None]]] = {}

    def adopt(self, slot: str, buffer: np.ndarray, free: Callable[[], None]) -> None:
        """Make ``buffer`` (page-locked bytes made elsewhere) ``slot``'s; ``free()`` releases it with the pool."""
        self._buffers[slot] = buffer
        self._adopted[buffer.__array_interface__["data"][0]] = (buffer, free)

    def reserve(self, slot: str, nbytes: int) -> None:
        """Allocate ``slot`` now, at least ``nbytes``, and keep at least that much for it from now on."""
        self._reserved[slot] = nbytes
        self.get(slot, nbytes, np.uint8)

    @property
    def held_bytes(self) -> int:
        """Page-locked bytes the pool holds now."""
        return sum(buf.nbytes for buf in self._buffers.values())

    def get(self, slot: str, shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A page-locked array of ``shape`` in ``slot`` (valid until the slot's next use)."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        need = max(count * dtype.itemsize, 1)
        buf = self._buffers.get(slot)
        floor = self._reserved.get(slot, 0)
        if buf is None or buf.nbytes < need or (buf.nbytes > floor and need < buf.nbytes * PINNED_REUSE_FRACTION):
            # The old buffer is dropped, not freed: views handed out earlier stay valid until they go.
            self._buffers.pop(slot, None)
            buf = self._allocate(max(need, floor))
            self._buffers[slot] = buf
        view: np.ndarray = buf[: count * dtype.itemsize].view(dtype).reshape(shape)
        return view

    def holds(self, host: np.ndarray) -> bool:
        """Whether ``host`` lies inside one of the pool's buffers (so it can be copied asynchronously)."""
        if not isinstance(host, np.ndarray) or host.size == 0:
            return False
        start = host.__array_interface__["data"][0]
        end = start + host.nbytes
        for buf in self._buffers.values():
            lo = buf.__array_interface__["data"][0]
            if lo <= start and end <= lo + buf.nbytes:
                return True
        return False

    def free_all(self) -> None:
        """Release every buffer now (the session is closing: views handed out are invalid after this)."""
        for buf in self._buffers.values():
            if buf.__array_interface__["data"][0] not in self._adopted:
                self._release(buf)
        self._buffers.clear()
        adopted = list(self._adopted.values())
        self._adopted.clear()
        for _, free in adopted:
            free()
