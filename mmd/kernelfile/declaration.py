"""The declaration: one vocabulary for what a kernel takes and how it is launched, read from YAML.

A declaration sits in a kernel file's header comment, under a line ``mmd:``, or in a same-stem
``NAME.kernel.yaml`` beside a file its author cannot edit. Sizes are expressions in the tile ``T``
and in the declaration's own ``defines`` and ``template`` names (``2*T``, ``BM*BN/(TM*TN)``,
``2 if DOUBLE_BUFFER else 1``); a kernel with no declaration is one thread per output in T×T blocks over
(columns, rows), its sizes multiples of T. mmd's own kernels (``kernels/*.cu``) are declared in the same
vocabulary, with the fields only they may use (:data:`OWN_KEYS`: their place in the registry, their
description, architecture and shape-class variants, tensor maps, clusters): :mod:`mmd.kernels` builds
its entries from them. docs/kernels.md ("Writing a kernel mmd can run") shows each field.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import yaml

from ..errors import KernelFileError
from .roles import ROLES

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .lexer import Lexed

#: The arithmetic a kernel's product has: ``fp32`` (fp32 operands, fp32 sums, or better: tc3's
#: 3xTF32) or ``tf32`` (operands rounded to TF32's 10 mantissa bits on the tensor cores).
#: The bench checks each against its own tolerance; a ``tf32`` LIBRARY entry is cuBLAS in its
#: TF32 tensor-core math mode.
PRECISIONS: tuple[str, ...] = ("fp32", "tf32")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_BINARY: dict[type[ast.operator], str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//"}
_COMPARE: dict[type[ast.cmpop], Callable[[int, int], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}  # fmt: skip
_GRAMMAR = "integers, names, + - * /, comparisons, and/or/not, X if C else Y and brackets"
#: The grid's axes, what each may walk.
AXES = ("columns", "rows")


@functools.cache
def _parse(text: str) -> ast.expr:
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError(f"{text!r} is not an expression of T ({_GRAMMAR})") from None
    for node in ast.walk(tree):
        ok = isinstance(node, ast.Name | ast.BinOp | ast.UnaryOp | ast.BoolOp | ast.Compare | ast.IfExp | ast.Load)
        ok = ok or type(node) in _BINARY or type(node) in _COMPARE
        ok = ok or isinstance(node, ast.USub | ast.Not | ast.And | ast.Or)
        ok = ok or (isinstance(node, ast.Constant) and type(node.value) is int)
        if not ok:
            raise ValueError(f"{text!r} is not an expression of T ({_GRAMMAR})")
    return tree


@dataclass(frozen=True)
class Expr:
    """An integer expression of the tile ``T`` and declared names; C's integer division, 1 for true."""

    text: str

    def __post_init__(self) -> None:
        _parse(self.text)

    @classmethod
    def of(cls, value: object) -> Expr:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"{value!r} is not a whole number or an expression of T")
        return cls(str(value))

    @property
    def names(self) -> frozenset[str]:
        return frozenset(n.id for n in ast.walk(_parse(self.text)) if isinstance(n, ast.Name))

    def value(self, env: Mapping[str, int]) -> int:
        return _evaluate(_parse(self.text), env, self.text)


def _evaluate(node: ast.expr, env: Mapping[str, int], text: str) -> int:
    if isinstance(node, ast.Constant):
        assert isinstance(node.value, int)
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, env, text)
        return int(not operand) if isinstance(node.op, ast.Not) else -operand
    if isinstance(node, ast.BoolOp):
        result = 0
        for part in node.values:  # Python's short circuit: the deciding value
            result = _evaluate(part, env, text)
            if bool(result) != isinstance(node.op, ast.And):
                break
        return result
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, env, text)
        for relation, comparator in zip(node.ops, node.comparators, strict=True):
            right = _evaluate(comparator, env, text)
            if not _COMPARE[type(relation)](left, right):
                return 0
            left = right
        return 1
    if isinstance(node, ast.IfExp):
        return _evaluate(node.body if _evaluate(node.test, env, text) else node.orelse, env, text)
    assert isinstance(node, ast.BinOp)
    left, right = _evaluate(node.left, env, text), _evaluate(node.right, env, text)
    op = _BINARY[type(node.op)]
    if op in ("/", "//"):
        if right == 0:
            raise ValueError(f"{text} divides by zero at {dict(env)}")
        return abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
    return {"+": left + right, "-": left - right, "*": left * right}[op]


def _exprs(value: object, what: str, count: tuple[int, ...]) -> tuple[Expr, ...]:
    items = value if isinstance(value, list | tuple) else [value]
    if len(items) not in count:
        raise ValueError(f"{what} takes {' or '.join(map(str, count))} values, got {len(items)}")
    return tuple(Expr.of(v) for v in items)


