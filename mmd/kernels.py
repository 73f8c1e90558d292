"""The one kernel registry: every way mmd can multiply, and how to launch it.

Each :class:`KernelSpec` says where a kernel's source is (``kernels/<name>.cu``),
its entry symbol, a one-line description, and its launch geometry as functions
of the output size and the tile: block and grid dimensions, outputs per thread,
threads per block and static shared memory. A source kernel's facts live in its
own file, in the declaration under ``mmd:`` in its header comment, in the
vocabulary kernel files use (:mod:`mmd.kernelfile.declaration`): the registry
reads ``kernels/`` at import, and only the library and host entries (cuBLAS,
the CPU) are written here. The CLI choices, the benchmark loop, the graph
labels, the docs and the tests all read kernel names and facts from here;
nothing about a kernel is written twice.

:func:`check_launch` is pure: given a kernel, a tile and a device's
:class:`DeviceLimits`, it raises :class:`~mmd.errors.TileError` with a one-line
reason when the launch cannot happen (too many threads, too much shared memory,
too many registers), before anything is allocated.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import KernelError, TileError
from .kernelfile.declaration import PRECISIONS as PRECISIONS
from .kernelfile.declaration import Declaration, in_header
from .kernelfile.declaration import TensorMaps as TensorMaps
from .resources import kernels_dir

#: Tiles the course asks about (and the benchmark loops over). Other tiles are
#: not refused here: :func:`check_launch` refuses what the device cannot launch
#: (tile 64: 4096 threads per block).
TILES: tuple[int, ...] = (4, 8, 16, 32)

#: The largest tile a setting may ask for, wherever it comes from (config, name,
#: flag): more than any GPU launches, so the device's own limit gives the
#: reason; this bound only keeps nonsense out of launch arithmetic.
MAX_TILE = 1024

#: Files in ``kernels/`` that are not matmul kernels: the GPU text path's (mmd.cuda.text).
TEXT_KERNEL_FILES: tuple[str, str] = ("text_parse.cu", "text_emit.cu")

#: Bytes in one matrix element (float32).
FLOAT_BYTES = 4

#: Kinds of registry entries: a CUDA C source compiled at run time, a library
#: call (cuBLAS) on the GPU, or the host (numpy) backend.
SOURCE, LIBRARY, HOST = "source", "library", "host"


@dataclass(frozen=True)
class DeviceLimits:
    """What a device allows one block; read from the device by :mod:`mmd.cuda.device`."""

    max_threads_per_block: int
    max_shared_per_block: int
    max_registers_per_block: int
    name: str = "unknown device"
    compute_capability: tuple[int, int] = (0, 0)
    total_memory: int = 0
    max_grid_x: int = 2**31 - 1
    max_grid_y: int = 65535
    #: Streaming multiprocessors (0: unknown); picks a fixed-block kernel's variant.
    multiprocessors: int = 0
    #: Shared memory a block may have when it opts in (static + dynamic); 0: only max_shared_per_block.
    max_shared_optin: int = 0
    #: How refusals word the limit: a real device's, or the common bound where no device was asked.
    allows: str = "this GPU allows"
    #: Bytes of L2 cache (0: unknown); the bench's L2 flush writes twice this.
    l2_cache_bytes: int = 0
    #: The PCI bus id (``0000:65:00.0``; empty: unknown): how the bench finds the GPU in nvidia-smi.
    pci_bus_id: str = ""

    @property
    def arch(self) -> str:
        """The nvcc architecture name, ``sm_90`` for compute capability 9.0."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


#: Limits of every CUDA GPU since compute capability 3.0 (1024 threads, 48 KiB
#: of static shared memory, 64 Ki registers per block): for checks made where
#: no device can be asked, such as validating a tile on the command line.
COMMON_LIMITS = DeviceLimits(
    max_threads_per_block=1024,
    max_shared_per_block=48 * 1024,
    max_registers_per_block=64 * 1024,
    name="any CUDA GPU",
    allows="no CUDA GPU allows more than",
)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


