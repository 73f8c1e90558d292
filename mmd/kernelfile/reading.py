"""A ``.cu`` file read as a kernel mmd can run: its entry, what each parameter is, its geometry, its tile.

:func:`read_kernel_file` checks the file's includes (:mod:`.sandbox`) before anything else, finds its
``__global__`` functions (:mod:`.signature`), reads its declaration (:mod:`.declaring`) from the header
comment or a same-stem ``NAME.kernel.yaml``, and tells whether the file fixes its tile macro itself
(``#define TILE_WIDTH 32`` outside ``#ifndef TILE_WIDTH``: it then runs only at that tile). Every refusal
is a :class:`~mmd.errors.KernelFileError` with a one-line reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelFileError
from ..launchlimits import DeviceLimits, check_block
from ..launchlimits import check_tile as check_tile_setting
from . import sandbox
from .declaration import Declaration
from .declaring import in_comments, parse_yaml
from .lexer import IDENT, Lexed, Token, code_tokens, directives, lex, normalise, refuse
from .signature import Kernel, check_roles, kernels, known_roles, unknown_reason

#: The largest kernel file mmd reads (a kernel is a page or two; this bounds what a compile is handed).
MAX_SOURCE_BYTES = 1 << 20

#: The suffix of a declaration beside a kernel file: ``p1.cu`` → ``p1.kernel.yaml``.
SIDECAR_SUFFIX = ".kernel.yaml"


@dataclass(frozen=True)
class FixedTile:
    """The file defines the tile macro itself, unguarded: it runs only at this tile."""

    tile: int
    line: int


@dataclass(frozen=True)
class KernelFile:
    """A kernel file as mmd understood it."""

    #: The author's file name (its last part): what messages and compile errors name.
    name: str
    #: The text NVRTC is handed (CRLF made LF).
    source: str
    sha256: str
    kernel: Kernel
    #: Each parameter's role, in order (:data:`~.signature.ROLES`).
    roles: tuple[str, ...]
    #: The known signature it matched, or ``declared``.
    signature: str
    declaration: Declaration
    #: Where the declaration was read (``p1.cu:3``, ``p1.kernel.yaml``); empty: none, the defaults.
    declared_in: str
    includes: tuple[str, ...]
    fixed_tile: FixedTile | None = None

    def check_tile(self, tile: int) -> None:
        """KernelFileError where the file cannot run at ``tile``: it fixes another, or its geometry fails there."""
        fixed = self.fixed_tile
        if fixed is not None and tile != fixed.tile and self.declaration.uses_tile:
            raise KernelFileError(
                f"{self.name}:{fixed.line}: the file fixes {self.declaration.tile_macro} to {fixed.tile}: "
                f"it runs only at tile {fixed.tile}, not {tile}",
                {"file": self.name, "line": fixed.line, "tile": tile, "fixed_tile": fixed.tile},
            )
        try:
            self.declaration.check_tile(tile)
        except ValueError as exc:
            where = self.declared_in or self.name
            raise KernelFileError(f"{where}: {exc}", {"file": self.name, "tile": tile}) from None

    def check_launch(self, tile: int, limits: DeviceLimits) -> None:
        """:meth:`check_tile`, then TileError where a block at ``tile`` passes ``limits`` (threads, shared memory),
        worded as for mmd's own kernels (:func:`mmd.launchlimits.check_block`: "tile 64 needs 4096 threads per
        block")."""
        check_tile_setting(tile)
        self.check_tile(tile)
        decl = self.declaration
        check_block(
            f"tile {tile}" if decl.uses_tile else self.name,
            self.name,
            decl.threads_per_block(tile),
            decl.static_shared(tile) or 0,
            decl.dynamic_shared(tile),
            limits,
            details={"kernel_file": self.name, "tile": tile},
        )

    def name_expression(self, tile: int) -> str:
        """What NVRTC is asked to find: the entry's name, with its template arguments at ``tile``."""
        args = self.declaration.template_arguments(tile)
        return f"{self.kernel.name}<{', '.join(map(str, args))}>" if args else self.kernel.name

    def macros(self, tile: int) -> dict[str, int]:
        """The ``-D`` macros of a build at ``tile`` (not the tile macro where the file fixes it)."""
        macros = self.declaration.macros(tile)
        if self.fixed_tile is not None and self.declaration.tile_macro is not None:
            macros.pop(self.declaration.tile_macro, None)
        return macros