def _named(value: object, what: str) -> tuple[tuple[str, Expr], ...]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} is a mapping of names to values (BM: 128)")
    out = []
    for key, v in value.items():
        if not isinstance(key, str) or not _NAME.match(key):
            raise ValueError(f"{what}: {key!r} is not a name")
        out.append((key, Expr.of(v)))
    return tuple(out)


def _texts(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} is a list of names")
    return tuple(value)


T = Expr("T")
ONE = Expr("1")
ZERO = Expr("0")


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
    swizzle: Expr = Expr("128")
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
            if name is not None and not _NAME.match(name):
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
            if not _NAME.match(name) or name in own or name in ("T", self.tile_macro):
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
            self.cluster_x, *(cond for cond, _ in self.requires), *maps,
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
        return rows * cols // self.threads_per_block(tile)

    def cluster(self, tile: int) -> int:
        """Blocks per cluster along grid x at ``tile``."""
        return self.cluster_x.value(self.env(tile))

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
        threads, outputs = self.threads_per_block(tile), self.outputs(tile)
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
    "cluster_x", "tensor_maps", "variants", "arch_variants",
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


def from_mapping(data: object, origin: str, own: bool = False) -> Declaration:
    """A declaration from parsed YAML; KernelFileError naming ``origin`` and the field at fault.

    ``own``: one of mmd's own kernels, which may set :data:`OWN_KEYS`; anyone else's file is refused them.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise KernelFileError(f"{origin}: a declaration is a mapping of {', '.join(KEYS)}", {"origin": origin})
    unknown = [str(k) for k in data if k not in KEYS]
    if unknown:
        raise KernelFileError(
            f"{origin}: declaration has no field {', '.join(unknown)} (fields: {', '.join(KEYS)})", {"origin": origin}
        )
    theirs = [str(k) for k in data if k in OWN_KEYS] if not own else []
    if theirs:
        raise KernelFileError(
            f"{origin}: declaration {', '.join(theirs)}: for mmd's own kernels only (kernels/*.cu)",
            {"origin": origin, "field": theirs[0]},
        )
    values: dict[str, Any] = {}
    key = ""
    try:
        for key, value in data.items():
            values[key] = _field(key, value)
        return Declaration(**values, origin=origin)
    except ValueError as exc:
        where = f"{key}: " if key and not str(exc).startswith(key) else ""
        raise KernelFileError(f"{origin}: declaration {where}{exc}", {"origin": origin, "field": key}) from None


def _field(key: str, value: object) -> object:
    if key in ("entry", "tile_macro"):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{value!r} is not a name")
        return value
    if key in ("description", "needs"):
        if not isinstance(value, str):
            raise ValueError("is one line of text")
        return value
    if key == "arguments":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("a list of roles, one per parameter in order ([A, B, C, width])")
        return tuple(value)
    if key == "block":
        exprs = _exprs(value, key, (1, 2, 3))
        return (*exprs, *(ONE,) * (3 - len(exprs)))
    if key == "block_tile":
        return _exprs(value, key + " (rows, columns, depth)", (3,))
    if key == "thread_tile":
        return _exprs(value, key + " (rows, columns)", (2,))
    if key in ("outputs_per_thread", "shared_bytes", "dynamic_shared_bytes", "cluster_x"):
        return None if value is None and key in ("outputs_per_thread", "shared_bytes") else Expr.of(value)
    if key == "grid":
        if not isinstance(value, list) or len(value) != 2:
            raise ValueError("[columns, rows] or [rows, columns]")
        return tuple(value)
    if key in ("template", "defines"):
        return _named(value, key)
    if key in ("arch_specific", "switches"):
        return _texts(value, key)
    if key == "min_compute_capability":
        return tuple(value) if isinstance(value, list) else (value,)
    if key == "requires":
        if not isinstance(value, Mapping) or not all(isinstance(r, str) for r in value.values()):
            raise ValueError("is a mapping of conditions to the reason each gives where it fails")
        return tuple((Expr.of(cond), reason) for cond, reason in value.items())
    if key == "tensor_maps":
        return _maps(value)
    if key == "variants":
        if not isinstance(value, list):
            raise ValueError("is a list of variants ({label: NAME, classes: [small], defines: {BM: 64}})")
        return tuple(_variant(v, classes=True) for v in value)
    if key == "arch_variants":
        if not isinstance(value, Mapping) or not all(isinstance(t, str) for t in value):
            raise ValueError("is a mapping of nvcc targets to variants (sm_90a: {label: NAME, defines: {...}})")
        return tuple((target, _variant(v, classes=False)) for target, v in value.items())
    return value  # multiples, exact, course, rung, precision: checked by the dataclass


def _variant(value: object, classes: bool) -> VariantDeclaration:
    keys = ("label", "defines", "classes") if classes else ("label", "defines")
    if not isinstance(value, Mapping) or not isinstance(value.get("label"), str) or set(value) - set(keys):
        raise ValueError(f"a variant is a mapping of {', '.join(keys)}, with a label")
    return VariantDeclaration(
        label=value["label"],
        defines=_named(value.get("defines", {}), "defines"),
        classes=_texts(value.get("classes", []), "classes"),
    )


def _maps(value: object) -> TensorMapsDeclaration:
    keys = ("a_box", "b_box", "when", "swizzle", "tf32")
    if not isinstance(value, Mapping) or set(value) - set(keys) or not {"a_box", "b_box"} <= set(value):
        raise ValueError(f"is a mapping of {', '.join(keys)}, with a_box and b_box")
    a_rows, a_cols = _exprs(value["a_box"], "a_box (rows, columns)", (2,))
    b_rows, b_cols = _exprs(value["b_box"], "b_box (rows, columns)", (2,))
    return TensorMapsDeclaration(
        a_box=(a_rows, a_cols),
        b_box=(b_rows, b_cols),
        when=Expr.of(value.get("when", 1)),
        swizzle=Expr.of(value.get("swizzle", 128)),
        tf32=Expr.of(value.get("tf32", 0)),
    )


def parse_yaml(text: str, origin: str) -> Declaration:
    """A declaration from a ``NAME.kernel.yaml``'s text (anyone's: :data:`OWN_KEYS` are refused)."""
    return from_mapping(_load(text, origin), origin)


_MMD_LINE = re.compile(r"(\s*)mmd:(.*)\Z")


def in_comments(lexed: Lexed, file: str, own: bool = False) -> Declaration | None:
    """The declaration under a ``mmd:`` line of a comment, or None; two such comments are refused."""
    return _declared(((c.text, c.line, c.style) for c in lexed.comments), file, own)


def in_header(text: str, file: str) -> Declaration | None:
    """The declaration in the block comment ``text`` opens with: one of mmd's own kernels (``kernels/*.cu``),
    whose declaration may set :data:`OWN_KEYS`. The registry reads every kernel's on each start, so that
    comment is taken as it stands, not lexed: mmd's own files need no guard against a comment read two ways."""
    end = text.find("*/")
    if not text.startswith("/*") or end < 0:
        return None
    return _declared([(text[2:end], 1, "/*")], file, own=True)


