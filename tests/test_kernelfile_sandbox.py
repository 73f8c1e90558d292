"""The include guard: every way of naming a file mmd does not provide is refused, with its line."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmd.errors import KernelFileError
from mmd.kernelfile.lexer import lex, normalise
from mmd.kernelfile.sandbox import HEADERS, check

KERNEL = "__global__ void k(float* M, float* N, float* P, int Width) { P[0] = M[0] * N[0]; }\n"


def guard(text: str, name: str = "k.cu") -> tuple[str, ...]:
    return check(lex(normalise(text, name), name), name)


def refused_at(text: str) -> str:
    with pytest.raises(KernelFileError) as caught:
        guard(text)
    return caught.value.reason


@pytest.mark.parametrize("header", HEADERS)
def test_every_provided_header_passes_in_both_spellings(header: str) -> None:
    assert guard(f'#include <{header}>\n#include "{header}"\n{KERNEL}') == (header,)


# (what, the file's text, the line the refusal names)
REFUSED: list[tuple[str, str, int]] = [
    ("an absolute path", '#include "/etc/shadow"\n', 1),
    ("an absolute path in brackets", "\n\n#include </etc/shadow>\n", 3),
    ("a relative path", '// x\n#include "../../x"\n', 2),
    ("a provided name through a path", '#include "./cuda_runtime.h"\n', 1),
    ("a provided name with a blank", '#include "cuda_runtime.h "\n', 1),
    ("a provided name in another case", "#include <CUDA_RUNTIME.H>\n", 1),
    ("a macro", '#define H "/etc/shadow"\n#include H\n', 2),
    ("a function-like macro", "#define H(x) <x>\n#include H(/etc/shadow)\n", 2),
    ("include_next", "#include_next <stdio.h>\n", 1),
    ("import", '#import "/etc/shadow"\n', 1),
    ("embed", '#embed "/etc/shadow"\n', 1),
    ("a digraph", '%:include "/etc/shadow"\n', 1),
    ("a digraph split by a splice", '%\\\n:include "/etc/shadow"\n', 1),
    ("blanks and comments around", ' \t/* a */ # /* b */ include /* c */ "/etc/shadow"\n', 1),
    ("a splice inside the word", '#inc\\\nlude "/etc/shadow"\n', 1),
    ("a splice after the hash", '#\\\ninclude "/etc/shadow"\n', 1),
    ("a splice inside the path", '#include "/etc/sha\\\ndow"\n', 1),
    ("after a comment spanning lines", '/* a\n b */ #include "/etc/shadow"\n', 2),
    ("inside #if 0", '#if 0\n#include "/etc/shadow"\n#endif\n', 2),
    ("__has_include", "#if __has_include(</etc/shadow>)\n#endif\n", 1),
    ("__has_include in a macro", "#define H __has_include\n", 1),
    ("__has_include_next", "#if __has_include_next(<x>)\n#endif\n", 1),
    ("_Pragma", '_Pragma("once")\n', 1),
    ("_Pragma in a macro", "#define P(x) _Pragma(#x)\n", 1),
    ("__pragma", "__pragma(once)\n", 1),
    ("pragma include_alias", '#pragma include_alias("a.h", "/etc/shadow")\n', 1),
    ("pragma push_macro", '#pragma push_macro("X")\n', 1),
    ("pragma GCC", "#pragma GCC system_header\n", 1),
    ("an empty pragma", "#pragma\n", 1),
    ("token pasting", "#define CAT(a, b) a ## b\n", 1),
    ("token pasting by digraph", "#define CAT(a, b) a %:%: b\n", 1),
    ("a trigraph directive", '??=include "/etc/shadow"\n', 1),
    ("a trigraph splice in a comment", '// x ??/\n#include "/etc/shadow"\n', 1),
    ("a line marker", '# 1 "/etc/shadow"\n', 1),
    ("#line", '#line 1 "/etc/shadow"\n', 1),
    ("#ident", '#ident "x"\n', 1),
    ("a raw string", 'const char* s = R"x(\n#include "/etc/shadow"\n)x";\n', 1),
    ("a universal character name", "int _Pr\\u0061gma;\n", 1),
    ("a backslash before blanks", '#define X 1 \\ \n#include "/etc/shadow"\n', 1),
    ("a lone carriage return", '// x\r#include "/etc/shadow"\n', 1),
    ("a NUL byte", "int x;\0\n", 1),
    ("an open string", 'const char* s = "abc\n#include "/etc/shadow"\n', 1),
    ("an open comment", "/* never closed\n", 1),
    ("an open header name", "#include <cuda_runtime.h\n", 1),
]


@pytest.mark.parametrize(("what", "text", "line"), REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_with_its_line(what: str, text: str, line: int) -> None:
    reason = refused_at(text + KERNEL)
    assert reason.startswith(f"k.cu:{line}: "), reason
    assert "\n" not in reason


def test_allowed_directives_and_pragmas_pass() -> None:
    text = (
        "#pragma once\n#define T2 (2 * TILE_WIDTH)\n#define S(x) #x\n#undef T2\n#if defined(X) && X > 1\n"
        '#elif 0\n#else\n#endif\n#ifdef A\n#endif\n#ifndef TILE_WIDTH\n#error "needs TILE_WIDTH"\n#endif\n#\n'
        "#pragma unroll\n#pragma nv_diag_suppress 177\n"
        "int n = 1'000'000; // the digit separator is not a quote\n"
        'const char* s = "#include \\"/etc/shadow\\" is only text"; char c = \'"\';\n'
    )
    assert guard(text + KERNEL) == ()


def test_a_line_spliced_into_a_comment_is_comment() -> None:
    """Splices join lines before comments are found, in the compiler as in the guard: the line is no directive."""
    assert guard('// see \\\n#include "/etc/shadow"\n' + KERNEL) == ()


def test_crlf_is_a_newline() -> None:
    assert guard("#include <cstdio>\r\n" + KERNEL.replace("\n", "\r\n")) == ("cstdio",)


FORBIDDEN_PATHS = ["/etc/shadow", "../../x", "/proc/self/environ", "kernels/naive.cu", "cuda_runtime.h/../x"]
BLANKS = st.sampled_from(["", " ", "\t", "/**/", "/* c */", "/* a\n b */"])


@st.composite
def include_spelling(draw: st.DrawFn) -> tuple[str, range]:
    """A file with a refused include somewhere, however spelled; and the lines its directive spans."""
    before = draw(st.lists(st.sampled_from(["int a;", "// note", "/* block */", "", "#define Q 1"]), max_size=4))
    path = draw(st.sampled_from(FORBIDDEN_PATHS))
    form = draw(st.sampled_from(["quoted", "bracketed", "macro", "has_include", "include_next"]))
    word = {"include_next": "include_next", "has_include": "if"}.get(form, "include")
    operand = {
        "quoted": f'"{path}"',
        "bracketed": f"<{path}>",
        "macro": "H",
        "has_include": f"__has_include(<{path}>)",
        "include_next": f"<{path}>",
    }[form]
    if form == "macro":
        before.append(f'#define H "{path}"')
    hash_ = draw(st.sampled_from(["#", "%:"]))
    lead = draw(BLANKS).replace("\n", " ")
    directive = lead + hash_ + draw(BLANKS) + word + draw(BLANKS) + " " + operand
    # splices anywhere after the line's first character
    cuts = sorted(draw(st.lists(st.integers(1, len(directive)), max_size=3)), reverse=True)
    for cut in cuts:
        directive = directive[:cut] + "\\\n" + directive[cut:]
    first = len(before) + 1
    after = "\n#endif" if form == "has_include" else ""
    return "\n".join([*before, directive]) + after + "\n" + KERNEL, range(first, first + directive.count("\n") + 1)


@given(include_spelling())
@settings(max_examples=400, deadline=None)
def test_any_spelling_of_a_refused_include_is_refused_at_its_line(case: tuple[str, range]) -> None:
    """The line named is one the directive spans (its hash's, or the forbidden name's)."""
    text, lines = case
    reason = refused_at(text)
    assert any(reason.startswith(f"k.cu:{line}: ") for line in lines), (text, reason)


@given(
    header=st.sampled_from(HEADERS),
    hash_=st.sampled_from(["#", "%:"]),
    blanks=st.lists(BLANKS, min_size=3, max_size=3),
    quoted=st.booleans(),
)
def test_any_spelling_of_a_provided_include_passes(header: str, hash_: str, blanks: list[str], quoted: bool) -> None:
    operand = f'"{header}"' if quoted else f"<{header}>"
    text = f"{blanks[0]}{hash_}{blanks[1]}include{blanks[2]} {operand}\n{KERNEL}"
    assert guard(text) == (header,)
