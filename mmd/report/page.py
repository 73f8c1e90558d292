"""The report as a web page: one self-contained HTML file (no server, no network: graphs inline as base64 PNG,
CSS and the small sorting script inline), sortable tables, every name and message escaped.

One renderer, :func:`page`, draws every page from :class:`Section`\\ s of headings, text, graphs and tables:
:func:`bench_page` (``mmd report``: the course's graphs and the speed-up tables of a bench run),
:func:`class_page` (a class's results, :class:`ClassResults`, which grading fills) and :func:`student_page`
(one student's part of it, to hand to that student alone).

The markup is built with :func:`el`, which escapes every text and attribute value it is given
(:func:`html.escape`) and passes through only :class:`Html` it made itself, so no name or message can become
markup. A template language (Jinja2's autoescape gives the same guarantee) would add a dependency and a second
language for a page that is a few tables and images built from data.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import write_atomic
from ..bench.rows import BenchRow
from .summary import GRAPH_FILES, Sections, Table, naive_kernel, ratio_table, sweep_table


class Html(str):
    """Markup made by :func:`el` (escaped already): the only text :func:`el` does not escape."""


Child = str | Html | None
_VOID = frozenset({"img", "meta", "br"})


def el(tag: str, *children: Child | Sequence[Child], **attrs: str | None) -> Html:
    """``<tag attrs>children</tag>``; a trailing ``_`` in an attribute's name is dropped (``class_``), an
    attribute of None is left out, a child of None is nothing."""
    flat: list[Child] = []
    for child in children:
        if isinstance(child, str) or child is None:
            flat.append(child)
        else:
            flat.extend(child)
    parts = "".join(
        f' {name.rstrip("_").replace("_", "-")}="{html.escape(value, quote=True)}"'
        for name, value in attrs.items()
        if value is not None
    )
    if tag in _VOID:
        return Html(f"<{tag}{parts}>")
    inner = "".join(c if isinstance(c, Html) else html.escape(c, quote=False) for c in flat if c is not None)
    return Html(f"<{tag}{parts}>{inner}</{tag}>")


@dataclass
class Cell:
    """A table cell: its text and, where the column sorts by another value than the text, that value."""

    text: Child
    sort: float | str | None = None
    class_: str | None = None


@dataclass
class HtmlTable:
    header: list[str]
    rows: list[list[Child | Cell]]
    caption: str | None = None

    @classmethod
    def of(cls, table: Table, caption: str | None = None) -> HtmlTable:
        return cls(table.header, [list(r) for r in table.rows], caption)


@dataclass
class Graph:
    """A graph as PNG bytes and the words that stand for it."""

    png: bytes
    alt: str


@dataclass
class Section:
    heading: str
    id: str | None = None
    text: list[str] = field(default_factory=list)
    graphs: list[Graph] = field(default_factory=list)
    tables: list[HtmlTable] = field(default_factory=list)
    subsections: list[Section] = field(default_factory=list)


# The page's style and its sorting script are the page's own (a few lines each): a library for either would
# have to be inlined whole into every page.
_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1200px}
h1,h2,h3,p,caption{overflow-wrap:anywhere}
h1{font-size:1.5em}h2{font-size:1.25em;margin-top:1.5em}h3{font-size:1.1em}
table{border-collapse:collapse;margin:.5em 0 1em}caption{text-align:left;font-weight:600;padding:.2em 0}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
td>span{display:inline-block;max-width:22em;overflow-wrap:break-word}
th{background:#f0f0f0;cursor:pointer;user-select:none;white-space:nowrap}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.bad{color:#b00020;font-weight:600}.late{color:#a15c00}
img{max-width:100%;height:auto;margin:.3em .5em .3em 0;border:1px solid #eee}
section.student{border-top:1px solid #ddd;margin-top:1em}
"""

