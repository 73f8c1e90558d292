"""The include guard: a kernel file reaches no file but the empty headers mmd hands the compiler.

NVRTC opens ``#include``d paths itself, and mmd's service can neither change user nor make namespaces,
so the guard is in the source: before anything is compiled, every directive is checked against a short
list, and every way to name a file (``#include MACRO``, ``__has_include``, ``#include_next``, ``#embed``,
``_Pragma``, pragmas, token pasting that could build one of those names) is refused with its line.
The includes tutorials carry are satisfied by :data:`HEADERS`, empty files NVRTC gets in memory; the
host compiler never sees a submitted file.
"""

from __future__ import annotations

import hashlib

from .lexer import HEADER, IDENT, INCLUDE_LIKE, Lexed, Token, directives, refuse

#: The headers a kernel file may include, each handed to NVRTC as an empty file: device code needs none
#: of them (NVRTC declares threadIdx, __syncthreads, the math functions and printf itself).
HEADERS: tuple[str, ...] = (
    "assert.h", "cassert", "cfloat", "climits", "cmath", "cstdint", "cstdio", "cstdlib", "cstring", "ctime",
    "cublas_v2.h", "cuda.h", "cuda_runtime.h", "cuda_runtime_api.h", "device_launch_parameters.h",
    "device_functions.h", "float.h", "helper_cuda.h", "helper_functions.h", "iomanip", "iostream", "limits.h",
    "math.h", "stdint.h", "stdio.h", "stdlib.h", "string.h", "time.h",
)  # fmt: skip

#: What identifies the header set in a compile-cache key.
HEADERS_DIGEST = hashlib.sha256("\0".join(HEADERS).encode()).hexdigest()[:16]

#: Directives a kernel file may use besides ``#include`` of :data:`HEADERS`.
DIRECTIVES = frozenset(
    {"define", "undef", "if", "ifdef", "ifndef", "elif", "elifdef", "elifndef", "else", "endif", "error", "warning"}
)

#: Pragmas a kernel file may use (``#pragma unroll`` and the diagnostics' own); others are refused.
PRAGMAS = frozenset(
    {"unroll", "nounroll", "once", "nv_diag_suppress", "nv_diag_warning", "nv_diag_error", "nv_diag_default"}
)

#: Names that open or test a file, or make a directive out of a macro: refused wherever they appear.
FORBIDDEN_NAMES = frozenset({"__has_include", "__has_include_next", "__has_embed", "_Pragma", "__pragma"})


def check(lexed: Lexed, name: str) -> tuple[str, ...]:
    """The headers the file includes (each one of :data:`HEADERS`); KernelFileError at the first thing refused."""
    for tok in lexed.tokens:
        if tok.kind == IDENT and tok.text in FORBIDDEN_NAMES:
            raise refuse(name, tok.line, f"{tok.text} is not accepted in a kernel file (it can reach other files)")
        if tok.text in ("##", "%:%:"):
            raise refuse(name, tok.line, "token pasting (##) is not accepted: it could build a name the guard refuses")
    included: list[str] = []
    for directive in directives(lexed):
        header = _directive(directive, name)
        if header is not None:
            included.append(header)
    return tuple(dict.fromkeys(included))


def _directive(tokens: list[Token], name: str) -> str | None:
    """The header an allowed ``#include`` names, None for another allowed directive; refused otherwise."""
    hash_, rest = tokens[0], tokens[1:]
    if not rest:
        return None  # the null directive
    word = rest[0]
    if word.kind != IDENT:
        raise refuse(name, hash_.line, f"'# {word.text}' is not a directive a kernel file may use")
    if word.text in DIRECTIVES:
        return None
    if word.text == "pragma":
        what = rest[1].text if len(rest) > 1 else ""
        if len(rest) > 1 and rest[1].kind == IDENT and what in PRAGMAS:
            return None
        allowed = ", ".join(sorted(PRAGMAS))
        raise refuse(name, hash_.line, f"#pragma {what} is not accepted in a kernel file (allowed: {allowed})")
    if word.text == "include":
        operand = rest[1:]
        shown = " ".join(t.text for t in operand)
        if len(operand) != 1 or operand[0].kind != HEADER:
            raise refuse(name, hash_.line, f'#include {shown} is refused: only <header> or "header" of a name')
        header = operand[0].text[1:-1]
        if header not in HEADERS:
            raise refuse(
                name,
                hash_.line,
                f"#include {shown} is refused: mmd provides only {', '.join(HEADERS)} (empty: a kernel needs none)",
            )
        return header
    if word.text in INCLUDE_LIKE:
        raise refuse(name, hash_.line, f"#{word.text} is not accepted in a kernel file")
    raise refuse(name, hash_.line, f"#{word.text} is not a directive a kernel file may use")
