"""The package's shape: no import circle, pycuda only in mmd.cuda, nobody imports another module's private names.

Every import counts, at the top of a module or inside a function, and
those under ``if TYPE_CHECKING:`` too: a circle a type checker needs is a
circle all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mmd"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
#: Compiled modules (a C source and its type stub): modules too, though not Python files.
EXTENSIONS = {module_name(p.with_suffix(".py")) for p in PACKAGE.rglob("*.pyi")}


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``from X import`` names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports_of(module: str) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import statement in ``module``."""
    out = []
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((_resolve(module, node), [alias.name for alias in node.names]))
    return out


def graph() -> dict[str, set[str]]:
    """mmd module → the mmd modules it imports (``from pkg import sub`` counts as importing ``pkg.sub``)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target, names in imports_of(module):
            for name in names:
                if f"{target}.{name}" in MODULES:
                    edges[module].add(f"{target}.{name}")
            if target in MODULES and not all(f"{target}.{n}" in MODULES for n in names or ["?"]):
                edges[module].add(target)
    for module in edges:
        edges[module].discard(module)
        # importing a package's module runs the package's __init__ first: not an edge of the module's own
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_pycuda_is_imported_only_in_mmd_cuda(module):
    if module.startswith("mmd.cuda"):
        return
    for target, _ in imports_of(module):
        assert not target.startswith("pycuda"), f"{module} imports {target}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_another_modules_private_names(module):
    for target, names in imports_of(module):
        if not target.startswith("mmd") or target == module:
            continue
        modules = MODULES.keys() | EXTENSIONS
        private = [n for n in names if n.startswith("_") and not n.startswith("__") and f"{target}.{n}" not in modules]
        assert not private, f"{module} imports {private} from {target}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_reaches_into_another_modules_private_names(module):
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    aliases = set()  # local names bound to mmd modules
    for target, names in imports_of(module):
        aliases |= {n for n in names if f"{target}.{n}" in MODULES}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.asname and (alias.name.startswith("mmd") or isinstance(node, ast.ImportFrom)):
                    aliases.add(alias.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            assert not (node.attr.startswith("_") and not node.attr.startswith("__")), (
                f"{module} uses {node.value.id}.{node.attr}"
            )


#: The files that run as scripts; a module beside them that they import (benchmarks/harness.py) has no
#: ``__main__`` block and is tested through them.
SCRIPTS = sorted(
    p
    for p in [*(PACKAGE.parent / "benchmarks").glob("*.py"), *(PACKAGE.parent / "scripts").glob("*.py")]
    if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")
)


@pytest.mark.integration  # runs real processes
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_and_script_starts(script):
    """They run on purpose, rarely, often on another machine: at least they must import and take --help."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


#: What building the command line (every ``mmd`` command does it first) must not import: the
#: modules only some commands run. With them, ``mmd check --help`` took 0.57 s on the 2-core
#: machine, 0.09 s without (docs/grading.md).
HEAVY = (
    "numpy",
    "yaml",
    "structlog",
    "matplotlib",
    "pycuda",
    "mmd.bench",
    "mmd.config",
    "mmd.kernels",
    "mmd.backends",
    "mmd.cuda",
    "mmd.report",
    "mmd.pipeline",
    "mmd.daemon",
    "mmd.check",
    "mmd.textformat",
)


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def _run_python(*args: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout + done.stderr


@pytest.mark.integration  # runs real processes
def test_building_the_command_line_imports_no_command():
    out = _run_python("-c", "import sys, mmd.cli; mmd.cli.build_parser(); print(*sorted(sys.modules))")
    assert _heavy(set(out.split())) == []


@pytest.mark.integration  # runs real processes
def test_mmd_check_help_imports_nothing_heavy():
    # sys.modules, not -X importtime: importlib.import_module (how the sub-commands are found) is not timed
    code = "import sys\nfrom mmd.cli import main\ntry:\n    main(['check', '--help'])\nexcept SystemExit:\n    pass\n"
    out = _run_python("-c", code + "print(*sorted(sys.modules))")
    assert "usage: mmd check" in out and "mmd.cli.check_cmd" in out.split()
    assert _heavy(set(out.split())) == []


@pytest.mark.integration  # runs real processes
def test_the_one_shot_gpu_warmer_starts_before_numpy_is_imported():
    # mmd run starts the GPU's context (or a kernel file's launch process) beside its imports: the modules it
    # starts from import no numpy (they did through mmd.cuda's package __init__, which held the context back by
    # the whole numpy import); tests/test_oneshot.py holds the order in a real run
    modules = "mmd.cli.run_cmd, mmd.oneshot, mmd.config, mmd.cuda.libcuda, mmd.kernelfile.launch"
    out = _run_python("-c", f"import sys, {modules}; print(*sorted(sys.modules))")
    assert [m for m in out.split() if m == "numpy" or m.startswith("numpy.")] == []


def _one_shot_modules(folder: Path) -> set[str]:
    """The modules a real process has imported once `mmd run` of a small job on the cpu backend is done."""
    (folder / "m.txt").write_text("2\n1 2\n3 4\n5 6\n7 8\n")
    code = (
        "import sys\nfrom mmd.cli import main\ntry:\n"
        f"    main(['run', {str(folder / 'm.txt')!r}, '--backend', 'cpu', '-q'])\n"
        "except SystemExit:\n    pass\n"
    )
    out = _run_python("-c", code + "print(*sorted(sys.modules))")
    assert (folder / "m.out").exists()
    return set(out.split())


@pytest.mark.integration  # runs real processes
def test_a_one_shot_that_logs_nothing_imports_no_logging_library(tmp_path: Path):
    # structlog (with the rich it imports) is about numpy's import again: a command pays for it once it logs
    # a line at its level, not before; here the cpu backend's note (info) is below the default level
    names = _one_shot_modules(tmp_path)
    assert "numpy" in names and not {m for m in names if m == "structlog" or m.startswith(("structlog.", "rich"))}


@pytest.mark.integration  # runs real processes
def test_a_one_shot_of_mmds_own_kernel_reads_no_kernel_file(tmp_path: Path):
    # a kernel file's reading (its lexer's patterns, its include sandbox: about 20 ms of imports on the VM) is a
    # kernel file's or a class's, not every job's start
    names = _one_shot_modules(tmp_path)
    assert [m for m in names if m.startswith(("mmd.kernelfile.lexer", "mmd.kernelfile.sandbox"))] == []


def test_the_logging_library_is_made_ready_before_the_first_line_where_asked():
    # the daemon makes it ready while its first worker starts, so that "serving" waits for no import
    code = (
        "import sys\nfrom mmd import logs\nlogs.configure('json', 'info')\nbefore = 'structlog' in sys.modules\n"
        "logs.ready().join()\nprint(before, 'structlog' in sys.modules)"
    )
    assert _run_python("-c", code).split() == ["False", "True"]