_SCRIPT = """
var NUMBER = /^[-+]?\\d+(\\.\\d+)?(e[-+]?\\d+)?(×|%)?( .*)?$/;  // as a cell's text shows a number
document.querySelectorAll("table.sortable th").forEach(function (th) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0], col = th.cellIndex;
    var up = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th").forEach(function (o) { o.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", up ? "ascending" : "descending");
    function key(tr) {
      var td = tr.cells[col];
      var v = td && td.hasAttribute("data-sort") ? td.getAttribute("data-sort") : (td ? td.textContent : "");
      v = v.trim();
      return v === "" ? null : NUMBER.test(v) ? parseFloat(v) : v;
    }
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      if (x === null || y === null) { return (x === null) - (y === null); }  // empty cells last either way
      var c = (typeof x === "number" && typeof y === "number") ? x - y
        : (typeof x === "number") ? -1 : (typeof y === "number") ? 1 : String(x).localeCompare(String(y));
      return up ? c : -c;
    });
    rows.forEach(function (tr) { body.appendChild(tr); });
  });
});
"""

# Nothing the page may fetch: it is a file, and a name that slipped into markup could not load anything either.
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"


def _cell(value: Child | Cell) -> Html:
    if not isinstance(value, Cell):
        value = Cell(value)
    numeric = isinstance(value.text, str) and not isinstance(value.text, Html) and _NUMBER.match(value.text)
    classes = " ".join(c for c in ("num" if numeric else None, value.class_) if c) or None
    sort = None if value.sort is None else str(value.sort)
    # The span holds a long name or message to a width of its own; a table cell's width cannot be capped.
    return el("td", el("span", value.text), class_=classes, data_sort=sort)


#: A cell's text that is a number (the sorting script's NUMBER): 1.5, 2.00×, 45.1%, 1.234 [1.1–1.3] (kernel).
_NUMBER = re.compile(r"^[-+]?\d+(\.\d+)?(e[-+]?\d+)?(×|%)?( .*)?$")


def table_html(table: HtmlTable) -> Html:
    head = el("thead", el("tr", [el("th", h, scope="col") for h in table.header]))
    body = el("tbody", [el("tr", [_cell(c) for c in row]) for row in table.rows])
    caption = el("caption", table.caption) if table.caption else None
    return el("table", caption, head, body, class_="sortable")


def graph_html(graph: Graph) -> Html:
    data = base64.b64encode(graph.png).decode("ascii")
    return el("img", src=f"data:image/png;base64,{data}", alt=graph.alt, title=graph.alt)


def section_html(section: Section, level: int = 2) -> Html:
    return el(
        "section",
        el(f"h{level}", section.heading),
        [el("p", t) for t in section.text],
        el("div", [graph_html(g) for g in section.graphs], class_="graphs") if section.graphs else None,
        [table_html(t) for t in section.tables],
        [section_html(s, level + 1) for s in section.subsections],
        id=section.id,
        class_="student" if section.id and section.id.startswith("student-") else None,
    )


def page(title: str, sections: Iterable[Section], intro: Sequence[Child] = ()) -> str:
    """The whole page: one HTML file that needs nothing else."""
    head = el(
        "head",
        el("meta", charset="utf-8"),
        el("meta", http_equiv="Content-Security-Policy", content=_CSP),
        el("meta", name="viewport", content="width=device-width, initial-scale=1"),
        el("title", title),
        el("style", Html(_STYLE)),
    )
    body = el(
        "body",
        el("h1", title),
        [el("p", t) for t in intro],
        [section_html(s) for s in sections],
        el("script", Html(_SCRIPT)),
    )
    return "<!DOCTYPE html>\n" + el("html", head, body, lang="en") + "\n"


# --- mmd report: a bench run's graphs and tables -------------------------------------------------------------


