"""What a session keeps from job to job: small device allocations by size class, page-locked host buffers by
slot (:class:`~mmd.cuda.memory.Memory` holds one of each)."""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np

#: A cached page-locked buffer is reused for a request down to this fraction
#: of its size; smaller requests get a fresh, smaller buffer.
PINNED_REUSE_FRACTION = 0.25

#: The largest device allocation a worker's session keeps for the next job: a 256×256 matrix. Up to here a
#: job's three cuMemAlloc and cuMemFree calls (cuMemFree also waits for the device) are a large share of its
#: CUDA time, its copies and kernel being small; every job the host text path takes under ``text_path: auto``
#: (inputs under 256 KiB) is well within it, and beyond it a job's own work outgrows its allocations.
DEVICE_CACHE_BLOCK_BYTES = 256 * 1024
#: The smallest block the cache makes: the sizes of tiny jobs (1×1 to 32×32) share one size class.
DEVICE_CACHE_MIN_BLOCK = 4 * 1024
#: The most device memory one session's cache holds. A job holds three blocks at once, so three of every
#: size class (4 KiB to 256 KiB) take 1.5 MiB: in steady use nothing is evicted and this is only a bound,
#: a small share of what a worker's CUDA context holds already (docs/daemon.md gives both).
DEVICE_CACHE_CAP_BYTES = 16 * 1024 * 1024

H = TypeVar("H")


def size_class(nbytes: int) -> int:
    """The block :class:`DeviceCache` makes for a request of ``nbytes``: the next power of two, at least
    :data:`DEVICE_CACHE_MIN_BLOCK`. Neighbouring sizes share blocks (a class's jobs are not all 32×32),
    at the cost of at most half a block each."""
    return max(DEVICE_CACHE_MIN_BLOCK, 1 << (max(nbytes, 1) - 1).bit_length())


