"""The one kernel registry: every way mmd can multiply, and how to launch it.

Each entry is a :class:`~mmd.kernelspec.KernelSpec`. A source kernel's facts live in its own file,
``kernels/<name>.cu``, in the declaration under ``mmd:`` in its header comment, in the vocabulary kernel
files use (:mod:`mmd.kernelfile.declaration`): the registry reads ``kernels/`` at import and builds each
entry from it; only the library and host entries (cuBLAS, the CPU) are written here. The CLI choices, the
benchmark loop, the graph labels, the docs and the tests all read kernel names and facts from here;
nothing about a kernel is written twice.

:func:`check_launch` is pure: given a kernel, a tile and a device's
:class:`~mmd.launchlimits.DeviceLimits`, it raises :class:`~mmd.errors.TileError` with a one-line
reason when the launch cannot happen (too many threads, too much shared memory,
too many registers), before anything is allocated.

An entry's type (:mod:`mmd.kernelspec`) and the launch limits (:mod:`mmd.launchlimits`) have modules of
their own; the names callers reach through the registry (``registry.KernelSpec``,
``registry.DeviceLimits`` ...) are its own here too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .errors import KernelError
from .kernelfile.declaration import PRECISIONS as PRECISIONS
from .kernelfile.declaration import Declaration
from .kernelfile.declaring import in_header
from .kernelspec import FLOAT_BYTES as FLOAT_BYTES
from .kernelspec import HOST as HOST
from .kernelspec import LIBRARY as LIBRARY
from .kernelspec import SHAPE_CLASSES, SOURCE, KernelSpec, Variant
from .launchlimits import COMMON_LIMITS as COMMON_LIMITS
from .launchlimits import MAX_TILE as MAX_TILE
from .launchlimits import DeviceLimits, check_block, check_tile
from .launchlimits import check_grid_dims as check_grid_dims
from .resources import kernels_dir

#: Tiles the course asks about (and the benchmark loops over). Other tiles are
#: not refused here: :func:`check_launch` refuses what the device cannot launch
#: (tile 64: 4096 threads per block).
TILES: tuple[int, ...] = (4, 8, 16, 32)

#: Files in ``kernels/`` that are not matmul kernels: the GPU text path's (mmd.cuda.text).
TEXT_KERNEL_FILES: tuple[str, str] = ("text_parse.cu", "text_emit.cu")


def _declaration(kernel: str) -> Declaration:
    try:
        return DECLARATIONS[kernel]
    except KeyError:
        raise KernelError(f"{get(kernel).name} is not a source kernel: it has no declaration") from None


def defaults(kernel: str) -> dict[str, int]:
    """The macros ``kernels/<kernel>.cu`` defaults itself, in order: its declaration's ``defines`` (a test holds
    them to the file's own ``#define``s, what a build without ``-D`` gets)."""
    return _declaration(kernel).defined(0)


def variant(kernel: str, label: str, classes: tuple[str, ...] = (), **changes: int) -> Variant:
    """A build of the fixed-block source kernel ``kernel`` with ``changes`` to its file's default macros.

    Every macro is spelled out, so a build means the same whatever the file's defaults; its geometry
    (block tile, shared memory, cluster, tensor maps) is the kernel's declaration evaluated with these
    macros, the one place that says how. KernelError for a macro the declaration has no define or switch
    for, and for a set its ``requires`` refuses.
    """
    declared = _declaration(kernel)
    if declared.uses_tile:
        raise KernelError(f"{kernel} takes the tile; its builds have no variants", details={"kernel": kernel})
    try:
        changed = declared.with_defines(changes)
    except ValueError as exc:
        raise KernelError(f"{kernel} has {exc}", details={"kernel": kernel}) from None
    return _build(kernel, changed, label, classes)


