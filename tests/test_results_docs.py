"""docs/results/: the files the docs cite and nothing else, each folder saying how its figure was made; and the
architecture doc's module table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"

#: ``docs/results/x/y`` anywhere, and ``results/x/y`` as a link relative to docs/ (``![graph](results/...)``).
CITED = re.compile(r"(?:docs/|(?<=\()|(?<=`))(results/[A-Za-z0-9_.\-/]+)")

#: What a folder's README.md, or the header of each of its files, must say about the figure.
HEADER_KEYS = ("command:", "machine:", "date:")

#: The most files docs/results may hold: a folder per figure the docs quote, not every run ever made.
MOST_FILES = 40


def doc_files() -> list[Path]:
    """The files whose citations keep a result: README.md and docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def citing_files() -> list[Path]:
    """Every file that may cite a result path: the docs, docs/results' READMEs and the code's comments."""
    files = [*doc_files(), *sorted(RESULTS.rglob("*.md"))]
    for folder in ("mmd", "scripts", "benchmarks", "kernels", "systemd", "config"):
        files += sorted(
            p
            for p in (ROOT / folder).rglob("*")
            if p.is_file() and p.suffix in (".py", ".sh", ".cu", ".md", ".yaml", ".service")
        )
    return files


def cited_paths(files: list[Path] | None = None) -> dict[str, list[str]]:
    """Each cited path (relative to docs/, a folder without its last slash) → the files citing it."""
    cited: dict[str, list[str]] = {}
    for path in citing_files() if files is None else files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in CITED.finditer(text):
            cited.setdefault(match.group(1).rstrip(".,;:)").rstrip("/"), []).append(str(path.relative_to(ROOT)))
    return cited


def result_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file())


def says_how_it_was_made(text: str) -> list[str]:
    """The header keys ``text`` lacks among its first lines (a README's list or a log's ``#`` header)."""
    head = [line.lstrip("#-* ").strip("`") for line in text.splitlines()[:40]]
    return [key for key in HEADER_KEYS if not any(line.startswith(key) for line in head)]


def test_the_docs_cite_result_paths():
    cited = cited_paths(doc_files())
    assert "results/daemon-table" in cited and "results/course" in cited  # the walk finds citations, folders too


def test_every_cited_result_path_exists():
    missing = {p: files for p, files in cited_paths().items() if not (ROOT / "docs" / p).exists()}
    assert not missing, f"cited but not in docs/results: {missing}"


def test_every_result_file_is_cited_by_the_docs():
    """A file counts as cited where README.md or a docs/*.md names it or the folder that holds it; a folder's
    README.md where they cite anything in its folder."""
    cited = set(cited_paths(doc_files()))

    def is_cited(path: Path) -> bool:
        return str(path.relative_to(ROOT / "docs")) in cited

    uncited = [
        str(p.relative_to(RESULTS))
        for p in result_files()
        if p != RESULTS / "README.md"
        and not is_cited(p)
        and not is_cited(p.parent)
        and not (p.name == "README.md" and any(is_cited(q) for q in p.parent.iterdir()))
    ]
    assert not uncited, f"in docs/results but cited by no doc (git rm them; the history keeps them): {uncited}"


def test_docs_results_holds_at_most_40_files():
    files = result_files()
    assert len(files) <= MOST_FILES, f"docs/results holds {len(files)} files: keep only what the docs cite"


def test_every_results_folder_says_its_command_machine_and_date():
    """Each folder's README.md says how its figure was made, or else each of its files does in a header."""
    lacking: dict[str, list[str]] = {}
    for folder in sorted({p.parent for p in result_files()} - {RESULTS}):
        readme = folder / "README.md"
        sources = [readme] if readme.exists() else [p for p in folder.iterdir() if p.is_file()]
        for source in sources:
            if gaps := says_how_it_was_made(source.read_text(encoding="utf-8", errors="replace")):
                lacking[str(source.relative_to(RESULTS))] = gaps
    assert not lacking, f"say the command, machine and date: {lacking}"


def test_the_results_index_names_every_folder():
    index = (RESULTS / "README.md").read_text(encoding="utf-8")
    folders = sorted(str(p.relative_to(RESULTS)) for p in {f.parent for f in result_files()} - {RESULTS})
    unnamed = [f for f in folders if f"`{f}/`" not in index]
    assert not unnamed, f"docs/results/README.md does not name {unnamed}"


def test_the_architecture_doc_names_every_module():
    """docs/architecture.md's module table has a row for each module of the package, and none that is gone."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(mmd/[\w/]+\.py)` \|", text, flags=re.M))
    present = {str(p.relative_to(ROOT)) for p in (ROOT / "mmd").rglob("*.py") if "__pycache__" not in p.parts}
    assert listed == present, (sorted(present - listed), sorted(listed - present))


#: A Sphinx role in a docstring (``:class:`~.x.Y```), shown in the table as code (`Y`: ``~`` keeps the last name).
ROLE = re.compile(r":[a-z]+:`(~?)\.?([^`]+)`")


def first_sentence(path: Path) -> str:
    """The first sentence of ``path``'s docstring, as the module table shows it (roles as code, ``x`` as `x`)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    sentence = re.match(r"(.+?[.!?])(?=\s|$)", paragraph)
    text = sentence.group(1) if sentence else paragraph
    text = ROLE.sub(lambda m: "`" + (m.group(2).rpartition(".")[2] if m.group(1) else m.group(2)) + "`", text)
    return text.replace("``", "`")


def test_each_module_row_is_the_first_sentence_of_its_docstring():
    """The table says what each module's docstring says (its one home), so that neither drifts from the other."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(mmd/[\w/]+\.py)` \| (.*) \|$", text, flags=re.M))
    wanted = {name: first_sentence(ROOT / name).replace("|", "\\|") for name in rows if (ROOT / name).is_file()}
    drifted = [f"| `{name}` | {wanted[name]} |" for name in sorted(wanted) if rows[name] != wanted[name]]
    assert not drifted, "docs/architecture.md's rows should read:\n" + "\n".join(drifted)
