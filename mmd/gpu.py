"""pycuda behind one module: context, compile cache, memory, copies, launches, cuBLAS.

This is the only module in mmd that imports pycuda, and it does so lazily, so
everything else imports and tests on machines without CUDA. A missing pycuda
or GPU raises :class:`~mmd.errors.BackendUnavailable`; driver failures become
:class:`~mmd.errors.CudaError` with a one-line reason.

A :class:`GpuSession` belongs to the thread that opened it: it retains the
device's primary context and pushes it onto that thread's context stack (the
context cuBLAS, through the runtime API, uses too), and :meth:`GpuSession.close`
pops it again. Open, use and close a session in one thread.

Kernels are compiled to cubins by nvcc and kept in mmd's own disk cache
(:class:`KernelCache`): one file per (source, headers, options, arch, nvcc
version), written through a temporary and a rename, so several processes
(daemons, workers) filling the same entry leave one whole file, and an entry
that is cut short or corrupt is rebuilt.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import hashlib
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import kernels as registry
from .atomic import write_atomic
from .errors import BackendUnavailable, CudaError, KernelError, MmdError
from .kernels import FLOAT_BYTES, DeviceLimits, KernelSpec

#: nvcc options besides -DTILE and -arch (the include dir is added separately).
COMPILE_OPTIONS: tuple[str, ...] = ("-O3",)

#: A cached page-locked buffer is reused for a request down to this fraction
#: of its size; smaller requests get a fresh, smaller buffer.
PINNED_REUSE_FRACTION = 0.25

_MIB = 1024 * 1024


def _import_driver() -> Any:
    """``pycuda.driver``, or BackendUnavailable saying why it cannot be had."""
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise BackendUnavailable(
            f"pycuda is not installed ({exc}); install pycuda with the CUDA toolkit, or use the cpu backend"
        ) from exc
    except OSError as exc:  # libcuda.so missing: no NVIDIA driver on this machine
        raise BackendUnavailable(f"no CUDA device: the NVIDIA driver library cannot be loaded ({exc})") from exc
    return cuda


def device_count() -> int:
    """How many CUDA devices the driver shows (after CUDA_VISIBLE_DEVICES); 0 without pycuda or a driver.

    Initialises the driver only: no context is made in the calling thread.
    """
    try:
        cuda = _import_driver()
        cuda.init()
        return int(cuda.Device.count())
    except Exception:  # no pycuda, no driver, no device: no GPU workers
        return 0


# ---------------------------------------------------------------------------
# the kernel cache

#: Each cache entry starts with this tag and the sha256 of the cubin after the first line.
_CACHE_TAG = b"mmd-cubin-1 "
#: Headers a kernel may include from its include folders (hashed into the key).
_HEADER_SUFFIXES = (".cuh", ".h", ".hpp", ".inc")


def default_kernel_cache(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/mmd/kernels``, else ``~/.cache/mmd/kernels``."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "mmd" / "kernels"


_nvcc_version: str | None = None


def nvcc_version() -> str:
    """``nvcc --version`` as pycuda reads it (cached per process); ``unknown`` where nvcc cannot say."""
    global _nvcc_version
    if _nvcc_version is None:
        try:
            from pycuda.compiler import get_nvcc_version

            _nvcc_version = str(get_nvcc_version("nvcc"))
        except Exception:  # no nvcc here: compiling fails later with the reason
            _nvcc_version = "unknown"
    return _nvcc_version


def _nvcc_compile(source: str, options: list[str], arch: str, include_dirs: list[str]) -> bytes:
    """nvcc → cubin through pycuda, with pycuda's own disk cache off (it writes files in place)."""
    from pycuda.compiler import compile as nvcc

    return nvcc(source, options=options, arch=arch, include_dirs=include_dirs, no_extern_c=True, cache_dir=False)


