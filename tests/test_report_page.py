"""The report's web page in a real browser: headless Chromium (Debian's, driven by playwright) loads the page
from disk, and the tests read the rendered DOM: tables, links, graphs, sorting, escaping, console errors."""

from __future__ import annotations

import dataclasses
import html
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmd import bench
from mmd.cli import main
from mmd.report import page
from mmd.report.page import ClassResults, KernelResult, StudentResult

from .test_bench import fake_gpu

pytestmark = pytest.mark.integration  # a real browser, and matplotlib draws every student's graphs

CHROMIUM = "/usr/bin/chromium"
KINDS = ("naive", "tiled", "4-outputs")
SIZES = (128, 256, 512, 1024, 2048, 4096)
TILES = (4, 8, 16, 32)
HOSTILE = (
    "<script>window.pwned = 1</script>",
    '"><img src=x onerror="window.pwned=2">',
    'O\'Brien & "Sons"',
    "\u202eevil\u202c name \u200f",
    "x" * 300,
    "$\\frac{1}{0}$ </td></tr></table>",
)


def fake_class(n: int = 40, seed: int = 46, names: tuple[str, ...] = ()) -> ClassResults:
    """A generated class: ``n`` students (``names`` first), three kernels each, times near the course's, some
    wrong, one that did not compile, some late."""
    rng = random.Random(seed)
    students = []
    for i in range(n):
        name = names[i] if i < len(names) else f"student{i + 1:02d}"
        kernels = []
        for j, kind in enumerate(KINDS):
            base = (400.0, 150.0, 60.0)[j] * rng.uniform(0.7, 1.5)
            correct: bool | None = rng.random() > 0.1
            if i == 3 and j == 2:
                correct = None
            kernels.append(
                KernelResult(
                    kernel=f"{kind}" if i >= len(names) else f"{name[:20]}-{kind}",
                    kind=kind,
                    correct=correct,
                    message="" if correct else ("nvcc: error: expected ';'" if correct is None else "C[0][1] wrong"),
                    tile64="refused",
                    by_tile_ms={} if correct is None else {t: base * (32 / t) ** 0.5 for t in TILES},
                    by_size_ms={} if correct is None else {z: base * (z / 4096) ** 3 for z in SIZES},
                    over_naive=None if correct is None else 400.0 / base,
                    over_cublas=None if correct is None else 8.0 / base,
                    late=rng.random() < 0.1,
                )
            )
        students.append(StudentResult(name, kernels))
    return ClassResults("CS 4xx, homework 1: matrix multiply", students)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    args = ["--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update"]
    args += ["--disable-sync"] + (["--no-sandbox"] if os.geteuid() == 0 else [])  # root has no user namespace
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        yield chromium
        chromium.close()


class Loaded:
    """A page opened from disk, and every console error and uncaught exception it raised."""

    def __init__(self, browser: Any, path: Path, viewport: dict[str, int] | None = None) -> None:
        self.errors: list[str] = []
        self.context = browser.new_context(viewport=viewport or {"width": 1280, "height": 900})
        self.tab = self.context.new_page()
        self.tab.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.tab.on("pageerror", lambda e: self.errors.append(str(e)))
        self.tab.goto(path.as_uri(), wait_until="load")

    def texts(self, selector: str) -> list[str]:
        result: list[str] = self.tab.eval_on_selector_all(selector, "els => els.map(e => e.textContent)")
        return result

    def column(self, table: str, col: int) -> list[str]:
        return self.texts(f"{table} tbody tr td:nth-child({col})")


@pytest.fixture(scope="module")
def class_folder(tmp_path_factory) -> tuple[ClassResults, Path]:
    results = fake_class()
    folder = tmp_path_factory.mktemp("class")
    page.write_class(results, folder)
    return results, folder


def test_markup_escapes_every_text_and_attribute():
    made = page.el("td", '<b x="1">&', title='"><script>', data_sort="'")
    assert made == '<td title="&quot;&gt;&lt;script&gt;" data-sort="&#x27;">&lt;b x="1"&gt;&amp;</td>'
    assert page.el("p", page.el("b", "<i>")) == "<p><b>&lt;i&gt;</b></p>"  # markup it made passes through once


