"""The package's size: no module of mmd over 600 lines, no class over 400, and the daemon's main call short.

A newcomer should be able to hold a module or a class in their head; past
these sizes a module is doing several jobs, and one more part (a module of
its own, see docs/architecture.md) is the way out. The import circles are
tests/test_imports.py's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mmd"

MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400
#: ``Daemon.serve``: what the daemon holds entered on one ExitStack, then the main loop; the rest is its parts'.
MAX_SERVE_LINES = 40

MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def lines_of(node: ast.ClassDef | ast.FunctionDef) -> int:
    """Lines from a definition's first (its decorators included) to its last."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return (node.end_lineno or node.lineno) - first + 1


@pytest.mark.parametrize("path", MODULES, ids=name)
def test_no_module_is_over_600_lines(path: Path) -> None:
    count = len(path.read_text(encoding="utf-8").splitlines())
    assert count <= MAX_MODULE_LINES, f"{name(path)} has {count} lines"


@pytest.mark.parametrize("path", MODULES, ids=name)
def test_no_class_is_over_400_lines(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    big = {n.name: lines_of(n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and lines_of(n) > MAX_CLASS_LINES}
    assert not big, f"{name(path)}: {big}"


def test_daemon_serve_is_at_most_40_lines() -> None:
    tree = ast.parse((PACKAGE / "daemon" / "server.py").read_text(encoding="utf-8"))
    (daemon,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Daemon")
    (serve,) = (n for n in daemon.body if isinstance(n, ast.FunctionDef) and n.name == "serve")
    assert lines_of(serve) <= MAX_SERVE_LINES


def test_the_limits_catch_what_is_over_them() -> None:
    """The measure itself: a class of 401 lines counts 401 (decorator and body included)."""
    source = "@dataclass\nclass Big:\n" + "    x = 1\n" * 399
    (big,) = ast.parse(source).body
    assert isinstance(big, ast.ClassDef) and lines_of(big) == 401 > MAX_CLASS_LINES