#: Fixed-block kernels classify shapes by how many 128×128 blocks of C they
#: have per multiprocessor: fewer than one is "small" (a large block tile
#: would leave multiprocessors idle), fewer than four "medium", else "large".
SHAPE_CLASS_EDGE = 128
SHAPE_CLASSES: tuple[tuple[str, float], ...] = (("small", 1.0), ("medium", 4.0), ("large", float("inf")))


def shape_class(m: int, n: int, multiprocessors: int) -> str:
    """``small``, ``medium`` or ``large`` for an m×n C on a GPU with that many multiprocessors."""
    if multiprocessors <= 0:
        return "large"
    per_sm = _ceil_div(m, SHAPE_CLASS_EDGE) * _ceil_div(n, SHAPE_CLASS_EDGE) / multiprocessors
    return next(name for name, bound in SHAPE_CLASSES if per_sm < bound)


@dataclass(frozen=True)
class Variant:
    """A compile-time parameter set of a fixed-block kernel (``-D`` macros and its geometry), as :func:`variant`
    builds it from the kernel's declaration."""

    label: str
    macros: tuple[tuple[str, int], ...]
    #: (BM, BN, TM, TN) as in :attr:`KernelSpec.block_tile`.
    block_tile: tuple[int, int, int, int]
    shared_bytes: int
    #: Shape classes this variant serves unless a tuning file says otherwise.
    classes: tuple[str, ...] = ()
    #: Dynamic shared memory per block (``extern __shared__``), as in :attr:`KernelSpec.dynamic_shared_bytes`.
    dynamic_shared_bytes: int = 0
    #: Blocks per thread-block cluster along x, as in :attr:`KernelSpec.cluster_x`.
    cluster_x: int = 1
    #: The TMA build's operand maps, as in :attr:`KernelSpec.tensor_maps`.
    tensor_maps: TensorMaps | None = None


