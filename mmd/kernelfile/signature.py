"""The ``__global__`` functions of a kernel file, their parameters, and the three signatures known without a word.

A parameter is read as one of three types: a pointer to float (``float *``, with ``const`` and
``__restrict__`` as the author likes), an integer (``int``, ``unsigned``, ``size_t``, ``long``) or a float.
The known signatures name each parameter's role (:data:`~.roles.ROLES`): the course's square one
``(M, N, P, Width)``, the rectangular ``(A, B, C, M, K, N)`` and the BLAS-like
``(M, N, K, alpha, A, B, beta, C)``. Any other list needs a declaration's ``arguments``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .lexer import IDENT, PUNCT, Lexed, Token, code_tokens, refuse
from .roles import FLOAT, FLOAT_PTR, INTEGER, ROLES

#: The signatures known without a declaration, by what they are called in messages.
KNOWN: dict[str, tuple[str, ...]] = {
    "square (M, N, P, Width)": ("A", "B", "C", "width"),
    "rectangular (A, B, C, M, K, N)": ("A", "B", "C", "M", "K", "N"),
    "BLAS-like (M, N, K, alpha, A, B, beta, C)": ("M", "N", "K", "alpha", "A", "B", "beta", "C"),
}

_QUALIFIERS = frozenset({"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__"})
_INTEGERS = frozenset({"int", "unsigned", "signed", "long", "short", "size_t", "int32_t", "uint32_t", "int64_t"})
#: Words between ``__global__`` and the name that are not the name.
_SPECIFIERS = frozenset({"void", "static", "inline", "__forceinline__", "__noinline__", "extern", "__host__"})
#: Attributes with an argument list that may stand before the name.
_ATTRIBUTES = frozenset({"__launch_bounds__", "__maxnreg__", "__cluster_dims__", "__attribute__", "__declspec"})


@dataclass(frozen=True)
class Parameter:
    name: str
    #: One of FLOAT_PTR, INTEGER, FLOAT, or the parameter's own text where it is none of them.
    type: str
    line: int


@dataclass(frozen=True)
class Kernel:
    """A ``__global__`` function defined in the file."""

    name: str
    line: int
    parameters: tuple[Parameter, ...]
    #: Template parameter names, in order (empty: not a template).
    template: tuple[str, ...] = ()
    extern_c: bool = False

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(p.type for p in self.parameters)


def kernels(lexed: Lexed) -> tuple[Kernel, ...]:
    """Every ``__global__`` function the file defines (declarations without a body are left out)."""
    toks = code_tokens(lexed)
    found: list[Kernel] = []
    for i, tok in enumerate(toks):
        if tok.kind == IDENT and tok.text == "__global__":
            kernel = _kernel_at(toks, i)
            if kernel is not None:
                found.append(kernel)
    return tuple(found)


def _kernel_at(toks: list[Token], at: int) -> Kernel | None:
    j = at + 1
    name: Token | None = None
    while j < len(toks):
        tok = toks[j]
        if tok.kind == IDENT and tok.text in _ATTRIBUTES and j + 1 < len(toks) and toks[j + 1].text == "(":
            j = _matching(toks, j + 1) + 1
            continue
        if tok.text == "(":
            break
        if tok.kind == IDENT and tok.text not in _SPECIFIERS:
            name = tok
        elif tok.text in (";", "{", "}"):
            return None
        j += 1
    if name is None or j >= len(toks):
        return None
    close = _matching(toks, j)
    if close + 1 >= len(toks) or toks[close + 1].text != "{":
        return None  # a declaration; its definition is found on its own
    return Kernel(
        name=name.text,
        line=name.line,
        parameters=_parameters(toks[j + 1 : close]),
        template=_template_before(toks, at),
        extern_c=_extern_c_before(toks, at),
    )


_OPENERS = {"(": ")", "<": ">", "[": "]", "{": "}"}
_CLOSERS = {close: open_ for open_, close in _OPENERS.items()}


def _matching(toks: list[Token], at: int) -> int:
    """The index of the bracket that pairs with the one at ``at``: forward from an opening bracket, backward from
    a closing one (the last or the first token where none does)."""
    here = toks[at].text
    there, step, stop = (_OPENERS[here], 1, len(toks)) if here in _OPENERS else (_CLOSERS[here], -1, -1)
    depth = 0
    for k in range(at, stop, step):
        if toks[k].text == here:
            depth += 1
        elif toks[k].text == there:
            depth -= 1
            if depth == 0:
                return k
    return stop - step


def _items(toks: list[Token]) -> list[list[Token]]:
    """A bracketed list's items: ``toks`` split at the commas outside any inner brackets."""
    groups: list[list[Token]] = [[]]
    depth = 0
    for tok in toks:
        if tok.text in ("(", "<", "["):
            depth += 1
        elif tok.text in (")", ">", "]"):
            depth -= 1
        if tok.text == "," and depth == 0:
            groups.append([])
        else:
            groups[-1].append(tok)
    return groups


