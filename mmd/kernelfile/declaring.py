"""Reading a declaration: where it is written (under ``mmd:`` in a comment, or a ``NAME.kernel.yaml``), its
YAML, and each field's value turned into the vocabulary's (:class:`~.declaration.Declaration`).

A field at fault is a :class:`~mmd.errors.KernelFileError` naming where the declaration was read and the
field; anyone's file is refused the fields only mmd's own kernels may set (:data:`~.declaration.OWN_KEYS`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import yaml

from ..errors import KernelFileError
from .declaration import KEYS, OWN_KEYS, Declaration, TensorMapsDeclaration, VariantDeclaration
from .expressions import NAME, ONE, Expr

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .lexer import Lexed


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
    if key in ("outputs_per_thread", "shared_bytes", "dynamic_shared_bytes", "cluster_x", "producers"):
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
        if not isinstance(key, str) or not NAME.match(key):
            raise ValueError(f"{what}: {key!r} is not a name")
        out.append((key, Expr.of(v)))
    return tuple(out)


def _texts(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} is a list of names")
    return tuple(value)
