"""docs/results/: every result path the docs and the code cite exists, and every folder there is described."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"

#: ``docs/results/x/y`` anywhere, and ``results/x/y`` as a link relative to docs/ (``![graph](results/...)``).
CITED = re.compile(r"(?:docs/|(?<=\()|(?<=`))(results/[A-Za-z0-9_.\-/]+)")


def citing_files() -> list[Path]:
    files = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "docs" / "results").glob("*.md")),
    ]
    for folder in ("mmd", "scripts", "benchmarks", "kernels", "systemd", "config"):
        files += sorted(
            p
            for p in (ROOT / folder).rglob("*")
            if p.is_file() and p.suffix in (".py", ".sh", ".cu", ".md", ".yaml", ".service")
        )
    return files


def cited_paths() -> dict[str, list[str]]:
    """Each cited path (relative to docs/) → the files citing it."""
    cited: dict[str, list[str]] = {}
    for path in citing_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in CITED.finditer(text):
            cited.setdefault(match.group(1).rstrip(".,;:)"), []).append(str(path.relative_to(ROOT)))
    return cited


def test_the_docs_cite_result_paths():
    assert "results/daemon-shape/cpu-bench_daemon-flood.json" in cited_paths()  # the walk finds citations


def test_every_cited_result_path_exists():
    missing = {p: files for p, files in cited_paths().items() if not (ROOT / "docs" / p).exists()}
    assert not missing, f"cited but not in docs/results: {missing}"


def test_every_results_folder_is_described_in_its_readme():
    readme = (RESULTS / "README.md").read_text(encoding="utf-8")
    folders = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())
    assert folders, "docs/results holds no folders"
    undescribed = [f for f in folders if f"## `{f}/`" not in readme]
    assert not undescribed, f"docs/results/README.md has no section for {undescribed}"


def test_the_architecture_doc_names_every_module():
    """docs/architecture.md's module table has a row for each module of the package, and none that is gone."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(mmd/[\w/]+\.py)` \|", text, flags=re.M))
    present = {str(p.relative_to(ROOT)) for p in (ROOT / "mmd").rglob("*.py") if "__pycache__" not in p.parts}
    assert listed == present, (sorted(present - listed), sorted(listed - present))