def test_class_page_tables_links_and_graphs(browser, class_folder):
    results, folder = class_folder
    loaded = Loaded(browser, folder / "index.html")
    tab = loaded.tab
    rows = tab.query_selector_all("#class tbody tr")
    assert len(rows) == 40 * 3
    first = [c.text_content() for c in rows[0].query_selector_all("td")]
    k = results.students[0].kernels[0]
    assert first[:3] == ["student01", k.kernel, "naive"]
    assert first[5] == f"{k.by_tile_ms[32]:.3f}" and first[6] == f"{k.over_naive:.2f}×"
    assert first[7] == f"{k.over_cublas:.1%}"
    # the one that did not compile says so, with its compiler line
    broken = [r for r in rows if "not run" in r.text_content()]
    assert len(broken) == 1 and "expected ';'" in broken[0].text_content()
    # every student's link leads to their section on the page
    hrefs = tab.eval_on_selector_all("#class tbody a", "as => as.map(a => a.getAttribute('href'))")
    assert len(hrefs) == 120 and len(set(hrefs)) == 40
    for href in set(hrefs):
        assert tab.query_selector(href) is not None, href
    # one leaderboard per kind, correct kernels only, fastest first
    boards = tab.eval_on_selector_all("h2", "hs => hs.map(h => h.textContent)")
    assert [b for b in boards if b.startswith("Leaderboard")] == [f"Leaderboard: {kind}" for kind in KINDS]
    # two graphs per student, decoded and drawn with a size
    sizes = tab.eval_on_selector_all(
        "section.student img", "is => is.map(i => [i.complete, i.naturalWidth, i.getBoundingClientRect().width])"
    )
    assert len(sizes) == 80
    assert all(done and natural >= 300 and shown > 100 for done, natural, shown in sizes)
    assert loaded.errors == []
    loaded.context.close()


def test_a_leaderboard_is_fastest_first_and_holds_only_correct_kernels(browser, class_folder):
    results, folder = class_folder
    loaded = Loaded(browser, folder / "index.html")
    correct = sorted(
        (k.by_tile_ms[32], s.name) for s in results.students for k in s.kernels if k.kind == "tiled" and k.correct
    )
    board = loaded.tab.locator("section", has=loaded.tab.locator("h2", has_text="Leaderboard: tiled"))
    names = board.locator("tbody tr td:nth-child(2)").all_text_contents()
    assert names == [name for _, name in correct]
    loaded.context.close()


#: Forty names as a class list has them: accents, apostrophes, hyphens, other scripts, one very long.
REALISTIC = (
    "Zoë O'Neill",
    "José Álvarez-Núñez",
    "Nguyễn Thị Minh Khai",
    "Анна Петрова",
    "李小龍",
    "Mohammed Al-Farsi",
    "محمد عبد الله",
    "Siobhán Ní Bhriain",
    "Łukasz Wróblewski",
    "Ørjan Sæther",
    "Priya Raghunathan",
    "Jean-Baptiste de La Fontaine",
    "Kwame Mensah",
    "Chloé Dubois",
    "Søren Kierkegaard-Hansen",
    "Ana María Ruiz",
    "Ömer Çelik",
    "Yuki Tanaka (田中 由紀)",
    "Björn Þórsson",
    "Aoife McGrath",
    "Dmitri Ivanov",
    "Fatima Zahra",
    "Gabriel García",
    "Hana Novák",
    "Ifeoma Okafor",
    "Jakob Müller",
    "Kim Min-jun",
    "Lea Schröder",
    "María-José Fernández de Córdoba y Sánchez-Albornoz",
    "Nils Åberg",
    "Olusegun Adeyemi",
    "Paweł Kowalski",
    "Quentin L'Écuyer",
    "Rania Haddad",
    "Sakura Itō",
    "Tomás Ó Súilleabháin",
    "Uma Venkataraman",
    "Valentina Rossi",
    "Wei Zhang",
    "Yasmin Bakr",
)


