"""The declaration: one vocabulary for what a kernel takes and how it is launched.

A declaration sits in a kernel file's header comment, under a line ``mmd:``, or in a same-stem
``NAME.kernel.yaml`` beside a file its author cannot edit (:mod:`.declaring` reads it). Sizes are
expressions (:mod:`.expressions`) in the tile ``T`` and in the declaration's own ``defines`` and
``template`` names (``2*T``, ``BM*BN/(TM*TN)``, ``2 if DOUBLE_BUFFER else 1``); a kernel with no
declaration is one thread per output in T×T blocks over (columns, rows), its sizes multiples of T. mmd's
own kernels (``kernels/*.cu``) are declared in the same vocabulary, with the fields only they may use
(:data:`OWN_KEYS`: their place in the registry, their description, architecture and shape-class variants,
tensor maps, clusters): :mod:`mmd.kernels` builds its entries from them. docs/kernels.md ("Writing a
kernel mmd can run") shows each field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from .expressions import NAME, ONE, ZERO, Expr, T
from .roles import ROLES

#: The arithmetic a kernel's product has: ``fp32`` (fp32 operands, fp32 sums, or better: tc3's
#: 3xTF32) or ``tf32`` (operands rounded to TF32's 10 mantissa bits on the tensor cores).
#: The bench checks each against its own tolerance; a ``tf32`` LIBRARY entry is cuBLAS in its
#: TF32 tensor-core math mode.
PRECISIONS: tuple[str, ...] = ("fp32", "tf32")

#: The grid's axes, what each may walk.
AXES = ("columns", "rows")

#: The tensor maps' swizzle unless a declaration says otherwise: the tensor cores' pattern.
_SWIZZLE = Expr("128")


@dataclass(frozen=True)
class Requirement:
    """What sizes a kernel takes: all three equal (``square``), and multiples of its block tile."""

    square: bool = False
    rows: int = 1
    columns: int = 1
    depth: int = 1

    def __post_init__(self) -> None:
        if min(self.rows, self.columns, self.depth) < 1:
            raise ValueError(f"block tile multiples must be positive: {self}")


@dataclass(frozen=True)
class TensorMaps:
    """How a TMA build reads A and B: the box of one copy-engine load of each (rows, columns), the swizzle.

    A build with these takes ``(map_a, map_b, C, M, K, N, ldc)`` (two CUtensorMaps by value), not the
    common argument list, and is launched through :mod:`mmd.cuda.libcuda`; the copy engine reads only
    matrices whose base and row stride are 16-byte multiples.
    """

    a_box: tuple[int, int]
    b_box: tuple[int, int]
    #: The shared-memory swizzle in bytes (128: the tensor cores' pattern).
    swizzle: int = 128
    #: Whether the maps are TF32: the copy engine rounds each operand to TF32 as it loads it.
    tf32: bool = False


@dataclass(frozen=True)
class TensorMapsDeclaration:
    """``tensor_maps``: the :class:`TensorMaps` of the builds where ``when`` holds, as expressions."""

    a_box: tuple[Expr, Expr]
    b_box: tuple[Expr, Expr]
    when: Expr = ONE
    swizzle: Expr = _SWIZZLE
    tf32: Expr = ZERO

    @property
    def exprs(self) -> tuple[Expr, ...]:
        return (*self.a_box, *self.b_box, self.when, self.swizzle, self.tf32)

    def at(self, env: Mapping[str, int]) -> TensorMaps | None:
        if not self.when.value(env):
            return None
        a_rows, a_cols = (e.value(env) for e in self.a_box)
        b_rows, b_cols = (e.value(env) for e in self.b_box)
        return TensorMaps((a_rows, a_cols), (b_rows, b_cols), self.swizzle.value(env), bool(self.tf32.value(env)))


@dataclass(frozen=True)
class VariantDeclaration:
    """A build of the same file with some defines changed (``variants``, ``arch_variants``). Its geometry
    follows from its macros through the declaration's own expressions, so a variant is its changes only."""

    label: str
    #: The defines (or switches) it changes, and their values.
    defines: tuple[tuple[str, Expr], ...] = ()
    #: The shape classes it serves (``small``, ``medium``, ``large``) unless a tuning file says otherwise.
    classes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Declaration:
    """What a kernel takes and how to launch it; every field's check is here (docs/kernels.md shows each)."""

    #: The ``__global__`` function to run (needed where the file defines several).
    entry: str | None = None
    #: Each parameter's role in order (:data:`~.roles.ROLES`); None: one of the known signatures.
    arguments: tuple[str, ...] | None = None
    #: The macro mmd defines to the tile (``-DTILE_WIDTH=T``); None: the tile is not a macro.
    tile_macro: str | None = "TILE_WIDTH"
    #: Threads per block along x, y, z.
    block: tuple[Expr, Expr, Expr] = (T, T, ONE)
    #: Rows and columns of C one block covers, and how deep in K one step of it goes.
    block_tile: tuple[Expr, Expr, Expr] = (T, T, T)
    #: Outputs each thread computes; None: rows·columns of the block tile over its threads.
    outputs_per_thread: Expr | None = None
    #: Rows and columns of C each thread computes (its outputs are their product); None: not said.
    thread_tile: tuple[Expr, Expr] | None = None
    #: What grid x and grid y walk: ``[columns, rows]`` or ``[rows, columns]``.
    grid: tuple[str, str] = AXES
    #: Static shared memory per block in bytes, where it is known before compiling (the compiler tells after).
    shared_bytes: Expr | None = None
    #: Dynamic shared memory each block is launched with (``extern __shared__``).
    dynamic_shared_bytes: Expr = ZERO
    #: Template arguments by name, in the template's order.
    template: tuple[tuple[str, Expr], ...] = ()
    #: Further ``-D`` macros by name.
    defines: tuple[tuple[str, Expr], ...] = ()
    #: Conditions a build must meet (expressions of T and the defines), each with the reason given where not.
    requires: tuple[tuple[Expr, str], ...] = ()
    #: Whether the kernel needs M, N, K to be multiples of the block tile (mmd pads them); no bounds checks.
    multiples: bool = True
    #: The arithmetic of its products (one of :data:`PRECISIONS`).
    precision: str = "fp32"
    #: Whether its outputs are printf's of the fp32 product wherever that product is exact.
    exact: bool = True
    # -- mmd's own kernels only (OWN_KEYS): what the registry (mmd.kernels) reads besides the above --
    #: Its place in the registry's ladder (the order of `mmd kernels`, the bench and the graphs).
    rung: int | None = None
    #: One line on what it does (`mmd kernels` prints it).
    description: str = ""
    #: Whether the course's benchmark plan runs it by default.
    course: bool = True
    #: The oldest GPU that can run it, and what that capability brings (the refusal names it).
    min_compute_capability: tuple[int, int] = (0, 0)
    needs: str = ""
    #: Devices (``sm_90``) on which it is built for the architecture-specific target (``sm_90a``).
    arch_specific: tuple[str, ...] = ()
    #: Macros a variant may set that the file defaults itself by target (no value here).
    switches: tuple[str, ...] = ()
    #: Blocks per thread-block cluster along grid x.
    cluster_x: Expr = ONE
    #: Threads of the block that compute no outputs (a warp-specialized kernel's copying warpgroup); the others
    #: cover the block tile.
    producers: Expr = ZERO
    #: The operand maps of its TMA builds (None: the common argument list, pointers and strides).
    tensor_maps: TensorMapsDeclaration | None = None
    #: Builds chosen per shape class (mmd.kernels.KernelSpec.for_shape); empty: one build.
    variants: tuple[VariantDeclaration, ...] = ()
    #: The build that replaces the declared one on an nvcc target (``sm_90a``), by target.
    arch_variants: tuple[tuple[str, VariantDeclaration], ...] = ()
    #: Where it was read (``p1.cu:3`` or ``p1.kernel.yaml``), for messages; not part of the vocabulary.
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in (self.entry, self.tile_macro):
            if name is not None and not NAME.match(name):
                raise ValueError(f"{name!r} is not a C identifier")
        if self.arguments is not None:
            check_arguments(self.arguments)
        if sorted(self.grid) != sorted(AXES):
            raise ValueError(f"grid is [columns, rows] or [rows, columns], got {list(self.grid)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision is one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not self.cluster_x.names and self.cluster_x.value({}) < 1:
            raise ValueError(f"cluster_x is a whole number of at least 1, got {self.cluster_x.text}")
        for flag in ("multiples", "exact", "course"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} is true or false")
        if self.rung is not None and (isinstance(self.rung, bool) or not isinstance(self.rung, int)):
            raise ValueError(f"rung is a whole number, got {self.rung!r}")
        capability = self.min_compute_capability
        if len(capability) != 2 or not all(type(v) is int and v >= 0 for v in capability):
            raise ValueError(f"min_compute_capability is [major, minor], got {list(capability)}")
        if self.thread_tile is not None and self.outputs_per_thread is not None:
            raise ValueError("thread_tile and outputs_per_thread say the same: give one")
        own = {name for name, _ in self.defines} | {name for name, _ in self.template}
        if len(own) != len(self.defines) + len(self.template) or "T" in own or self.tile_macro in own:
            raise ValueError("defines and template names must differ from each other, from T and from tile_macro")
        for name in self.switches:
            if not NAME.match(name) or name in own or name in ("T", self.tile_macro):
                raise ValueError(f"switches: {name!r} is not a name apart from the defines, template, T, tile_macro")
        for name, expr in (*self.defines, *self.template):
            if expr.names - {"T"}:
                raise ValueError(f"{name}: {expr.text} may use only T")
        for expr in self._expressions():
            unknown = expr.names - own - {"T"}
            if unknown:
                raise ValueError(f"{expr.text} uses {', '.join(sorted(unknown))}, which defines and template lack")
        labels = [v.label for v in self.variants] + [v.label for _, v in self.arch_variants]
        if len(set(labels)) != len(labels):
            raise ValueError(f"variant labels must differ, got {', '.join(labels)}")
        for variant in (*self.variants, *(v for _, v in self.arch_variants)):
            self.with_defines(dict(variant.defines))

    def _expressions(self) -> tuple[Expr, ...]:
        """Every expression of the geometry (sizes, conditions, maps): what may use T and the declared names."""
        optional = tuple(e for e in (self.outputs_per_thread, self.shared_bytes) if e is not None)
        maps = self.tensor_maps.exprs if self.tensor_maps is not None else ()
        return (
            *self.block, *self.block_tile, self.dynamic_shared_bytes, *optional, *(self.thread_tile or ()),
            self.cluster_x, self.producers, *(cond for cond, _ in self.requires), *maps,
        )  # fmt: skip

    @property
    def uses_tile(self) -> bool:
        """Whether the tile changes the build or the launch."""
        every = (*self._expressions(), *(e for _, e in (*self.defines, *self.template)))
        return self.tile_macro is not None or any("T" in e.names for e in every)

    @property
    def square(self) -> bool:
        """Whether the kernel is told one size (``width``): M, K and N are padded to one."""
        return self.arguments is not None and "width" in self.arguments

    def with_defines(self, changes: Mapping[str, int | Expr]) -> Declaration:
        """This declaration with ``changes`` to its defines, a switch set after them: the build of a variant,
        whose geometry the same expressions give. ValueError naming a macro that is neither."""
        unknown = set(changes) - {name for name, _ in self.defines} - set(self.switches)
        if unknown:
            raise ValueError(f"no parameter {', '.join(sorted(unknown))}")
        new = {name: v if isinstance(v, Expr) else Expr.of(v) for name, v in changes.items()}
        kept = tuple((name, new.pop(name, expr)) for name, expr in self.defines)
        return dataclasses.replace(
            self,
            defines=kept + tuple(new.items()),
            switches=tuple(s for s in self.switches if s not in new),
            variants=(),
            arch_variants=(),
        )

    def variant(self, variant: VariantDeclaration) -> Declaration:
        """The declaration of one of its variants' builds."""
        return self.with_defines(dict(variant.defines))

    def env(self, tile: int) -> dict[str, int]:
        """The values of T, the defines and the template arguments at ``tile``."""
        base = {"T": tile}
        return {**base, **{n: e.value(base) for n, e in (*self.defines, *self.template)}}

    def defined(self, tile: int) -> dict[str, int]:
        """The defines' values at ``tile``, in their order."""
        env = self.env(tile)
        return {n: env[n] for n, _ in self.defines}

    def macros(self, tile: int) -> dict[str, int]:
        """The ``-D`` macros of a build at ``tile``: the tile macro (where the tile is one) and the defines."""
        return {**({self.tile_macro: tile} if self.tile_macro else {}), **self.defined(tile)}

    def template_arguments(self, tile: int) -> tuple[int, ...]:
        env = self.env(tile)
        return tuple(env[n] for n, _ in self.template)

    def block_dims(self, tile: int) -> tuple[int, int, int]:
        env = self.env(tile)
        x, y, z = (e.value(env) for e in self.block)
        return x, y, z

    def threads_per_block(self, tile: int) -> int:
        x, y, z = self.block_dims(tile)
        return x * y * z

    def block_shape(self, tile: int) -> tuple[int, int, int]:
        """(rows, columns, depth) of the block tile."""
        env = self.env(tile)
        rows, cols, depth = (e.value(env) for e in self.block_tile)
        return rows, cols, depth

    def thread_shape(self, tile: int) -> tuple[int, int] | None:
        """(rows, columns) of C each thread computes, where declared."""
        if self.thread_tile is None:
            return None
        env = self.env(tile)
        rows, cols = (e.value(env) for e in self.thread_tile)
        return rows, cols

    def outputs(self, tile: int) -> int:
        if self.outputs_per_thread is not None:
            return self.outputs_per_thread.value(self.env(tile))
        shape = self.thread_shape(tile)
        if shape is not None:
            return shape[0] * shape[1]
        rows, cols, _ = self.block_shape(tile)
        return rows * cols // (self.threads_per_block(tile) - self.producer_threads(tile))

    def cluster(self, tile: int) -> int:
        """Blocks per cluster along grid x at ``tile``."""
        return self.cluster_x.value(self.env(tile))

    def producer_threads(self, tile: int) -> int:
        """Threads of a block at ``tile`` that compute no outputs (:attr:`producers`)."""
        return self.producers.value(self.env(tile))

    def grid_dims(self, m: int, n: int, tile: int) -> tuple[int, int, int]:
        """Grid (x, y, z) for an m×n C: each axis walks what :attr:`grid` says; x a whole number of clusters."""
        rows, cols, _ = self.block_shape(tile)
        count = {"rows": -(-m // rows), "columns": -(-n // cols)}
        x, y = count[self.grid[0]], count[self.grid[1]]
        cluster = self.cluster(tile)
        return -(-x // cluster) * cluster, y, 1

    def static_shared(self, tile: int) -> int | None:
        return None if self.shared_bytes is None else self.shared_bytes.value(self.env(tile))

    def dynamic_shared(self, tile: int) -> int:
        return self.dynamic_shared_bytes.value(self.env(tile))

    def maps(self, tile: int) -> TensorMaps | None:
        """The build's tensor maps at ``tile`` (None: it takes pointers)."""
        return None if self.tensor_maps is None else self.tensor_maps.at(self.env(tile))

    def unmet(self, tile: int) -> str | None:
        """The reason of the first condition in :attr:`requires` the build at ``tile`` does not meet, or None."""
        env = self.env(tile)
        return next((reason for cond, reason in self.requires if not cond.value(env)), None)

    def requirement(self, tile: int) -> Requirement:
        """What sizes the kernel takes at ``tile`` (:mod:`.padding` pads to it)."""
        if not self.multiples:
            return Requirement(square=self.square)
        rows, cols, depth = self.block_shape(tile)
        return Requirement(self.square, rows, cols, depth)

    def check_tile(self, tile: int) -> None:
        """ValueError where the geometry makes no sense at ``tile``: a block, block tile or cluster size below 1,
        shared memory below 0, threads × outputs per thread not the block tile, a condition of
        :attr:`requires` not met."""
        env = self.env(tile)
        counts = (*self.block, *self.block_tile, *((self.outputs_per_thread,) if self.outputs_per_thread else ()))
        for expr in (*counts, *(self.thread_tile or ()), self.cluster_x):
            if expr.value(env) < 1:
                raise ValueError(f"at tile {tile}: {expr.text} is {expr.value(env)}; it must be at least 1")
        for bytes_ in (self.shared_bytes, self.dynamic_shared_bytes):
            if bytes_ is not None and bytes_.value(env) < 0:
                raise ValueError(f"at tile {tile}: {bytes_.text} is {bytes_.value(env)} bytes of shared memory")
        rows, cols, _ = self.block_shape(tile)
        producers = self.producer_threads(tile)
        if not 0 <= producers < self.threads_per_block(tile):
            raise ValueError(
                f"at tile {tile}: {self.producers.text} is {producers} producer threads; the block has "
                f"{self.threads_per_block(tile)}"
            )
        threads, outputs = self.threads_per_block(tile) - producers, self.outputs(tile)
        if threads * outputs != rows * cols:
            raise ValueError(
                f"at tile {tile}: {threads} threads × {outputs} outputs per thread do not cover a {rows}×{cols} "
                "block tile"
            )
        reason = self.unmet(tile)
        if reason is not None:
            raise ValueError(f"at tile {tile}: {reason}")


#: The vocabulary's keys (the dataclass's fields a declaration may set).
KEYS: tuple[str, ...] = tuple(f.name for f in fields(Declaration) if f.name != "origin")

#: The keys only mmd's own kernels (``kernels/*.cu``, read by the registry) may set: a kernel file runs once,
#: in a process of its own, through the common argument list, so none of these would mean anything there.
OWN_KEYS: tuple[str, ...] = (
    "rung", "description", "course", "min_compute_capability", "needs", "arch_specific", "switches",
    "cluster_x", "producers", "tensor_maps", "variants", "arch_variants",
)  # fmt: skip


def check_arguments(roles: tuple[str, ...]) -> None:
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ValueError(f"arguments: {', '.join(map(str, unknown))} not among {', '.join(ROLES)}")
    for role, most in (("A", 1), ("B", 1), ("C", 1), ("alpha", 1), ("beta", 1)):
        if roles.count(role) > most or (role in "ABC" and role not in roles):
            raise ValueError(f"arguments name {role} {roles.count(role)} times; it takes exactly one")
    sizes = {"M", "K", "N"} & set(roles)
    if "width" in roles and sizes:
        raise ValueError("arguments name width (a square kernel's one size) beside M, K or N")
    if "width" not in roles and sizes != {"M", "K", "N"}:
        raise ValueError("arguments must name M, K and N (or width, for a square kernel)")
