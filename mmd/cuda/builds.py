"""Every build mmd can load, and building them ahead of time into the kernel cache.

The list is the registry's (each kernel at each course tile, each tuned
variant) and the text path's sources, or what a daemon configured for one
kernel at one tile loads (what the installer builds into the service's
cache); each build goes through the same
:meth:`KernelCache.get` as a session's, so `mmd kernels --build` fills the
cache a daemon then loads from (a warm first job), and compile-checks every
source on a machine with nvcc and no GPU.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .. import kernels as registry
from ..cpus import usable_cores
from ..errors import MmdError
from ..resources import kernels_dir
from .compiler import KernelCache, macro_options
from .text import SOURCES


@dataclass(frozen=True)
class Build:
    """One source with one set of macros for one architecture."""

    label: str
    source: Path
    defines: dict[str, int] = field(default_factory=dict)
    arch: str = "sm_90"


def every_build(arch: str, tiles: Iterable[int] = registry.TILES) -> list[Build]:
    """Every registered kernel's builds (each tile, each variant) and the text kernels, for ``arch``."""
    return [b for name in registry.SOURCE_KERNELS for b in _kernel_builds(name, arch, tiles)] + _text_builds(arch)


def configured_builds(arch: str, kernel: str, tile: int) -> list[Build]:
    """What a daemon that runs ``kernel`` at ``tile`` loads, for ``arch``: that kernel's builds (each variant) and
    the text kernels; the text kernels alone for a kernel without a CUDA source (cuBLAS, the CPU's)."""
    own = _kernel_builds(kernel, arch, (tile,)) if kernel in registry.SOURCE_KERNELS else []
    return own + _text_builds(arch)


def _kernel_builds(name: str, arch: str, tiles: Iterable[int]) -> list[Build]:
    out = []
    # each build, and the one the device's architecture launches in its place (tc1's TMA build on sm_90)
    for spec in dict.fromkeys(b for own in registry.get(name).builds() for b in (own, own.for_arch(arch))):
        assert spec.source is not None
        for tile in tiles if spec.uses_tile else (0,):
            where = f"tile {tile}" if spec.uses_tile else (spec.variant or "default")
            out.append(Build(f"{spec.name} {where}", spec.source, spec.defines(tile), spec.arch_for(arch)))
    return out


def _text_builds(arch: str) -> list[Build]:
    return [Build(name, kernels_dir() / name, dict(defines), arch) for name, (defines, _entries) in SOURCES.items()]


@dataclass(frozen=True)
class Built:
    """A build's outcome: compiled now, found in the cache, or why it failed."""

    build: Build
    compiled: bool = False
    error: str | None = None


def build_all(
    cache: KernelCache, builds: list[Build], workers: int | None = None, done: Callable[[Built], object] | None = None
) -> list[Built]:
    """Compile what the cache lacks (nvcc runs in parallel, one process per build); ``done`` is told of each
    build as it ends (from the thread that ran it)."""

    def one(build: Build) -> Built:
        try:
            text = build.source.read_text(encoding="utf-8")
            _, compiled = cache.get(text, macro_options(build.defines), build.arch, [kernels_dir()])
            built = Built(build, compiled=compiled)
        except (MmdError, OSError) as exc:
            built = Built(build, error=exc.reason if isinstance(exc, MmdError) else str(exc))
        if done is not None:
            done(built)
        return built

    with concurrent.futures.ThreadPoolExecutor(workers or usable_cores()) as pool:
        return list(pool.map(one, builds))