def bench_page(shown: Sections, graphs: dict[str, bytes]) -> str:
    """``mmd report``'s page: graphs 1-3 (and 4) from ``graphs`` (file name as summary.md links it -> PNG bytes),
    the tables behind graphs 1 and 2, the speed-ups over naive and the efficiency against cuBLAS."""
    results = shown.results
    size = shown.sweep.size
    where = f"{size}×{size}" if size is not None else "no size"
    sections = [
        Section(
            f"Graph 1: overall time at {where} (ms)",
            graphs=[Graph(graphs[GRAPH_FILES[0]], "graph 1: overall time by tile")],
            tables=[HtmlTable.of(sweep_table(shown.sweep, "overall"), "median [min–max] ms")],
        ),
        Section(
            f"Graph 2: CUDA time at {where} (ms)",
            graphs=[Graph(graphs[GRAPH_FILES[1]], "graph 2: CUDA time by tile")],
            tables=[HtmlTable.of(sweep_table(shown.sweep, "cuda", fallback_kernel=True), "median [min–max] ms")],
        ),
        Section(
            "Graph 3: kernel time and GFLOP/s against size",
            graphs=[Graph(graphs[GRAPH_FILES[2]], "graph 3: kernel time and GFLOP/s by size")],
        ),
    ]
    kernel_ms = BenchRow.median
    naive = naive_kernel(shown)
    speedup = Section(f"Speed-up over {naive}")
    if naive in shown.sweeps:
        base = shown.base(naive, "kernel")
        table = ratio_table(shown.sweeps, base, lambda r: kernel_ms(r, "kernel"))
        speedup.tables.append(HtmlTable.of(table, f"{naive} kernel time / kernel time, by size (higher is faster)"))
    else:
        speedup.text.append("No naive results to compare with.")
    cublas = Section("Efficiency against cuBLAS")
    if "cublas" in shown.sweeps:
        base = shown.base("cublas", "kernel")
        table = ratio_table(shown.sweeps, base, lambda r: kernel_ms(r, "kernel"), fmt="{:.1%}")
        cublas.tables.append(HtmlTable.of(table, "cuBLAS kernel time / kernel time, by size (100% = as fast)"))
    else:
        cublas.text.append("No cuBLAS results to compare with.")
    sections += [speedup, cublas]
    for name, png in graphs.items():
        if name not in GRAPH_FILES:
            sections.append(Section(name.removesuffix(".png"), graphs=[Graph(png, name)]))
    intro = [f"Source: {results.source} ({results.kind}, {len(results.rows)} cases)."]
    intro += ["The numbers of every table, and the cases these leave out, are in summary.md beside this page."]
    return page("mmd benchmark report", sections, intro)


# --- a class's results ---------------------------------------------------------------------------------------


@dataclass
class KernelResult:
    """One student's result for one kernel they handed in."""

    kernel: str  # the hand-in's name
    kind: str  # the course's kernel it is (naive, tiled, 4-outputs): the leaderboards are per kind
    #: Right on every test input at every tile; None where it was not run (it did not compile).
    correct: bool | None
    message: str = ""  # why not: the compiler's first line, the first wrong element
    tile64: str = ""  # what tile 64 did: "refused before launch", or what ran
    #: Kernel time (ms) at the course's size, by tile (graph 1) and at the course's tile, by size (graph 2).
    by_tile_ms: dict[int, float] = field(default_factory=dict)
    by_size_ms: dict[int, float] = field(default_factory=dict)
    over_naive: float | None = None  # mmd's naive kernel time / this kernel's, same session
    over_cublas: float | None = None  # cuBLAS SGEMM's kernel time / this kernel's (1.0: as fast)
    late: bool = False  # received by the service after the deadline


@dataclass
class StudentResult:
    name: str
    kernels: list[KernelResult]


@dataclass
class ClassResults:
    """A class's graded kernels: what :func:`class_page` and :func:`student_page` show."""

    title: str
    students: list[StudentResult]
    size: int = 4096  # graph 1's size, the headline time's
    tile: int = 32  # graph 2's tile, the headline time's

    def time_ms(self, k: KernelResult) -> float | None:
        """The headline time: at the course's size and tile."""
        return k.by_tile_ms.get(self.tile, k.by_size_ms.get(self.size))


def _number(value: float | None, fmt: str) -> Cell:
    return Cell("" if value is None else fmt.format(value), value)


def _correct(k: KernelResult) -> Cell:
    if k.correct is None:
        return Cell("not run", 0, "bad")
    return Cell("yes", 2) if k.correct else Cell("WRONG", 1, "bad")


def _row(results: ClassResults, student: Child | Cell, k: KernelResult) -> list[Child | Cell]:
    return [
        student,
        k.kernel,
        k.kind,
        _correct(k),
        k.tile64,
        _number(results.time_ms(k), "{:.3f}"),
        _number(k.over_naive, "{:.2f}×"),
        _number(k.over_cublas, "{:.1%}"),
        Cell("late", 1, "late") if k.late else Cell("", 0),
        k.message,
    ]