class DeviceCache(Generic[H]):
    """Small device allocations kept by size class from one job for the next, instead of being freed.

    ``allocate(nbytes)`` makes a block (cuMemAlloc), ``release(block)`` frees
    one (cuMemFree). :meth:`take` hands out a kept block of the request's
    :func:`size_class` when there is one, else a new one; :meth:`give` keeps a
    block given back, freeing the oldest kept blocks first while the cache
    would hold more than ``cap_bytes``. Requests above ``block_bytes`` are not
    the cache's (:meth:`holds_size`). Every block is the caller's between
    :meth:`take` and :meth:`give`; :meth:`close` frees what the cache holds.

    Reuse is safe without waiting for the device because one session queues
    all its work on one stream: a block's next user's copies and kernels run
    after its last user's.
    """

    def __init__(
        self,
        allocate: Callable[[int], H],
        release: Callable[[H], None],
        *,
        block_bytes: int = DEVICE_CACHE_BLOCK_BYTES,
        cap_bytes: int = DEVICE_CACHE_CAP_BYTES,
    ) -> None:
        if size_class(block_bytes) > cap_bytes:
            raise ValueError(f"a cache of {cap_bytes} bytes cannot hold one block of {size_class(block_bytes)}")
        self._allocate = allocate
        self._release = release
        self.block_bytes = block_bytes
        self.cap_bytes = cap_bytes
        #: Kept blocks, oldest given back first: sequence number → (size class, block).
        self._kept: OrderedDict[int, tuple[int, H]] = OrderedDict()
        #: Each size class's kept blocks' sequence numbers, oldest first.
        self._by_size: dict[int, deque[int]] = {}
        self._seq = 0
        self._held = 0

    def holds_size(self, nbytes: int) -> bool:
        """Whether a request of ``nbytes`` is the cache's (else the caller allocates and frees it itself)."""
        return nbytes <= self.block_bytes

    @property
    def held_bytes(self) -> int:
        """Device memory the cache holds now (blocks handed out are not counted)."""
        return self._held

    def take(self, nbytes: int) -> tuple[H, bool]:
        """A block of at least ``nbytes`` and whether it was kept from before (True) or allocated now.

        A failed allocation raises what ``allocate`` raised and leaves the cache as it was.
        """
        size = size_class(nbytes)
        waiting = self._by_size.get(size)
        if waiting:
            # The newest block of its class: the oldest stay oldest, so eviction order is kept.
            _, block = self._kept.pop(waiting.pop())
            self._held -= size
            return block, True
        return self._allocate(size), False

    def give(self, nbytes: int, block: H) -> None:
        """Keep ``block`` (taken for ``nbytes``) for a later :meth:`take`; free the oldest kept blocks first
        while the cache would hold more than its cap (what their ``release`` raises is raised, once the
        cache has dropped them)."""
        size = size_class(nbytes)
        self._seq += 1
        self._kept[self._seq] = (size, block)
        self._by_size.setdefault(size, deque()).append(self._seq)
        self._held += size
        while self._held > self.cap_bytes:
            _, (old_size, old) = self._kept.popitem(last=False)
            self._by_size[old_size].popleft()  # the oldest of its class, since it is the oldest of all
            self._held -= old_size
            self._release(old)

    def close(self) -> None:
        """Free every kept block; a block whose release fails is dropped too, and the first failure is raised
        after all were tried."""
        kept = [block for _, block in self._kept.values()]
        self._kept.clear()
        self._by_size.clear()
        self._held = 0
        first: Exception | None = None
        for block in kept:
            try:
                self._release(block)
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first


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
        #: Each buffer's address range, kept beside it: :meth:`holds` runs for every copy to the device, and
        #: numpy makes a dict each time it is asked for an array's address.
        self._spans: dict[str, tuple[int, int]] = {}
        self._reserved: dict[str, int] = {}
        #: Buffers made elsewhere, by their address: how each is freed (kept after its slot drops it, since a
        #: view of it may still be in use, until free_all).
        self._adopted: dict[int, tuple[np.ndarray, Callable[[], None]]] = {}

    def adopt(self, slot: str, buffer: np.ndarray, free: Callable[[], None]) -> None:
        """Make ``buffer`` (page-locked bytes made elsewhere) ``slot``'s; ``free()`` releases it with the pool."""
        self._keep(slot, buffer)
        self._adopted[_address(buffer)] = (buffer, free)

    def drop(self, slot: str) -> None:
        """Free ``slot``'s buffer now, adopted or the pool's own (the caller holds no view of it any more)."""
        buf = self._buffers.pop(slot, None)
        self._spans.pop(slot, None)
        if buf is None:
            return
        adopted = self._adopted.pop(_address(buf), None)
        if adopted is not None:
            adopted[1]()
        else:
            self._release(buf)

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
        count = shape if isinstance(shape, int) else math.prod(shape)
        need = max(count * dtype.itemsize, 1)
        buf = self._buffers.get(slot)
        floor = self._reserved.get(slot, 0)
        if buf is None or buf.nbytes < need or (buf.nbytes > floor and need < buf.nbytes * PINNED_REUSE_FRACTION):
            # The old buffer is dropped, not freed: views handed out earlier stay valid until they go.
            self._buffers.pop(slot, None)
            self._spans.pop(slot, None)
            buf = self._allocate(max(need, floor))
            self._keep(slot, buf)
        view: np.ndarray = buf[: count * dtype.itemsize].view(dtype).reshape(shape)
        return view

    def holds(self, host: np.ndarray) -> bool:
        """Whether ``host`` lies inside one of the pool's buffers (so it can be copied asynchronously)."""
        if not isinstance(host, np.ndarray) or host.size == 0:
            return False
        start = _address(host)
        end = start + host.nbytes
        return any(lo <= start and end <= hi for lo, hi in self._spans.values())

    def _keep(self, slot: str, buffer: np.ndarray) -> None:
        self._buffers[slot] = buffer
        lo = _address(buffer)
        self._spans[slot] = (lo, lo + buffer.nbytes)

    def free_all(self) -> None:
        """Release every buffer now (the session is closing: views handed out are invalid after this)."""
        for buf in self._buffers.values():
            if _address(buf) not in self._adopted:
                self._release(buf)
        self._buffers.clear()
        self._spans.clear()
        adopted = list(self._adopted.values())
        self._adopted.clear()
        for _, free in adopted:
            free()


def _address(array: np.ndarray) -> int:
    """Where ``array``'s first byte lies."""
    address: int = array.__array_interface__["data"][0]
    return address