def _declared(comments: Iterable[tuple[str, int, str]], file: str, own: bool) -> Declaration | None:
    """The declaration in ``comments`` (each its text, first line and style)."""
    found: list[tuple[str, int]] = []
    for text, first, style in comments:
        lines = _undecorated(text, style)
        for offset, line in enumerate(lines):
            head = _MMD_LINE.match(line)
            if head is None:
                continue
            indent = len(head.group(1))
            body = [line[indent:]]
            for more in lines[offset + 1 :]:
                if more.strip() and len(more) - len(more.lstrip()) <= indent:
                    break
                body.append(more[indent:] if more.strip() else "")
            found.append(("\n".join(body), first + offset))
    if not found:
        return None
    if len(found) > 1:
        shown = ", ".join(str(at) for _, at in found)
        raise KernelFileError(f"{file}: two declarations (mmd: on lines {shown}); keep one", {"file": file})
    text, at = found[0]
    origin = f"{file}:{at}"
    data = _load(text, origin)
    return from_mapping(data.get("mmd") if isinstance(data, dict) else data, origin, own)


#: libyaml's loader where PyYAML has it: the registry parses every kernel's declaration on each start.
_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


def _load(text: str, origin: str) -> object:
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) and exc.problem else "not valid YAML"
        raise KernelFileError(f"{origin}: declaration is not valid YAML ({problem})", {"origin": origin}) from None


def _strip_slashes(text: str) -> str:
    return text[1:] if text.startswith(" ") else text


def _undecorated(text: str, style: str) -> list[str]:
    """A comment's lines without its markers: ``// `` and a leading `` * `` column of a block comment."""
    lines = text.split("\n")
    if style == "//":
        return [_strip_slashes(line) for line in lines]
    starred = [ln for ln in lines[1:] if ln.strip() and ln.strip() != "*"]
    if starred and all(re.match(r"\s*\*(?!/)", ln) for ln in starred):
        lines = [lines[0], *(re.sub(r"^\s*\* ?", "", ln) if ln.strip() else "" for ln in lines[1:])]
    return lines