def _build(kernel: str, declared: Declaration, label: str, classes: tuple[str, ...] = ()) -> Variant:
    """A fixed-block kernel's build as its declaration (with a variant's macros) gives it."""
    reason = declared.unmet(0)
    if reason is not None:
        raise KernelError(f"{kernel}: {reason}", details={"kernel": kernel})
    per_thread = declared.thread_shape(0)
    if per_thread is None:
        raise KernelError(f"{kernel}: a kernel with a fixed block declares its thread_tile", details={"kernel": kernel})
    rows, cols, _ = declared.block_shape(0)
    return Variant(
        label=label,
        macros=tuple(declared.defined(0).items()),
        block_tile=(rows, cols, *per_thread),
        shared_bytes=declared.static_shared(0) or 0,
        classes=classes,
        dynamic_shared_bytes=declared.dynamic_shared(0),
        cluster_x=declared.cluster(0),
        tensor_maps=declared.maps(0),
        producer_threads=declared.producer_threads(0),
    )


def _source_spec(name: str, declared: Declaration) -> KernelSpec:
    """The entry of ``kernels/<name>.cu``, from its declaration."""
    spec = KernelSpec(
        name=name,
        kind=SOURCE,
        description=declared.description,
        source_file=f"{name}.cu",
        entry=declared.entry,
        arch_specific=declared.arch_specific,
        min_compute_capability=declared.min_compute_capability,
        requirement=declared.needs,
        precision=declared.precision,
        exact=declared.exact,
        course=declared.course,
    )
    if declared.uses_tile:
        # tile × tile threads, edge × edge outputs each, floats · tile² of shared memory: the tiled kernels'
        # geometry as KernelSpec says it (tests/test_kernels.py holds each declaration to it at every tile)
        edge, _ = declared.thread_shape(1) or (1, 1)
        floats = (declared.static_shared(1) or 0) // FLOAT_BYTES
        return dataclasses.replace(spec, outputs_edge=edge, shared_floats_per_tile2=floats)
    classes = {c for v in declared.variants for c in v.classes} - {c for c, _ in SHAPE_CLASSES}
    if classes:
        raise KernelError(f"{name}: no shape class {', '.join(sorted(classes))}", details={"kernel": name})
    return dataclasses.replace(
        spec.with_variant(_build(name, declared, "default")),
        variant=None,
        variants=tuple(_build(name, declared.variant(v), v.label, v.classes) for v in declared.variants),
        arch_variants=tuple((to, _build(name, declared.variant(v), v.label)) for to, v in declared.arch_variants),
    )


def read_declarations(folder: Path) -> dict[str, Declaration]:
    """Each ``<name>.cu``'s declaration in ``folder`` (the text kernels' aside), in ladder order (its ``rung``).

    Only each file's header comment is read; a file without a declaration that names its rung, or two
    files of one rung, are a KernelError: the registry cannot be read, and mmd cannot start.
    """
    found: list[tuple[int, str, Declaration]] = []
    for path in sorted(folder.glob("*.cu")):
        if path.name in TEXT_KERNEL_FILES:
            continue
        declared = in_header(path.read_text(encoding="utf-8"), path.name)
        if declared is None or declared.rung is None:
            raise KernelError(f"kernels/{path.name}: no rung declared in its header comment (mmd: rung: N)")
        found.append((declared.rung, path.stem, declared))
    rungs = [rung for rung, _, _ in found]
    if len(set(rungs)) != len(rungs):
        twice = sorted({name for rung, name, _ in found if rungs.count(rung) > 1})
        raise KernelError(f"kernels/*.cu: {' and '.join(twice)} declare the same rung")
    return {name: declared for _, name, declared in sorted(found, key=lambda item: item[0])}


#: Each source kernel's declaration, read from the header comment of ``kernels/<name>.cu``, in ladder order.
DECLARATIONS: dict[str, Declaration] = read_declarations(kernels_dir())

#: fast.cu's compile-time parameters and their defaults (tests/test_fast_kernels.py holds them to its #defines).
FAST_DEFAULTS: dict[str, int] = defaults("fast")

