"""A stand-in for ``pycuda.driver`` in a kernel file's launch process, on a machine without a GPU.

The launch process (:mod:`mmd.kernelfile.launch_child`) runs as it does on a GPU, through the real
:class:`~mmd.cuda.session.GpuSession`; only the driver underneath is this: device memory is host
memory by address, copies are copies, and a "kernel" (a real cubin, compiled by NVRTC) is run by its
entry's name: ``square`` computes C = A·B with numpy in float32 (and so does any of mmd's own, ``mmd_*``, with
its rectangular arguments), ``spin`` never ends, ``fault`` fails as
an illegal address does (at the next wait), ``noisy`` prints 100 KB as device printf does and computes.
Cheats, each a square kernel otherwise: ``wrong`` computes and adds 1 to C's first value; ``writes_nan``
computes and writes NaN there; ``logs`` takes :data:`LOGGED_LAUNCH_S` and appends its process id, the
product's width and when it started and ended (``time.monotonic``) to the file named by ``$FAKEGPU_LAUNCH_LOG``
(to see which launches ran beside which); ``replay`` keeps each product it computed (taking :data:`REPLAY_COMPUTE_S`
to compute it) and returns the kept one, at once, when the same inputs come again; ``stale`` keeps its
first product of each size and returns it for any later inputs of that size (a kernel that replays an
earlier product whatever it is given). What they keep lives as long as the launch process does: across
its launches where it serves several, as device memory would.
Tests put this folder first on the launch process's PYTHONPATH (tests/test_kernelfile_run.py).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import time
from typing import Any

import numpy as np


class Error(Exception):
    pass


class LaunchError(Error):
    pass


_memory: dict[int, np.ndarray] = {}
_addresses = itertools.count(1 << 20, 1 << 20)
_sticky: list[str] = []
#: What ``replay`` and ``stale`` keep between launches (their __device__ globals).
_kept: dict[object, np.ndarray] = {}
#: How long ``replay`` takes to compute a product (what it saves by replaying one).
REPLAY_COMPUTE_S = 0.05
#: How long each ``logs`` launch takes.
LOGGED_LAUNCH_S = 0.1


def init() -> None:
    return None


class device_attribute:
    MAX_THREADS_PER_BLOCK = "threads"
    MAX_SHARED_MEMORY_PER_BLOCK = "shared"
    MAX_REGISTERS_PER_BLOCK = "registers"
    MAX_GRID_DIM_X = "grid_x"
    MAX_GRID_DIM_Y = "grid_y"
    MULTIPROCESSOR_COUNT = "sms"
    MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = "optin"
    L2_CACHE_SIZE = "l2"


class function_attribute:
    MAX_DYNAMIC_SHARED_SIZE_BYTES = "dynamic"


_ATTRIBUTES = {
    "threads": 1024, "shared": 48 * 1024, "registers": 65536, "grid_x": 2**31 - 1, "grid_y": 65535,
    "sms": 132, "optin": 227 * 1024, "l2": 50 << 20,
}  # fmt: skip


class _Context:
    def push(self) -> None:
        return None

    def pop(self) -> None:
        return None


class Device:
    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal

    @staticmethod
    def count() -> int:
        return 1

    def retain_primary_context(self) -> _Context:
        return _Context()

    def compute_capability(self) -> tuple[int, int]:
        return (9, 0)

    def get_attribute(self, attribute: str) -> int:
        return _ATTRIBUTES[attribute]

    def name(self) -> str:
        return "Fake GPU"

    def total_memory(self) -> int:
        return 80 << 30

    def pci_bus_id(self) -> str:
        return "0000:00:00.0"


def _check() -> None:
    if _sticky:
        raise Error(_sticky[0])


class Stream:
    handle = 0

    def synchronize(self) -> None:
        _check()


class Event:
    def record(self, stream: Stream) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        _check()

    def time_till(self, other: Event) -> float:
        return (other.at - self.at) * 1e3


class _Allocation:
    def __init__(self, nbytes: int) -> None:
        self.address = next(_addresses)
        _memory[self.address] = np.zeros(nbytes, np.uint8)

    def __int__(self) -> int:
        return self.address

    def free(self) -> None:
        _memory.pop(self.address, None)


def mem_alloc(nbytes: int) -> _Allocation:
    return _Allocation(nbytes)


class _Host(np.ndarray):
    def free(self) -> None:
        return None


def pagelocked_empty(nbytes: int, dtype: Any) -> np.ndarray:
    base = np.empty(nbytes, dtype).view(_Host)
    return base[:]


def memcpy_htod_async(dest: Any, src: np.ndarray, stream: Stream | None = None) -> None:
    raw = src.reshape(-1).view(np.uint8)
    _memory[int(dest)][: raw.size] = raw


def memcpy_dtoh_async(dest: np.ndarray, src: Any, stream: Stream | None = None) -> None:
    _check()
    raw = dest.reshape(-1).view(np.uint8)
    raw[:] = _memory[int(src)][: raw.size]


def memset_d32_async(ptr: int, word: int, count: int, stream: Stream | None = None) -> None:
    _memory[int(ptr)][: 4 * count].view(np.uint32)[:] = word


def mem_get_info() -> tuple[int, int]:
    return (70 << 30, 80 << 30)


def _floats(ptr: int) -> np.ndarray:
    return _memory[ptr].view(np.float32)


class _Function:
    #: What pycuda reports of a compiled function (mmd records it of its own kernels).
    num_regs = 32
    shared_size_bytes = 0
    local_size_bytes = 0

    def __init__(self, symbol: str) -> None:
        self.symbol = symbol

    def prepare(self, signature: str) -> None:
        self.signature = signature

    def set_attribute(self, attribute: str, value: int) -> None:
        return None

    def prepared_async_call(self, grid: Any, block: Any, stream: Stream, *args: Any, shared_size: int = 0) -> None:
        if "spin" in self.symbol:
            while True:
                time.sleep(1)
        if "fault" in self.symbol:
            _sticky.append("cuStreamSynchronize failed: an illegal memory access was encountered")
            return
        if "noisy" in self.symbol:
            libc = ctypes.CDLL(None)
            for _ in range(1000):
                libc.printf(b"%s\n", b"x" * 99)
        if self.symbol.startswith("mmd_"):  # one of mmd's own (the cuda backend's): (A, B, C, m, k, n, lda, ldb, ldc)
            a, b, c, m, k, n, lda, ldb, ldc = (int(x) for x in args)
            left = _floats(a)[: m * lda].reshape(m, lda)[:, :k]
            right = _floats(b)[: k * ldb].reshape(k, ldb)[:, :n]
            _floats(c)[: m * ldc].reshape(m, ldc)[:, :n] = np.matmul(left, right)
            return
        a, b, c, width = args
        n = int(width)
        if "logs" in self.symbol:
            began = time.monotonic()
            time.sleep(LOGGED_LAUNCH_S)
            with open(os.environ["FAKEGPU_LAUNCH_LOG"], "a", encoding="ascii") as log:
                log.write(f"{os.getpid()} {n} {began} {time.monotonic()}\n")
        left = _floats(a)[: n * n].reshape(n, n)
        right = _floats(b)[: n * n].reshape(n, n)
        out = _floats(c)[: n * n].reshape(n, n)
        if "replay" in self.symbol:
            key = ("replay", n, left.tobytes(), right.tobytes())
            if key not in _kept:
                time.sleep(REPLAY_COMPUTE_S)
                _kept[key] = np.matmul(left, right)
            out[:] += _kept[key]
            return
        if "stale" in self.symbol:
            out[:] += _kept.setdefault(("stale", n), np.matmul(left, right))
            return
        out[:] += np.matmul(left, right)
        if "wrong" in self.symbol:
            out[0, 0] += 1
        if "writes_nan" in self.symbol:
            out[0, 0] = np.nan


class _Module:
    def get_function(self, symbol: str) -> _Function:
        return _Function(symbol)


def module_from_buffer(cubin: bytes) -> _Module:
    if not cubin.startswith(b"\x7fELF"):
        raise Error("cuModuleLoadDataEx failed: device kernel image is invalid")
    return _Module()


def get_driver_version() -> int:
    return 13000


def get_version() -> tuple[int, int, int]:
    return (13, 0, 0)
