"""`mmd grade`: a class's kernel files graded, over the stand-in driver (tests/fakegpu/pycuda), as real processes.

The launch process is real (a process of its own per kernel, through the real GpuSession); only the driver is
the stand-in, which runs a kernel by its entry's name: ``square`` is right, ``wrong``, ``writes_nan``,
``replay`` and ``stale`` are the cheats (tests/fakegpu/pycuda/driver.py). tests/gpu/test_grade.py grades real
kernels, cheats included, on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from mmd import textformat
from mmd.check.results import Status
from mmd.grade import reports
from mmd.grade.grader import GradePlan
from mmd.grade.records import CUBLAS, NAIVE, NO_TILE, Case, KernelGrade, Reference, StudentGrade
from mmd.kernelfile.store import KernelStore
from mmd.report import page

from .conftest import run_mmd
from .test_kernelfile_run import SQUARE, fake_gpu, integer_input, kernel

pytestmark = pytest.mark.integration

#: What the fake's ``replay`` takes to compute a product (tests/fakegpu/pycuda/driver.py's REPLAY_COMPUTE_S).
REPLAY_COMPUTE_MS = 50.0

#: A small plan: every test at tiles 8 and 64, timed at 16 (tile 32, then tiles 4, 8, 16).
SMALL = ("--tiles", "8", "64", "--sizes", "16")


def data_sets(root: Path) -> Path:
    tests = root / "tests"
    tests.mkdir()
    integer_input(tests / "sq8.txt", 8, 8, 8)
    a, b = integer_input(tests / "rect.txt", 5, 7, 3, seed=2)
    (tests / "rect.out").write_bytes(textformat.emit(np.matmul(a, b)))  # an expected output: judged against it
    return tests


def grade(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return run_mmd("grade", *args, cwd=cwd, env=fake_gpu(**env), timeout=300)


def stopped_by_the_plan(plan: GradePlan, kernel_ms: list[float]) -> bool:
    """Whether a timed case's launches stopped where the plan says: enough with the last, not before it."""
    return plan.enough(kernel_ms) and not plan.enough(kernel_ms[:-1])


def cases(report: dict, student: str) -> dict[str, dict]:
    (mine,) = [s for s in report["students"] if s["student"] == student]
    return {r["name"]: r for r in mine["results"]}


def test_the_course_plan_is_the_course_s() -> None:
    plan = GradePlan()
    assert plan.tiles == (4, 8, 16, 32, 64)
    assert plan.timed() == [(32, 32), (256, 32), (512, 32), (1024, 32), (2048, 32), (4096, 32),
                            (4096, 4), (4096, 8), (4096, 16)]  # fmt: skip


