"""The expressions a declaration gives sizes in: integers of the tile ``T`` and the declaration's own names.

``2*T``, ``BM*BN/(TM*TN)``, ``2 if DOUBLE_BUFFER else 1``: Python's expression grammar cut down to
integers, names, ``+ - * /``, comparisons, ``and``/``or``/``not``, ``X if C else Y`` and brackets, with C's
integer division (towards zero) and 1 for true. Parsed once by :mod:`ast`, never run by Python.
"""

from __future__ import annotations

import ast
import functools
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: A C identifier (a macro's, a template parameter's, a kernel's name).
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_BINARY: dict[type[ast.operator], str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//"}
_COMPARE: dict[type[ast.cmpop], Callable[[int, int], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}  # fmt: skip
_GRAMMAR = "integers, names, + - * /, comparisons, and/or/not, X if C else Y and brackets"


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


#: The expressions a declaration's defaults are made of.
T = Expr("T")
ONE = Expr("1")
ZERO = Expr("0")
