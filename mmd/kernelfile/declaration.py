"""The declaration: one vocabulary for what a kernel takes and how it is launched, read from YAML.

A declaration sits in a kernel file's header comment, under a line ``mmd:``, or in a same-stem
``NAME.kernel.yaml`` beside a file its author cannot edit. Sizes are expressions in the tile ``T``
and in the declaration's own ``defines`` and ``template`` names (``2*T``, ``BM*BN/(TM*TN)``); a kernel
with no declaration is one thread per output in T×T blocks over (columns, rows), its sizes multiples
of T. docs/kernels.md ("Writing a kernel mmd can run") shows each field.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import yaml

from ..errors import KernelFileError
from ..kernels import PRECISIONS
from .lexer import Lexed
from .padding import Requirement
from .signature import ROLES

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_BINARY: dict[type[ast.operator], str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//"}
#: The grid's axes, what each may walk.
AXES = ("columns", "rows")


@functools.cache
def _parse(text: str) -> ast.expr:
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError(f"{text!r} is not an expression of T (integers, names, + - * / and brackets)") from None
    for node in ast.walk(tree):
        ok = isinstance(node, ast.Name | ast.BinOp | ast.UnaryOp | ast.Load) or type(node) in _BINARY
        ok = ok or isinstance(node, ast.USub)
        ok = ok or (isinstance(node, ast.Constant) and type(node.value) is int)
        if not ok:
            raise ValueError(f"{text!r} is not an expression of T (integers, names, + - * / and brackets)")
    return tree


@dataclass(frozen=True)
class Expr:
    """An integer expression of the tile ``T`` and declared names; C's integer division."""

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
        return -_evaluate(node.operand, env, text)
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


T = Expr("T")
ONE = Expr("1")
ZERO = Expr("0")