def test_a_class_is_graded_as_mmd_check_reports(tmp_path: Path) -> None:
    tests = data_sets(tmp_path)
    handin = tmp_path / "handin"
    for who in ("alice", "bob"):
        (handin / who).mkdir(parents=True)
    kernel(handin / "alice", "p1.cu")
    kernel(handin / "alice", "p2.cu", entry="wrong")
    kernel(handin / "bob", "p1.cu", entry="writes_nan")
    (handin / "bob" / "bad.cu").write_text(SQUARE.replace("Width) {", "Width) { oops;"), encoding="utf-8")
    (handin / "bob" / "README.txt").write_text("not a kernel", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    done = grade(
        "handin", "--tests", str(tests), *SMALL, "--repeats", "2", "--json", str(out / "g.json"),
        "--junit", str(out / "g.xml"), "--page", str(out / "page"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # wrong kernels fail the run, as wrong outputs fail mmd check
    report = json.loads((out / "g.json").read_text())
    alice, bob = cases(report, "alice"), cases(report, "bob")

    assert alice["p1.cu:sq8@tile=8"]["status"] == "ok" and alice["p1.cu:rect@tile=8"]["status"] == "ok"
    assert alice["p1.cu:rect@tile=8"]["reference"].endswith("rect.out")  # its expected output judged it
    tile64 = alice["p1.cu:sq8@tile=64"]
    assert tile64["status"] == "ok" and tile64["reason"].startswith("refused before launch: tile 64 needs 4096")
    for timed in ("timed 16x16x16@tile=32", "timed 16x16x16@tile=4", "timed 16x16x16@tile=8", "timed 16x16x16@tile=16"):
        assert alice[f"p1.cu:{timed}"]["status"] == "ok"
    wrong = alice["p2.cu:sq8@tile=8"]
    assert wrong["status"] == "mismatch" and "1 outside tolerance" in wrong["reason"]
    assert alice["p2.cu:timed 16x16x16@tile=32"]["reason"].startswith("timed launch 1 (fresh inputs):")
    nan = bob["p1.cu:sq8@tile=8"]
    assert nan["status"] == "mismatch" and "not finite" in nan["reason"]  # NaN is wrong, never a wildcard
    assert "not finite" in bob["p1.cu:timed 16x16x16@tile=32"]["reason"]
    refused = bob["bad.cu:sq8@tile=8"]
    assert refused["status"] == "refused" and refused["reason"].startswith('bad.cu:1: error: identifier "oops"')
    assert all(r["status"] == "refused" for name, r in bob.items() if name.startswith("bad.cu:"))
    assert bob["README.txt"]["status"] == "extra"

    (p1,) = [k for s in report["grade"]["students"] if s["student"] == "alice" for k in s["kernels"]
             if k["kernel"] == "p1.cu"]  # fmt: skip
    timed = [c for c in p1["cases"] if c["kind"] == "timed"]
    assert [(c["shape"][0], c["tile"]) for c in timed] == [(16, 32), (16, 4), (16, 8), (16, 16)]
    for c in timed:
        assert stopped_by_the_plan(GradePlan(repeats=2), c["kernel_ms"]) and len(c["cuda_ms"]) == len(c["kernel_ms"])
        assert c["kernel_median_ms"] == pytest.approx(float(np.median(c["kernel_ms"])))
        assert c["cuda_median_ms"] >= c["kernel_median_ms"]
    assert p1["correct"] is True and p1["sha256"] and not p1["late"]

    # one JUnit test case per student × kernel × test × tile, and one per timed case; extras are none
    suites = {s.find("properties/property[@name='student']").get("value"): s
              for s in ET.parse(out / "g.xml").getroot()}  # fmt: skip
    names = [c.get("name") for c in suites["alice"].iter("testcase")]
    assert len(names) == 2 * (2 * 2 + 4) and "p1.cu:rect@tile=64" in names
    assert len(list(suites["bob"].iter("testcase"))) == 2 * (2 * 2 + 4)
    assert suites["alice"].get("failures") == str(2 * 2 + 4 - 2)  # p2's: all but tile 64's two

    lines = done.stdout.splitlines()
    assert any(line.split()[:3] == ["alice", "p1.cu", "yes"] for line in lines)  # the timing table
    assert any(line.split()[:3] == ["bob", "bad.cu", "not"] for line in lines)
    page = (out / "page" / "index.html").read_text()
    assert "refused before launch" in page and "WRONG" in page


def test_correctness_runs_kernels_side_by_side_and_no_timed_launch_beside_any_other(tmp_path: Path) -> None:
    """Phase 1 checks two kernels at once (--workers 2): launches of different kernels (launch processes) overlap.
    Phase 2 times one kernel at a time: no timed launch (a product 40 wide or more; the tests' are 8 and 16)
    overlaps any other launch of the grading."""
    tests = data_sets(tmp_path)
    for who in ("lee", "max", "ned"):
        (tmp_path / "handin" / who).mkdir(parents=True)
        kernel(tmp_path / "handin" / who, "p1.cu", entry="logs")
    log = tmp_path / "launches.log"
    done = grade("handin", "--tests", str(tests), "--tiles", "8", "16", "--sizes", "40", "--repeats", "2",
                 "--workers", "2", "--json", str(tmp_path / "g.json"), cwd=tmp_path,
                 FAKEGPU_LAUNCH_LOG=str(log))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    launches = [(int(pid), int(n), float(began), float(ended))
                for pid, n, began, ended in (line.split() for line in log.read_text().splitlines())]  # fmt: skip
    timed = [x for x in launches if x[1] >= 40]
    checks = [x for x in launches if x[1] < 40]
    assert len(checks) == 3 * 2 * 2 and len(timed) == 3 * 4 * 2  # 2 launches a case: 0.2 s of kernel time
    for t in timed:
        beside = [x for x in launches if x is not t and x[2] < t[3] and t[2] < x[3]]
        assert not beside, (t, beside)
    assert any(x[0] != y[0] and x[2] < y[3] and y[2] < x[3] for x in checks for y in checks)
    assert "phase 1, compile and correctness (2 workers):" in done.stdout
    assert "phase 2, timed cases (one kernel at a time):" in done.stdout
    assert len({c["name"] for c in json.loads((tmp_path / "g.json").read_text())["students"][0]["results"]}) == 8


def test_every_timed_launch_gets_fresh_inputs_so_a_replay_is_never_timed(tmp_path: Path) -> None:
    """The fake's ``replay`` answers at once when its inputs repeat (in its one launch process): a grader that
    timed the same inputs again would time no work. Every timed launch here computed (its kernel time is the
    fake's compute time), and each product was right."""
    tests = data_sets(tmp_path)
    (tmp_path / "handin" / "carol").mkdir(parents=True)
    kernel(tmp_path / "handin" / "carol", "r.cu", entry="replay")
    done = grade("handin", "--tests", str(tests), "--tiles", "8", "--sizes", "16", "--repeats", "3",
                 "--json", str(tmp_path / "g.json"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (part,) = json.loads((tmp_path / "g.json").read_text())["grade"]["students"]
    timed = [c for c in part["kernels"][0]["cases"] if c["kind"] == "timed"]
    assert len(timed) == 4
    for c in timed:
        assert stopped_by_the_plan(GradePlan(repeats=3), c["kernel_ms"])
        assert min(c["kernel_ms"]) >= REPLAY_COMPUTE_MS * 0.9, c


def test_a_kernel_that_replays_an_earlier_product_is_caught(tmp_path: Path) -> None:
    tests = data_sets(tmp_path)
    (tmp_path / "handin" / "dave").mkdir(parents=True)
    kernel(tmp_path / "handin" / "dave", "s.cu", entry="stale")
    done = grade("handin", "--tests", str(tests), "--tiles", "8", "--sizes", "16", "--repeats", "3",
                 "--json", str(tmp_path / "g.json"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1
    dave = cases(json.loads((tmp_path / "g.json").read_text()), "dave")
    timed = [r for name, r in dave.items() if "timed" in name]
    assert timed and all(r["status"] == "mismatch" and "fresh inputs" in r["reason"] for r in timed)


def _aged(path: Path, when: datetime) -> None:
    os.utime(path, (when.timestamp(), when.timestamp()), follow_symlinks=False)


def test_a_plain_folder_is_late_by_ctime_not_mtime(tmp_path: Path) -> None:
    tests = data_sets(tmp_path)
    (tmp_path / "handin" / "erin").mkdir(parents=True)
    k = kernel(tmp_path / "handin" / "erin", "p1.cu")
    deadline = datetime.now(timezone.utc) - timedelta(minutes=5)
    _aged(k, deadline - timedelta(days=3))  # an mtime set back by its author: not what is judged
    done = grade("handin", "--tests", str(tests), "--tiles", "8", "--sizes", "--deadline", deadline.isoformat(),
                 "--json", str(tmp_path / "g.json"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr  # late hand-ins are graded
    report = json.loads((tmp_path / "g.json").read_text())
    case = cases(report, "erin")["p1.cu:sq8@tile=8"]
    assert case["status"] == "ok" and case["arrived_by"] == "ctime"
    assert case["reason"].startswith("late: arrived ") and "its files' ctime" in case["reason"]
    assert report["grade"]["students"][0]["kernels"][0]["late"] is True


def test_the_store_is_late_by_when_the_service_received_it(tmp_path: Path) -> None:
    tests = data_sets(tmp_path)
    (tmp_path / "state").mkdir()
    store = KernelStore(tmp_path / "state" / "kernels")
    deadline = datetime.now(timezone.utc) - timedelta(hours=1)
    store.keep("fay", "p1", SQUARE.encode(), None)
    store.keep("gus", "p1", SQUARE.replace("square", "wrong").encode(), None)
    _aged(store.folder("fay") / "p1.cu", deadline - timedelta(hours=1))  # received in time
    for path in store.folder("gus").rglob("*.cu"):  # received late, its version's mtime set back: not judged
        _aged(path, deadline - timedelta(days=1))
    _aged(store.folder("gus") / "p1.cu", deadline + timedelta(minutes=10))
    done = grade(str(store.root), "--store", "--tests", str(tests), "--tiles", "8", "--sizes",
                 "--deadline", deadline.isoformat(), "--json", str(tmp_path / "g.json"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads((tmp_path / "g.json").read_text())
    fay, gus = cases(report, "fay")["p1.cu:sq8@tile=8"], cases(report, "gus")["p1.cu:sq8@tile=8"]
    assert fay["status"] == "ok" and fay["reason"] == "" and fay["arrived_by"] == "received"
    assert gus["status"] == "mismatch" and "late: arrived" in gus["reason"]
    assert "when the service received it" in gus["reason"]


HOSTILE = ['<script>alert("s")', "a&b 'q' \"d\"", "tab\there", "new\nline", "]]>x<!--", "\x1b[31mred"]


def test_hostile_names_keep_every_report_well_formed_and_no_path_escapes(tmp_path: Path) -> None:
    tests = data_sets(tmp_path)
    handin = tmp_path / "handin"
    secret = tmp_path / "secret"
    secret.mkdir()
    kernel(secret, "p1.cu")
    (secret / "leak.kernel.yaml").write_text("SECRET-TEXT: 1\n", encoding="utf-8")
    for name in HOSTILE:
        (handin / name).mkdir(parents=True)
        kernel(handin / name, f"{name}.cu")
    (handin / "linked").symlink_to(secret)  # a student's folder that is a link: never followed
    (handin / "mallory").mkdir()
    (handin / "mallory" / "p1.cu").symlink_to(secret / "p1.cu")
    kernel(handin / "mallory", "leak.cu")
    (handin / "mallory" / "leak.kernel.yaml").symlink_to(secret / "leak.kernel.yaml")
    out = tmp_path / "out"
    out.mkdir()
    done = grade("handin", "--tests", str(tests), "--tiles", "8", "--sizes", "--json", str(out / "g.json"),
                 "--junit", str(out / "g.xml"), "--page", str(out / "page"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr  # the links are failures, as in mmd check
    report = json.loads((out / "g.json").read_text())
    assert len(report["students"]) == len(HOSTILE) + 2
    linked = cases(report, "linked")["linked"]
    assert linked["status"] == "not-a-file" and "link" in linked["reason"]
    mallory = cases(report, "mallory")
    assert mallory["p1.cu"]["status"] == "not-a-file" and mallory["leak.cu"]["status"] == "not-a-file"
    assert not any(name.startswith("p1.cu:") for name in mallory)
    ET.parse(out / "g.xml")  # well-formed, whatever the names
    html = "".join(p.read_text() for p in (out / "page").rglob("*.html"))
    everything = (out / "g.json").read_text() + (out / "g.xml").read_text() + html
    assert "SECRET-TEXT" not in everything  # the linked declaration was never read
    assert "\x1b" not in everything
    assert "<script>alert" not in html and "&lt;script&gt;alert" in html
    pages = sorted(p.name for p in (out / "page" / "students").iterdir())
    assert len(pages) == len(HOSTILE) + 2 and all("/" not in p and not p.startswith(".") for p in pages)
    for name in HOSTILE:
        graded = [r for s in report["students"] for r in s["results"] if r["name"].endswith(":sq8@tile=8")]
        assert any(r["status"] == "ok" for r in graded), name
    assert sorted(p.name for p in out.iterdir()) == ["g.json", "g.xml", "page"]


def test_without_a_gpu_nothing_is_marked(tmp_path: Path) -> None:
    tests = data_sets(tmp_path)
    (tmp_path / "handin" / "hal").mkdir(parents=True)
    kernel(tmp_path / "handin" / "hal", "p1.cu")
    done = run_mmd("grade", "handin", "--tests", str(tests), "--json", str(tmp_path / "g.json"), cwd=tmp_path)
    assert done.returncode == 1 and "mmd grade:" in done.stderr
    assert not (tmp_path / "g.json").exists()


def test_slurm_array_of_one_task_per_student_then_gather(tmp_path: Path) -> None:
    tests = data_sets(tmp_path)
    handin = tmp_path / "handin"
    for who, entry in (("ivy", "square"), ("jon", "wrong"), ("new\nline", "square")):
        (handin / who).mkdir(parents=True)
        kernel(handin / who, "p1.cu", entry=entry)
    mmd = f"{sys.executable} -m mmd"
    done = grade("handin", "--tests", str(tests), "--tiles", "8", "--sizes", "--slurm", str(tmp_path / "grading"),
                 "--mmd", mmd, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "left out 'new\\nline'" in done.stderr
    script = tmp_path / "grading" / "grade.sbatch"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMD_", "SLURM_"))}
    env["PYTHONPATH"] = fake_gpu()["PYTHONPATH"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for task in range(2):
        ran = subprocess.run(["bash", str(script)], cwd=elsewhere, env={**env, "SLURM_ARRAY_TASK_ID": str(task)},
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
    assert sorted(p.name for p in (tmp_path / "grading" / "parts").iterdir()) == ["0000.json", "0001.json"]
    gathered = grade("--gather", str(tmp_path / "grading"), "--json", str(tmp_path / "g.json"), "--junit",
                     str(tmp_path / "g.xml"), cwd=tmp_path)  # fmt: skip
    assert gathered.returncode == 1, gathered.stderr  # jon's kernel is wrong
    report = json.loads((tmp_path / "g.json").read_text())
    assert cases(report, "ivy")["p1.cu:sq8@tile=8"]["status"] == "ok"
    assert cases(report, "jon")["p1.cu:sq8@tile=8"]["status"] == "mismatch"
    ET.parse(tmp_path / "g.xml")
    (tmp_path / "grading" / "parts" / "0001.json").unlink()  # a task that never ran: its student is not graded
    again = grade("--gather", str(tmp_path / "grading"), "--json", str(tmp_path / "g.json"), cwd=tmp_path)
    assert again.returncode == 2
    assert "wrote no part" in cases(json.loads((tmp_path / "g.json").read_text()), "jon")["jon"]["reason"]


def test_tests_that_are_no_test_are_said(tmp_path: Path) -> None:
    tests = data_sets(tmp_path)
    (tests / "orphan.out").write_bytes(b"1\n  1.00\n")
    (tmp_path / "handin" / "kim").mkdir(parents=True)
    kernel(tmp_path / "handin" / "kim", "p1.cu")
    done = grade("handin", "--tests", str(tests), "--tiles", "8", "--sizes", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "not a test: orphan.out: an expected output with no input orphan.txt" in done.stderr


def _timed(size: int, tile: int, *ms: float) -> Case:
    return Case("timed", f"{size}x{size}x{size}", (size, size, size), tile, Status.OK, kernel_ms=ms, cuda_ms=ms)


def _graded(name: str, *cases: Case) -> KernelGrade:
    return KernelGrade(name, "0" * 64, None, False, cases)


class _ClassTable(HTMLParser):
    """The rows of the class page's class table (``#class``), each a list of its cells' texts."""

    def __init__(self) -> None:
        super().__init__()
        self.header: list[str] = []
        self.rows: list[list[str]] = []
        self._in_class = self._in_body = self._in_th = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section" and ("id", "class") in attrs:
            self._in_class = True
        elif self._in_class and tag == "tbody":
            self._in_body = True
        elif self._in_body and tag == "tr":
            self.rows.append([])
        elif self._in_body and tag == "td":
            self.rows[-1].append("")
        elif self._in_class and tag == "th":
            self._in_th = True
            self.header.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody" and self._in_body:
            self._in_body = self._in_class = False
        self._in_th = self._in_th and tag != "th"

    def handle_data(self, data: str) -> None:
        if self._in_th:
            self.header[-1] += data
        elif self._in_body and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data


def test_the_page_shows_each_time_over_naive_and_as_a_fraction_of_cublas_from_the_records() -> None:
    """A generated class: each kernel's headline time (the largest size at the size sweep's tile) over mmd's naive
    kernel's and as a fraction of cuBLAS's at the same size and tile, both timed in the student's session; blank,
    never zero, where the records hold no such figure (no cuBLAS there, no references at all, a wrong kernel)."""
    plan = GradePlan(tiles=(8,), sizes=(16, 64), sizes_at_tile=32, timing_tiles=(8, 32))
    naive = Reference(NAIVE, (_timed(64, 32, 29.0, 30.0, 31.0), _timed(64, 8, 90.0), _timed(16, 32, 1.0)))
    cublas = Reference(CUBLAS, (_timed(64, NO_TILE, 3.0),))
    tiled = _graded("tiled.cu", _timed(16, 32, 0.5), _timed(64, 32, 12.0, 11.0, 13.0), _timed(64, 8, 40.0))
    slow = _graded("naive.cu", _timed(64, 32, 60.0))
    wrong = _graded("wrong.cu", replace(_timed(64, 32), status=Status.MISMATCH, reason="timed launch 1: wrong"))
    students = [
        StudentGrade("ann", (tiled, slow, wrong), references=(naive, cublas)),
        StudentGrade("ben", (tiled,), references=(naive,)),  # a session that timed no cuBLAS
        StudentGrade("cal", (tiled,)),  # none: a part graded before references were timed
    ]
    gathered = [StudentGrade.from_dict(json.loads(json.dumps(s.as_dict()))) for s in students]
    assert gathered == students  # a Slurm task's part keeps its session's references
    results = reports.class_results("hw1", gathered, plan)
    ratios = [(k.kernel, k.over_naive, k.over_cublas) for s in results.students for k in s.kernels]
    assert ratios == [("tiled.cu", 2.5, 0.25), ("naive.cu", 0.5, 0.05), ("wrong.cu", None, None),
                      ("tiled.cu", 2.5, None), ("tiled.cu", None, None)]  # fmt: skip
    table = _ClassTable()
    table.feed(page.class_page(results, graphs=False))
    assert table.header[:8] == ["student", "kernel", "kind", "correct", "tile 64", "ms (64, tile 32)", "× naive",
                                "of cuBLAS"]  # fmt: skip
    assert [row[:2] + row[5:8] for row in table.rows] == [
        ["ann", "tiled.cu", "12.000", "2.50×", "25.0%"],
        ["ann", "naive.cu", "60.000", "0.50×", "5.0%"],
        ["ann", "wrong.cu", "", "", ""],
        ["ben", "tiled.cu", "12.000", "2.50×", ""],
        ["cal", "tiled.cu", "12.000", "", ""],
    ]


def test_a_case_repeats_until_its_median_is_known_or_enough_time_is_measured() -> None:
    """At least ``repeats`` launches; then more until the kernel median's noise (as mmd bench measures it) is under
    ``noise``, or ``enough_ms`` of kernel time is in, or ``max_repeats`` launches ran."""
    plan = GradePlan(repeats=3, noise=0.02, enough_ms=200.0, max_repeats=6)
    assert not plan.enough([10.0, 10.0])  # fewer than the least
    assert plan.enough([10.0, 10.0, 10.1])  # steady: the median is known
    assert not plan.enough([10.0, 14.0, 10.1])  # noisy, and 34 ms is not enough time
    assert plan.enough([80.0, 120.0, 60.0])  # noisy, but 260 ms of kernel time
    assert plan.enough([10.0, 14.0, 10.1, 15.0, 9.0, 13.0])  # the most
    with pytest.raises(ValueError):
        GradePlan(repeats=11, max_repeats=10)


#: One kernel graded in a process of its own (the stand-in driver importable there, as in ``mmd grade``: the
#: references' cuda backend opens in that process), the GPU read by a clock that sees the grading's own processes
#: (the grading's, which keeps the context it timed mmd's own kernels in, and the timed kernel's) and, where
#: argv[2] is "stranger", another at the first reading after the student's kernel's first timed launch (the clock
#: is read in phase 2 only): prints each timed case's and reference case's facts.
_GRADE_WITH_CLOCK = """
import json, sys
from pathlib import Path
from mmd import config
from mmd.backends.kernelfile import KernelFileBackend
from mmd.bench.clock import ClockSample
from mmd.grade import fresh, grader, handins, testset
from mmd.grade.grader import GradePlan
from mmd.grade.records import StudentGrade

fresh.GONE_S = 0.0  # this clock lists a process exactly while it lives

class Clock:
    read_yet = False
    timed_launches = 0
    stranger = sys.argv[2] == "stranger"
    def read(self):
        self.read_yet = True
        seen = self.stranger and self.timed_launches > 0
        self.stranger = self.stranger and not seen
        return ClockSample(1755.0, 1980.0, 0, 3 if seen else 2)

clock = Clock()
multiply = KernelFileBackend.multiply
def counted(self, a, b, request):
    clock.timed_launches += clock.read_yet
    return multiply(self, a, b, request)
KernelFileBackend.multiply = counted

root = Path(sys.argv[1])
tests, _ = testset.load(root / "tests")
settings = config.Settings(kernel_cache=str(root / "cache"))
_, limits = grader.probe(settings)
plan = GradePlan(tiles=(8,), sizes=(16,), timing_tiles=(8,), repeats=2)
grading = grader.Grading(tests, plan, settings, limits.arch, clock=clock)
(part,), _ = grader.grade_class([handins.student(root / "handin" / "ann", False)], grading, "fake", 1)
def facts(cases):
    return [[c.tile, c.status.value, c.windows, c.disturbed, c.gpu_processes, c.sm_clock_mhz, c.noise is not None,
             c.detail or c.reason] for c in cases if c.kind == "timed"]
print(json.dumps({"timed": facts(part.kernels[0].cases), "references": [facts(r.cases) for r in part.references],
                  "round_trip": StudentGrade.from_dict(json.loads(json.dumps(part.as_dict()))).as_dict()
                  == json.loads(json.dumps(part.as_dict()))}))
"""


def graded_with_clock(tmp_path: Path, stranger: bool) -> dict:
    data_sets(tmp_path)
    (tmp_path / "handin" / "ann").mkdir(parents=True)
    kernel(tmp_path / "handin" / "ann", "p1.cu")
    done = subprocess.run([sys.executable, "-c", _GRADE_WITH_CLOCK, str(tmp_path), "stranger" if stranger else "-"],
                          env=fake_gpu(), capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_quiet_gpu_times_every_case_in_one_window(tmp_path: Path) -> None:
    """The GPU lists the grading's process (it timed mmd's own kernels, and holds its context to the end) beside
    the timed kernel's: that is no other process's use, and every case, the references' too, runs in one
    window."""
    got = graded_with_clock(tmp_path, stranger=False)
    assert [t[2:5] for t in got["timed"]] == [[1, False, 2]] * 2
    # mmd's own kernels (run where this box's nvcc builds them) are never run again either
    assert got["references"] and all(t[2] <= 1 and not t[3] for r in got["references"] for t in r)


def test_a_timed_case_that_another_process_disturbed_runs_again_and_says_so(tmp_path: Path) -> None:
    """The first timed case's window saw a process on the GPU that is not the grading's: it runs again, its times
    are the second window's, and it says so (windows 2, not disturbed at the end); every case carries the GPU's
    SM clock and its noise."""
    got = graded_with_clock(tmp_path, stranger=True)
    timed = got["timed"]
    assert [t[:4] for t in timed] == [[32, "ok", 2, False], [8, "ok", 1, False]]
    assert all(t[4] == 2 and t[5] == 1755.0 and t[6] for t in timed[1:])
    assert "run 2 times: another process used the GPU" in timed[0][7] and "SM clock 1755" in timed[0][7]
    assert got["round_trip"]  # a Slurm part keeps them


def test_mmd_s_naive_kernel_is_timed_in_the_same_session_so_the_page_gives_each_time_over_naive(tmp_path: Path) -> None:
    """Phase 2 times mmd's own naive kernel over the same timed cases (fresh inputs, checked), on the same GPU,
    before the students' kernels: every part carries it, and the page's × naive is filled. cuBLAS is timed where
    the box has it; here (no cuBLAS library) its column stays blank."""
    tests = data_sets(tmp_path)
    for who in ("ann", "ben"):
        (tmp_path / "handin" / who).mkdir(parents=True)
        kernel(tmp_path / "handin" / who, "p1.cu")
    done = grade("handin", "--tests", str(tests), "--tiles", "8", "--sizes", "16", "--json", str(tmp_path / "g.json"),
                 "--page", str(tmp_path / "page"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    parts = json.loads((tmp_path / "g.json").read_text())["grade"]["students"]
    for part in parts:
        (naive,) = [r for r in part["references"] if r["kernel"] == NAIVE]
        assert [(c["shape"][0], c["tile"], c["status"]) for c in naive["cases"]] == [
            (16, 32, "ok"), (16, 4, "ok"), (16, 8, "ok"), (16, 16, "ok")]  # fmt: skip
        assert all(c["kernel_median_ms"] > 0 and len(c["kernel_ms"]) >= 3 for c in naive["cases"])
    results = reports.class_results("hw1", [StudentGrade.from_dict(p) for p in parts], GradePlan(sizes=(16,)))
    assert all(k.over_naive is not None and k.over_naive > 0 for s in results.students for k in s.kernels)
    table = _ClassTable()
    table.feed((tmp_path / "page" / "index.html").read_text(encoding="utf-8"))
    column = table.header.index("× naive")
    assert all(row[column].endswith("×") for row in table.rows)


def test_a_launch_process_going_or_just_gone_is_the_gradings_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML lists a process a moment after it has ended: one being closed, or closed less than GONE_S ago, counts
    among the grading's own processes; after that it does not."""
    import threading
    import time

    from mmd.grade import fresh

    monkeypatch.setattr(fresh, "GONE_S", 0.2)
    going = fresh.Going()
    closing, release = threading.Event(), threading.Event()

    class Slow:
        def close(self) -> None:
            closing.set()
            release.wait(5)

    worker = threading.Thread(target=going.close, args=(Slow(),))
    worker.start()
    closing.wait(5)
    assert going.count() == 1
    release.set()
    worker.join()
    assert going.count() == 1  # gone, but maybe still listed
    time.sleep(0.25)
    assert going.count() == 0


def test_fresh_inputs_reuse_their_memory_with_new_values_once_given_back() -> None:
    """Inputs given back (their product checked) lend their memory to a later launch's inputs, filled anew: no
    page faults on the timed path, and still no input twice."""
    from mmd.grade.fresh import FreshInputs
    from mmd.kernelfile.exchange import Operands

    with FreshInputs() as inputs:
        first = inputs.take(64)
        seen = first.a.copy()
        assert Operands.of(first.a, first.b) is first
        other = inputs.take(64)  # the first not given back yet: memory of its own
        assert other is not first
        inputs.done_with(first)
        again = inputs.take(64)
        assert again is first and not np.array_equal(again.a, seen)
        assert again.a.min() >= -1 and again.a.max() < 1
