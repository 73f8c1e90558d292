"""A kernel file split into preprocessing tokens and comments, each with its line in the author's file.

Written by hand because it is the sandbox's own: the include guard (:mod:`.sandbox`) must see every
directive the compiler will see, so this reads the text the way a C++ preprocessor does (line splices,
comments, string and character literals, pp-numbers with digit separators, digraphs, header names) and
refuses what a compiler might read two ways: trigraphs, a backslash before trailing blanks, a carriage
return alone, raw strings, universal character names, literals or comments left open. Where it cannot
tell whether a ``#`` starts a line (after a comment that spans lines) it takes it as a directive, so the
guard errs towards refusing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import KernelFileError

#: Token kinds.
IDENT, NUMBER, STRING, CHAR, PUNCT, HEADER = "ident", "number", "string", "char", "punct", "header"

#: Directives whose operand is a header name (``<...>``), however the compiler treats them.
INCLUDE_LIKE = frozenset({"include", "include_next", "import", "embed"})

_TRIGRAPH = re.compile(r"\?\?[=/'()!<>\-]")
_IDENT_START = re.compile(r"[A-Za-z_$\x80-\U0010ffff]")
_IDENT = re.compile(r"[A-Za-z0-9_$\x80-\U0010ffff]*")
_PP_NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|'[A-Za-z0-9_]|[A-Za-z0-9_.])*")
_RAW_PREFIXES = frozenset({"R", "LR", "uR", "UR", "u8R"})


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    #: The physical line of the author's file where the token starts (1-based).
    line: int
    #: Which logical line it is on (splices joined, comments counted as blanks): directives end with it.
    logical: int
    #: Whether only blanks and comments come before it on its line: a ``#`` there starts a directive.
    first: bool


@dataclass(frozen=True)
class Comment:
    text: str
    line: int
    #: ``//`` or ``/*``.
    style: str


@dataclass(frozen=True)
class Lexed:
    tokens: tuple[Token, ...]
    comments: tuple[Comment, ...]


def refuse(name: str, line: int, message: str) -> KernelFileError:
    """The one shape of a refusal that points into the author's file: ``NAME:LINE: message``."""
    return KernelFileError(f"{name}:{line}: {message}", {"file": name, "line": line})


def normalise(text: str, name: str) -> str:
    """The text the compiler is handed: CRLF made LF; NUL bytes and lone carriage returns refused."""
    text = text.replace("\r\n", "\n")
    for bad, what in (("\0", "a NUL byte"), ("\r", "a carriage return without a line feed")):
        at = text.find(bad)
        if at >= 0:
            raise refuse(name, text.count("\n", 0, at) + 1, f"{what} is not accepted in a kernel file")
    return text


def _splice(text: str, name: str) -> tuple[str, list[int]]:
    """Phase 2: backslash-newline removed; with each kept character's physical line."""
    found = _TRIGRAPH.search(text)
    if found:
        line = text.count("\n", 0, found.start()) + 1
        raise refuse(name, line, f"trigraph {found.group()} is not accepted (compilers disagree on what it means)")
    out: list[str] = []
    lines: list[int] = []
    line, i, n = 1, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            j = i + 1
            while j < n and text[j] in " \t\f\v":
                j += 1
            if j < n and text[j] == "\n":
                if j > i + 1:
                    raise refuse(name, line, "a backslash followed by blanks ends this line; remove the blanks")
                i, line = j + 1, line + 1
                continue
        out.append(c)
        lines.append(line)
        if c == "\n":
            line += 1
        i += 1
    lines.append(line)  # the end of the text
    return "".join(out), lines