@dataclass(frozen=True)
class Declaration:
    """What a kernel takes and how to launch it; every field's check is here (docs/kernels.md shows each)."""

    #: The ``__global__`` function to run (needed where the file defines several).
    entry: str | None = None
    #: Each parameter's role in order (:data:`~.signature.ROLES`); None: one of the known signatures.
    arguments: tuple[str, ...] | None = None
    #: The macro mmd defines to the tile (``-DTILE_WIDTH=T``); None: the tile is not a macro.
    tile_macro: str | None = "TILE_WIDTH"
    #: Threads per block along x, y, z.
    block: tuple[Expr, Expr, Expr] = (T, T, ONE)
    #: Rows and columns of C one block covers, and how deep in K one step of it goes.
    block_tile: tuple[Expr, Expr, Expr] = (T, T, T)
    #: Outputs each thread computes; None: rows·columns of the block tile over its threads.
    outputs_per_thread: Expr | None = None
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
    #: Whether the kernel needs M, N, K to be multiples of the block tile (mmd pads them); no bounds checks.
    multiples: bool = True
    #: Blocks per thread-block cluster along grid x.
    cluster_x: int = 1
    #: The arithmetic of its products (one of mmd.kernels.PRECISIONS).
    precision: str = "fp32"
    #: Whether its outputs are printf's of the fp32 product wherever that product is exact.
    exact: bool = True
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
        if isinstance(self.cluster_x, bool) or not isinstance(self.cluster_x, int) or self.cluster_x < 1:
            raise ValueError(f"cluster_x is a whole number of at least 1, got {self.cluster_x!r}")
        for flag in ("multiples", "exact"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} is true or false")
        own = {name for name, _ in self.defines} | {name for name, _ in self.template}
        if len(own) != len(self.defines) + len(self.template) or "T" in own or self.tile_macro in own:
            raise ValueError("defines and template names must differ from each other, from T and from tile_macro")
        for name, expr in (*self.defines, *self.template):
            if expr.names - {"T"}:
                raise ValueError(f"{name}: {expr.text} may use only T")
        for expr in self._sizes():
            unknown = expr.names - own - {"T"}
            if unknown:
                raise ValueError(f"{expr.text} uses {', '.join(sorted(unknown))}, which defines and template lack")

    def _sizes(self) -> tuple[Expr, ...]:
        optional = tuple(e for e in (self.outputs_per_thread, self.shared_bytes) if e is not None)
        return (*self.block, *self.block_tile, self.dynamic_shared_bytes, *optional)

    @property
    def uses_tile(self) -> bool:
        """Whether the tile changes the build or the launch."""
        every = (*self._sizes(), *(e for _, e in (*self.defines, *self.template)))
        return self.tile_macro is not None or any("T" in e.names for e in every)

    @property
    def square(self) -> bool:
        """Whether the kernel is told one size (``width``): M, K and N are padded to one."""
        return self.arguments is not None and "width" in self.arguments

    def env(self, tile: int) -> dict[str, int]:
        """The values of T, the defines and the template arguments at ``tile``."""
        base = {"T": tile}
        return {**base, **{n: e.value(base) for n, e in (*self.defines, *self.template)}}

    def macros(self, tile: int) -> dict[str, int]:
        """The ``-D`` macros of a build at ``tile``: the tile macro (where the tile is one) and the defines."""
        env = self.env(tile)
        own = {n: env[n] for n, _ in self.defines}
        return {**({self.tile_macro: tile} if self.tile_macro else {}), **own}

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

    def outputs(self, tile: int) -> int:
        if self.outputs_per_thread is not None:
            return self.outputs_per_thread.value(self.env(tile))
        rows, cols, _ = self.block_shape(tile)
        return rows * cols // self.threads_per_block(tile)

    def grid_dims(self, m: int, n: int, tile: int) -> tuple[int, int, int]:
        """Grid (x, y, z) for an m×n C: each axis walks what :attr:`grid` says; x a whole number of clusters."""
        rows, cols, _ = self.block_shape(tile)
        count = {"rows": -(-m // rows), "columns": -(-n // cols)}
        x, y = count[self.grid[0]], count[self.grid[1]]
        return -(-x // self.cluster_x) * self.cluster_x, y, 1

    def static_shared(self, tile: int) -> int | None:
        return None if self.shared_bytes is None else self.shared_bytes.value(self.env(tile))

    def dynamic_shared(self, tile: int) -> int:
        return self.dynamic_shared_bytes.value(self.env(tile))

    def requirement(self, tile: int) -> Requirement:
        """What sizes the kernel takes at ``tile`` (:mod:`.padding` pads to it)."""
        if not self.multiples:
            return Requirement(square=self.square)
        rows, cols, depth = self.block_shape(tile)
        return Requirement(self.square, rows, cols, depth)

    def check_tile(self, tile: int) -> None:
        """ValueError where the geometry makes no sense at ``tile``: a block or block tile size below 1, shared
        memory below 0, threads × outputs per thread not the block tile."""
        env = self.env(tile)
        counts = (*self.block, *self.block_tile, *((self.outputs_per_thread,) if self.outputs_per_thread else ()))
        for expr in counts:
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


#: The vocabulary's keys (the dataclass's fields a file may set).
KEYS: tuple[str, ...] = tuple(f.name for f in fields(Declaration) if f.name != "origin")


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


def from_mapping(data: object, origin: str) -> Declaration:
    """A declaration from parsed YAML; KernelFileError naming ``origin`` and the field at fault."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise KernelFileError(f"{origin}: a declaration is a mapping of {', '.join(KEYS)}", {"origin": origin})
    unknown = [str(k) for k in data if k not in KEYS]
    if unknown:
        raise KernelFileError(
            f"{origin}: declaration has no field {', '.join(unknown)} (fields: {', '.join(KEYS)})", {"origin": origin}
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
    if key == "arguments":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("a list of roles, one per parameter in order ([A, B, C, width])")
        return tuple(value)
    if key == "block":
        exprs = _exprs(value, key, (1, 2, 3))
        return (*exprs, *(ONE,) * (3 - len(exprs)))
    if key == "block_tile":
        return _exprs(value, key + " (rows, columns, depth)", (3,))
    if key in ("outputs_per_thread", "shared_bytes", "dynamic_shared_bytes"):
        return None if value is None and key != "dynamic_shared_bytes" else Expr.of(value)
    if key == "grid":
        if not isinstance(value, list) or len(value) != 2:
            raise ValueError("[columns, rows] or [rows, columns]")
        return tuple(value)
    if key in ("template", "defines"):
        return _named(value, key)
    return value  # multiples, exact, cluster_x, precision: checked by the dataclass


def parse_yaml(text: str, origin: str) -> Declaration:
    """A declaration from a ``NAME.kernel.yaml``'s text."""
    return from_mapping(_load(text, origin), origin)


_MMD_LINE = re.compile(r"(\s*)mmd:(.*)\Z")


def in_comments(lexed: Lexed, file: str) -> Declaration | None:
    """The declaration under a ``mmd:`` line of a comment, or None; two such comments are refused."""
    found: list[tuple[str, int]] = []
    for comment in lexed.comments:
        lines = _undecorated(comment.text, comment.style)
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
            found.append(("\n".join(body), comment.line + offset))
    if not found:
        return None
    if len(found) > 1:
        shown = ", ".join(str(at) for _, at in found)
        raise KernelFileError(f"{file}: two declarations (mmd: on lines {shown}); keep one", {"file": file})
    text, at = found[0]
    origin = f"{file}:{at}"
    data = _load(text, origin)
    return from_mapping(data.get("mmd") if isinstance(data, dict) else data, origin)


def _load(text: str, origin: str) -> object:
    try:
        return yaml.safe_load(text)
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