class KernelCache:
    """Compiled kernels on disk, safe to share between processes.

    ``folder/<key>.cubin``, where the key is the sha256 of the source, the
    headers in the include folders, the options, the arch and the nvcc
    version. An entry is written with :func:`mmd.atomic.write_atomic` (a
    temporary of this process, then a rename): processes racing to fill one
    key each write a whole file and the last rename wins, never a mix. Each
    entry carries the sha256 of its cubin, so a short or corrupt one (a full
    disk, a copy cut off) is ignored and rebuilt. ``folder`` None: no disk
    cache, every session compiles. ``build`` and ``version`` are the compiler
    and its version (nvcc through pycuda; tests pass fakes).
    """

    def __init__(
        self,
        folder: Path | None,
        build: Callable[[str, list[str], str, list[str]], bytes] = _nvcc_compile,
        version: Callable[[], str] = nvcc_version,
    ) -> None:
        self.folder = None if folder is None else Path(folder).expanduser()
        self._build = build
        self._version = version

    def key(self, source: str, options: Iterable[str], arch: str, include_dirs: Iterable[str | Path] = ()) -> str:
        digest = hashlib.sha256()
        for part in (source, "\0".join(options), arch, self._version()):
            digest.update(part.encode("utf-8", "surrogateescape") + b"\0\1")
        for folder in include_dirs:
            for header in sorted(Path(folder).glob("*")):
                if header.suffix in _HEADER_SUFFIXES and header.is_file():
                    digest.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0\1")
        return digest.hexdigest()

    def path(self, key: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{key}.cubin"

    @staticmethod
    def read(path: Path) -> bytes | None:
        """The cubin in entry ``path``, or None when it is missing, short or corrupt."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        head, newline, payload = data.partition(b"\n")
        if not newline or not head.startswith(_CACHE_TAG):
            return None
        if head[len(_CACHE_TAG) :].decode("ascii", "replace") != hashlib.sha256(payload).hexdigest():
            return None
        return payload

    def get(
        self,
        source: str,
        options: Iterable[str],
        arch: str,
        include_dirs: Iterable[str | Path] = (),
        refresh: bool = False,
    ) -> tuple[bytes, bool]:
        """(cubin, whether it was compiled now); ``refresh``: compile even when an entry exists."""
        options, include_dirs = list(options), [str(d) for d in include_dirs]
        path = self.path(self.key(source, options, arch, include_dirs))
        if path is not None and not refresh:
            cached = self.read(path)
            if cached is not None:
                return cached, False
        cubin = self._build(source, options, arch, include_dirs)
        if path is not None:
            self._store(path, cubin)
        return cubin, True

    def _store(self, path: Path, cubin: bytes) -> None:
        """Write an entry; a cache that cannot be written only costs compile time."""
        head = _CACHE_TAG + hashlib.sha256(cubin).hexdigest().encode() + b"\n"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, [head, cubin], durable=False)
        except (OSError, MmdError):
            pass


def pycuda_available() -> bool:
    """Whether pycuda can be imported here (says nothing about a GPU)."""
    return importlib.util.find_spec("pycuda") is not None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


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
    #: managed ndarray).
    handle: Any = field(repr=False)

    @property
    def nbytes(self) -> int:
        """Bytes this allocation holds, padding included."""
        return self.rows * self.ld * FLOAT_BYTES


@dataclass
class Compiled:
    """A compiled kernel and what the compiler reported about it."""

    spec: KernelSpec
    tile: int
    function: Any = field(repr=False)
    module: Any = field(repr=False)
    registers: int
    shared_bytes: int
    local_bytes: int
    #: Host milliseconds this session spent building it.
    compile_ms: float


class PhaseTimer:
    """CUDA events on the session's stream around each named phase.

    ``with timer.phase("h2d"): ...`` records an event before and after the
    block; :meth:`elapsed_ms` waits for the last event and returns each
    phase's milliseconds. Host-synchronous calls (allocation, free) inside a
    phase are measured too: an event recorded on an idle stream is stamped
    when it is recorded.
    """

    def __init__(self, cuda: Any, stream: Any) -> None:
        self._cuda = cuda
        self._stream = stream
        self._marks: list[tuple[str, Any, Any]] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self._cuda.Event()
        start.record(self._stream)
        yield
        end = self._cuda.Event()
        end.record(self._stream)
        self._marks.append((name, start, end))

    def elapsed_ms(self) -> dict[str, float]:
        """Milliseconds per phase (waits for the device)."""
        if not self._marks:
            return {}
        self._marks[-1][2].synchronize()
        return {name: float(start.time_till(end)) for name, start, end in self._marks}


def cublas_candidates() -> list[str]:
    """Paths (or sonames) where libcublas may be, most specific first."""
    found: list[str] = []
    env = os.environ.get("MMD_CUBLAS")
    if env:
        found.append(env)
    name = ctypes.util.find_library("cublas")
    if name:
        found.append(name)
    roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    roots += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for root in filter(None, roots):
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            found += sorted(glob.glob(os.path.join(root, sub, "libcublas.so*")), reverse=True)
    # The nvidia-cublas wheel (what PyTorch and CuPy bring): site-packages/nvidia/cublas/lib.
    for entry in sys.path:
        for pattern in ("nvidia/cublas/lib/libcublas.so*", "nvidia/cu*/lib/libcublas.so*"):
            found += sorted(glob.glob(os.path.join(entry, pattern)), reverse=True)
    found += ["libcublas.so", "libcublas.so.13", "libcublas.so.12"]
    unique: list[str] = []
    for path in found:
        if path not in unique and "Lt" not in os.path.basename(path):
            unique.append(path)
    return unique


class Cublas:
    """cuBLAS SGEMM through ctypes, on the session's stream and buffers."""

    #: cublasOperation_t CUBLAS_OP_N.
    OP_N = 0

    def __init__(self, stream_handle: int) -> None:
        self.lib, self.path = self._load()
        self._handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self._handle)), "cublasCreate")
        self._check(self.lib.cublasSetStream_v2(self._handle, ctypes.c_void_p(stream_handle)), "cublasSetStream")
        self._alpha = ctypes.c_float(1.0)
        self._beta = ctypes.c_float(0.0)

    @staticmethod
    def _load() -> tuple[ctypes.CDLL, str]:
        tried = []
        for candidate in cublas_candidates():
            try:
                folder = os.path.dirname(candidate)
                if folder:  # cublas needs cublasLt from the same folder
                    for lt in sorted(glob.glob(os.path.join(folder, "libcublasLt.so*"))):
                        with contextlib.suppress(OSError):
                            ctypes.CDLL(lt, mode=ctypes.RTLD_GLOBAL)
                            break
                lib = ctypes.CDLL(candidate)
                lib.cublasSgemm_v2.restype = ctypes.c_int
                return lib, candidate
            except (OSError, AttributeError) as exc:
                tried.append(f"{candidate}: {_one_line(exc)}")
        raise BackendUnavailable(
            "libcublas cannot be loaded (set MMD_CUBLAS to its path); tried "
            + "; ".join(tried[:4])
            + (" ..." if len(tried) > 4 else "")
        )

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CudaError(f"{what} failed with cuBLAS status {status}", details={"status": status})

    def sgemm(self, a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix) -> None:
        """C = A·B for row-major A (m×k), B (k×n), C (m×n).

        cuBLAS is column-major: a row-major matrix is its transpose in column
        major, so C^T = B^T·A^T is asked for, B first and no transposes.
        """
        m, k, n = a.rows, a.cols, b.cols
        status = self.lib.cublasSgemm_v2(
            self._handle, self.OP_N, self.OP_N,
            ctypes.c_int(n), ctypes.c_int(m), ctypes.c_int(k),
            ctypes.byref(self._alpha),
            ctypes.c_void_p(b.ptr), ctypes.c_int(b.ld),
            ctypes.c_void_p(a.ptr), ctypes.c_int(a.ld),
            ctypes.byref(self._beta),
            ctypes.c_void_p(c.ptr), ctypes.c_int(c.ld),
        )  # fmt: skip
        self._check(status, "cublasSgemm")

    def close(self) -> None:
        if self._handle:
            self.lib.cublasDestroy_v2(self._handle)
            self._handle = ctypes.c_void_p()