@dataclass(frozen=True)
class KernelSpec:
    """One registry entry; a ``source`` kernel's, built from its declaration (:func:`_source_spec`).

    For a ``source`` kernel the block is ``tile × tile`` threads and each thread
    computes ``outputs_edge × outputs_edge`` outputs, so a block covers
    ``tile·outputs_edge`` rows and columns of C; the kernel's static shared
    memory is ``shared_floats_per_tile2 · tile²`` floats.
    """

    name: str
    kind: str
    description: str
    #: File name inside :data:`KERNELS_DIR`; None for cublas and cpu.
    source_file: str | None = None
    #: The ``extern "C"`` symbol to launch; None for cublas and cpu.
    entry: str | None = None
    #: Outputs per thread along each edge (1 or 2).
    outputs_edge: int = 1
    #: Static shared memory in floats per tile² (2: one tile of A, one of B).
    shared_floats_per_tile2: int = 0
    #: For kernels whose block does not depend on the tile (the tile is
    #: ignored): (BM, BN, TM, TN), C rows and columns per block and per
    #: thread, with (BM/TM)·(BN/TN) threads in a 1-D block.
    block_tile: tuple[int, int, int, int] | None = None
    #: Their static shared memory in bytes.
    fixed_shared_bytes: int = 0
    #: Dynamic shared memory each block is launched with (``extern __shared__``); the
    #: launcher raises the function's limit to it (past 48 KiB needs the opt-in).
    dynamic_shared_bytes: int = 0
    #: Blocks per thread-block cluster along x (1: no clusters). The grid's x is padded to a multiple of it:
    #: a padded block has no C columns of its own but still takes its part in its cluster's shared copies.
    cluster_x: int = 1
    #: Devices (``sm_90``) on which it is built for the architecture-specific target (``sm_90a``), whose
    #: instructions (wgmma) only that architecture has; elsewhere it is built for the device as it is.
    arch_specific: tuple[str, ...] = ()
    #: The build that replaces this one on an nvcc target (``sm_90a``: tc1's TMA build), by target: the one
    #: home of per-architecture macros (:meth:`for_arch`). Elsewhere, and where the operands do not suit it
    #: (:attr:`fallback`), this spec's own build runs.
    arch_variants: tuple[tuple[str, Variant], ...] = ()
    #: The operand maps of a TMA build (None: the common argument list, pointers and strides).
    tensor_maps: TensorMaps | None = None
    #: What a build chosen by :meth:`for_arch` falls back to where its operands do not suit it (a TMA
    #: build: A or B not 16-byte aligned); None for every other build.
    fallback: KernelSpec | None = None
    #: The oldest GPU that can run it (8.0: TF32 tensor cores); older ones are refused before launch.
    min_compute_capability: tuple[int, int] = (0, 0)
    #: What that capability brings, for the refusal ("TF32 tensor cores").
    requirement: str = ""
    #: The arithmetic its products carry (one of :data:`PRECISIONS`): ``fp32`` (fp32-class error), or
    #: ``tf32`` (operands rounded to TF32's 10-bit mantissa: relative error near 3e-4, which `mmd
    #: check`'s fp32 tolerance refuses).
    precision: str = "fp32"
    #: Whether its bytes are printf's of the fp32 product wherever that product is exact (C = I·B, or
    #: sums of ties such as 0.125 that fp32 holds exactly): every FMA kernel, cuBLAS SGEMM and numpy
    #: are. The tensor-core kernels are not: tc3, fp32-class in error, may print 0.13 where printf of
    #: the exact product prints 0.12 (docs/tensorcores.md).
    exact: bool = True
    #: ``-D`` macros this spec is compiled with (part of the compile-cache key).
    macros: tuple[tuple[str, int], ...] = ()
    #: Parameter sets chosen per shape class (:meth:`for_shape`); empty: one build.
    variants: tuple[Variant, ...] = ()
    #: The label of the variant this spec was resolved to, if any.
    variant: str | None = None
    #: Whether the course's benchmark plan runs it by default; the tensor-core rung and cuBLAS's
    #: TF32 mode are the ladder plan's (``mmd bench --plan ladder``), so the course's graphs keep
    #: the kernels the course teaches.
    course: bool = True

    def for_shape(self, m: int, n: int, limits: DeviceLimits) -> KernelSpec:
        """The spec to launch for an m×n C on this device: the variant its shape class calls for.

        The class → variant choice comes from ``kernels/<name>.tune.yaml`` for
        this GPU when the autotuner recorded one (``benchmarks/sgemm_ladder.py``),
        else from each variant's default classes.
        """
        if not self.variants:
            return self
        cls = shape_class(m, n, limits.multiprocessors)
        wanted = tuning(self.name).get(limits.name, {}).get(cls)
        chosen = next((v for v in self.variants if v.label == wanted), None)
        if chosen is None:
            chosen = next((v for v in self.variants if cls in v.classes), self.variants[0])
        return self.with_variant(chosen)

    def with_variant(self, variant: Variant) -> KernelSpec:
        """This kernel built with ``variant``'s macros and geometry."""
        return dataclasses.replace(
            self,
            macros=variant.macros,
            block_tile=variant.block_tile,
            fixed_shared_bytes=variant.shared_bytes,
            dynamic_shared_bytes=variant.dynamic_shared_bytes,
            cluster_x=variant.cluster_x,
            tensor_maps=variant.tensor_maps,
            variants=(),
            variant=variant.label,
        )

    def for_arch(self, device_arch: str) -> KernelSpec:
        """The build to compile on a device of ``device_arch``: the variant :attr:`arch_variants` names for its
        nvcc target (its :attr:`fallback` this spec), or this spec."""
        chosen = dict(self.arch_variants).get(self.arch_for(device_arch))
        if chosen is None:
            return self
        fallback = dataclasses.replace(self, arch_variants=())
        return dataclasses.replace(fallback.with_variant(chosen), fallback=fallback)

    def builds(self) -> tuple[KernelSpec, ...]:
        """Every distinct build of this kernel: one per variant, or itself."""
        return tuple(self.with_variant(v) for v in self.variants) or (self,)

    @property
    def source(self) -> Path | None:
        """The absolute path of the ``.cu`` file, or None."""
        return kernels_dir() / self.source_file if self.source_file else None

    def arch_for(self, device_arch: str) -> str:
        """nvcc's target for this kernel on a device of ``device_arch`` (``sm_90`` → ``sm_90a`` where asked)."""
        return device_arch + "a" if device_arch in self.arch_specific else device_arch

    def defines(self, tile: int) -> dict[str, int]:
        """The ``-D`` macros of a build at ``tile``: ``TILE`` where the tile shapes the block, and the variant's."""
        return {**({"TILE": tile} if self.uses_tile else {}), **dict(self.macros)}

    @property
    def on_gpu(self) -> bool:
        """Whether this entry runs on the CUDA backend."""
        return self.kind in (SOURCE, LIBRARY)

    @property
    def compiled(self) -> bool:
        """Whether this entry is a ``.cu`` file compiled at run time."""
        return self.kind == SOURCE

    @property
    def uses_tile(self) -> bool:
        """Whether the tile changes the launch (compiled kernels without a fixed block)."""
        return self.kind == SOURCE and self.block_tile is None

    @property
    def outputs_per_thread(self) -> int:
        """Elements of C each thread computes."""
        if self.block_tile is not None:
            _, _, tm, tn = self.block_tile
            return tm * tn
        return self.outputs_edge * self.outputs_edge

    def block(self, tile: int) -> tuple[int, int, int]:
        """Block dimensions (x, y, z) in threads."""
        if self.block_tile is not None:
            bm, bn, tm, tn = self.block_tile
            return ((bm // tm) * (bn // tn), 1, 1)
        return (tile, tile, 1)

    def block_shape(self, tile: int) -> tuple[int, int]:
        """Rows and columns of C one block covers."""
        if self.block_tile is not None:
            bm, bn, _, _ = self.block_tile
            return (bm, bn)
        edge = tile * self.outputs_edge
        return (edge, edge)

    def grid(self, m: int, n: int, tile: int) -> tuple[int, int, int]:
        """Grid dimensions (x over C's columns, y over its rows) for an m×n C; x a whole number of clusters."""
        rows, cols = self.block_shape(tile)
        return (_ceil_div(n, cols * self.cluster_x) * self.cluster_x, _ceil_div(m, rows), 1)

    def threads_per_block(self, tile: int) -> int:
        """Threads in one block."""
        x, y, z = self.block(tile)
        return x * y * z

    def shared_bytes(self, tile: int) -> int:
        """Static shared memory of one block in bytes."""
        if self.block_tile is not None:
            return self.fixed_shared_bytes
        return self.shared_floats_per_tile2 * tile * tile * FLOAT_BYTES


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


@functools.cache
def tuning(name: str) -> dict[str, dict[str, str]]:
    """``kernels/<name>.tune.yaml`` as GPU name → shape class → variant label (empty without a file).

    The autotuner (``benchmarks/sgemm_ladder.py``) writes it. An entry whose
    label names no variant of the kernel is a KernelError: a silent fall back
    would hide a tuning that never applies.
    """
    path = kernels_dir() / f"{name}.tune.yaml"
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as exc:
        raise KernelError(f"{path.name} cannot be read: {exc}") from None
    spec = REGISTRY.get(name)
    labels = {v.label for v in spec.variants} if spec is not None else set()
    out: dict[str, dict[str, str]] = {}
    for gpu, classes in (data or {}).items():
        if not isinstance(classes, dict):
            continue
        for cls, chosen in classes.items():
            if not isinstance(chosen, dict) or "params" not in chosen:
                continue  # notes beside the choices (the shape-class rule, measurements)
            label = str(chosen["params"])
            if label not in labels:
                raise KernelError(
                    f"{path.name}: {gpu} {cls} names variant {label!r}, which {name} does not have "
                    f"(its variants: {', '.join(sorted(labels)) or 'none'})",
                    details={"kernel": name, "variant": label},
                )
            out.setdefault(str(gpu), {})[str(cls)] = label
    return out


def get(name: str) -> KernelSpec:
    """The spec of kernel ``name``; KernelError naming the choices otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KernelError(
            f"unknown kernel {name!r}; choose one of {', '.join(NAMES)}",
            details={"kernel": name, "choices": list(NAMES)},
        ) from None


def check_tile(tile: object) -> int:
    """``tile`` as a whole number from 1 to :data:`MAX_TILE`, or TileError: the one check of a tile setting.

    Whether a device can launch it is :func:`check_launch`'s question.
    """
    if isinstance(tile, bool) or not isinstance(tile, int) or not 1 <= tile <= MAX_TILE:
        raise TileError(f"tile {tile!r} must be a whole number from 1 to {MAX_TILE}", details={"tile": tile})
    return tile


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


def check_block(
    what: str,
    name: str,
    threads: int,
    shared: int,
    dynamic_shared: int,
    limits: DeviceLimits,
    *,
    registers_per_thread: int | None = None,
    details: dict[str, object] | None = None,
) -> None:
    """Raise TileError when a block of ``threads`` threads with ``shared`` bytes of static and ``dynamic_shared``
    of dynamic shared memory (and ``registers_per_thread``, where known) cannot be launched under ``limits``.

    ``what`` is what asked for the block in the message (``tile 64``), ``name`` the kernel's name. The one
    home of these limits, for the registry's kernels (:func:`check_launch`) and kernel files alike.
    """
    details = dict(details or {})
    if threads > limits.max_threads_per_block:
        raise TileError(
            f"{what} needs {threads} threads per block; {limits.allows} {limits.max_threads_per_block}",
            details={**details, "threads": threads, "limit": limits.max_threads_per_block},
        )
    total = shared + dynamic_shared
    allowed = max(limits.max_shared_optin, limits.max_shared_per_block) if dynamic_shared else 0
    if shared > limits.max_shared_per_block or total > max(allowed, limits.max_shared_per_block):
        limit = max(allowed, limits.max_shared_per_block)
        raise TileError(
            f"{what} needs {total} bytes of shared memory per block for {name}; {limits.allows} {limit}",
            details={**details, "shared_bytes": total, "limit": limit},
        )
    if registers_per_thread is not None:
        registers = registers_per_thread * threads
        if registers > limits.max_registers_per_block:
            raise TileError(
                f"{what} needs {registers} registers per block "
                f"({registers_per_thread} per thread) for {name}; "
                f"{limits.allows} {limits.max_registers_per_block}",
                details={**details, "registers": registers, "limit": limits.max_registers_per_block},
            )


def check_grid(kernel: str | KernelSpec, m: int, n: int, tile: int, limits: DeviceLimits) -> None:
    """Raise TileError when an m×n output needs more blocks than the grid allows."""
    spec = kernel if isinstance(kernel, KernelSpec) else get(kernel)
    if not spec.compiled:
        return
    check_grid_dims(spec.name, m, n, tile, spec.grid(m, n, tile), limits)


def check_grid_dims(name: str, m: int, n: int, tile: int, grid: tuple[int, int, int], limits: DeviceLimits) -> None:
    """Raise TileError when ``grid`` (an m×n output's blocks for kernel ``name`` at ``tile``) passes the device's."""
    gx, gy, _ = grid
    if gx > limits.max_grid_x or gy > limits.max_grid_y:
        raise TileError(
            f"a {m}×{n} result with {name} at tile {tile} needs a {gx}×{gy} grid of blocks; "
            f"{limits.allows} {limits.max_grid_x}×{limits.max_grid_y}",
            details={"kernel": name, "tile": tile, "grid": [gx, gy]},
        )
