"""The CUDA driver API through ctypes, beside pycuda: tensor maps, modules and cluster launches.

pycuda's launcher takes only plain values and pointers, and its ``Function``
exposes no ``CUfunction`` handle, so a kernel that reads its tiles with the
Hopper copy engine (TMA: a ``const __grid_constant__ CUtensorMap`` parameter
passed by value) or runs as thread-block clusters is loaded and launched
here: ``cuModuleLoadData`` / ``cuModuleGetFunction`` for the cubin,
``cuTensorMapEncodeTiled`` for each operand's map, ``cuLaunchKernelEx`` with
a cluster-dimension attribute. Every call acts on the context current in the
calling thread (pycuda's, or CuPy's primary context), so memory and streams
come from whoever made them, as plain integers.

The geometry of a tensor map (:class:`TileMap`, :func:`matrix_map`) and the
packing of a launch's arguments (:func:`pack_args`) are pure and tested on
machines without a GPU. A failing driver call raises
:class:`~mmd.errors.CudaError` with the driver's own error name; a machine
without the driver library raises :class:`~mmd.errors.BackendUnavailable`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BackendUnavailable, CudaError, KernelError

#: Bytes of a CUtensorMap (CU_TENSOR_MAP_NUM_QWORDS = 16), and the alignment the driver and the kernel want.
TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64

# cuda.h's enumerations (CUDA 12 and 13 agree on every value used here).
_FLOAT32 = 7  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
_TFLOAT32 = 11  # CU_TENSOR_MAP_DATA_TYPE_TFLOAT32: the copy engine rounds fp32 to TF32 on the way in
_INTERLEAVE_NONE = 0
_L2_PROMOTION_256B = 3
_OOB_FILL_ZERO = 0  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: boxes past an edge land as zeros
_FUNC_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_FUNC_SHARED_SIZE = 1  # CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: static shared memory
_FUNC_LOCAL_SIZE = 3  # CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
_FUNC_NUM_REGS = 4  # CU_FUNC_ATTRIBUTE_NUM_REGS
_LAUNCH_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION

#: Swizzle modes by the bytes of their pattern (CUtensorMapSwizzle); the box's inner edge may not exceed them.
SWIZZLES: dict[int, int] = {0: 0, 32: 1, 64: 2, 128: 3}

#: The copy engine's limits on a box (cuda.h, cuTensorMapEncodeTiled).
MAX_BOX = 256
#: Global strides and the base address must be multiples of this many bytes.
TMA_ALIGN = 16

FLOAT_BYTES = 4


@dataclass(frozen=True)
class TileMap:
    """What cuTensorMapEncodeTiled is told about a row-major float32 matrix and the box one copy moves.

    Dimensions innermost first, as the driver takes them: ``dims`` = (columns,
    rows), ``strides`` = (bytes between rows,), ``box`` = (columns, rows) of
    one copy; ``swizzle`` = the shared-memory swizzle in bytes (0 = none).
    """

    dims: tuple[int, int]
    strides: tuple[int]
    box: tuple[int, int]
    swizzle: int
    #: Whether the copy engine rounds each value to TF32 (else it copies fp32 bits as they are).
    tf32: bool = False

    @property
    def box_bytes(self) -> int:
        """Bytes one copy writes to shared memory (boxes past an edge are filled, and count in full)."""
        return self.box[0] * self.box[1] * FLOAT_BYTES


def tma_ok(ptr: int, ld: int) -> bool:
    """Whether a float32 matrix at ``ptr`` with row stride ``ld`` floats can be read by the copy engine."""
    return ptr % TMA_ALIGN == 0 and (ld * FLOAT_BYTES) % TMA_ALIGN == 0


def matrix_map(
    rows: int, cols: int, ld: int, box_rows: int, box_cols: int, swizzle: int, tf32: bool = False
) -> TileMap:
    """The tensor map of a rows×cols row-major float32 matrix with row stride ``ld`` floats.

    KernelError where the driver would refuse it: an empty matrix, ``ld`` under
    ``cols`` or not a multiple of 4 floats (16 bytes), a box edge of 0 or over
    256, a box row longer than its swizzle pattern, or a swizzle the copy
    engine does not have.
    """
    if rows < 1 or cols < 1 or rows >= 2**32 or cols >= 2**32:
        raise KernelError(f"a {rows}×{cols} matrix has no tensor map (each edge must be 1 .. 2^32 - 1)")
    if ld < cols or (ld * FLOAT_BYTES) % TMA_ALIGN:
        raise KernelError(f"row stride {ld} cannot be a tensor map's: at least {cols} and a multiple of 4 floats")
    if not (1 <= box_rows <= MAX_BOX and 1 <= box_cols <= MAX_BOX):
        raise KernelError(f"a {box_rows}×{box_cols} box is outside the copy engine's 1 .. {MAX_BOX} per edge")
    if swizzle not in SWIZZLES:
        raise KernelError(f"no {swizzle}-byte swizzle; the copy engine has {', '.join(map(str, SWIZZLES))}")
    inner = box_cols * FLOAT_BYTES
    if inner % TMA_ALIGN or (swizzle and inner > swizzle):
        raise KernelError(f"a box row of {inner} bytes does not fit a {swizzle}-byte swizzle in 16-byte units")
    return TileMap(dims=(cols, rows), strides=(ld * FLOAT_BYTES,), box=(box_cols, box_rows), swizzle=swizzle, tf32=tf32)


@dataclass(frozen=True)
class TensorMap:
    """An encoded CUtensorMap: 128 opaque bytes the kernel takes by value."""

    data: bytes


#: A kernel argument: a device pointer or 32-bit integer (:class:`Int` / :class:`Pointer`), or a tensor map.
@dataclass(frozen=True)
class Int:
    value: int


@dataclass(frozen=True)
class Pointer:
    value: int


Arg = Int | Pointer | TensorMap


class _Aligned(ctypes.Structure):
    """128 bytes on a 64-byte boundary: where a tensor map's bytes are kept for the driver to read."""

    _fields_ = [("raw", ctypes.c_ubyte * (TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN))]

    def aligned_address(self) -> int:
        return -(-ctypes.addressof(self) // TENSOR_MAP_ALIGN) * TENSOR_MAP_ALIGN


@dataclass
class PackedArgs:
    """A launch's ``kernelParams``: one pointer per argument to its bytes, and the buffers that hold them."""

    pointers: ctypes.Array[ctypes.c_void_p]
    holders: list[object]


def pack_args(args: Sequence[Arg]) -> PackedArgs:
    """``void *kernelParams[]`` for ``args``: each entry points at its argument's value, as the driver copies it.

    Pointers are 8 bytes, integers 4 (a kernel's ``int``), tensor maps their
    128 bytes on a 64-byte boundary. Out-of-range integers are a KernelError,
    not a silent wrap.
    """
    holders: list[object] = []
    pointers = (ctypes.c_void_p * len(args))()
    for i, arg in enumerate(args):
        if isinstance(arg, TensorMap):
            if len(arg.data) != TENSOR_MAP_BYTES:
                raise KernelError(f"a tensor map is {TENSOR_MAP_BYTES} bytes, not {len(arg.data)}")
            box = _Aligned()
            address = box.aligned_address()
            ctypes.memmove(address, arg.data, TENSOR_MAP_BYTES)
            holders.append(box)
            pointers[i] = address
            continue
        value: ctypes.c_int32 | ctypes.c_uint64
        if isinstance(arg, Int):
            if not -(2**31) <= arg.value < 2**31:
                raise KernelError(f"argument {i} ({arg.value}) does not fit a 32-bit int")
            value = ctypes.c_int32(arg.value)
        else:
            if not 0 <= arg.value < 2**64:
                raise KernelError(f"argument {i} ({arg.value}) is not a device address")
            value = ctypes.c_uint64(arg.value)
        holders.append(value)
        pointers[i] = ctypes.addressof(value)
    return PackedArgs(pointers, holders)


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value (here the cluster's x, y, z)."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


def check_cluster(grid: tuple[int, int, int], cluster: tuple[int, int, int]) -> None:
    """KernelError unless each grid edge is a whole number of clusters (the driver refuses the launch otherwise)."""
    if any(c < 1 or g % c for g, c in zip(grid, cluster, strict=True)):
        raise KernelError(f"a {'×'.join(map(str, grid))} grid is not made of {'×'.join(map(str, cluster))} clusters")


def launch_config(
    grid: tuple[int, int, int], block: tuple[int, int, int], shared: int, stream: int, cluster: tuple[int, int, int]
) -> tuple[_LaunchConfig, ctypes.Array[_LaunchAttribute]]:
    """The CUlaunchConfig of a launch, with the cluster attribute where ``cluster`` is not 1×1×1."""
    check_cluster(grid, cluster)
    attrs = (_LaunchAttribute * 1)()
    count = 0
    if cluster != (1, 1, 1):
        attrs[0].id = _LAUNCH_CLUSTER_DIMENSION
        attrs[0].value[0], attrs[0].value[1], attrs[0].value[2] = cluster
        count = 1
    config = _LaunchConfig()
    config.grid[:] = list(grid)
    config.block[:] = list(block)
    config.shared = shared
    config.stream = stream or None
    config.attrs = ctypes.cast(attrs, ctypes.POINTER(_LaunchAttribute))
    config.num_attrs = count
    return config, attrs


@dataclass(frozen=True)
class HostMemory:
    """Page-locked host memory made through the driver: its address, its size, and how to free it (from any
    thread: ``free`` makes its context current for the call)."""

    address: int
    nbytes: int
    free: Callable[[], None]


@dataclass(frozen=True)
class FunctionResources:
    """What the compiler gave a kernel, as the driver reports it (pycuda's ``num_regs`` and the like)."""

    registers: int
    shared_bytes: int
    local_bytes: int


class Driver:
    """libcuda's entry points mmd needs beside pycuda, acting on the calling thread's current context."""

    def __init__(self, lib: Any = None) -> None:
        """``lib``: libcuda (found and loaded when None), or a stand-in with the same entry points."""
        self.lib: Any = lib if lib is not None else self._load()
        self._check(self.lib.cuInit(0), "cuInit")

    @staticmethod
    def _load() -> ctypes.CDLL:
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            raise BackendUnavailable(f"no CUDA driver: {name} cannot be loaded ({exc})") from exc

    def _error(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode("ascii", "replace")
        return f"CUDA error {code}"

    def _check(self, code: int, doing: str) -> None:
        if code != 0:
            raise CudaError(f"{doing} failed: {self._error(code)}", details={"during": doing, "code": code})

    def retain_primary_context(self, device: int) -> int:
        """Make ``device``'s primary context (the one pycuda retains too), or take another hold on it."""
        ctx = ctypes.c_void_p()
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self._device(device)), "making a context")
        return int(ctx.value or 0)

    def host_alloc(self, context: int, nbytes: int) -> HostMemory:
        """``nbytes`` of page-locked host memory in ``context``; its ``free`` may be called from any thread."""
        ptr = ctypes.c_void_p()
        with self._current(context):
            code = self.lib.cuMemHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes), 0)
        self._check(code, "allocating page-locked memory")
        address = int(ptr.value or 0)

        def free() -> None:
            with self._current(context):
                code = self.lib.cuMemFreeHost(ctypes.c_void_p(address))
            self._check(code, "freeing page-locked memory")

        return HostMemory(address, nbytes, free)

    @contextlib.contextmanager
    def _current(self, context: int) -> Iterator[None]:
        """``context`` current on this thread for the block (pushed on its stack, popped after)."""
        self._check(self.lib.cuCtxPushCurrent_v2(ctypes.c_void_p(context)), "making a context current")
        try:
            yield
        finally:
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))

    def host_register(self, address: int, nbytes: int, context: int | None = None) -> Callable[[], None]:
        """Page-lock ``nbytes`` of host memory at ``address`` (memory this process maps: a memory file's) in
        ``context`` (None: the calling thread's current one); the callable returned unlocks it, in the same context
        (given one: from any thread)."""
        where = self._current(context) if context is not None else contextlib.nullcontext()
        with where:
            code = self.lib.cuMemHostRegister_v2(ctypes.c_void_p(address), ctypes.c_size_t(nbytes), 0)
        self._check(code, "page-locking")

        def unregister() -> None:
            where = self._current(context) if context is not None else contextlib.nullcontext()
            with where:
                code = self.lib.cuMemHostUnregister(ctypes.c_void_p(address))
            self._check(code, "unlocking page-locked memory")

        return unregister

    def release_primary_context(self, device: int) -> None:
        """Give back one hold on ``device``'s primary context."""
        self._check(self.lib.cuDevicePrimaryCtxRelease_v2(self._device(device)), "releasing a context")

    def _device(self, ordinal: int) -> ctypes.c_int:
        dev = ctypes.c_int()
        self._check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), f"finding CUDA device {ordinal}")
        return dev

    def encode(self, ptr: int, tile: TileMap) -> TensorMap:
        """The tensor map of ``tile`` over the matrix at device address ``ptr`` (16-byte aligned)."""
        if ptr % TMA_ALIGN:
            raise KernelError(f"a tensor map's matrix must start on a 16-byte boundary (address {ptr:#x})")
        holder = _Aligned()
        address = holder.aligned_address()
        dims = (ctypes.c_uint64 * 2)(*tile.dims)
        strides = (ctypes.c_uint64 * 1)(*tile.strides)
        box = (ctypes.c_uint32 * 2)(*tile.box)
        unit = (ctypes.c_uint32 * 2)(1, 1)
        code = self.lib.cuTensorMapEncodeTiled(
            ctypes.c_void_p(address), _TFLOAT32 if tile.tf32 else _FLOAT32, ctypes.c_uint32(2), ctypes.c_void_p(ptr),
            dims, strides, box, unit, _INTERLEAVE_NONE, SWIZZLES[tile.swizzle], _L2_PROMOTION_256B, _OOB_FILL_ZERO,
        )  # fmt: skip
        self._check(code, "encoding a tensor map")
        return TensorMap(ctypes.string_at(address, TENSOR_MAP_BYTES))

    def load_module(self, cubin: bytes) -> int:
        """A CUmodule of ``cubin`` in the current context."""
        module = ctypes.c_void_p()
        self._check(self.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), "loading a module")
        return int(module.value or 0)

    def unload_module(self, module: int) -> None:
        self._check(self.lib.cuModuleUnload(ctypes.c_void_p(module)), "unloading a module")

    def function(self, module: int, name: str, dynamic_shared: int = 0) -> int:
        """The CUfunction ``name`` of ``module``, allowed ``dynamic_shared`` bytes of dynamic shared memory."""
        function = ctypes.c_void_p()
        code = self.lib.cuModuleGetFunction(ctypes.byref(function), ctypes.c_void_p(module), name.encode())
        self._check(code, f"finding {name}")
        if dynamic_shared:
            code = self.lib.cuFuncSetAttribute(function, _FUNC_MAX_DYNAMIC_SHARED, ctypes.c_int(dynamic_shared))
            self._check(code, f"allowing {name} {dynamic_shared} bytes of shared memory")
        return int(function.value or 0)

    def resources(self, function: int) -> FunctionResources:
        """What the compiler gave ``function``: registers per thread, static shared and local bytes."""

        def read(attribute: int, what: str) -> int:
            value = ctypes.c_int()
            self._check(self.lib.cuFuncGetAttribute(ctypes.byref(value), attribute, ctypes.c_void_p(function)), what)
            return int(value.value)

        return FunctionResources(
            registers=read(_FUNC_NUM_REGS, "reading a kernel's registers"),
            shared_bytes=read(_FUNC_SHARED_SIZE, "reading a kernel's shared memory"),
            local_bytes=read(_FUNC_LOCAL_SIZE, "reading a kernel's local memory"),
        )

    def launch(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[Arg],
        *,
        shared: int = 0,
        stream: int = 0,
        cluster: tuple[int, int, int] = (1, 1, 1),
    ) -> None:
        """Queue ``function`` on ``stream`` (0: the legacy default stream) as clusters of ``cluster`` blocks."""
        config, attrs = launch_config(grid, block, shared, stream, cluster)
        packed = pack_args(args)
        code = self.lib.cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(function), packed.pointers, None)
        del attrs, packed  # kept alive through the call: the driver copies them before it returns
        self._check(code, "launching a cluster kernel" if cluster != (1, 1, 1) else "launching a kernel")


