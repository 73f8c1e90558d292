"""``mmd check`` as a user meets it: real processes, real files, exit statuses 0, 1 and 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from mmd import textformat
from mmd.check import lateness
from mmd.generate import input_chunks, random_matrix

from .conftest import ROOT, LoggedProcess, mmd_env, run_mmd

# Every test here runs `mmd check` as a real process (left out of `make quick`).
pytestmark = pytest.mark.integration


def _pair(folder: Path, name: str, m: int, k: int, n: int, seed: int) -> tuple[Path, Path]:
    """``name.txt`` and the right ``name.out`` (what the cpu backend writes) in ``folder``."""
    rng = np.random.default_rng(seed)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    src, out = folder / f"{name}.txt", folder / f"{name}.out"
    src.write_bytes(b"".join(input_chunks(a, b, square=m == k == n)))
    out.write_bytes(textformat.emit(a @ b))
    return src, out


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_help_names_the_exit_statuses():
    r = run_mmd("check", "--help")
    assert r.returncode == 0
    assert "exit status:\n  0  every check passed" in r.stdout
    assert "  1  a check failed: wrong values or format, a missing output, a refused job" in r.stdout
    assert "  2  usage, or a file that cannot be read" in r.stdout
    assert "--quick" in r.stdout and "--junit FILE" in r.stdout and "--inputs" in r.stdout


def test_one_output(tmp_path):
    src, out = _pair(tmp_path, "m", 6, 5, 4, 1)
    r = run_mmd("check", str(out), "--input", str(src))
    assert r.returncode == 0 and r.stderr == ""
    assert re.fullmatch(rf"{re.escape(str(out))}: format ok; ok: 6x4 values, 0 outside tolerance \(.*\n", r.stdout)
    wrong = tmp_path / "wrong.out"
    body = bytearray(out.read_bytes())
    body[body.index(b"\n") + 1 : body.index(b"\n") + 7] = b" 99.99"
    wrong.write_bytes(bytes(body))
    r = run_mmd("check", str(wrong), "--input", str(src))
    assert r.returncode == 1 and "MISMATCH: 6x4 values, 1 outside tolerance" in r.stdout
    assert "worst at row 1 col 1" in r.stdout
    good, bad = tmp_path / "good.out", tmp_path / "bad.out"
    good.write_bytes(b"2\n  1.00  2.00\n  3.00  4.00\n")
    bad.write_bytes(b"2\n  1.00  2.00\n  3.00 4.00\n")
    r = run_mmd("check", str(bad), str(good))
    assert r.returncode == 1
    assert r.stdout == f"FORMAT: {bad}: line 3, column 7: field ' 4.00' is not in %6.2f format (width)\n"
    r = run_mmd("check", str(out), str(out))
    assert r.returncode == 0 and "format ok; ok: 6x4 values" in r.stdout
    r = run_mmd("check", str(out), "--input", str(src), "--quick", "--seed", "5")
    assert r.returncode == 0 and "format ok; ok (quick): 6x4" in r.stdout and "seed 5" in r.stdout
    r = run_mmd("check", str(wrong), "--input", str(src), "--quick")
    assert r.returncode == 1 and "MISMATCH (quick)" in r.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["nosuch.out", "--input", "m.txt"], "mmd check: cannot read nosuch.out: No such file or directory"),
        (["m.out", "--input", "nosuch.txt"], "mmd check: cannot read nosuch.txt: No such file or directory"),
        (["m.out", "nosuch.out"], "mmd check: cannot read nosuch.out: No such file or directory"),
        (["m.out", "--input", "bad.txt"], "mmd check: input bad.txt: line 2: 'x' is not a number"),
        (
            ["m.out", "bad.txt"],
            "mmd check: expected output bad.txt: line 2, column 1: field 'x 1' is not in %6.2f format",
        ),
        (["nosuch.out"], "mmd check: give one of EXPECTED, --expected or --input (see mmd check --help)"),
        (["m.out", "m.out", "--input", "m.txt"], "mmd check: give one of EXPECTED, --expected or --input"),
        (["m.out", "m.out", "--quick"], "mmd check: --quick checks against inputs: give --input"),
        (["m.out", "--input", "."], "mmd check: m.out is a file: give a file to check it against"),
        ([".", "--input", "m.txt"], "mmd check: . is a folder: give a folder to check it against"),
        (["nosuch", "--inputs", "."], "mmd check: cannot read nosuch: No such file or directory"),
        (["m.out", "--input", "m.txt", "--jobs", "0"], "mmd check: --jobs must be at least 1"),
        (["m.out", "--input", "m.txt", "--json", "nodir/r.json"], "mmd check: "),
        ([".", "--inputs", ".", "--before", "friday"], "mmd check: --before friday: not an ISO 8601 time"),
        ([".", "--inputs", ".", "--roster", "bad.txt"], "mmd check: --roster bad.txt: line 2: 'x 1' is not a login"),
        (["m.out", "--input", "m.txt", "--by-student"], "mmd check: --by-student checks a folder"),
    ],
)
def test_exit_2_with_one_line(tmp_path, args, line):
    _pair(tmp_path, "m", 3, 3, 3, 2)
    (tmp_path / "bad.txt").write_text("1\nx 1\n")
    r = run_mmd("check", *args, cwd=tmp_path)
    assert r.returncode == 2, r
    assert _one_line(r.stderr).startswith(line)
    assert "Traceback" not in r.stderr


def test_junit_holds_the_tests_only(tmp_path):
    """Outputs no test asks for (a user's own jobs in the same outbox) are listed, never JUnit test cases."""
    tests, outbox = tmp_path / "tests", tmp_path / "outbox"
    tests.mkdir()
    outbox.mkdir()
    _pair(tests, "t0", 4, 4, 4, seed=0)
    (tests / "t0.out").rename(outbox / "t0.out")
    for i in range(19):
        _pair(outbox, f"mine{i}", 2, 2, 2, seed=i)
        (outbox / f"mine{i}.txt").unlink()
    r = run_mmd("check", str(outbox), "--inputs", str(tests), "--junit", "r.xml", "--json", "r.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "1 jobs checked against the inputs" in r.stdout and "1 ok; 19 extra;" in r.stdout
    root = ET.parse(tmp_path / "r.xml").getroot()
    (suite,) = root.findall("testsuite")
    assert (root.get("tests"), suite.get("tests"), suite.get("skipped")) == ("1", "1", "0")
    assert [c.get("name") for c in suite.findall("testcase")] == ["t0"]
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["extra"] == "19", "said, as a count: the table and the JSON name them"
    assert json.loads((tmp_path / "r.json").read_text())["counts"]["extra"] == 19


def test_a_quick_refusal_says_what_was_checked(tmp_path):
    """--quick's reason, in words a student reads: which row, what it was multiplied by, how far beyond."""
    tests, outbox = tmp_path / "tests", tmp_path / "outbox"
    tests.mkdir()
    outbox.mkdir()
    _pair(tests, "t", 6, 5, 4, seed=3)
    body = bytearray((tests / "t.out").read_bytes())
    (tests / "t.out").unlink()
    second = body.index(b"\n", body.index(b"\n") + 1) + 1  # row 2's first field
    body[second : second + 6] = b"999.99"
    (outbox / "t.out").write_bytes(bytes(body))
    r = run_mmd("check", "outbox", "--inputs", "tests", "--quick", "--seed", "1", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    (row,) = (line for line in r.stdout.splitlines() if line.startswith("t.out"))
    assert re.search(
        r"mismatch +- +row 2 is wrong: multiplied by 16 random vectors, it is off by [0-9.,]+ times what the "
        r"tolerance allows$",
        row,
    ), row


def test_a_folder(tmp_path):
    tests, outbox = tmp_path / "tests", tmp_path / "outbox"
    tests.mkdir()
    outbox.mkdir()
    for i, shape in enumerate([(4, 4, 4), (3, 5, 2), (7, 1, 7)]):
        _pair(tests, f"t{i}", *shape, seed=i)
        (tests / f"t{i}.out").rename(outbox / f"t{i}.out")
    (tests / "t3.txt").write_text("2\n1 2\n3 x\n1 0\n0 1\n")
    r = run_mmd("run", str(tests / "t3.txt"), "-o", str(outbox / "t3.out"))  # a real refusal
    assert r.returncode == 1 and (outbox / "t3.error.yaml").exists()
    junit, report = tmp_path / "report.xml", tmp_path / "report.json"
    r = run_mmd("check", str(outbox), "--inputs", str(tests), "--junit", str(junit), "--json", str(report))
    assert r.returncode == 1 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["file", "shape", "status", "max", "error", "reason"]
    assert [ln.split()[:3] for ln in lines[1:5]] == [
        ["t0.out", "4x4", "ok"],
        ["t1.out", "3x2", "ok"],
        ["t2.out", "7x7", "ok"],
        ["t3.out", "-", "refused"],
    ]
    assert lines[4].endswith("refused: line 3: 'x' is not a number (t3.error.yaml)")
    assert lines[5].startswith(f"4 jobs checked against the inputs in {tests}: 3 ok, 1 refused; 0 extra;")
    assert len(lines) == 6
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "1", "0")
    assert json.loads(report.read_text())["counts"]["refused"] == 1
    # every job right: 0; a reference that cannot be read: 2
    (tests / "t3.txt").unlink()
    (outbox / "t3.error.yaml").unlink()
    r = run_mmd("check", str(outbox), "--inputs", str(tests), "--jobs", "1")
    assert r.returncode == 0 and "3 jobs checked against the inputs" in r.stdout
    r = run_mmd("check", str(outbox), "--inputs", str(tests), "--quick", "--seed", "7")
    assert r.returncode == 0 and "(quick, seed 7)" in r.stdout
    (tests / "t1.txt").write_text("3 5 2\n")
    r = run_mmd("check", str(outbox), "--inputs", str(tests))
    assert r.returncode == 2 and "t1.out" in r.stdout and " error " in r.stdout
    r = run_mmd("check", str(outbox), "--inputs", str(tmp_path / "nosuch"))
    assert r.returncode == 2 and _one_line(r.stderr).startswith("mmd check: cannot read")
    assert "nosuch: No such file or directory" in r.stderr


def _grade_script() -> str:
    """The grading script of docs/grading.md, as it is printed there."""
    text = (ROOT / "docs" / "grading.md").read_text()
    start = text.index("```bash\n#!/usr/bin/env bash\n# grade.sh") + len("```bash\n")
    return text[start : text.index("```", start)]


def test_the_grading_script_of_the_docs(tmp_path):
    tests, inbox, outbox = tmp_path / "tests", tmp_path / "inbox", tmp_path / "outbox"
    for d in (tests, inbox, outbox):
        d.mkdir()
    for i, shape in enumerate([(5, 5, 5), (8, 3, 6), (1, 4, 1)]):
        _pair(tests, f"t{i}", *shape, seed=10 + i)
        (tests / f"t{i}.out").unlink()
    (tests / "t3.txt").write_text("2\n1 2\n3 x\n1 0\n0 1\n")
    script = tmp_path / "grade.sh"
    script.write_text(_grade_script())
    env = mmd_env({"MMD_LOG_FORMAT": "json", "MMD_BACKEND": "cpu", "MMD_QUIET_SECONDS": "0.3"})
    daemon = LoggedProcess(
        [sys.executable, "-m", "mmd", "serve", "--inbox", str(inbox), "--outbox", str(outbox)],
        cwd=tmp_path,
        log_path=tmp_path / "daemon.log",
        env=env,
    )
    try:
        grade = dict(env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", GRADE_TIMEOUT="90")

        def run() -> subprocess.CompletedProcess:
            args = ["bash", str(script), "tests", "inbox", "outbox", "report"]
            return subprocess.run(args, cwd=tmp_path, env=grade, capture_output=True, text=True, timeout=150)

        r = run()
        assert r.returncode == 1, r.stdout + r.stderr + daemon.logs()
        assert [ln.split()[2] for ln in r.stdout.splitlines()[1:5]] == ["ok", "ok", "ok", "refused"]
        suite = ET.parse(tmp_path / "report.xml").getroot().find("testsuite")
        assert (suite.get("tests"), suite.get("failures")) == ("4", "1")
        assert json.loads((tmp_path / "report.json").read_text())["counts"]["ok"] == 3
        # again, without the bad input: the first run's results are cleared, the names used again
        (tests / "t3.txt").unlink()
        (outbox / "t3.error.yaml").unlink()
        r = run()
        assert r.returncode == 0, r.stdout + r.stderr + daemon.logs()
        assert "3 jobs checked against the inputs in tests: 3 ok;" in r.stdout
        assert not list(outbox.glob("*.1.*"))
    finally:
        assert daemon.stop() == 0


def test_one_quick_check_imports_no_numpy(tmp_path):
    """`mmd check --quick` of one output with the C accelerators runs without numpy (its start-up is
    most of the check's time: docs/grading.md); where they are not built, it imports numpy."""

    src, out = tmp_path / "m.txt", tmp_path / "m.out"
    assert run_mmd("gen", "40", "--seed", "2", "-o", str(src)).returncode == 0
    assert run_mmd("run", str(src), "-o", str(out)).returncode == 0
    code = (
        "import sys; from mmd.cli import main; from mmd import accel; status = main(['check', sys.argv[1], "
        "'--input', sys.argv[2], '--quick']); print('numpy' in sys.modules, accel.passes() is None, status)"
    )
    got = subprocess.run([sys.executable, "-c", code, str(out), str(src)], capture_output=True, text=True, check=True)
    numpy_, c_off, status = got.stdout.splitlines()[-1].split()  # the child's route: the environment decides
    assert (numpy_, status) == (c_off, "0")
    assert "format ok; ok (quick): 40x40" in got.stdout


@pytest.mark.parametrize(("change", "status"), [(None, 0), (("  3.00", "  3.01"), 0), (("  3.00", "  4.00"), 1)])
def test_a_check_against_an_expected_output_imports_no_numpy(tmp_path, change, status):
    """`mmd check OUT EXPECTED` with the C accelerators reads, compares and reports without numpy,
    whether the two have the same bytes, values close enough, or one too far."""
    rows = [("  1.00" * 6) + "\n", ("  2.00" * 5) + "  3.00\n", ("  5.00" * 6) + "\n"]
    out, expected = tmp_path / "m.out", tmp_path / "want.out"
    out.write_text("3 6\n" + "".join(rows))
    text = "3 6\n" + "".join(rows)
    expected.write_text(text if change is None else text.replace(*change))
    code = (
        "import sys; from mmd.cli import main; from mmd import accel; status = main(['check', sys.argv[1], "
        "sys.argv[2]]); print('numpy' in sys.modules, accel.passes() is None or accel.text() is None, "
        "status)"
    )
    got = subprocess.run([sys.executable, "-c", code, str(out), str(expected)], capture_output=True, text=True)
    numpy_, c_off, got_status = got.stdout.splitlines()[-1].split()  # the child's route: the environment decides
    assert (numpy_, got_status) == (c_off, str(status)), got.stdout + got.stderr
    assert ("MISMATCH" in got.stdout) == bool(status)


def _run_limited(*args: str, cwd: Path, kib: int = 3_000_000) -> tuple[subprocess.CompletedProcess[str], float]:
    """``mmd check ARGS`` in a process that may map at most ``kib`` KiB (ulimit -v), and its wall time."""
    script = f'ulimit -v {kib} && exec "$0" -m mmd check "$@"'
    start = time.perf_counter()
    r = subprocess.run(
        ["bash", "-c", script, sys.executable, *args],
        cwd=cwd,
        env=mmd_env({"MMD_BACKEND": "cpu"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r, time.perf_counter() - start


@pytest.mark.serial  # a wall-clock bound: alone on the machine
def test_a_quick_check_sizes_nothing_from_a_header_its_file_cannot_hold(tmp_path):
    _pair(tmp_path, "m", 2, 2, 2, 1)
    (tmp_path / "m.out").write_bytes(b"100000000\n  1.00\n")  # 18 bytes promise 10^8 rows (3.2 GB of sums)
    r, seconds = _run_limited("m.out", "--input", "m.txt", "--quick", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (1, "")
    assert r.stdout == "FORMAT: m.out: line 2, column 7: expected 100000000 fields, found 1\n"
    assert seconds < 5


@pytest.mark.parametrize("quick", [[], ["--quick"]])
def test_a_folder_check_with_a_huge_header_writes_every_report(tmp_path, quick):
    tests, outbox = tmp_path / "tests", tmp_path / "outbox"
    tests.mkdir()
    outbox.mkdir()
    _pair(tests, "a", 3, 3, 3, 1)
    (tests / "a.out").rename(outbox / "a.out")
    _pair(tests, "b", 2, 3, 64, 2)
    (outbox / "b.out").write_bytes(b"3000000000 64\n  1.00\n")
    r, _ = _run_limited(
        str(outbox), "--inputs", str(tests), "--junit", "r.xml", "--json", "r.json", *quick, cwd=tmp_path
    )
    assert (r.returncode, r.stderr) == (1, "")
    assert r.stdout.splitlines()[2].split(maxsplit=3) == [
        "b.out",
        "-",
        "format",
        "-  line 2, column 7: expected 64 fields, found 1",
    ]
    assert json.loads((tmp_path / "r.json").read_text())["counts"]["format"] == 1
    assert ET.parse(tmp_path / "r.xml").getroot().find("testsuite").get("failures") == "1"


def test_one_output_that_is_a_link_is_not_followed(tmp_path):
    _, out = _pair(tmp_path, "m", 3, 3, 3, 1)
    (tmp_path / "link.out").symlink_to(out)
    for extra in ([], ["--quick"]):
        r = run_mmd("check", "link.out", "--input", "m.txt", *extra, cwd=tmp_path)
        assert (r.returncode, r.stderr) == (1, ""), r
        assert r.stdout == "NOT A FILE: link.out is a symbolic link: not opened\n"


def test_names_reach_the_terminal_and_the_reports_escaped(tmp_path):
    tests, outbox = tmp_path / "tests", tmp_path / "outbox"
    tests.mkdir()
    outbox.mkdir()
    _pair(tests, "t", 3, 3, 3, 1)
    (tests / "t.out").rename(outbox / "t.out")
    shutil.copy(outbox / "t.out", outbox / "\x1b[1A\x1b[2Kt.out")  # would erase the row above
    shutil.copy(outbox / "t.out", os.fsencode(outbox) + b"/w\xff.out")  # not UTF-8
    # tests of those names, so that each is a JUnit test case too (extra files are not)
    shutil.copy(tests / "t.txt", tests / "\x1b[1A\x1b[2Kt.txt")
    shutil.copy(tests / "t.txt", os.fsencode(tests) + b"/w\xff.txt")
    r = run_mmd("check", "outbox", "--inputs", "tests", "--junit", "r.xml", "--json", "r.json", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, "")
    assert "\x1b" not in r.stdout
    rows = [line.split()[:3] for line in r.stdout.splitlines()[1:4]]
    assert rows == [["\\x1b[1A\\x1b[2Kt.out", "3x3", "ok"], ["t.out", "3x3", "ok"], ["w\\xff.out", "3x3", "ok"]]
    cases = [c.get("name") for c in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")]
    assert cases == ["\\x1b[1A\\x1b[2Kt", "t", "w\\xff"]
    assert [x["file"] for x in json.loads((tmp_path / "r.json").read_text())["results"]] == [
        "\\x1b[1A\\x1b[2Kt.out",
        "t.out",
        "w\\xff.out",
    ]


@pytest.mark.parametrize(
    ("report", "line"),
    [
        (["--junit", "nodir/r.xml"], "mmd check: --junit nodir/r.xml: the folder nodir does not exist"),
        (["--json", "outbox"], "mmd check: --json outbox: is a folder; give a file name"),
        (["--json", "r.json", "--junit", "tests/nodir/r.xml"], "mmd check: --junit tests/nodir/r.xml: the folder"),
    ],
)
def test_report_paths_are_checked_before_any_check(tmp_path, report, line):
    tests, outbox = tmp_path / "tests", tmp_path / "outbox"
    tests.mkdir()
    outbox.mkdir()
    _pair(tests, "t", 3, 3, 3, 1)
    os.mkfifo(outbox / "t.out")  # were it checked, a row would say so
    r = run_mmd("check", "outbox", "--inputs", "tests", *report, cwd=tmp_path)
    assert (r.returncode, r.stdout) == (2, "")
    assert _one_line(r.stderr).startswith(line)
    assert not (tmp_path / "r.json").exists()


def test_quick_draws_a_fresh_seed_shows_it_and_repeats_it(tmp_path):
    src, out = _pair(tmp_path, "m", 6, 5, 4, 1)
    lines = [run_mmd("check", str(out), "--input", str(src), "--quick").stdout for _ in range(2)]
    seeds = [int(re.search(r", seed (\d+),", line).group(1)) for line in lines]
    assert seeds[0] != seeds[1]
    again = run_mmd("check", str(out), "--input", str(src), "--quick", "--seed", str(seeds[0]))
    assert again.stdout == lines[0]
    tests, outbox = tmp_path / "tests", tmp_path / "outbox"
    tests.mkdir()
    outbox.mkdir()
    src.rename(tests / src.name)
    out.rename(outbox / out.name)
    r = run_mmd("check", "outbox", "--inputs", "tests", "--quick", "--json", "r.json", "--junit", "r.xml", cwd=tmp_path)
    seed = int(re.search(r"\(quick, seed (\d+)\)", r.stdout).group(1))
    assert json.loads((tmp_path / "r.json").read_text())["seed"] == seed
    props = ET.parse(tmp_path / "r.xml").getroot().find("testsuite").find("properties")
    assert {p.get("name"): p.get("value") for p in props}["seed"] == str(seed)


def test_a_resubmission_and_a_deadline(tmp_path):
    """x.txt served, then another x.txt (the daemon writes x.1.out): the newest is graded, the other one
    superseded; --before grades what had arrived at a deadline, and says what judged it (the files' ctime)."""
    for folder in ("tests", "inbox", "outbox"):
        (tmp_path / folder).mkdir()
    src, _ = _pair(tmp_path / "tests", "x", 4, 3, 2, seed=1)
    (tmp_path / "tests" / "x.out").unlink()
    for body in (src.read_bytes(), src.read_bytes().replace(b"\n", b" \n", 1)):  # the same values, other bytes
        if (tmp_path / "outbox" / "x.out").exists():
            time.sleep(0.05)  # longer than the clock tick that stamps ctime
            deadline = datetime.now(timezone.utc).isoformat()
            time.sleep(0.05)
        (tmp_path / "inbox" / "x.txt").write_bytes(body)
        assert run_mmd("serve", "--once", "--inbox", "inbox", "--outbox", "outbox", cwd=tmp_path).returncode == 0
    r = run_mmd("check", "outbox", "--inputs", "tests", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, "")
    rows = [line.split(maxsplit=4) for line in r.stdout.splitlines()]
    assert rows[1][:3] == ["x.1.out", "4x2", "ok"]
    assert rows[2] == ["x.out", "-", "superseded", "-", "superseded by x.1.out"]
    assert r.stdout.splitlines()[3].startswith(
        "1 jobs checked against the inputs in tests: 1 ok; 0 extra; 1 superseded; 0 could not be checked ("
    )
    r = run_mmd(
        "check", "outbox", "--inputs", "tests", "--before", deadline, "--json", "r.json", "--junit", "r.xml",
        cwd=tmp_path,
    )  # fmt: skip
    assert (r.returncode, r.stderr) == (0, "")
    rows = [line.split(maxsplit=6) for line in r.stdout.splitlines()]
    assert rows[0] == ["file", "shape", "status", "arrived", "max", "error", "reason"]
    assert rows[1][:3] == ["x.out", "4x2", "ok"] and rows[1][4] == "(ctime)"
    assert rows[2][:5] == ["x.1.out", "-", "late", rows[2][3], "(ctime)"]
    shown = lateness.shown_time(lateness.parse_time(deadline))
    assert rows[2][5:] == ["-", f"arrived {rows[2][3]} (its files' ctime), not before the deadline {shown}"]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["before"] == shown and report["counts"]["late"] == 1
    assert [(x["file"], x["arrived_by"]) for x in report["results"]] == [("x.out", "ctime"), ("x.1.out", "ctime")]
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")}
    assert cases["x"].find("system-out").text.splitlines()[3] == f"arrived: {rows[1][3]} (ctime)"
    assert cases["x (x.1.out)"].find("skipped").get("type") == "late"


def test_a_class_in_one_command(tmp_path):
    tests, handin = tmp_path / "tests", tmp_path / "handin"
    tests.mkdir()
    for login in ("alice", "bob", "slurm"):
        (handin / login).mkdir(parents=True)
    _, out = _pair(tests, "x", 3, 3, 3, seed=1)
    for login in ("alice", "slurm"):
        shutil.copy(out, handin / login / "x.out")
    out.unlink()
    (tmp_path / "roster.txt").write_text("# the class\nalice\nbob\n\ncarol\n")
    r = run_mmd(
        "check",
        "handin",
        "--inputs",
        "tests",
        "--by-student",
        "--roster",
        "roster.txt",
        "--json",
        "r.json",
        cwd=tmp_path,
    )
    assert (r.returncode, r.stderr) == (1, "")
    lines = r.stdout.splitlines()
    assert [line.split()[:4] for line in lines[:4]] == [
        ["student", "file", "shape", "status"],
        ["alice", "x.out", "3x3", "ok"],
        ["bob", "x.out", "-", "missing"],
        ["carol", "x.out", "-", "missing"],
    ]
    assert lines[3].endswith("no folder carol")
    assert lines[4:7] == [
        "alice: 1 jobs checked: 1 ok; 0 extra; 0 could not be checked",
        "bob: 1 jobs checked: 1 missing; 0 extra; 0 could not be checked",
        "carol: 1 jobs checked: 1 missing; 0 extra; 0 could not be checked",
    ]
    assert lines[7].startswith("3 jobs checked against the inputs in tests: 1 ok, 2 missing; 0 extra;")
    assert len(lines) == 8
    assert [s["student"] for s in json.loads((tmp_path / "r.json").read_text())["students"]] == [
        "alice",
        "bob",
        "carol",
    ]


def _on_a_terminal(*args: str, cwd: Path) -> tuple[int, str, bytes]:
    """``mmd check ARGS`` with its stderr on a pseudo-terminal: (exit status, stdout, what the terminal got)."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mmd", "check", *args],
            cwd=cwd,
            env=mmd_env({"MMD_BACKEND": "cpu", "TERM": "xterm-256color", "COLUMNS": "100"}),
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
        )
        os.close(follower)
        stdout, _ = proc.communicate(timeout=120)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    return proc.returncode, stdout, seen


def test_a_folder_check_shows_progress_on_a_terminal_only(tmp_path):
    tests, outbox = tmp_path / "tests", tmp_path / "outbox"
    tests.mkdir()
    outbox.mkdir()
    for i in range(3):
        _pair(tests, f"t{i}", 4, 4, 4, seed=i)
        (tests / f"t{i}.out").rename(outbox / f"t{i}.out")
    status, stdout, seen = _on_a_terminal("outbox", "--inputs", "tests", cwd=tmp_path)
    assert status == 0 and stdout.splitlines()[-1].startswith("3 jobs checked")
    assert b"checking" in seen and b"3/3" in seen  # rich's bar, on stderr
    assert b"3 jobs checked" not in seen  # the table and summary stay on stdout
    status, stdout, seen = _on_a_terminal("outbox", "--inputs", "tests", "--quiet", cwd=tmp_path)
    assert (status, seen) == (0, b"")
    r = run_mmd("check", "outbox", "--inputs", "tests", cwd=tmp_path)  # stderr a pipe: nothing on it
    assert (r.returncode, r.stderr) == (0, "")