def _parameters(toks: list[Token]) -> tuple[Parameter, ...]:
    groups = _items(toks)
    if groups == [[]] or (len(groups) == 1 and [t.text for t in groups[0]] == ["void"]):
        return ()
    return tuple(_parameter(g) for g in groups if g)


def _parameter(toks: list[Token]) -> Parameter:
    words = [t.text for t in toks if t.kind == IDENT and t.text not in _QUALIFIERS]
    stars = sum(t.text == "*" for t in toks if t.kind == PUNCT)
    name = words[-1] if len(words) >= 2 else ""
    kinds = words[:-1] if name else words
    if kinds == ["float"] and stars == 1:
        kind = FLOAT_PTR
    elif kinds == ["float"] and stars == 0:
        kind = FLOAT
    elif kinds and set(kinds) <= _INTEGERS and stars == 0 and not any(t.text in "&[" for t in toks):
        kind = INTEGER
    else:
        named = [t for t in toks if not (name and t.kind == IDENT and t.text == name)]
        kind = " ".join(t.text for t in named)
    return Parameter(name or "?", kind, toks[0].line)


def _template_before(toks: list[Token], at: int) -> tuple[str, ...]:
    """The template parameter names of the declaration ``__global__`` at ``at`` belongs to (empty: none)."""
    j = at - 1
    while j >= 0 and toks[j].kind == IDENT and toks[j].text in _SPECIFIERS:
        j -= 1
    if j < 0 or toks[j].text != ">":
        return ()
    k = _matching(toks, j)
    if k == 0 or toks[k].text != "<" or toks[k - 1].text != "template":
        return ()
    return tuple(_template_names(toks[k + 1 : j]))


def _template_names(toks: list[Token]) -> list[str]:
    """Each template parameter's name: the last word before its default, if it has one."""
    names: list[str] = []
    for group in _items(toks):
        texts = [t.text for t in group]
        before_default = group[: texts.index("=")] if "=" in texts else group
        idents = [t.text for t in before_default if t.kind == IDENT]
        if idents:
            names.append(idents[-1])
    return names


def _extern_c_before(toks: list[Token], at: int) -> bool:
    j = at - 1
    while j >= 0 and toks[j].kind == IDENT and toks[j].text in _SPECIFIERS - {"extern"}:
        j -= 1
    return j >= 1 and toks[j].text == '"C"' and toks[j - 1].text == "extern"


def known_roles(kernel: Kernel) -> tuple[str, tuple[str, ...]] | None:
    """(what it is called, its roles) where the parameter types match a known signature; None otherwise."""
    for label, roles in KNOWN.items():
        if kernel.types == tuple(ROLES[r] for r in roles):
            return label, roles
    return None


def check_roles(kernel: Kernel, roles: tuple[str, ...], file: str) -> None:
    """Refuse roles whose number or types do not fit the kernel's parameters, with the parameter's line."""
    if len(roles) != len(kernel.parameters):
        raise refuse(
            file,
            kernel.line,
            f"{kernel.name} has {len(kernel.parameters)} parameters; its declared arguments name {len(roles)}",
        )
    for role, param in zip(roles, kernel.parameters, strict=True):
        if ROLES[role] != param.type:
            raise refuse(
                file,
                param.line,
                f"{kernel.name}'s parameter {param.name} is {param.type}; argument {role} must be {ROLES[role]}",
            )


def unknown_reason(kernel: Kernel) -> str:
    """Why a kernel's parameter list needs a declaration, in one line."""
    shown = ", ".join(f"{p.type} {p.name}" for p in kernel.parameters)
    return (
        f"{kernel.name}({shown}) is none of the signatures mmd knows ({'; '.join(KNOWN)}): "
        "say which parameter is which with a declaration's arguments (docs/kernels.md)"
    )