#: Maps memory to page-lock (a memory file another process reads into): its address and size.
Mapper = Callable[[], tuple[int, int]]
#: The slot :meth:`ContextWarmer.take_host_memory` gives ``mapped``'s memory under.
MAPPED = "mapped"


class ContextWarmer:
    """Start the CUDA driver and make ``device``'s primary context on a thread of its own, now.

    Starting the driver and making a context is a few hundred milliseconds of
    the driver's own work, which a one-shot job otherwise pays before it can
    begin. Called through ctypes, which lets go of the GIL, it runs beside the
    job's imports and its read; pycuda, retaining the same primary context
    later, finds it made. Nothing is raised: without a driver or device the
    thread just ends, and the backend says why when it opens. :meth:`release`
    gives back this thread's hold on the context once the job is done.

    The job's page-locked memory is made on the same thread once the context is up: for each slot of ``host``,
    in its order, that many bytes the driver allocates (a slot of 0 bytes gets none); and the memory ``mapped``
    maps (a memory file another process reads the input into: its address and size), page-locked where it lies,
    as slot :data:`MAPPED`. A slot whose memory cannot be made is left out: the job makes its own, as it would
    have.
    """

    def __init__(
        self,
        device: int,
        driver: Callable[[], Driver] = Driver,
        host: Mapping[str, int] | None = None,
        mapped: Mapper | None = None,
    ) -> None:
        self._held: Driver | None = None
        self._device = device
        #: What the thread made, by slot; read once it has ended.
        self._host: dict[str, HostMemory] = {}
        self._thread = threading.Thread(
            target=self._warm, args=(driver, dict(host or {}), mapped), name="mmd-cuda-warm", daemon=True
        )
        self._thread.start()

    def _warm(self, driver: Callable[[], Driver], host: dict[str, int], mapped: Mapper | None) -> None:
        try:
            made = driver()
            context = made.retain_primary_context(self._device)
        except (BackendUnavailable, CudaError, OSError):
            return  # the backend, opening, says why there is no GPU
        self._held = made
        # one that fails (out of page-locked memory) costs only itself: the job makes it, as it would have
        for slot, nbytes in host.items():
            if nbytes > 0:
                with contextlib.suppress(CudaError, OSError):
                    self._host[slot] = made.host_alloc(context, nbytes)
        if mapped is not None:
            with contextlib.suppress(CudaError, OSError):
                address, size = mapped()
                self._host[MAPPED] = HostMemory(address, size, made.host_register(address, size, context))

    def take_host_memory(self) -> dict[str, HostMemory]:
        """The page-locked memory made beside the job's start, by slot (``host``'s, then :data:`MAPPED`), once:
        the slots it could not make are not there; the taker frees what it takes."""
        self._thread.join()
        host, self._host = self._host, {}
        return host

    def release(self) -> None:
        """Wait for the thread, free the page-locked memory no one took, and give back its hold on the context
        (pycuda keeps its own)."""
        self._thread.join()
        left, self._host = self._host, {}
        for memory in left.values():
            with contextlib.suppress(CudaError):
                memory.free()
        if self._held is not None:
            held, self._held = self._held, None
            with contextlib.suppress(CudaError):
                held.release_primary_context(self._device)
