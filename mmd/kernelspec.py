"""One entry of the kernel registry: a kernel's kind, source, launch geometry and builds (:class:`KernelSpec`).

A ``source`` kernel's entry is built from its declaration by :mod:`mmd.kernels`; its geometry is given as
functions of the output size and the tile: block and grid dimensions, outputs per thread, threads per
block and static shared memory. A fixed-block kernel's builds are :class:`Variant` objects, chosen per
shape class (:func:`shape_class`) and, where the autotuner measured one, by ``kernels/<name>.tune.yaml``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import KernelError
from .kernelfile.declaration import TensorMaps
from .launchlimits import DeviceLimits
from .resources import kernels_dir

#: Bytes in one matrix element (float32).
FLOAT_BYTES = 4

#: Kinds of registry entries: a CUDA C source compiled at run time, a library
#: call (cuBLAS) on the GPU, or the host (numpy) backend.
SOURCE, LIBRARY, HOST = "source", "library", "host"


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
    """A compile-time parameter set of a fixed-block kernel (``-D`` macros and its geometry), as
    :func:`mmd.kernels.variant` builds it from the kernel's declaration."""

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
    #: Threads that compute no outputs, as in :attr:`KernelSpec.producer_threads`.
    producer_threads: int = 0


@dataclass(frozen=True)
class KernelSpec:
    """One registry entry; a ``source`` kernel's, built from its declaration (:mod:`mmd.kernels`).

    For a ``source`` kernel the block is ``tile × tile`` threads and each thread
    computes ``outputs_edge × outputs_edge`` outputs, so a block covers
    ``tile·outputs_edge`` rows and columns of C; the kernel's static shared
    memory is ``shared_floats_per_tile2 · tile²`` floats.
    """

    name: str
    kind: str
    description: str
    #: File name inside ``kernels/`` (:func:`~mmd.resources.kernels_dir`); None for cublas and cpu.
    source_file: str | None = None
    #: The ``extern "C"`` symbol to launch; None for cublas and cpu.
    entry: str | None = None
    #: Outputs per thread along each edge (1 or 2).
    outputs_edge: int = 1
    #: Static shared memory in floats per tile² (2: one tile of A, one of B).
    shared_floats_per_tile2: int = 0
    #: For kernels whose block does not depend on the tile (the tile is
    #: ignored): (BM, BN, TM, TN), C rows and columns per block and per
    #: thread, with (BM/TM)·(BN/TN) threads (and :attr:`producer_threads`) in a 1-D block.
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
    #: Threads of a fixed block that compute no outputs (tc3's TMA build: the warpgroup that copies and splits
    #: the tiles), beside the (BM/TM)·(BN/TN) that do.
    producer_threads: int = 0
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
        wanted = self.tuned().get(limits.name, {}).get(cls)
        chosen = next((v for v in self.variants if v.label == wanted), None)
        if chosen is None:
            chosen = next((v for v in self.variants if cls in v.classes), self.variants[0])
        return self.with_variant(chosen)

    def tuned(self) -> dict[str, dict[str, str]]:
        """Its ``kernels/<name>.tune.yaml`` as GPU name → shape class → variant label (:func:`tuning`)."""
        return tuning(self.name, frozenset(v.label for v in self.variants))

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
            producer_threads=variant.producer_threads,
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
            return ((bm // tm) * (bn // tn) + self.producer_threads, 1, 1)
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


@functools.cache
def tuning(name: str, labels: frozenset[str]) -> dict[str, dict[str, str]]:
    """``kernels/<name>.tune.yaml`` as GPU name → shape class → variant label (empty without a file).

    The autotuner (``benchmarks/sgemm_ladder.py``) writes it. An entry whose
    label is none of ``labels`` (the kernel's variants) is a KernelError: a
    silent fall back would hide a tuning that never applies.
    """
    path = kernels_dir() / f"{name}.tune.yaml"
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as exc:
        raise KernelError(f"{path.name} cannot be read: {exc}") from None
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
