"""The one kernel registry: every way mmd can multiply, and how to launch it.

Each :class:`KernelSpec` says where a kernel's source is (``kernels/<name>.cu``),
its entry symbol, a one-line description, and its launch geometry as functions
of the output size and the tile: block and grid dimensions, outputs per thread,
threads per block and static shared memory. The CLI choices, the benchmark
loop, the graph labels, the docs and the tests all read kernel names and facts
from here; nothing about a kernel is written twice.

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

#: The folder holding the ``.cu`` files (``<repo>/kernels``).
KERNELS_DIR: Path = Path(__file__).resolve().parent.parent / "kernels"

#: Tiles the course asks about (and the benchmark loops over). Other tiles are
#: not refused here: :func:`check_launch` refuses what the device cannot launch
#: (tile 64: 4096 threads per block).
TILES: tuple[int, ...] = (4, 8, 16, 32)

#: Bytes in one matrix element (float32).
FLOAT_BYTES = 4

#: Kinds of registry entries: a CUDA C source compiled at run time, a library
#: call (cuBLAS) on the GPU, or the host (numpy) backend.
SOURCE, LIBRARY, HOST = "source", "library", "host"


@dataclass(frozen=True)
class DeviceLimits:
    """What a device allows one block; read from the device by :mod:`mmd.gpu`."""

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
    """A compile-time parameter set of a fixed-block kernel (``-D`` macros and its geometry)."""

    label: str
    macros: tuple[tuple[str, int], ...]
    #: (BM, BN, TM, TN) as in :attr:`KernelSpec.block_tile`.
    block_tile: tuple[int, int, int, int]
    shared_bytes: int
    #: Shape classes this variant serves unless a tuning file says otherwise.
    classes: tuple[str, ...]


@dataclass(frozen=True)
class KernelSpec:
    """One registry entry.

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
    #: ``-D`` macros this spec is compiled with (part of the compile-cache key).
    macros: tuple[tuple[str, int], ...] = ()
    #: Parameter sets chosen per shape class (:meth:`for_shape`); empty: one build.
    variants: tuple[Variant, ...] = ()
    #: The label of the variant this spec was resolved to, if any.
    variant: str | None = None

    def for_shape(self, m: int, n: int, limits: DeviceLimits) -> KernelSpec:
        """The spec to launch for an m×n C on this device: the variant its shape class calls for.

        The class → variant choice comes from ``kernels/<name>.tune.yaml`` for
        this GPU when the autotuner recorded one (``benchmarks/sgemm_ladder.py``),
        else from each variant's default classes.
        """
        if not self.variants:
            return self
        cls = shape_class(m, n, limits.multiprocessors)
        wanted = _tuned_label(self.name, limits.name, cls)
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
            variants=(),
            variant=variant.label,
        )

    def builds(self) -> tuple[KernelSpec, ...]:
        """Every distinct build of this kernel: one per variant, or itself."""
        return tuple(self.with_variant(v) for v in self.variants) or (self,)

    @property
    def source(self) -> Path | None:
        """The absolute path of the ``.cu`` file, or None."""
        return KERNELS_DIR / self.source_file if self.source_file else None

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
        """Grid dimensions (x over C's columns, y over its rows) for an m×n C."""
        rows, cols = self.block_shape(tile)
        return (_ceil_div(n, cols), _ceil_div(m, rows), 1)

    def threads_per_block(self, tile: int) -> int:
        """Threads in one block."""
        x, y, z = self.block(tile)
        return x * y * z

    def shared_bytes(self, tile: int) -> int:
        """Static shared memory of one block in bytes."""
        if self.block_tile is not None:
            return self.fixed_shared_bytes
        return self.shared_floats_per_tile2 * tile * tile * FLOAT_BYTES