def read_kernel_file(path: Path) -> KernelFile:
    """The kernel file at ``path`` (and its ``NAME.kernel.yaml`` where there is one)."""
    name = path.name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KernelFileError(f"{name}: cannot be read: {exc.strerror}", {"file": name}) from None
    sidecar_path = path.with_name(path.name.rsplit(".", 1)[0] + SIDECAR_SUFFIX)
    try:
        sidecar = sidecar_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        sidecar = None
    except (OSError, UnicodeDecodeError) as exc:
        raise KernelFileError(f"{sidecar_path.name}: cannot be read: {exc}", {"file": sidecar_path.name}) from None
    return parse_kernel(data, name, sidecar, sidecar_path.name)


def parse_kernel(
    data: bytes, name: str, sidecar: str | None = None, sidecar_name: str = "", sandboxed: bool = True
) -> KernelFile:
    """A kernel file from its bytes; ``sidecar``: the text of its ``NAME.kernel.yaml``, if any.

    ``sandboxed`` False: mmd's own kernels (``kernels/``), which include mmd's own headers and whose
    declarations may set :data:`~.declaration.OWN_KEYS`; every file from anyone else goes through the
    include guard.
    """
    if len(data) > MAX_SOURCE_BYTES:
        raise KernelFileError(f"{name}: {len(data)} bytes; a kernel file may have {MAX_SOURCE_BYTES}", {"file": name})
    try:
        text = normalise(data.decode("utf-8"), name)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise refuse(name, line, "the file is not UTF-8 text") from None
    lexed = lex(text, name)
    includes = sandbox.check(lexed, name) if sandboxed else ()
    declaration, declared_in = _declaration(lexed, name, sidecar, sidecar_name, own=not sandboxed)
    kernel = _entry(lexed, name, declaration)
    if declaration.arguments is not None:
        roles = declaration.arguments
        check_roles(kernel, roles, name)
        signature = "declared"
    else:
        known = known_roles(kernel)
        if known is None:
            raise refuse(name, kernel.line, unknown_reason(kernel))
        signature, roles = known
        _check_size_names(kernel, roles, name)
    if tuple(n for n, _ in declaration.template) != kernel.template:
        if kernel.template:
            want = ", ".join(kernel.template)
            message = f"{kernel.name} is a template <{want}>: declare its arguments (template: {{{want}: ...}})"
        else:
            message = f"{kernel.name} is not a template, but the declaration gives template arguments"
        raise refuse(name, kernel.line, message)
    if kernel.template and kernel.extern_c:
        raise refuse(name, kernel.line, f'{kernel.name} is extern "C" and a template; C has no templates')
    return KernelFile(
        name=name,
        source=text,
        sha256=hashlib.sha256(data).hexdigest(),
        kernel=kernel,
        roles=roles,
        signature=signature,
        declaration=dataclasses.replace(declaration, arguments=roles),
        declared_in=declared_in,
        includes=includes,
        fixed_tile=_fixed_tile(lexed, declaration.tile_macro, name),
    )


def _declaration(lexed: Lexed, name: str, sidecar: str | None, sidecar_name: str, own: bool) -> tuple[Declaration, str]:
    """The file's declaration and where it was read; ``own``: one of mmd's own kernels (its header may set
    :data:`~.declaration.OWN_KEYS`)."""
    inside = in_comments(lexed, name, own)
    if inside is not None and sidecar is not None:
        raise KernelFileError(
            f"{name}: declared twice, in {inside.origin} and in {sidecar_name}; keep one", {"file": name}
        )
    if inside is not None:
        return inside, inside.origin
    if sidecar is not None:
        return parse_yaml(sidecar, sidecar_name), sidecar_name
    return Declaration(), ""