@pytest.fixture(scope="module")
def realistic_class(tmp_path_factory) -> tuple[ClassResults, Path]:
    results = fake_class(len(REALISTIC), seed=4646, names=REALISTIC)
    for student in results.students:  # the files the course asks for, as its site exports them
        student.kernels = [dataclasses.replace(k, kernel=f"{k.kind}.cu") for k in student.kernels]
    folder = tmp_path_factory.mktemp("realistic")
    page.write_class(results, folder)
    return results, folder


def load_ms(loaded: Loaded) -> float:
    """The page's load as the browser timed it: its navigation's start to the end of its load event."""
    took: float = loaded.tab.evaluate(
        "(() => { const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime; })()"
    )
    return took


@pytest.mark.serial  # a wall-clock bound
def test_the_class_page_and_a_students_page_load_in_a_second(browser, realistic_class):
    """A 40-student class of three kernels each, with the names a class list has, some wrong, one not compiled,
    some late, as write_class writes it: the class page and a student's page each load within 1 s in headless
    Chromium (its own navigation timing), with no console error."""
    results, folder = realistic_class
    kernels = [k for s in results.students for k in s.kernels]
    assert len(results.students) == 40 and len(kernels) == 120
    assert any(k.correct is False for k in kernels) and any(k.correct is None for k in kernels)
    assert any(k.late for k in kernels)
    student = sorted((folder / "students").iterdir())[28]  # the longest name
    pages = ((folder / "index.html", "the class page", "Class table"), (student, "a student's page", REALISTIC[28]))
    for path, what, heading in pages:
        loaded = Loaded(browser, path)
        took = load_ms(loaded)
        print(f"{what} ({path.stat().st_size / 1e6:.2f} MB) loaded in {took:.0f} ms")
        assert loaded.errors == [], what
        assert loaded.texts("h2")[0] == heading
        assert loaded.tab.evaluate("[...document.images].every(i => i.complete && i.naturalWidth > 0)"), what
        assert took <= 1000, f"{what} took {took:.0f} ms to load"
        loaded.context.close()


def _numbers(cells: list[str]) -> list[float]:
    return [float(c.rstrip("×%")) for c in cells if c]


def test_clicking_a_header_sorts_its_column(browser, class_folder):
    _, folder = class_folder
    loaded = Loaded(browser, folder / "index.html")
    tab = loaded.tab
    header = tab.locator("#class th", has_text="ms (4096")
    col = int(header.evaluate("th => th.cellIndex")) + 1
    header.click()
    cells = loaded.column("#class", col)
    assert _numbers(cells) == sorted(_numbers(cells)) and cells[-1] == ""  # blanks last
    assert header.get_attribute("aria-sort") == "ascending"
    header.click()
    cells = loaded.column("#class", col)
    assert _numbers(cells) == sorted(_numbers(cells), reverse=True) and cells[-1] == ""
    student = tab.locator("#class th", has_text="student")
    student.click()
    names = loaded.column("#class", 1)
    assert names == sorted(names) and names[0] == "student01"
    assert loaded.errors == []
    loaded.context.close()


def test_hostile_names_render_as_text(browser, tmp_path):
    results = fake_class(8, names=HOSTILE)
    (tmp_path / "hostile.html").write_text(page.class_page(results), encoding="utf-8")
    loaded = Loaded(browser, tmp_path / "hostile.html")
    tab = loaded.tab
    assert tab.evaluate("window.pwned") is None
    assert tab.evaluate("document.scripts.length") == 1  # the page's own
    assert tab.evaluate("document.querySelectorAll('section.student img').length") == 16
    links = loaded.texts("#class tbody a")
    assert links[::3][: len(HOSTILE)] == list(HOSTILE)
    headings = loaded.texts("section.student h3")
    assert headings[: len(HOSTILE)] == list(HOSTILE)
    assert len(tab.query_selector_all("#class tbody tr")) == 8 * 3  # no name closed a row or a table
    # a very long name wraps inside its column rather than stretching the page
    width = tab.evaluate("document.documentElement.scrollWidth")
    assert width <= 1280
    assert loaded.errors == []
    loaded.context.close()