_SPECS: tuple[KernelSpec, ...] = (
    KernelSpec(
        name="naive",
        kind=SOURCE,
        description="one thread per output, operands from global memory",
        source_file="naive.cu",
        entry="mmd_naive",
    ),
    KernelSpec(
        name="tiled",
        kind=SOURCE,
        description="shared-memory tiles of A and B, one output per thread",
        source_file="tiled.cu",
        entry="mmd_tiled",
        shared_floats_per_tile2=2,
    ),
    KernelSpec(
        name="prefetch",
        kind=SOURCE,
        description="tiled, with the next tile prefetched into registers",
        source_file="prefetch.cu",
        entry="mmd_prefetch",
        shared_floats_per_tile2=2,
    ),
    KernelSpec(
        name="coarse",
        kind=SOURCE,
        description="tiled, four outputs (2×2) per thread",
        source_file="coarse.cu",
        entry="mmd_coarse",
        outputs_edge=2,
        shared_floats_per_tile2=8,
    ),
    KernelSpec(
        name="aplus",
        kind=SOURCE,
        description="A+: four outputs per thread, prefetch interleaved with the partial products",
        source_file="aplus.cu",
        entry="mmd_aplus",
        outputs_edge=2,
        shared_floats_per_tile2=8,
    ),
    KernelSpec(
        name="blocktile2d",
        kind=SOURCE,
        description="2-D block tiling: 128×128 C per block, 8×8 outputs per thread (tile ignored)",
        source_file="blocktile2d.cu",
        entry="mmd_blocktile2d",
        block_tile=(128, 128, 8, 8),
        fixed_shared_bytes=(128 * 8 + 8 * 128) * FLOAT_BYTES,
    ),
    KernelSpec(
        name="vectorized",
        kind=SOURCE,
        description="blocktile2d with 16-byte loads and stores and A's slab transposed (tile ignored)",
        source_file="vectorized.cu",
        entry="mmd_vectorized",
        block_tile=(128, 128, 8, 8),
        fixed_shared_bytes=(8 * (128 + 4) + 8 * 128) * FLOAT_BYTES,
    ),
    KernelSpec(
        name="fast",
        kind=SOURCE,
        description="warp-tiled, double-buffered SGEMM with 16-byte accesses (tile ignored)",
        source_file="fast.cu",
        entry="mmd_fast",
        # The file's defaults: BM 128, BN 256, BK 16, 8×16 outputs per thread,
        # two shared-memory stages of BK·(BM + BN) floats.
        block_tile=(128, 256, 8, 16),
        fixed_shared_bytes=2 * 16 * (128 + 256) * FLOAT_BYTES,
        variants=(
            Variant(
                label="128x256x16_reg_t8x16_pad0",
                macros=(),
                block_tile=(128, 256, 8, 16),
                shared_bytes=2 * 16 * (128 + 256) * FLOAT_BYTES,
                classes=("medium", "large"),
            ),
            Variant(
                label="64x64x16_t4x8_reg",
                macros=(("BM", 64), ("BN", 64), ("BK", 16), ("TM", 4), ("TN", 8), ("WTM", 4),
                        ("MIN_BLOCKS", 1), ("A_PAD", 4)),
                block_tile=(64, 64, 4, 8),
                shared_bytes=2 * 16 * (64 + 4 + 64) * FLOAT_BYTES,
                classes=("small",),
            ),
        ),
    ),
    KernelSpec(
        name="cublas",
        kind=LIBRARY,
        description="cuBLAS SGEMM (the vendor library, for reference)",
    ),
    KernelSpec(
        name="cpu",
        kind=HOST,
        description="numpy float32 matmul on the host",
    ),
)

#: name → spec, in ladder order (naive first, cpu last).
REGISTRY: dict[str, KernelSpec] = {spec.name: spec for spec in _SPECS}

#: Every registered name, in ladder order.
NAMES: tuple[str, ...] = tuple(REGISTRY)

#: Names of the compiled kernels (those with a ``.cu`` file).
SOURCE_KERNELS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.kind == SOURCE)

#: Names the CUDA backend accepts (compiled kernels and cublas).
GPU_KERNELS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.on_gpu)


@functools.cache
def _tuning(name: str) -> dict:
    """``kernels/<name>.tune.yaml``: GPU name → shape class → chosen parameter set."""
    path = KERNELS_DIR / f"{name}.tune.yaml"
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _tuned_label(name: str, gpu: str, cls: str) -> str | None:
    entry = _tuning(name).get(gpu, {})
    chosen = entry.get(cls) if isinstance(entry, dict) else None
    return chosen.get("params") if isinstance(chosen, dict) else None


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

    Checks, in order: the tile is a positive integer (where the kernel uses
    it); threads per block; static shared memory per block; registers per
    block when ``registers_per_thread`` is known (after compiling). cublas and
    cpu pass any tile; kernels with a fixed block are checked whatever the
    tile. Pure: reads nothing but its arguments.
    """
    spec = kernel if isinstance(kernel, KernelSpec) else get(kernel)
    if not spec.compiled:
        return
    details = {"kernel": spec.name, "tile": tile}
    if spec.uses_tile and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
        raise TileError(f"tile {tile!r} is not a positive whole number", details=details)
    what = f"tile {tile}" if spec.uses_tile else spec.name

    threads = spec.threads_per_block(tile)
    if threads > limits.max_threads_per_block:
        raise TileError(
            f"{what} needs {threads} threads per block; this GPU allows {limits.max_threads_per_block}",
            details={**details, "threads": threads, "limit": limits.max_threads_per_block},
        )
    shared = spec.shared_bytes(tile)
    if shared > limits.max_shared_per_block:
        raise TileError(
            f"{what} needs {shared} bytes of shared memory per block for {spec.name}; "
            f"this GPU allows {limits.max_shared_per_block}",
            details={**details, "shared_bytes": shared, "limit": limits.max_shared_per_block},
        )
    if registers_per_thread is not None:
        registers = registers_per_thread * threads
        if registers > limits.max_registers_per_block:
            raise TileError(
                f"{what} needs {registers} registers per block "
                f"({registers_per_thread} per thread) for {spec.name}; "
                f"this GPU allows {limits.max_registers_per_block}",
                details={**details, "registers": registers, "limit": limits.max_registers_per_block},
            )


def check_grid(kernel: str | KernelSpec, m: int, n: int, tile: int, limits: DeviceLimits) -> None:
    """Raise TileError when an m×n output needs more blocks than the grid allows."""
    spec = kernel if isinstance(kernel, KernelSpec) else get(kernel)
    if not spec.compiled:
        return
    gx, gy, _ = spec.grid(m, n, tile)
    if gx > limits.max_grid_x or gy > limits.max_grid_y:
        raise TileError(
            f"a {m}×{n} result with {spec.name} at tile {tile} needs a {gx}×{gy} grid of blocks; "
            f"this GPU allows {limits.max_grid_x}×{limits.max_grid_y}",
            details={"kernel": spec.name, "tile": tile, "grid": [gx, gy]},
        )