#: The entries that are no file of ``kernels/``: the vendor library and the host.
_IN_CODE: tuple[KernelSpec, ...] = (
    KernelSpec(
        name="cublas",
        kind=LIBRARY,
        description="cuBLAS SGEMM (the vendor library, for reference)",
    ),
    KernelSpec(
        name="cublas_tf32",
        kind=LIBRARY,
        description="cuBLAS with TF32 tensor cores (its speed ceiling, its accuracy)",
        min_compute_capability=(8, 0),
        requirement="TF32 tensor cores",
        precision="tf32",
        exact=False,
        course=False,
    ),
    KernelSpec(
        name="cpu",
        kind=HOST,
        description="numpy float32 matmul on the host",
    ),
)

_SPECS: tuple[KernelSpec, ...] = (*(_source_spec(n, d) for n, d in DECLARATIONS.items()), *_IN_CODE)

#: name → spec, in ladder order (naive first, cpu last).
REGISTRY: dict[str, KernelSpec] = {spec.name: spec for spec in _SPECS}

#: Every registered name, in ladder order.
NAMES: tuple[str, ...] = tuple(REGISTRY)

#: Names of the compiled kernels (those with a ``.cu`` file).
SOURCE_KERNELS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.kind == SOURCE)

#: Names the CUDA backend accepts (compiled kernels, cublas and cublas_tf32).
GPU_KERNELS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.on_gpu)

#: Names the course's benchmark plan runs by default (:attr:`KernelSpec.course`).
COURSE_KERNELS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.course)


def get(name: str) -> KernelSpec:
    """The spec of kernel ``name``; KernelError naming the choices otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KernelError(
            f"unknown kernel {name!r}; choose one of {', '.join(NAMES)}",
            details={"kernel": name, "choices": list(NAMES)},
        ) from None


def check_launch(
    kernel: str | KernelSpec,
    tile: int,
    limits: DeviceLimits,
    *,
    registers_per_thread: int | None = None,
) -> None:
    """Raise TileError when ``kernel`` at ``tile`` cannot be launched under ``limits``.

    Checks, in order: the device's compute capability (every kind: TF32
    needs 8.0); the tile is a positive integer (where the kernel uses it);
    threads per block; static shared memory per block; registers per block
    when ``registers_per_thread`` is known (after compiling). cublas and cpu
    pass any tile; kernels with a fixed block are checked whatever the tile.
    Pure: reads nothing but its arguments.
    """
    spec = kernel if isinstance(kernel, KernelSpec) else get(kernel)
    have = limits.compute_capability
    if have != (0, 0) and have < spec.min_compute_capability:  # cuBLAS's TF32 mode too, not only sources
        need = ".".join(map(str, spec.min_compute_capability))
        raise KernelError(
            f"{spec.name} needs a GPU of compute capability {need} or newer "
            f"({spec.requirement}); {limits.name} is {'.'.join(map(str, have))}",
            details={"kernel": spec.name, "compute_capability": list(have)},
        )
    if not spec.compiled:
        return
    if spec.uses_tile:
        check_tile(tile)
    what = f"tile {tile}" if spec.uses_tile else spec.name
    check_block(
        what,
        spec.name,
        spec.threads_per_block(tile),
        spec.shared_bytes(tile),
        spec.dynamic_shared_bytes,
        limits,
        registers_per_thread=registers_per_thread,
        details={"kernel": spec.name, "tile": tile},
    )


def check_grid(kernel: str | KernelSpec, m: int, n: int, tile: int, limits: DeviceLimits) -> None:
    """Raise TileError when an m×n output needs more blocks than the grid allows."""
    spec = kernel if isinstance(kernel, KernelSpec) else get(kernel)
    if not spec.compiled:
        return
    check_grid_dims(spec.name, m, n, tile, spec.grid(m, n, tile), limits)