def test_a_student_s_page_holds_their_part_only(browser, class_folder, tmp_path):
    results, folder = class_folder
    files = sorted((folder / "students").iterdir())
    assert len(files) == 40 and files[4].name == "005-student05.html"
    text = files[4].read_text(encoding="utf-8")
    others = [s.name for s in results.students if s.name != "student05"]
    assert not [name for name in others if name in text]
    loaded = Loaded(browser, files[4])
    assert loaded.texts("section.student h2") == ["student05"]
    assert len(loaded.tab.query_selector_all("tbody tr")) == 3
    assert len(loaded.tab.query_selector_all("img")) == 2
    assert loaded.errors == []
    loaded.context.close()
    with pytest.raises(ValueError, match="no student"):
        page.student_page(results, "nobody")
    hostile = fake_class(len(HOSTILE), names=HOSTILE)
    assert [page.student_file(i, s.name) for i, s in enumerate(hostile.students)][:2] == [
        "001-script_window.pwned_1_script.html",
        "002-img_src_x_onerror_window.pwned_2.html",
    ]


def test_mmd_report_renders_its_graphs_and_tables_on_the_page(browser, tmp_path):
    folder = tmp_path / "run"
    plan = bench.course_plan(sizes=(8, 16, 32), tiles=(4, 8, 16, 32, 64), tiles_at_size=32, repeats=2)
    backend, _ = fake_gpu()
    assert bench.run_plan(plan, backend, folder=folder, env={"device": backend.device_name()}).ok
    out = tmp_path / "report"
    assert main(["report", str(folder), "-o", str(out)]) == 0
    loaded = Loaded(browser, out / "report.html")
    tab = loaded.tab
    headings = loaded.texts("h2")
    assert headings[:3] == ["Graph 1: overall time at 32×32 (ms)", "Graph 2: CUDA time at 32×32 (ms)",
                            "Graph 3: kernel time and GFLOP/s against size"]  # fmt: skip
    assert "Speed-up over naive" in headings and "Efficiency against cuBLAS" in headings
    sizes = tab.eval_on_selector_all("img", "is => is.map(i => [i.naturalWidth, i.naturalHeight])")
    assert sizes == [[900, 500], [900, 500], [1200, 500]]
    # graph 1's table: a row per kernel, tile 64 refused, the same cells as summary.md's
    summary = (out / "summary.md").read_text(encoding="utf-8")
    rows = tab.locator("table").first.locator("tbody tr")
    for i in range(rows.count()):
        cells = rows.nth(i).locator("td").all_text_contents()
        assert "| " + " | ".join(cells) + " |" in summary
    assert "refused" in tab.locator("table").first.text_content()
    speedup = tab.locator("section", has=tab.locator("h2", has_text="Speed-up over naive")).locator("tbody tr")
    naive = [r for r in speedup.all_text_contents() if r.startswith("naive")]
    assert naive and all(c == "1.00×" for c in speedup.first.locator("td").all_text_contents()[1:])
    assert loaded.errors == []
    loaded.context.close()


def test_screenshot_of_a_generated_class(browser, class_folder, tmp_path):
    """The screenshot in docs/ (set REPORT_SCREENSHOT=docs/class-report.png to write it there)."""
    _, folder = class_folder
    loaded = Loaded(browser, folder / "index.html", {"width": 1280, "height": 800})
    loaded.tab.locator("#class th", has_text="of cuBLAS").click()
    loaded.tab.locator("#class th", has_text="of cuBLAS").click()  # the fastest first
    target = Path(os.environ.get("REPORT_SCREENSHOT") or tmp_path / "class-report.png")
    started = time.monotonic()
    loaded.tab.screenshot(path=str(target), type="png")
    assert target.stat().st_size > 10_000 and time.monotonic() - started < 30
    assert loaded.errors == []
    loaded.context.close()


def test_page_text_is_never_markup():
    results = fake_class(len(HOSTILE), names=HOSTILE)
    text = page.class_page(results, graphs=False)
    for name in HOSTILE:
        assert html.escape(name, quote=False) in text
    assert "<script>window" not in text and "<img src=x" not in text