def _header(results: ClassResults) -> list[str]:
    return ["student", "kernel", "kind", "correct", "tile 64", f"ms ({results.size}, tile {results.tile})",
            "× naive", "of cuBLAS", "late", "message"]  # fmt: skip


def _student_id(index: int) -> str:
    # Ids by place, not by name: a name can hold anything.
    return f"student-{index + 1}"


def _student_section(results: ClassResults, index: int, draw: bool) -> Section:
    from . import figures  # matplotlib's: only to draw

    student = results.students[index]
    rows = [_row(results, None, k)[1:] for k in student.kernels]
    section = Section(student.name, _student_id(index), tables=[HtmlTable(_header(results)[1:], rows)])
    if draw:
        series = {k.kernel: (k.by_tile_ms, k.by_size_ms) for k in student.kernels if k.correct}
        by_tile, by_size = figures.student_figures(series, results.size, results.tile)
        section.graphs = [
            Graph(figures.png_bytes(by_tile, 72), f"graph 1 of {student.name}: kernel time by tile"),
            Graph(figures.png_bytes(by_size, 72), f"graph 2 of {student.name}: kernel time by size"),
        ]
    return section


def _leaderboards(results: ClassResults) -> list[Section]:
    kinds: dict[str, list[tuple[int, KernelResult]]] = {}
    for i, s in enumerate(results.students):
        for k in s.kernels:
            kinds.setdefault(k.kind, [])
            if k.correct and results.time_ms(k) is not None:
                kinds[k.kind].append((i, k))
    out = []
    for kind, entries in kinds.items():
        entries.sort(key=lambda e: results.time_ms(e[1]) or 0.0)
        rows: list[list[Child | Cell]] = [
            [Cell(str(rank), rank), _link(results, i), *_row(results, None, k)[5:9]]
            for rank, (i, k) in enumerate(entries, start=1)
        ]
        header = ["rank", "student", *_header(results)[5:9]]
        out.append(Section(f"Leaderboard: {kind}", tables=[HtmlTable(header, rows, "correct kernels, fastest first")]))
    return out


def _link(results: ClassResults, index: int) -> Html:
    return el("a", el("bdi", results.students[index].name), href="#" + _student_id(index))


def class_page(results: ClassResults, graphs: bool = True) -> str:
    """The class's page: the class table (a row per student and kernel), a leaderboard per kernel kind, and each
    student's part (their table and two course graphs, where ``graphs``)."""
    return _class_page(results, [_student_section(results, i, graphs) for i in range(len(results.students))])


def _class_page(results: ClassResults, parts: list[Section]) -> str:
    rows = [_row(results, _link(results, i), k) for i, s in enumerate(results.students) for k in s.kernels]
    table = Section("Class table", "class", tables=[HtmlTable(_header(results), rows)])
    students = Section("Students", "students", subsections=parts)
    intro = [f"{len(results.students)} students. Click a column's header to sort by it."]
    return page(results.title, [table, *_leaderboards(results), students], intro)


def student_page(results: ClassResults, name: str, graphs: bool = True) -> str:
    """The page of one student, ``name``: their part of the class page and nothing of anyone else's."""
    index = next((i for i, s in enumerate(results.students) if s.name == name), None)
    if index is None:
        raise ValueError(f"no student {name!r} in {results.title}")
    return _student_page(results, _student_section(results, index, graphs))


def _student_page(results: ClassResults, part: Section) -> str:
    return page(f"{results.title}: {part.heading}", [part])


def student_file(index: int, name: str) -> str:
    """A student's page's file name: their place and their name's safe characters, no more than 60 of them."""
    return f"{index + 1:03d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', name)[:60].strip('._') or 'student'}.html"


def write_class(results: ClassResults, folder: Path) -> list[Path]:
    """``folder/index.html`` (the class page) and ``folder/students/NNN-name.html`` (a page per student), each
    student's graphs drawn once for both."""
    parts = [_student_section(results, i, True) for i in range(len(results.students))]
    (folder / "students").mkdir(parents=True, exist_ok=True)
    index = folder / "index.html"
    write_atomic(index, [_class_page(results, parts).encode()], durable=False)
    files = [index]
    for i, part in enumerate(parts):
        path = folder / "students" / student_file(i, results.students[i].name)
        write_atomic(path, [_student_page(results, part).encode()], durable=False)
        files.append(path)
    return files
