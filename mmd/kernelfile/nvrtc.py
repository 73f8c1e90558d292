"""Compiling a kernel file with NVIDIA's NVRTC, in a child process under limits, cached by what made it.

NVRTC (PyPI's ``nvidia-cuda-nvrtc``, the ``nvrtc`` extra, pinned to the toolkit's CUDA major) needs no
GPU. Each compile runs in :mod:`.nvrtc_child`, a fresh ``python -I -S`` with an address-space and a CPU
limit and no environment, handed only :data:`~.sandbox.HEADERS` in memory; a compile past its wall-clock
limit is killed. The file has passed the include guard (:func:`~.reading.read_kernel_file`) first.

Results go to mmd's kernel cache (:class:`mmd.cuda.compiler.KernelCache`, the folder of the
``kernel_cache`` setting) under the sha256 of the source, the options, the architecture and the
compiler (libnvrtc's path, size and time stamp, and the header set). An entry holds the cubin and the
lowered names of the kernel (course kernels are C++: their names are mangled, and NVRTC tells the
lowered name of each name expression).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..cuda.compiler import KernelCache
from ..errors import KernelFileError, MissingExtra
from ..resources import install_hint
from ..spawning import exit_status
from .nvrtc_child import OUT_OF_MEMORY
from .reading import KernelFile
from .sandbox import HEADERS, HEADERS_DIGEST

#: The PyPI distribution that carries libnvrtc.
DISTRIBUTION = "nvidia-cuda-nvrtc"

#: NVRTC options besides the architecture and the macros (pinned: part of every cache key).
OPTIONS: tuple[str, ...] = ("--std=c++17",)

#: mmd's own option in a compile's option list: a name expression to lower, not passed to NVRTC.
NAME_OPTION = "--mmd-name-expression="

#: The child that runs NVRTC.
CHILD = Path(__file__).with_name("nvrtc_child.py")

_PAYLOAD_TAG = b"mmd-nvrtc-1 "
#: The line number in a ``FILE:LINE: message``.
_LINE_NUMBER = re.compile(r"^[^:]*:(\d+):")
_LOG_LINE = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<message>.*)$")


@dataclass(frozen=True)
class CompileLimits:
    """What one compile may take: wall-clock seconds (CPU seconds too) and bytes of address space."""

    seconds: float = 10.0
    memory_bytes: int = 1 << 30


@dataclass(frozen=True)
class Compiled:
    """A kernel file built for one tile and architecture."""

    cubin: bytes
    #: The symbol to load: the entry's lowered (mangled) name.
    symbol: str
    #: The compiler's warnings, as ``FILE:LINE: warning: ...``.
    warnings: tuple[str, ...]
    #: Whether it was compiled now (False: read from the cache).
    compiled: bool


def library_path() -> Path:
    """libnvrtc from the ``nvidia-cuda-nvrtc`` distribution; MissingExtra where it is not installed."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise MissingExtra(
            f"kernel files need NVRTC, which this install of mmd lacks: {install_hint('nvrtc')}"
        ) from None
    for file in dist.files or ():
        if file.name.startswith("libnvrtc.so"):
            return Path(str(dist.locate_file(file)))
    raise MissingExtra(f"{DISTRIBUTION} {dist.version} has no libnvrtc.so; reinstall it: {install_hint('nvrtc')}")


@functools.cache
def identity() -> str:
    """Which compiler builds: libnvrtc's real path, size and time stamp (a stat, no load) and the header set."""
    real = os.path.realpath(library_path())
    info = os.stat(real)
    return f"nvrtc:{real}:{info.st_size}:{info.st_mtime_ns}:headers:{HEADERS_DIGEST}"


def options(kernel: KernelFile, tile: int, arch: str) -> list[str]:
    """Everything a build of ``kernel`` at ``tile`` for ``arch`` is made of besides its source (the cache key)."""
    macros = [f"-D{name}={value}" for name, value in sorted(kernel.macros(tile).items())]
    return [f"--gpu-architecture={arch}", *macros, *OPTIONS, NAME_OPTION + kernel.name_expression(tile)]