class GpuSession:
    """One device, in the calling thread: compile, allocate, copy, launch, time."""

    def __init__(self, device: int = 0, kernel_cache: Path | KernelCache | None = None) -> None:
        """Open ``device``; ``kernel_cache``: the folder of compiled kernels (None: the default folder)."""
        if not isinstance(kernel_cache, KernelCache):
            kernel_cache = KernelCache(default_kernel_cache() if kernel_cache is None else kernel_cache)
        self.kernel_cache = kernel_cache
        cuda = _import_driver()
        self._cuda = cuda
        #: Exception classes the driver raises, for callers' nets.
        self.errors: tuple[type[BaseException], ...] = (cuda.Error, MemoryError)
        try:
            cuda.init()
            count = cuda.Device.count()
        except cuda.Error as exc:
            raise BackendUnavailable(f"no CUDA device: {_one_line(exc)}") from exc
        if count == 0:
            raise BackendUnavailable("no CUDA device: the driver sees no GPU")
        if not 0 <= device < count:
            raise BackendUnavailable(f"no CUDA device {device}: this machine has {count} (0..{count - 1})")
        self._thread = threading.get_ident()
        self._device = cuda.Device(device)
        self._context = self._device.retain_primary_context()
        self._context.push()
        self._closed = False
        try:
            self.stream = cuda.Stream()
            self.limits = self._read_limits()
        except cuda.Error as exc:
            self.close()
            raise CudaError(f"opening CUDA device {device} failed: {_one_line(exc)}") from exc
        self._modules: dict[tuple[Any, ...], Compiled] = {}
        self._pinned: dict[str, np.ndarray] = {}
        self._cublas: Cublas | None = None

    # -- facts ---------------------------------------------------------------

    def _read_limits(self) -> DeviceLimits:
        attr = self._cuda.device_attribute
        dev = self._device
        return DeviceLimits(
            max_threads_per_block=dev.get_attribute(attr.MAX_THREADS_PER_BLOCK),
            max_shared_per_block=dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK),
            max_registers_per_block=dev.get_attribute(attr.MAX_REGISTERS_PER_BLOCK),
            name=dev.name(),
            compute_capability=tuple(dev.compute_capability()),  # type: ignore[arg-type]
            total_memory=dev.total_memory(),
            max_grid_x=dev.get_attribute(attr.MAX_GRID_DIM_X),
            max_grid_y=dev.get_attribute(attr.MAX_GRID_DIM_Y),
            multiprocessors=dev.get_attribute(attr.MULTIPROCESSOR_COUNT),
        )

    def device_name(self) -> str:
        """``"NVIDIA H100 80GB HBM3 (sm_90)"``."""
        return f"{self.limits.name} ({self.limits.arch})"

    def versions(self) -> dict[str, str]:
        """Driver, toolkit (as pycuda was built) and pycuda versions."""
        import pycuda

        def dotted(v: int) -> str:
            return f"{v // 1000}.{v % 1000 // 10}"

        return {
            "driver": dotted(self._cuda.get_driver_version()),
            "pycuda_built_for": ".".join(map(str, self._cuda.get_version())),
            "pycuda": getattr(pycuda, "VERSION_TEXT", "?"),
        }

    def mem_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes."""
        with self._converting("reading free device memory"):
            free, total = self._cuda.mem_get_info()
        return int(free), int(total)

    # -- compile -------------------------------------------------------------

    def compile(self, spec: KernelSpec, tile: int) -> tuple[Compiled, bool]:
        """The kernel built for ``tile`` and whether it was built just now.

        Cached in this session by (kernel, tile, source hash, options, device
        capability); mmd's disk cache (:class:`KernelCache`) sits beneath.
        """
        if spec.source is None or spec.entry is None:
            raise KernelError(f"kernel {spec.name} has no CUDA source to compile")
        self._check_thread()
        source = spec.source.read_text()
        digest = hashlib.sha256(source.encode()).hexdigest()
        # Kernels with a fixed block ignore the tile: one build serves every tile.
        tile = tile if spec.uses_tile else 0
        macros = tuple(f"-D{key}={value}" for key, value in spec.macros)
        options = ((f"-DTILE={tile}",) if spec.uses_tile else ()) + macros + COMPILE_OPTIONS
        key = (spec.name, tile, digest, options, self.limits.compute_capability)
        cached = self._modules.get(key)
        if cached is not None:
            return cached, False
        from pycuda.driver import CompileError

        start = time.perf_counter()
        try:
            module = self._load_module(source, options, [str(registry.KERNELS_DIR)])
            function = module.get_function(spec.entry)
        except CompileError as exc:
            lines = [ln for ln in (exc.stderr or str(exc)).splitlines() if "error" in ln] or [str(exc)]
            raise KernelError(
                f"kernel {spec.name} does not compile at tile {tile}: {_one_line(Exception(lines[0]))}",
                details={"kernel": spec.name, "tile": tile},
            ) from exc
        except self._cuda.Error as exc:
            raise CudaError(f"loading kernel {spec.name} at tile {tile} failed: {_one_line(exc)}") from exc
        function.prepare("PPPiiiiii")
        compiled = Compiled(
            spec=spec,
            tile=tile,
            function=function,
            module=module,
            registers=int(function.num_regs),
            shared_bytes=int(function.shared_size_bytes),
            local_bytes=int(function.local_size_bytes),
            compile_ms=(time.perf_counter() - start) * 1e3,
        )
        self._modules[key] = compiled
        return compiled, True

    def _load_module(self, source: str, options: Iterable[str], include_dirs: list[str]) -> Any:
        """A module from the kernel cache (compiled there if missing); a cached cubin the driver refuses is rebuilt."""
        cubin, built = self.kernel_cache.get(source, options, self.limits.arch, include_dirs)
        try:
            return self._cuda.module_from_buffer(cubin)
        except self._cuda.Error:
            if built:
                raise
        cubin, _ = self.kernel_cache.get(source, options, self.limits.arch, include_dirs, refresh=True)
        return self._cuda.module_from_buffer(cubin)

    # -- memory --------------------------------------------------------------

    def alloc(self, mode: str, rows: int, cols: int) -> DeviceMatrix:
        """A rows×cols float32 matrix in device, pitched or managed memory."""
        self._check_thread()
        nbytes = rows * cols * FLOAT_BYTES
        with self._converting(f"allocating {nbytes / _MIB:.1f} MiB of {mode} memory"):
            cuda = self._cuda
            if mode == "device":
                handle = cuda.mem_alloc(max(nbytes, FLOAT_BYTES))
                return DeviceMatrix(mode, rows, cols, cols, int(handle), handle)
            if mode == "pitched":
                handle, pitch = cuda.mem_alloc_pitch(max(cols, 1) * FLOAT_BYTES, max(rows, 1), FLOAT_BYTES)
                return DeviceMatrix(mode, rows, cols, pitch // FLOAT_BYTES, int(handle), handle)
            if mode == "managed":
                array = cuda.managed_empty((max(rows, 1), max(cols, 1)), np.float32, "C", cuda.mem_attach_flags.GLOBAL)
                ptr = int(array.base.get_device_pointer())
                return DeviceMatrix(mode, rows, cols, max(cols, 1), ptr, array)
        raise KernelError(f"unknown memory mode {mode!r}; choose device, pitched or managed")

    def free(self, matrix: DeviceMatrix) -> None:
        """Release a matrix's memory now (not at garbage collection)."""
        self._check_thread()
        with self._converting(f"freeing {matrix.mode} memory"):
            if matrix.mode == "managed":
                matrix.handle.base.free()
            else:
                matrix.handle.free()

    def _pinned_buffer(self, slot: str, rows: int, cols: int) -> np.ndarray:
        """A page-locked rows×cols float32 staging buffer, reused by slot."""
        need = max(rows * cols, 1)
        buf = self._pinned.get(slot)
        if buf is None or buf.size < need or need < buf.size * PINNED_REUSE_FRACTION:
            if buf is not None:
                buf.base.free()
                del self._pinned[slot]
            buf = self._cuda.pagelocked_empty(need, np.float32)
            self._pinned[slot] = buf
        return buf[:need].reshape(rows, cols) if rows * cols else buf[:0].reshape(rows, cols)

    def upload(self, matrix: DeviceMatrix, host: np.ndarray, slot: str) -> None:
        """Copy ``host`` (rows×cols float32) into ``matrix`` on the session's stream."""
        self._check_thread()
        if host.size == 0:
            return
        with self._converting(f"copying {host.nbytes / _MIB:.1f} MiB to the device"):
            if matrix.mode == "managed":
                self.stream.synchronize()
                np.copyto(matrix.handle[: matrix.rows, : matrix.cols], host)
                return
            if self.is_pinned(host) and host.flags.c_contiguous:
                staging = host  # already page-locked (host_empty): copy straight from it
            else:
                staging = self._pinned_buffer(slot, matrix.rows, matrix.cols)
                np.copyto(staging, host)
            if matrix.mode == "device":
                self._cuda.memcpy_htod_async(matrix.handle, staging, self.stream)
            else:
                copy = self._cuda.Memcpy2D()
                copy.set_src_host(staging)
                copy.src_pitch = matrix.cols * FLOAT_BYTES
                copy.set_dst_device(matrix.handle)
                copy.dst_pitch = matrix.ld * FLOAT_BYTES
                copy.width_in_bytes = matrix.cols * FLOAT_BYTES
                copy.height = matrix.rows
                copy(self.stream)

    def download(self, matrix: DeviceMatrix, slot: str = "c") -> np.ndarray:
        """A new host array with ``matrix``'s contents (waits for the stream)."""
        self._check_thread()
        out = np.empty((matrix.rows, matrix.cols), np.float32)
        if out.size == 0:
            return out
        with self._converting(f"copying {out.nbytes / _MIB:.1f} MiB from the device"):
            if matrix.mode == "managed":
                self.stream.synchronize()
                np.copyto(out, matrix.handle[: matrix.rows, : matrix.cols])
                return out
            staging = self._pinned_buffer(slot, matrix.rows, matrix.cols)
            if matrix.mode == "device":
                self._cuda.memcpy_dtoh_async(staging, matrix.handle, self.stream)
            else:
                copy = self._cuda.Memcpy2D()
                copy.set_src_device(matrix.handle)
                copy.src_pitch = matrix.ld * FLOAT_BYTES
                copy.set_dst_host(staging)
                copy.dst_pitch = matrix.cols * FLOAT_BYTES
                copy.width_in_bytes = matrix.cols * FLOAT_BYTES
                copy.height = matrix.rows
                copy(self.stream)
            self.stream.synchronize()
            np.copyto(out, staging)
        return out

    # -- page-locked host memory and raw buffers (the text path) -------------

    def host_empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32, slot: str = "host") -> np.ndarray:
        """A page-locked array of ``shape``, reused by ``slot`` (valid until the slot's next use).

        Arrays from here go to the device without a staging copy
        (:meth:`upload` checks :meth:`is_pinned`); the host parser can write
        into one directly (``textformat.parse(..., out=...)``).
        """
        self._check_thread()
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        need = max(count * dtype.itemsize, 1)
        key = f"host:{slot}"
        buf = self._pinned.get(key)
        if buf is None or buf.nbytes < need or need < buf.nbytes * PINNED_REUSE_FRACTION:
            if buf is not None:
                # Dropped, not freed: views handed out earlier stay valid until they go.
                del self._pinned[key]
            with self._converting(f"allocating {need / _MIB:.1f} MiB of page-locked memory"):
                buf = self._cuda.pagelocked_empty(need, np.uint8)
            self._pinned[key] = buf
        return buf[: count * dtype.itemsize].view(dtype).reshape(shape)

    def is_pinned(self, host: np.ndarray) -> bool:
        """Whether ``host`` lies inside one of this session's page-locked buffers."""
        if not isinstance(host, np.ndarray) or host.size == 0:
            return False
        start = host.__array_interface__["data"][0]
        end = start + host.nbytes
        for buf in self._pinned.values():
            lo = buf.__array_interface__["data"][0]
            if lo <= start and end <= lo + buf.nbytes:
                return True
        return False

    def mem_alloc(self, nbytes: int) -> Any:
        """Raw device memory (``int(handle)`` is its address); free with :meth:`mem_free`."""
        self._check_thread()
        with self._converting(f"allocating {nbytes / _MIB:.1f} MiB of device memory"):
            return self._cuda.mem_alloc(max(int(nbytes), 1))

    def mem_free(self, handle: Any) -> None:
        """Release raw device memory now."""
        self._check_thread()
        with self._converting("freeing device memory"):
            handle.free()

    def memset8(self, ptr: int, value: int, nbytes: int) -> None:
        """Set ``nbytes`` bytes at ``ptr`` to ``value`` on the session's stream."""
        if nbytes > 0:
            with self._converting("setting device memory"):
                self._cuda.memset_d8_async(int(ptr), int(value), int(nbytes), self.stream)

    def copy_htod(self, ptr: int, host: np.ndarray) -> None:
        """Copy ``host`` (page-locked for an asynchronous copy) to ``ptr`` on the stream."""
        if host.nbytes:
            with self._converting(f"copying {host.nbytes / _MIB:.1f} MiB to the device"):
                self._cuda.memcpy_htod_async(int(ptr), host, self.stream)

    def copy_dtoh(self, host: np.ndarray, ptr: int) -> None:
        """Copy ``host.nbytes`` bytes from ``ptr`` into ``host`` on the stream (page-locked: asynchronous)."""
        if host.nbytes:
            with self._converting(f"copying {host.nbytes / _MIB:.1f} MiB from the device"):
                self._cuda.memcpy_dtoh_async(host, int(ptr), self.stream)

    def compile_functions(
        self, source: Path, entries: dict[str, str], defines: dict[str, int]
    ) -> tuple[dict[str, Any], float | None]:
        """Build ``source`` (not a registry kernel) and prepare ``entries`` (name: pycuda signature).

        Returns the functions and the milliseconds spent building them
        (None when they came from this session's cache).
        """
        self._check_thread()
        text = source.read_text()
        options = tuple(f"-D{k}={v}" for k, v in sorted(defines.items())) + COMPILE_OPTIONS
        key = ("text", str(source), hashlib.sha256(text.encode()).hexdigest(), options, self.limits.compute_capability)
        cached = self._modules.get(key)
        if cached is not None:
            return cached.function, None
        from pycuda.driver import CompileError

        start = time.perf_counter()
        try:
            module = self._load_module(text, options, [])
            functions = {}
            for name, signature in entries.items():
                fn = module.get_function(name)
                fn.prepare(signature)
                functions[name] = fn
        except CompileError as exc:
            lines = [ln for ln in (exc.stderr or str(exc)).splitlines() if "error" in ln] or [str(exc)]
            raise KernelError(f"{source.name} does not compile: {_one_line(Exception(lines[0]))}") from exc
        except self._cuda.Error as exc:
            raise CudaError(f"loading {source.name} failed: {_one_line(exc)}") from exc
        ms = (time.perf_counter() - start) * 1e3
        # Cached beside the matmul kernels; ``spec`` is unused for these entries.
        self._modules[key] = Compiled(
            spec=None, tile=0, function=functions, module=module, registers=0, shared_bytes=0,
            local_bytes=0, compile_ms=ms,
        )  # type: ignore[arg-type]  # fmt: skip
        return functions, ms

    def record_event(self) -> Any:
        """A CUDA event recorded now on the session's stream (``.synchronize()`` waits for it)."""
        with self._converting("recording an event"):
            event = self._cuda.Event()
            event.record(self.stream)
        return event

    def call(self, function: Any, blocks: int, threads: int, *args: Any) -> None:
        """Launch a prepared 1-D ``function`` with ``blocks`` × ``threads`` on the session's stream."""
        if blocks <= 0:
            return
        with self._converting("launching a text kernel"):
            function.prepared_async_call((int(blocks), 1), (int(threads), 1, 1), self.stream, *args)

    def fill(self, matrix: DeviceMatrix, value: float) -> None:
        """Set every element (padding included) to ``value``: poison for tests."""
        self._check_thread()
        with self._converting("filling device memory"):
            word = int(np.array(value, np.float32).view(np.uint32))
            if matrix.mode == "managed":
                self.stream.synchronize()
                matrix.handle.fill(value)
            else:
                self._cuda.memset_d32_async(matrix.ptr, word, matrix.rows * matrix.ld, self.stream)

    # -- run -----------------------------------------------------------------

    def launch(self, compiled: Compiled, a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix) -> None:
        """Launch a compiled kernel for C = A·B on the session's stream."""
        self._check_thread()
        m, k, n = a.rows, a.cols, b.cols
        spec, tile = compiled.spec, compiled.tile
        if m == 0 or n == 0:
            return
        grid = spec.grid(m, n, tile)
        block = spec.block(tile)
        with self._converting(f"launching {spec.name} at tile {tile}"):
            compiled.function.prepared_async_call(
                grid[:2], block, self.stream, a.ptr, b.ptr, c.ptr, m, k, n, a.ld, b.ld, c.ld
            )

    def sgemm(self, a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix) -> None:
        """C = A·B through cuBLAS (the handle is made on first use)."""
        self._check_thread()
        if self._cublas is None:
            handle = getattr(self.stream, "handle", None)
            if handle is None:
                handle = self.stream.handle_int
            self._cublas = Cublas(int(handle))
        self._cublas.sgemm(a, b, c)

    def phase_timer(self) -> PhaseTimer:
        """A fresh event timer on the session's stream."""
        return PhaseTimer(self._cuda, self.stream)

    def synchronize(self) -> None:
        """Wait for everything queued on the session's stream."""
        with self._converting("waiting for the device"):
            self.stream.synchronize()

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Free staging buffers, drop modules and cuBLAS, pop the context. Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        problems = []
        with contextlib.suppress(Exception):
            self.stream.synchronize()
        if getattr(self, "_cublas", None) is not None:
            try:
                self._cublas.close()
            except Exception as exc:
                problems.append(exc)
            self._cublas = None
        for buf in getattr(self, "_pinned", {}).values():
            with contextlib.suppress(Exception):
                buf.base.free()
        self._pinned = {}
        self._modules = {}
        self.stream = None
        try:
            self._context.pop()
        except self._cuda.Error as exc:
            problems.append(exc)
        if problems:
            raise CudaError(f"closing the CUDA device: {_one_line(problems[0])}")

    def _check_thread(self) -> None:
        if self._closed:
            raise CudaError("the CUDA session is closed")
        if threading.get_ident() != self._thread:
            raise CudaError("the CUDA session was opened in another thread; open, use and close it in one thread")

    @contextlib.contextmanager
    def _converting(self, doing: str) -> Iterator[None]:
        """Turn driver errors raised while ``doing`` into CudaError."""
        try:
            yield
        except (self._cuda.Error, MemoryError) as exc:
            raise CudaError(f"{doing} failed: {_one_line(exc)}", details={"during": doing}) from exc


def source_path(name: str) -> Path:
    """The ``.cu`` file of a registered kernel (for scripts and docs)."""
    spec = registry.get(name)
    if spec.source is None:
        raise KernelError(f"kernel {name} has no CUDA source")
    return spec.source
