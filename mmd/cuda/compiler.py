"""Compiling CUDA sources to cubins with nvcc, and mmd's own disk cache of the results.

Every ``.cu`` mmd loads (the registry's matmul kernels and the text kernels)
goes through :meth:`KernelCache.get`: one file per (source, headers, options,
arch, nvcc), written through a temporary and a rename, so several processes
(daemons, workers) filling the same entry leave one whole file, and an entry
that is cut short or corrupt is rebuilt. A missing entry is compiled once:
the process that compiles it holds a lock on it (``flock``), and the others
that want it meanwhile (a daemon's workers, all starting at once) wait and
load what it stored.

nvcc is called directly (not through pycuda, whose ``compile`` does the same
with a temporary folder): so kernels compile, and the cache can be filled
(`mmd kernels --build`), on a machine with the CUDA toolkit and no GPU or
pycuda, and a warm cache costs no nvcc process at all (the key names nvcc by
its path, size and time stamp instead of asking it its version).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_atomic
from ..errors import KernelError, MmdError
from ..kernels import KernelSpec

#: nvcc options besides the ``-D`` macros and the arch (the include folder is added separately).
COMPILE_OPTIONS: tuple[str, ...] = ("-O3",)

#: Each cache entry starts with this tag and the sha256 of the cubin after the first line.
_CACHE_TAG = b"mmd-cubin-1 "
#: Headers a kernel may include from its include folders (hashed into the key).
_HEADER_SUFFIXES = (".cuh", ".h", ".hpp", ".inc")

#: A compiler: (source, options, arch, include folders) → cubin bytes.
Build = Callable[[str, list[str], str, list[str]], bytes]


def nvcc_path() -> str | None:
    """The nvcc to use: on PATH, else under $CUDA_HOME or /usr/local/cuda; None where there is none."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


@functools.cache
def nvcc_identity() -> str:
    """Which nvcc builds: its real path, size and time stamp (a stat, no process); ``none`` without one."""
    path = nvcc_path()
    if path is None:
        return "none"
    real = os.path.realpath(path)
    info = os.stat(real)
    return f"{real}:{info.st_size}:{info.st_mtime_ns}"


def gencode(arch: str) -> str:
    """nvcc's target for ``sm_90`` or ``sm_90a``: ``-gencode=arch=compute_90a,code=sm_90a``.

    The explicit form, not ``-arch=sm_90a``: that shorthand also runs a plain
    sm_90 pass, which refuses the Hopper-only instructions (wgmma, setmaxnreg).
    """
    return f"-gencode=arch=compute_{arch.removeprefix('sm_')},code={arch}"


def nvcc_compile(source: str, options: list[str], arch: str, include_dirs: list[str]) -> bytes:
    """``nvcc --cubin`` of ``source`` for ``arch``; KernelError with nvcc's first error line when it fails."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise KernelError("nvcc is not installed (the CUDA toolkit): kernels cannot be compiled here")
    with tempfile.TemporaryDirectory(prefix="mmd-nvcc-") as tmp:
        src, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        src.write_text(source, encoding="utf-8")
        argv = [nvcc, "--cubin", gencode(arch), *options, *(f"-I{d}" for d in include_dirs), "-o", str(out), str(src)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.is_file():
            lines = [ln for ln in (done.stderr + done.stdout).splitlines() if "error" in ln]
            first = lines[0] if lines else (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise KernelError(f"nvcc failed: {' '.join(first.split())}", {"arch": arch})
        return out.read_bytes()


def macro_options(defines: Mapping[str, int]) -> tuple[str, ...]:
    """``-DNAME=value`` for each macro, sorted (part of the cache key), then :data:`COMPILE_OPTIONS`."""
    return tuple(f"-D{key}={value}" for key, value in sorted(defines.items())) + COMPILE_OPTIONS


class KernelCache:
    """Compiled kernels on disk, safe to share between processes.

    ``folder/<key>.cubin``, where the key is the sha256 of the source, the
    headers in the include folders, the options, the arch and the nvcc
    identity. An entry is written with :func:`mmd.atomic.write_atomic` (a
    temporary of this process, then a rename), and compiled under a lock of
    its own (:func:`_compiling`): of the processes that miss one key at once,
    one compiles and the others wait for it and load its file. Each
    entry carries the sha256 of its cubin, so a short or corrupt one (a full
    disk, a copy cut off) is ignored and rebuilt. ``folder`` None: no disk
    cache, every session compiles. ``build`` and ``version`` are the compiler
    and what names it in the key (nvcc; tests pass fakes).
    """

    def __init__(
        self,
        folder: Path | None,
        build: Build = nvcc_compile,
        version: Callable[[], str] = nvcc_identity,
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
        opts, dirs = list(options), [str(d) for d in include_dirs]
        path = self.path(self.key(source, opts, arch, dirs))
        if path is None:
            return self._build(source, opts, arch, dirs), True
        if not refresh:
            cached = self.read(path)
            if cached is not None:
                return cached, False
        with _compiling(path):
            if not refresh:  # another process may have compiled it while this one waited
                cached = self.read(path)
                if cached is not None:
                    return cached, False
            cubin = self._build(source, opts, arch, dirs)
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


@contextlib.contextmanager
def _compiling(entry: Path) -> Iterator[None]:
    """Hold the lock of cache entry ``entry`` (``.<name>.lock`` beside it, ``flock``): one process compiles an
    entry at a time. The lock file is removed when left (unless another has taken its name meanwhile), so a
    cache holds cubins only; a waiter on a removed one re-reads the entry before it compiles, and finds it. A
    cache where no lock can be made (unwritable) is filled without one: each process compiles for itself."""
    lock = entry.with_name(f".{entry.name}.lock")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(OSError):
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                os.unlink(lock)
        os.close(fd)  # releases the lock


@dataclass
class Module:
    """A loaded CUDA module and its prepared entry points."""

    functions: dict[str, Any] = field(repr=False)
    #: Host milliseconds spent getting it (cache read or nvcc, and the driver's load).
    load_ms: float


@dataclass
class Compiled:
    """A registry kernel built for one tile, and what the compiler reported about it."""

    spec: KernelSpec
    tile: int
    function: Any = field(repr=False)
    registers: int
    shared_bytes: int
    local_bytes: int
    #: Host milliseconds this session spent building it.
    compile_ms: float