def compile_kernel(
    kernel: KernelFile,
    tile: int,
    arch: str = "sm_90",
    cache_folder: Path | None = None,
    limits: CompileLimits | None = None,
) -> Compiled:
    """``kernel`` built at ``tile`` for ``arch`` (``sm_90``), from the cache in ``cache_folder`` or by NVRTC
    under ``limits`` (the defaults: :class:`CompileLimits`)."""
    kernel.check_tile(tile)
    limits = limits or CompileLimits()
    opts = options(kernel, tile, arch)

    def build(source: str, opts: list[str], arch: str, _dirs: list[str]) -> bytes:
        assert limits is not None
        return _run_child(kernel.name, source, opts, limits)

    cache = KernelCache(cache_folder, build=build, version=identity)
    payload, compiled = cache.get(kernel.source, opts, arch)
    manifest, cubin = unpack(payload)
    expr = kernel.name_expression(tile)
    symbol = manifest["lowered"].get(expr)
    if not symbol:
        raise KernelFileError(f"{kernel.name}: NVRTC built it but did not find {expr}", {"file": kernel.name})
    return Compiled(cubin, symbol, tuple(manifest.get("warnings", ())), compiled)


def pack(cubin: bytes, lowered: dict[str, str], warnings: list[str]) -> bytes:
    """A cache entry's payload: a JSON line (lowered names, warnings), then the cubin."""
    return _PAYLOAD_TAG + json.dumps({"lowered": lowered, "warnings": warnings}).encode() + b"\n" + cubin


def unpack(payload: bytes) -> tuple[dict, bytes]:
    head, _, cubin = payload.partition(b"\n")
    if not head.startswith(_PAYLOAD_TAG):
        raise KernelFileError("a kernel cache entry is not NVRTC's (mmd-nvrtc-1); remove the kernel cache")
    return json.loads(head[len(_PAYLOAD_TAG) :]), cubin


def _run_child(name: str, source: str, opts: list[str], limits: CompileLimits) -> bytes:
    names = [o[len(NAME_OPTION) :] for o in opts if o.startswith(NAME_OPTION)]
    job = {
        "lib": str(library_path()),
        "source": source,
        "name": name,
        "options": [o for o in opts if not o.startswith(NAME_OPTION)],
        "names": names,
        "headers": list(HEADERS),
        "seconds": limits.seconds,
        "memory": limits.memory_bytes,
    }
    mib = limits.memory_bytes >> 20
    with tempfile.TemporaryDirectory(prefix="mmd-nvrtc-") as empty:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-S", str(CHILD)],
                input=json.dumps(job).encode(),
                capture_output=True,
                timeout=limits.seconds,
                env={"LC_ALL": "C"},
                cwd=empty,  # an empty folder: nothing to find there, should NVRTC look
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise KernelFileError(
                f"{name}: compiling took longer than {limits.seconds:g} s; it was stopped",
                {"file": name, "seconds": limits.seconds},
            ) from None
    if done.returncode != 0:
        if done.returncode == -signal.SIGXCPU:
            reason = f"took more than its {limits.seconds:g} s of CPU"
        elif done.returncode in (OUT_OF_MEMORY, -signal.SIGABRT):  # SIGABRT: NVRTC's std::bad_alloc
            reason = f"ran out of its {mib} MiB of memory"
        else:
            reason = f"stopped with {exit_status(done.returncode)}"
        raise KernelFileError(f"{name}: compiling {reason}; it was stopped", {"file": name})
    head, _, cubin = done.stdout.partition(b"\n")
    answer = json.loads(head)
    lines = compiler_lines(answer.get("log", ""), name)
    if answer["status"] != 0:
        errors = [ln for ln in lines if ": error" in ln or "catastrophic" in ln] or lines
        if not errors:
            what = answer.get("error", f"status {answer['status']}")
            if "OUT_OF_MEMORY" in what:
                raise KernelFileError(f"{name}: compiling ran out of its {mib} MiB of memory", {"file": name})
            raise KernelFileError(f"{name}: NVRTC failed: {what}", {"file": name})
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        found = _LINE_NUMBER.match(errors[0])
        details = {"file": name, "errors": errors[:20], **({"line": int(found.group(1))} if found else {})}
        raise KernelFileError(errors[0] + more, details)
    return pack(cubin, answer.get("lowered", {}), [ln for ln in lines if ": warning" in ln])


def compiler_lines(log: str, name: str) -> list[str]:
    """NVRTC's diagnostics on the author's own file, each as ``FILE:LINE: message``; lines about anything
    else (mmd's name lookups, the echoed source, the summary) are left out."""
    out = []
    for raw in log.splitlines():
        found = _LOG_LINE.match(raw)
        if found and found.group("file") == name:
            out.append(f"{name}:{found.group('line')}: {found.group('message')}")
    return out