def _entry(lexed: Lexed, name: str, declaration: Declaration) -> Kernel:
    """The kernel to run: the declared entry, or the file's one ``__global__`` function."""
    found = kernels(lexed)
    by_name: dict[str, list[Kernel]] = {}
    for kernel in found:
        by_name.setdefault(kernel.name, []).append(kernel)
    if declaration.entry is not None:
        if declaration.entry not in by_name:
            have = ", ".join(by_name) or "none"
            raise KernelFileError(
                f"{declaration.origin}: the declared entry {declaration.entry} is not a __global__ function here "
                f"(found: {have})",
                {"file": name},
            )
        chosen = by_name[declaration.entry]
    elif not by_name:
        main = next((t for t in code_tokens(lexed) if t.kind == IDENT and t.text == "main"), None)
        if main is not None:
            raise refuse(name, main.line, "the file holds host code only (main), no __global__ kernel")
        raise KernelFileError(f"{name}: no __global__ function: a kernel file holds the kernel", {"file": name})
    elif len(by_name) > 1:
        shown = ", ".join(f"{k} (line {v[0].line})" for k, v in by_name.items())
        raise KernelFileError(
            f"{name}: {len(by_name)} __global__ functions, {shown}: say which to run (entry: NAME in a declaration)",
            {"file": name, "candidates": list(by_name)},
        )
    else:
        chosen = next(iter(by_name.values()))
    if len(chosen) > 1 and declaration.arguments is not None:
        # the same kernel under #if branches: the one whose parameters the declaration describes
        chosen = [k for k in chosen if len(k.parameters) == len(declaration.arguments)] or chosen
    if len({k.parameters for k in chosen}) > 1 or len({k.types for k in chosen}) > 1:
        lines = ", ".join(str(k.line) for k in chosen)
        raise KernelFileError(
            f"{name}: {chosen[0].name} is defined with different parameters on lines {lines}; "
            "declare its arguments to pick one",
            {"file": name},
        )
    return chosen[0]


def _check_size_names(kernel: Kernel, roles: tuple[str, ...], name: str) -> None:
    """Refuse a known signature whose size names say another order (``int K, int M, int N``): a silent
    mix-up would compute the wrong product."""
    sizes = [(p.name, r) for p, r in zip(kernel.parameters, roles, strict=True) if r in ("M", "K", "N")]
    said = [n.upper() for n, _ in sizes]
    if sorted(said) == ["K", "M", "N"] and said != [r for _, r in sizes]:
        raise refuse(
            name,
            kernel.line,
            f"{kernel.name} names its sizes ({', '.join(n for n, _ in sizes)}) in another order than the "
            f"signature mmd knows ({', '.join(r for _, r in sizes)}): declare its arguments",
        )


_INT = re.compile(r"\(*\s*(\d+)[uUlL]*\s*\)*\Z")


def _fixed_tile(lexed: Lexed, macro: str | None, name: str) -> FixedTile | None:
    """Where the file ``#define``s the tile macro outside an ``#ifndef`` of it: the tile it fixes."""
    if macro is None:
        return None
    guards: list[bool] = []  # per open conditional: whether it is "macro not defined"
    for directive in directives(lexed):
        words = [t.text for t in directive[1:]]
        if not words:
            continue
        head = words[0]
        if head in ("if", "ifdef", "ifndef"):
            guards.append(_guards(head, words[1:], macro))
        elif head in ("elif", "else", "elifdef", "elifndef") and guards:
            guards[-1] = False
        elif head == "endif" and guards:
            guards.pop()
        elif head == "define" and len(words) > 1 and words[1] == macro and not any(guards):
            value = _value(directive[2:])
            found = _INT.match(value)
            line = directive[0].line
            if found is None:
                raise refuse(name, line, f"#define {macro} {value}: the tile macro must be a whole number")
            return FixedTile(int(found.group(1)), line)
    return None


def _guards(head: str, words: list[str], macro: str) -> bool:
    if head == "ifndef":
        return words[:1] == [macro]
    if head == "if":
        return words in (["!", "defined", "(", macro, ")"], ["!", "defined", macro])
    return False


def _value(tokens: list[Token]) -> str:
    return " ".join(t.text for t in tokens[1:])