def lex(text: str, name: str) -> Lexed:
    """Tokens and comments of ``text`` (already :func:`normalise`d); KernelFileError with a line where the
    text could be read two ways."""
    src, lines = _splice(text, name)
    tokens: list[Token] = []
    comments: list[Comment] = []
    i, n, logical, first = 0, len(src), 0, True
    joinable = -1  # the line of the last // comment that stood alone on its line
    while i < n:
        c = src[i]
        line = lines[i]
        if c == "\n":
            logical, first, i = logical + 1, True, i + 1
            continue
        if c in " \t\f\v":
            i += 1
            continue
        if src.startswith("//", i):
            end = src.find("\n", i)
            end = n if end < 0 else end
            text_ = src[i + 2 : end]
            if first and comments and comments[-1].style == "//" and joinable == line - 1:
                # consecutive lines of // comments alone on their lines are one comment (a header, a declaration)
                prev = comments.pop()
                comments.append(Comment(prev.text + "\n" + text_, prev.line, "//"))
            else:
                comments.append(Comment(text_, line, "//"))
            joinable = lines[end] if first else -1
            i = end
            continue
        if src.startswith("/*", i):
            end = src.find("*/", i + 2)
            if end < 0:
                raise refuse(name, line, "a /* comment is not closed")
            body = src[i + 2 : end]
            comments.append(Comment(body, line, "/*"))
            # A comment is one blank; where it spans lines a compiler may or may not take what follows as
            # the start of a line, so the guard takes it as one (a directive it checks, never one it misses).
            first = first or "\n" in body
            i = end + 2
            continue
        start = i
        kind: str
        if _IDENT_START.match(c):
            i = _end(_IDENT, src, i + 1)
            word = src[start:i]
            if i < n and src[i] == '"' and word in _RAW_PREFIXES:
                raise refuse(name, line, "raw string literals are not accepted in a kernel file")
            if i < n and src[i] == "\\":
                raise refuse(name, line, "universal character names (\\u, \\U) are not accepted outside literals")
            kind = IDENT
        elif c.isdigit() or (c == "." and i + 1 < n and src[i + 1].isdigit()):
            i = _end(_PP_NUMBER, src, i)
            kind = NUMBER
        elif c in "\"'":
            if c == '"' and _in_include(tokens, logical):
                i = _closing(src, i, name, line, '"', escapes=False)
                kind = HEADER
            else:
                i = _closing(src, i, name, line, c, escapes=True)
                kind = STRING if c == '"' else CHAR
        elif c == "<" and _in_include(tokens, logical):
            i = _closing(src, i, name, line, ">", escapes=False)
            kind = HEADER
        elif c == "\\":
            raise refuse(name, line, "a backslash outside a literal is not accepted (other than to join lines)")
        else:
            for punct in ("%:%:", "##", "%:"):
                if src.startswith(punct, i):
                    i += len(punct)
                    break
            else:
                i += 1
            kind = PUNCT
        tokens.append(Token(kind, src[start:i], line, logical, first))
        first = False
    return Lexed(tuple(tokens), tuple(comments))


def _end(pattern: re.Pattern[str], src: str, i: int) -> int:
    """Where ``pattern``'s match at ``i`` ends (``i`` where it does not match)."""
    found = pattern.match(src, i)
    return found.end() if found else i


def _in_include(tokens: list[Token], logical: int) -> bool:
    """Whether the next token is an include-like directive's operand (a header name, not an expression)."""
    if len(tokens) < 2:
        return False
    hash_, word = tokens[-2], tokens[-1]
    return (
        hash_.first
        and is_hash(hash_)
        and hash_.logical == word.logical == logical
        and word.kind == IDENT
        and word.text in INCLUDE_LIKE
    )


def is_hash(token: Token) -> bool:
    return token.kind == PUNCT and token.text in ("#", "%:")


def _closing(src: str, i: int, name: str, line: int, close: str, escapes: bool) -> int:
    """The index after the literal (or header name) that starts at ``i``; refused when the line ends first."""
    j = i + 1
    while j < len(src) and src[j] != "\n":
        if escapes and src[j] == "\\":
            j += 2
            continue
        if src[j] == close:
            return j + 1
        j += 1
    what = {'"': "a string literal", "'": "a character literal", ">": "a header name <...>"}[close]
    raise refuse(name, line, f"{what} is not closed on its line")


def directives(lexed: Lexed) -> list[list[Token]]:
    """Each directive's tokens, its ``#`` first: a ``#`` that starts a line, to the end of its logical line."""
    out: list[list[Token]] = []
    toks = lexed.tokens
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok.first and is_hash(tok):
            j = i + 1
            while j < len(toks) and toks[j].logical == tok.logical:
                j += 1
            out.append(list(toks[i:j]))
            i = j
        else:
            i += 1
    return out


def code_tokens(lexed: Lexed) -> list[Token]:
    """The tokens outside directives: the C++ the compiler parses."""
    inside = {id(t) for d in directives(lexed) for t in d}
    return [t for t in lexed.tokens if id(t) not in inside]
