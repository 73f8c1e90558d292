"""Tests for mmd.check (jobs, pairing, reports): a real outbox, made by the daemon, checked as a whole folder."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import xmlschema

from mmd import accel, textcore, textformat, textoutput
from mmd.check import jobs, lateness, pairing, reports, results, tolerance
from mmd.check import quick as quickcheck
from mmd.check.results import Options, Pairing, Status
from mmd.errors import ExitStatus, UnreadableError
from mmd.generate import input_chunks, random_matrix
from mmd.record import reader

from .conftest import blocks_of, run_mmd
from .fakes import tf32_round

#: The JUnit schema pytest's junit_family=xunit2 targets (the file says where it comes from).
JUNIT_SCHEMA = xmlschema.XMLSchema(Path(__file__).parent / "data" / "junit-10.xsd")

#: name -> (m, k, n): the test inputs of the folder
SHAPES = {
    "a_square": (16, 16, 16),
    "b_rect": (9, 13, 7),
    "c_one": (1, 1, 1),
    "d_wrong": (12, 12, 12),
    "e_missing": (5, 6, 7),
    "f_format": (8, 3, 4),
    "g_tall": (40, 2, 3),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """tests/ (inputs, one of them bad) and outbox/ as `mmd serve --once` left them."""
    root = tmp_path_factory.mktemp("graded")
    tests, inbox, outbox = root / "tests", root / "inbox", root / "outbox"
    for d in (tests, inbox, outbox):
        d.mkdir()
    for i, (name, (m, k, n)) in enumerate(SHAPES.items()):
        rng = np.random.default_rng(i)
        a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
        (tests / f"{name}.txt").write_bytes(b"".join(input_chunks(a, b, square=m == k == n)))
    (tests / "h_refused.txt").write_text("2\n1 2\n3 x\n1 0\n0 1\n")
    (tests / "README.md").write_text("not a test\n")
    for f in tests.glob("*.txt"):
        shutil.copy(f, inbox / f.name)
    r = run_mmd("serve", "--once", "--inbox", str(inbox), "--outbox", str(outbox), cwd=root)
    assert r.returncode == 0, r.stderr
    return root


@pytest.fixture
def folder(served, tmp_path) -> Path:
    """A copy of the served folder, spoiled: one missing, one wrong, one not in format, one extra."""
    root = tmp_path / "g"
    shutil.copytree(served / "tests", root / "tests")
    shutil.copytree(served / "outbox", root / "outbox")
    out = root / "outbox"
    (out / "e_missing.out").unlink()
    (out / "e_missing.timing.yaml").unlink()
    wrong = bytearray((out / "d_wrong.out").read_bytes())
    row3 = wrong.index(b"\n", wrong.index(b"\n", wrong.index(b"\n") + 1) + 1) + 1
    wrong[row3 : row3 + 6] = b"999.99"  # row 3, column 1 (the field is 6 wide where it was)
    (out / "d_wrong.out").write_bytes(bytes(wrong))
    head, body = (out / "f_format.out").read_bytes().split(b"\n", 1)
    (out / "f_format.out").write_bytes(head + b"\n" + body.replace(b"\n", b"\r\n", 1))  # line 2 ends in CR LF
    shutil.copy(out / "c_one.out", out / "z_extra.out")
    return root


def test_served_folder_is_all_right(served):
    run = jobs.check_folder(served / "outbox", served / "tests", Options())
    assert [(r.name, r.status) for r in run.results] == [
        *[(name, Status.OK) for name in SHAPES],
        ("h_refused", Status.REFUSED),
    ]
    assert run.results[-1].reason == "refused: line 3: 'x' is not a number (h_refused.error.yaml)"
    assert run.exit_status == 1
    assert [r.shape for r in run.results[:-1]] == [(m, n) for m, _, n in SHAPES.values()]
    assert all(r.max_error is not None and r.max_error <= 0.0051 for r in run.results[:-1])


def test_folder_statuses_table_and_summary(folder):
    run = jobs.check_folder(folder / "outbox", folder / "tests", Options())
    got = {r.name: (r.status, r.reason) for r in run.results}
    assert got == {
        "a_square": (Status.OK, ""),
        "b_rect": (Status.OK, ""),
        "c_one": (Status.OK, ""),
        "d_wrong": (Status.MISMATCH, "1 of 144 values outside tolerance, worst at row 3 col 1"),
        "e_missing": (Status.MISSING, "no output and no error sidecar"),
        "f_format": (Status.FORMAT, "line 2, column 25: field '\\r' is not in %6.2f format"),
        "g_tall": (Status.OK, ""),
        "h_refused": (Status.REFUSED, "refused: line 3: 'x' is not a number (h_refused.error.yaml)"),
        "z_extra": (Status.EXTRA, "z_extra.out: no z_extra.txt to check it against"),
    }
    assert run.exit_status == ExitStatus.FAILED
    assert run.counts == {
        "ok": 4,
        "mismatch": 1,
        "format": 1,
        "missing": 1,
        "refused": 1,
        "extra": 1,
        "superseded": 0,
        "late": 0,
        "not-a-file": 0,
        "error": 0,
    }
    e = {r.name: "%.4g" % r.max_error for r in run.results if r.max_error is not None}
    assert reports.table(run.results) == "\n".join(
        [
            "file           shape  status    max error  reason",
            f"a_square.out   16x16  ok        {e['a_square']:>9}",
            f"b_rect.out     9x7    ok        {e['b_rect']:>9}",
            f"c_one.out      1x1    ok        {e['c_one']:>9}",
            f"d_wrong.out    12x12  mismatch  {e['d_wrong']:>9}  1 of 144 values outside tolerance,"
            " worst at row 3 col 1",
            "e_missing.out  -      missing           -  no output and no error sidecar",
            "f_format.out   -      format            -  line 2, column 25: field '\\r' is not in %6.2f format",
            f"g_tall.out     40x3   ok        {e['g_tall']:>9}",
            "h_refused.out  -      refused           -  refused: line 3: 'x' is not a number (h_refused.error.yaml)",
            "z_extra.out    -      extra             -  z_extra.out: no z_extra.txt to check it against",
        ]
    )
    assert re.fullmatch(
        r"8 jobs checked against the inputs in \S+/tests: 4 ok, 1 mismatch, 1 format, 1 missing, "
        r"1 refused; 1 extra; 0 could not be checked \(\d+\.\d\d s\)",
        run.summary(),
    ), run.summary()
    fmt = next(r for r in run.results if r.name == "f_format")
    assert (fmt.line, fmt.column) == (2, 25)


def test_folder_junit(folder, tmp_path):
    run = jobs.check_folder(folder / "outbox", folder / "tests", Options())
    path = tmp_path / "report.xml"
    reports.write_junit(run, path)
    assert path.read_bytes().startswith(b"<?xml version='1.0' encoding='utf-8'?>\n<testsuites name=\"mmd check\"")
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    JUNIT_SCHEMA.validate(path)
    assert {k: root.get(k) for k in ("tests", "failures", "errors")} == {"tests": "8", "failures": "4", "errors": "0"}
    (suite,) = root.findall("testsuite")
    assert suite.get("failures") == "4" and suite.get("skipped") == "0"
    assert suite.get("timestamp") == run.started_at.removesuffix("+00:00")  # UTC, as JUnit writes it
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["against"] == "inputs" and props["quick"] == "false" and props["tol"] == "model"
    assert props["extra"] == "1"  # z_extra.out answers no test: no test case
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == sorted(cases) and len(cases) == 8
    assert all(c.get("classname") == "mmd.check" for c in cases.values())
    assert cases["a_square"].find("failure") is None and "ok: 16x16 values" in cases["a_square"].find("system-out").text
    for name, kind in (
        ("d_wrong", "mismatch"),
        ("e_missing", "missing"),
        ("f_format", "format"),
        ("h_refused", "refused"),
    ):
        fail = cases[name].find("failure")
        assert fail is not None and fail.get("type") == kind and fail.get("message"), name
    assert cases["d_wrong"].find("failure").text.startswith("MISMATCH: 12x12 values, 1 outside tolerance")
    assert "z_extra" not in cases
    assert cases["a_square"].find("system-out").text == (
        f"output: {folder / 'outbox' / 'a_square.out'}\nreference: {folder / 'tests' / 'a_square.txt'}\n"
        f"kernel: {run.results[0].kernel} (fp32)\n" + run.results[0].detail
    )


def test_folder_json(folder, tmp_path):
    run = jobs.check_folder(folder / "outbox", folder / "tests", Options())
    path = tmp_path / "report.json"
    reports.write_json(run, path)
    data = json.loads(path.read_text())
    assert data["exit_status"] == 1 and data["against"] == "inputs" and data["quick"] is False
    assert data["counts"] == run.counts
    rows = {r["name"]: r for r in data["results"]}
    assert rows["d_wrong"]["status"] == "mismatch" and rows["d_wrong"]["shape"] == [12, 12]
    assert rows["d_wrong"]["max_error"] == pytest.approx(run.results[3].max_error)
    assert rows["e_missing"] == {
        "name": "e_missing",
        "file": "e_missing.out",
        "status": "missing",
        "output": None,
        "reference": str(folder / "tests" / "e_missing.txt"),
        "shape": None,
        "max_error": None,
        "reason": "no output and no error sidecar",
        "detail": "",
        "catches": None,
        "line": None,
        "column": None,
        "seconds": rows["e_missing"]["seconds"],
        "kernel": None,
        "precision": "fp32",
        "arrived_at": None,  # no deadline: no arrival judged
        "arrived_by": None,
    }
    assert rows["f_format"]["line"] == 2 and rows["f_format"]["column"] == 25


def test_folder_quick(folder):
    run = jobs.check_folder(folder / "outbox", folder / "tests", Options(quick=True, seed=3))
    got = {r.name: r.status for r in run.results}
    assert got["a_square"] is Status.OK and got["g_tall"] is Status.OK
    # 999.99 where about 10 was: far beyond the quick bound
    d = next(r for r in run.results if r.name == "d_wrong")
    assert d.status is Status.MISMATCH and "seed 3" in d.detail
    assert d.reason.startswith("row ") and "is wrong: multiplied by 16 random vectors" in d.reason
    assert "quick, seed 3" in run.summary()
    # what it catches: the largest figure of the folder's outputs, in the JSON each output's own
    figure = max(r.catches for r in run.results if r.catches is not None)
    assert run.summary().endswith(f"; each catches any row or column off by >= {figure:.3g} rms (chance >= 1 - 1e-06)")
    assert d.as_dict()["catches"] == d.catches > 0 and f"off by >= {d.catches:.3g} rms" in d.detail


def test_folder_against_expected(served, tmp_path):
    expected = tmp_path / "expected"
    expected.mkdir()
    for name in ("a_square", "b_rect", "c_one"):
        shutil.copy(served / "outbox" / f"{name}.out", expected / f"{name}.out")
    # one expected output from a different product: a mismatch
    rng = np.random.default_rng(0)
    (expected / "c_one.out").write_bytes(textformat.emit(random_matrix(rng, 1, 1, 50, 60)))
    run = jobs.check_folder(served / "outbox", expected, Options(against="expected"))
    got = {r.name: r.status for r in run.results}
    assert got["a_square"] is Status.OK and got["b_rect"] is Status.OK and got["c_one"] is Status.MISMATCH
    assert got["d_wrong"] is Status.EXTRA and got["h_refused"] is Status.EXTRA
    assert next(r for r in run.results if r.name == "d_wrong").reason == (
        "d_wrong.out: no d_wrong.out to check it against"
    )


def test_unreadable_references_and_outputs(folder):
    tests, out = folder / "tests", folder / "outbox"
    (tests / "a_square.txt").write_text("3\n1 2\n")  # not a valid input
    (out / "b_rect.out").unlink()
    (out / "c_one.out").chmod(0)  # an output that cannot be read (but by root)
    run = jobs.check_folder(out, tests, Options())
    got = {r.name: (r.status, r.reason) for r in run.results}
    assert got["a_square"][0] is Status.ERROR
    assert (
        got["a_square"][1] == f"input {tests / 'a_square.txt'}: line 2: expected 18 values (9 for A, 9 for B), found 2"
    )
    if os.geteuid() != 0:
        assert got["c_one"] == (Status.ERROR, f"cannot read {out / 'c_one.out'}: Permission denied")
    assert run.exit_status == ExitStatus.USAGE
    with pytest.raises(UnreadableError, match=r"cannot read .*nosuch"):
        jobs.check_folder(folder / "nosuch", tests, Options())


def test_shape_mismatch_and_broken_sidecar(folder):
    out, tests = folder / "outbox", folder / "tests"
    shutil.copy(out / "b_rect.out", out / "a_square.out")
    (out / "e_missing.error.yaml").write_text("status: [error\n")
    run = jobs.check_folder(out, tests, Options())
    got = {r.name: (r.status, r.reason) for r in run.results}
    assert got["a_square"] == (Status.MISMATCH, "shape 9x7, expected 16x16")
    assert got["e_missing"] == (Status.REFUSED, "refused (e_missing.error.yaml cannot be read: ParserError)")


def test_threads_give_the_same_results(folder):
    paired = pairing.pair_folder(folder / "outbox", folder / "tests", "inputs")
    assert [j.name for j in paired] == sorted(j.name for j in paired)
    one = jobs.check_jobs(paired, Options(), workers=1)
    many = jobs.check_jobs(paired, Options(), workers=4)
    strip = [(r.name, r.status, r.shape, r.max_error, r.reason, r.detail) for r in one]
    assert strip == [(r.name, r.status, r.shape, r.max_error, r.reason, r.detail) for r in many]


def test_pairing_ignores_hidden_files_and_other_suffixes(tmp_path):
    out, ref = tmp_path / "out", tmp_path / "ref"
    out.mkdir()
    ref.mkdir()
    for name in ("x.out", ".x.claim", ".tmp.y.out", "x.timing.yaml", "w.error.yaml", ".out"):
        (out / name).write_text("")
    for name in ("x.txt", "y.txt", "notes.md", ".hidden.txt"):
        (ref / name).write_text("")
    paired = pairing.pair_folder(out, ref, "inputs")
    assert paired == [
        Pairing("w", None, None, out / "w.error.yaml"),
        Pairing("x", out / "x.out", ref / "x.txt", None),
        Pairing("y", None, ref / "y.txt", None),
    ]
    assert jobs.check_job(paired[0], Options()).reason == "w.error.yaml: no w.txt to check it against"


def test_big_files_are_mapped_and_read_alike(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, 300, 200), random_matrix(rng, 200, 250)
    src, out = tmp_path / "m.txt", tmp_path / "m.out"
    src.write_bytes(b"".join(input_chunks(a, b, square=False)))
    out.write_bytes(textformat.emit(a @ b))
    assert src.stat().st_size > 1 << 19
    results = []
    for size in (1 << 40, 1 << 10):  # read, then mapped
        monkeypatch.setattr(textcore, "MAP_BYTES", size)
        data = textcore.read_bytes(src)
        assert isinstance(data, bytes) == (size > 1 << 20)
        results.append(jobs.check_file(out, src, Options()).results[0])
    assert results[0].status is Status.OK and results[0].detail == results[1].detail


# ---------------------------------------------------------------------------
# one output: its rows read beside the reference, its faults first


def _pair(tmp_path: Path, m: int = 6, k: int = 5, n: int = 4) -> tuple[Path, Path]:
    rng = np.random.default_rng(9)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    src, out = tmp_path / "m.txt", tmp_path / "m.out"
    src.write_bytes(b"".join(input_chunks(a, b, square=False)))
    out.write_bytes(textformat.emit(a @ b))
    return out, src


@pytest.mark.parametrize("quick", [False, True])
def test_the_output_s_bad_rows_come_before_the_reference_s_faults(tmp_path, quick):
    out, src = _pair(tmp_path)
    text = out.read_bytes()
    out.write_bytes(text[: text.index(b"\n") + 1] + b" x" + text[text.index(b"\n") + 3 :])  # row 1 spoiled
    bad_input = tmp_path / "bad.txt"
    bad_input.write_text("3\n1 2\n")
    other = tmp_path / "other.txt"
    other.write_bytes(b"".join(input_chunks(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), square=True)))
    for reference in (src, bad_input, other):  # right, not valid, another shape: the format fault in each
        r = jobs.check_file(out, reference, Options(quick=quick)).results[0]
        assert (r.status, r.line) == (Status.FORMAT, 2), reference
    good = tmp_path / "good.out"
    good.write_bytes(text)
    r = jobs.check_file(good, bad_input, Options(quick=quick)).results[0]
    assert (r.status, r.shape) == (Status.ERROR, (6, 4)) and r.reason.startswith("input ")
    r = jobs.check_file(good, other, Options(quick=quick)).results[0]
    assert (r.status, r.reason) == (Status.MISMATCH, "shape 6x4, expected 2x2")


def test_an_expected_output_with_the_output_s_bytes_is_not_parsed_again(tmp_path, monkeypatch):
    """The same bytes: the output is checked once and no values are read; other bytes: each once."""
    out, _ = _pair(tmp_path, 30, 20, 25)
    same, near = tmp_path / "same.out", tmp_path / "near.out"
    shutil.copy(out, same)
    text = out.read_bytes()
    last = int(text[-2:-1])
    near.write_bytes(text[:-2] + b"%d\n" % (last + 1 if last < 9 else last - 1))  # the last value off by 0.01
    calls: list[str] = []
    # the C route checks by textcore.output_ok and reads by textcore.output_rows; the numpy route by
    # textoutput's check_output and parse_output
    for mod, name in (
        (textoutput, "parse_output"),
        (textoutput, "check_output"),
        (textcore, "output_ok"),
        (textcore, "output_rows"),
    ):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    c_route = accel.text() is not None
    r = jobs.check_file(out, same, Options(against="expected")).results[0]
    assert r.status is Status.OK and r.max_error == 0.0 and calls == ["output_ok" if c_route else "check_output"]
    calls.clear()
    r = jobs.check_file(out, near, Options(against="expected")).results[0]
    read = "output_rows" if c_route else "parse_output"
    assert r.status is Status.OK and 0 < r.max_error <= 0.02 and calls == [read, read]
    spoiled = tmp_path / "spoiled.out"
    spoiled.write_bytes(text.replace(b".", b",", 1))
    shutil.copy(spoiled, tmp_path / "spoiled2.out")  # the same bad bytes: the output's fault is reported
    r = jobs.check_file(spoiled, tmp_path / "spoiled2.out", Options(against="expected")).results[0]
    assert r.status is Status.FORMAT
    r = jobs.check_file(out, same, Options(against="expected", tol=-1.0)).results[0]  # no value passes
    assert r.status is Status.MISMATCH


def _spoil(text: bytes, row: int, what: bytes = b" x") -> bytes:
    """``text`` with row ``row`` (0-based) starting with ``what`` in place of its first bytes."""
    lines = text.split(b"\n")
    lines[row + 1] = what + lines[row + 1][len(what) :]
    return b"\n".join(lines)


@pytest.mark.parametrize("block", [1, 7 * 25, 1 << 20])  # elements: a row, 7 rows, the whole output at a time
def test_two_outputs_in_blocks_report_as_whole(tmp_path, monkeypatch, block):
    """Outputs compared a block of rows at a time: every outcome (values, the output's faults
    before the expected output's wherever each lies, faults past the last row) as one read would
    give it."""
    blocks_of(monkeypatch, block)
    out, _ = _pair(tmp_path, 30, 20, 25)
    text = out.read_bytes()
    vals = textoutput.parse_output(text)
    rng = np.random.default_rng(1)
    cases = {
        "near": (text, textformat.emit((vals + rng.choice([0, 0, 0.01, -0.01], vals.shape)).astype(np.float32))),
        "far": (text, textformat.emit((vals + rng.choice([0, 0, 0.3], vals.shape)).astype(np.float32))),
        "expected bad late": (text, _spoil(text, 26)),
        "expected bad early, output bad late": (_spoil(text, 25), _spoil(text, 2)),
        "expected bad late, output bad early": (_spoil(text, 3), _spoil(text, 22)),
        "output has a row too many": (text + text[text.index(b"\n") + 1 :][:176], text),
        "expected has bytes after its last row": (text, text + b"  1.00\n"),
        "expected cut short": (text, text[: len(text) // 2]),
    }
    got = {}
    for name, (mine, theirs) in cases.items():
        a, b = tmp_path / "a.out", tmp_path / "b.out"
        a.write_bytes(mine)
        b.write_bytes(theirs)
        r = jobs.check_file(a, b, Options(against="expected")).results[0]
        got[name] = {k: v for k, v in r.as_dict().items() if k != "seconds"}
    blocks_of(monkeypatch, 1 << 40)
    for name, (mine, theirs) in cases.items():
        a, b = tmp_path / "a.out", tmp_path / "b.out"
        a.write_bytes(mine)
        b.write_bytes(theirs)
        r = jobs.check_file(a, b, Options(against="expected")).results[0]
        assert got[name] == {k: v for k, v in r.as_dict().items() if k != "seconds"}, name
    assert got["near"]["status"] == "ok" and got["far"]["status"] == "mismatch"
    assert got["expected bad late"]["status"] == "error"
    assert got["expected bad early, output bad late"]["status"] == "format"
    assert got["expected bad early, output bad late"]["line"] == 27
    assert got["expected bad late, output bad early"]["line"] == 5
    assert got["output has a row too many"]["status"] == "format"
    assert got["expected has bytes after its last row"]["status"] == "error"
    assert got["expected cut short"]["status"] == "error"


@pytest.mark.parametrize("block", [1, 7 * 25, 1 << 20])  # elements: a row, 7 rows, the whole output at a time
@pytest.mark.parametrize("tol", [None, 0.05])
@pytest.mark.parametrize("quick", [False, True])
def test_check_against_an_input_in_blocks_reports_as_whole(tmp_path, monkeypatch, block, tol, quick):
    """The product made a block of rows at a time, or --quick's output sums: every outcome (right, a
    few values wrong, wrong everywhere so that S is made in full, faults anywhere in the output) as
    one block of the whole gives it."""
    out, src = _pair(tmp_path, 30, 20, 25)
    text = out.read_bytes()
    vals = textoutput.parse_output(text)
    few = vals.copy()
    few[[3, 17, 29], [0, 11, 24]] += [0.5, -2.0, 40.0]
    cases = {
        "right": text,
        "a few wrong": textformat.emit(few.astype(np.float32)),
        "wrong everywhere": textformat.emit((vals * 1.01 + 0.3).astype(np.float32)),
        "a fault late": _spoil(text, 27),
        "a fault early": _spoil(text, 1),
        "a row too many": text + text[text.index(b"\n") + 1 :][:176],
    }

    def outcomes(elems: int) -> dict[str, dict[str, object]]:
        blocks_of(monkeypatch, elems)
        got = {}
        for name, body in cases.items():
            out.write_bytes(body)
            r = jobs.check_file(out, src, Options(tol=tol, quick=quick, seed=0)).results[0]
            got[name] = {k: v for k, v in r.as_dict().items() if k != "seconds"}
        return got

    blocks, whole = outcomes(block), outcomes(1 << 40)
    for name in cases:  # the largest error to the product's rounding, which GEMMs of other shapes may change
        want = whole[name].pop("max_error")
        assert blocks[name].pop("max_error") == (want if want is None else pytest.approx(want, rel=1e-12, abs=0))
    assert blocks == whole
    assert [blocks[k]["status"] for k in cases] == ["ok", "mismatch", "mismatch", "format", "format", "format"]
    assert blocks["a fault late"]["line"] == 29


@pytest.mark.parametrize("accelerated", [True, False], ids=["c", "python"])
def test_same_bytes(monkeypatch, accelerated):
    if accelerated and accel.fasttext is None:
        pytest.skip("mmd._fasttext is not built")
    if not accelerated:
        monkeypatch.setattr(accel, "fasttext", None)
    monkeypatch.setattr(textcore, "COMPARE_BYTES", 64)  # many blocks
    base = bytes(range(256)) * 9 + b"tail"
    assert textcore.same_bytes(memoryview(base), memoryview(bytearray(base)))
    for i in (0, 63, 64, 100, len(base) - 1, len(base) - 6):
        other = bytearray(base)
        other[i] ^= 1
        assert not textcore.same_bytes(memoryview(base), memoryview(other)), i
    assert not textcore.same_bytes(memoryview(base), memoryview(base[:-1]))
    assert textcore.same_bytes(memoryview(b""), memoryview(b""))


@pytest.mark.parametrize("block", [1, 7 * 25, 1 << 20])
def test_quick_by_the_c_route_reports_as_numpy_s(tmp_path, monkeypatch, block):
    """--quick with the C accelerators reads and sums without numpy (mmd.check.quick, mmd.textcore);
    with them switched off, numpy's parsers and passes make the same sums. Every outcome (right,
    a value, a row, a column wrong, faults anywhere, another shape) is the same both ways, to the
    rounding of the sums in the ratio."""
    if accel.passes() is None:
        pytest.skip("the C accelerators are not built")
    blocks_of(monkeypatch, block)
    out, src = _pair(tmp_path, 30, 20, 25)
    text = out.read_bytes()
    vals = textoutput.parse_output(text)
    spoilt = {"a value": (3, 11, 40.0), "a row": (17, slice(None), 2.0), "a column": (slice(None), 24, -2.0)}
    cases = {"right": text, "a fault late": _spoil(text, 27), "a row too many": text + text[-176:]}
    for name, (i, j, delta) in spoilt.items():
        wrong = vals.copy()
        wrong[i, j] += delta
        cases[name] = textformat.emit(wrong.astype(np.float32))
    other = tmp_path / "other.txt"
    rng = np.random.default_rng(3)
    other.write_bytes(b"".join(input_chunks(random_matrix(rng, 30, 20), random_matrix(rng, 20, 24), square=False)))

    def outcomes(accelerated: bool) -> dict[str, dict[str, object]]:
        monkeypatch.setattr(accel, "ON", accelerated)
        got = {}
        for name, body in cases.items():
            out.write_bytes(body)
            got[name] = jobs.check_file(out, src, Options(quick=True, seed=0)).results[0].as_dict()
        out.write_bytes(text)
        got["another shape"] = jobs.check_file(out, other, Options(quick=True, seed=0)).results[0].as_dict()
        return got

    c, numpy_ = outcomes(True), outcomes(False)
    ratio = re.compile(r"[0-9.e+-]+ (of|times) its bound")
    for name in c:
        for key in ("status", "reason", "detail", "line", "column", "shape"):
            mine, theirs = c[name][key], numpy_[name][key]
            if isinstance(mine, str):
                mine, theirs = ratio.sub("R", mine), ratio.sub("R", theirs)
            assert mine == theirs, (name, key)
    statuses = {name: r["status"] for name, r in c.items()}
    assert statuses == {
        "right": "ok",
        "a fault late": "format",
        "a row too many": "format",
        "a value": "mismatch",
        "a row": "mismatch",
        "a column": "mismatch",
        "another shape": "mismatch",
    }
    assert c["a row"]["reason"].startswith("row 18 is wrong")
    assert c["a column"]["reason"].startswith("column 25 is wrong")


SECRET = b"ta-token-3f9a1c SECRET\n"


def _reports(run: results.CheckRun, tmp_path: Path) -> bytes:
    """Everything the run shows a grader: the table, the summary, the JUnit and JSON files."""
    reports.write_junit(run, tmp_path / "r.xml")
    reports.write_json(run, tmp_path / "r.json")
    shown = (reports.table(run.results) + "\n" + run.summary()).encode()
    return shown + (tmp_path / "r.xml").read_bytes() + (tmp_path / "r.json").read_bytes()


@pytest.mark.parametrize("quick", [False, True])
def test_links_fifos_and_folders_in_an_outbox_are_reported_never_opened(folder, tmp_path, quick):
    out, tests = folder / "outbox", folder / "tests"
    secret, answers = tmp_path / "secret", tmp_path / "answers"
    secret.write_bytes(SECRET)
    answers.mkdir()
    shutil.move(out / "a_square.out", answers / "a_square.out")
    (out / "a_square.out").symlink_to(answers / "a_square.out")  # the right answer, through a link
    (out / "b_rect.out").unlink()
    (out / "b_rect.out").symlink_to(secret)  # a grader's private file
    (out / "c_one.out").unlink()
    os.mkfifo(out / "c_one.out")
    (out / "g_tall.out").unlink()
    (out / "g_tall.out").mkdir()
    (out / "e_missing.error.yaml").symlink_to(secret)
    run = jobs.check_folder(out, tests, Options(quick=quick))
    got = {r.name: (r.status, r.reason) for r in run.results if r.status is Status.NOT_A_FILE}
    assert got == {
        "a_square": (Status.NOT_A_FILE, "a_square.out is a symbolic link: not opened"),
        "b_rect": (Status.NOT_A_FILE, "b_rect.out is a symbolic link: not opened"),
        "c_one": (Status.NOT_A_FILE, "c_one.out is a FIFO: not opened"),
        "e_missing": (Status.NOT_A_FILE, "e_missing.error.yaml is a symbolic link: not opened"),
        "g_tall": (Status.NOT_A_FILE, "g_tall.out is a folder: not opened"),
    }
    assert run.exit_status == ExitStatus.FAILED and run.counts["not-a-file"] == 5
    assert "5 not-a-file" in run.summary()
    assert b"SECRET" not in _reports(run, tmp_path)


def test_an_output_made_a_link_after_pairing_is_not_followed(folder, tmp_path):
    out, tests = folder / "outbox", folder / "tests"
    paired = pairing.pair_folder(out, tests, "inputs")
    (tmp_path / "secret").write_bytes(SECRET)
    (out / "a_square.out").unlink()
    (out / "a_square.out").symlink_to(tmp_path / "secret")
    got = {r.name: (r.status, r.reason) for r in jobs.check_jobs(paired, Options(), workers=1)}
    assert got["a_square"] == (Status.NOT_A_FILE, "a_square.out is a symbolic link: not opened")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes device nodes")
def test_a_device_in_an_outbox_is_never_opened(folder):
    out, tests = folder / "outbox", folder / "tests"
    (out / "a_square.out").unlink()
    os.mknod(out / "a_square.out", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's: an endless read
    run = jobs.check_folder(out, tests, Options())
    got = {r.name: (r.status, r.reason) for r in run.results}
    assert got["a_square"] == (Status.NOT_A_FILE, "a_square.out is a character device: not opened")


def test_names_are_escaped_in_every_report(folder, tmp_path):
    out = folder / "outbox"
    forged = "\x1b[2K\x1b[1Ad_wrong.out    12x12  ok"  # erases the row above, draws an "ok" row
    raw = os.fsdecode(b"w\xff\x07.out")  # not UTF-8, and a bell
    for name in (forged + ".out", raw, "y\u202egnp.out"):  # a right-to-left override
        shutil.copy(out / "c_one.out", out / name)
        # tests of those names, so that each is a JUnit test case too (extra files are not)
        shutil.copy(folder / "tests" / "c_one.txt", folder / "tests" / (name[: -len(".out")] + ".txt"))
    refusal = (out / "h_refused.error.yaml").read_text()
    assert "reason: 'line 3: ''x'' is not a number'\n" in refusal
    refusal = refusal.replace("reason: 'line 3: ''x'' is not a number'", 'reason: "\\e[31mno\\n"')
    # e_missing's own: a sidecar names the input it read, and one naming h_refused's would answer h_refused
    sha = {
        n: hashlib.sha256((folder / "tests" / f"{n}.txt").read_bytes()).hexdigest() for n in ("h_refused", "e_missing")
    }
    refusal = refusal.replace(sha["h_refused"], sha["e_missing"])
    (out / "e_missing.error.yaml").write_text(refusal)  # a student's sidecar with escapes in its reason
    run = jobs.check_folder(out, folder / "tests", Options())
    table = reports.table(run.results) + "\n" + run.summary()
    assert all(ch == "\n" or ch.isprintable() for ch in table)
    rows = table.splitlines()
    for name in ("\\x1b[2K\\x1b[1Ad_wrong.out    12x12  ok.out", "w\\xff\\x07.out", "y\\u202egnp.out"):
        assert any(row.startswith(name + "  ") and " ok " in row for row in rows), name
    (refused,) = (row for row in rows if row.startswith("e_missing.out"))
    assert refused.endswith("refused: \\x1b[31mno\\n (e_missing.error.yaml)")
    reports.write_junit(run, tmp_path / "r.xml")
    JUNIT_SCHEMA.validate(tmp_path / "r.xml")
    names = {c.get("name") for c in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")}
    assert names >= {"\\x1b[2K\\x1b[1Ad_wrong.out    12x12  ok", "w\\xff\\x07", "y\\u202egnp"}
    reports.write_json(run, tmp_path / "r.json")
    text = (tmp_path / "r.json").read_text(encoding="ascii")
    files = {r["file"] for r in json.loads(text)["results"]}
    assert files >= {"\\x1b[2K\\x1b[1Ad_wrong.out    12x12  ok.out", "w\\xff\\x07.out", "y\\u202egnp.out"}


def test_every_status_in_junit_is_valid(folder, tmp_path):
    out = folder / "outbox"
    (folder / "tests" / "a_square.txt").write_text("3\n1 2\n")  # an error
    (out / "b_rect.out").unlink()
    (out / "b_rect.out").symlink_to(out / "c_one.out")  # not-a-file
    sidecar = (out / "g_tall.timing.yaml").read_text()
    shutil.copy(out / "g_tall.out", out / "g_tall.1.out")  # superseded
    (out / "g_tall.1.timing.yaml").write_text(sidecar)
    before = _between()
    shutil.copy(out / "g_tall.out", out / "g_tall.2.out")  # late: it arrives after the deadline, whatever it says
    forged = re.sub(r"(?m)^finished_at: .*$", "finished_at: '1999-01-01T00:00:00.000+00:00'", sidecar)
    (out / "g_tall.2.timing.yaml").write_text(forged)
    for quick in (False, True):
        run = jobs.check_folder(out, folder / "tests", Options(quick=quick, before=before))
        assert {r.status for r in run.results} == set(Status)
        reports.write_junit(run, tmp_path / "r.xml")
        JUNIT_SCHEMA.validate(tmp_path / "r.xml")


def _forged_for_seed_0(folder: Path, m: int = 96, k: int = 80, n: int = 112) -> Pairing:
    """x.txt and an output x.out far from its product (off by about 20 everywhere) that passes --quick
    at seed 0: the product plus an error that seed 0's vectors cannot see (E·x = 0 and yᵀ·E = 0 for
    each of its x and y). Anyone can make it in O(n²) from the public vectors; the product here
    only makes the test short."""
    rng = np.random.default_rng(30)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    src = folder / "x.txt"
    src.write_bytes(b"".join(input_chunks(a, b, square=False)))
    x_t, y = quickcheck.random_vectors(m, n, 0)
    qx, _ = np.linalg.qr(np.asarray(x_t).reshape(-1, n).T)  # n × vectors
    qy, _ = np.linalg.qr(np.asarray(y).reshape(m, -1))  # m × vectors
    z = rng.normal(scale=20.0, size=(m, n))
    e = z - qy @ (qy.T @ z)
    e -= (e @ qx) @ qx.T
    out = folder / "x.out"
    out.write_bytes(textformat.emit((a.astype(np.float64) @ b + e).astype(np.float32)))
    return Pairing("x", out, src)


def test_a_forgery_for_seed_0_fails_under_the_default_seed(tmp_path):
    job = _forged_for_seed_0(tmp_path)
    assert jobs.check_job(job, Options(quick=True, seed=0)).status is Status.OK  # the public seed: forged
    full = jobs.check_job(job, Options())
    assert full.status is Status.MISMATCH and full.reason.startswith("107")
    seeds = set()
    for _ in range(3):
        options = Options(quick=True)  # a fresh seed each time
        r = jobs.check_job(job, options)
        assert r.status is Status.MISMATCH and f"seed {options.seed}," in r.detail
        seeds.add(options.seed)
    assert len(seeds) == 3


# ---------------------------------------------------------------------------
# resubmissions and deadlines: an output pairs with a test by its input's sha256, then by name


def _between() -> datetime:
    """A deadline between the files made before this call and those made after it (ctime, which judges
    arrivals, is stamped from a clock that lags by up to one kernel tick, 1-10 ms)."""
    time.sleep(0.05)
    now = datetime.now(timezone.utc)
    time.sleep(0.05)
    return now


def _input_bytes(seed: int, m: int = 5, k: int = 4, n: int = 3) -> bytes:
    rng = np.random.default_rng(seed)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    return b"".join(input_chunks(a, b, square=False))


def _serve(root: Path, name: str, body: bytes) -> None:
    """``name`` dropped into root/inbox and served by a real `mmd serve --once` into root/outbox."""
    for folder in ("inbox", "outbox"):
        (root / folder).mkdir(exist_ok=True)
    (root / "inbox" / name).write_bytes(body)
    r = run_mmd("serve", "--once", "--inbox", str(root / "inbox"), "--outbox", str(root / "outbox"), cwd=root)
    assert r.returncode == 0, r.stderr


@pytest.mark.integration  # seconds of examples or of real runs: left out of `make quick`
def test_a_resubmission_is_graded_and_the_output_before_it_superseded(tmp_path):
    """x.txt processed, then a corrected x.txt dropped: the daemon wrote x.1.out, which is graded (its
    sidecar's input is the test's bytes, and it is the newest); x.out is superseded, not a mismatch."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "x.txt").write_bytes(_input_bytes(2))  # the corrected test
    _serve(tmp_path, "x.txt", _input_bytes(1))  # the first, wrong x.txt
    _serve(tmp_path, "x.txt", _input_bytes(2))
    out = tmp_path / "outbox"
    assert sorted(p.name for p in out.glob("*.out")) == ["x.1.out", "x.out"]
    run = jobs.check_folder(out, tests, Options())
    assert [(r.name, r.file, r.status, r.reason) for r in run.results] == [
        ("x", "x.1.out", Status.OK, ""),
        ("x", "x.out", Status.SUPERSEDED, "superseded by x.1.out"),
    ]
    assert run.exit_status == ExitStatus.OK
    assert re.fullmatch(
        r"1 jobs checked against the inputs in \S+: 1 ok; 0 extra; 1 superseded; 0 could not be checked \(.*\)",
        run.summary(),
    ), run.summary()
    reports.write_junit(run, tmp_path / "r.xml")
    JUNIT_SCHEMA.validate(tmp_path / "r.xml")
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("2", "0", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == ["x", "x (x.out)"]
    assert cases["x (x.out)"].find("skipped").attrib == {"type": "superseded", "message": "superseded by x.1.out"}


@pytest.mark.integration  # seconds of examples or of real runs: left out of `make quick`
def test_before_grades_what_arrived_before_the_deadline(tmp_path):
    """The daemon's outbox judged by its files' ctime: what its commit stamped, which nobody sets back."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "x.txt").write_bytes(_input_bytes(2))
    early = _between()  # nothing had arrived
    _serve(tmp_path, "x.txt", _input_bytes(2))  # right, in time
    deadline = _between()
    _serve(tmp_path, "x.txt", _input_bytes(1))  # another x.txt, after the deadline
    out = tmp_path / "outbox"
    newest = jobs.check_folder(out, tests, Options())  # the newest is graded, whatever its input
    assert [(r.file, r.status) for r in newest.results] == [("x.1.out", Status.MISMATCH), ("x.out", Status.SUPERSEDED)]
    assert {r.arrival for r in newest.results} == {None}  # no deadline: nothing judged
    run = jobs.check_folder(out, tests, Options(before=deadline))
    assert [(r.file, r.status, r.arrival.source) for r in run.results] == [
        ("x.out", Status.OK, lateness.Source.CTIME),
        ("x.1.out", Status.LATE, lateness.Source.CTIME),
    ]
    arrived = run.results[1].arrival.at
    ctime = max(os.stat(out / name).st_ctime_ns for name in ("x.1.out", "x.1.timing.yaml"))
    assert arrived > deadline and arrived == lateness.from_ns(ctime)  # its later file's
    when = lateness.shown_time(deadline)
    assert (
        run.results[1].reason
        == f"arrived {lateness.shown_time(arrived)} (its files' ctime), not before the deadline {when}"
    )
    run = jobs.check_folder(out, tests, Options(before=early))
    assert [(r.file, r.status) for r in run.results] == [
        ("x.out", Status.MISSING),
        ("x.1.out", Status.LATE),
        ("x.out", Status.LATE),
    ]
    assert run.results[0].reason == f"no output and no error sidecar arrived before {lateness.shown_time(early)}"
    assert run.exit_status == ExitStatus.FAILED


def _facts(sha: str | None = None, at: str | None = None, wanted: str | None = None) -> pairing.Sidecar:
    return pairing.Sidecar(input_sha256=sha, finished_at=None if at is None else lateness.parse_time(at), wanted=wanted)


def test_pairing_by_sha256_then_by_name_is_a_pure_function():
    out, ref = Path("out"), Path("ref")
    found = [
        pairing.Found(out / "renamed.out", _facts("aa", "2030-01-01T10:00:00+00:00")),  # x's bytes, another name
        pairing.Found(out / "y.out", _facts("ff", "2030-01-01T09:00:00+00:00")),  # y's name, other bytes
        pairing.Found(out / "y.1.out", _facts(None, "2030-01-01T11:00:00+00:00", wanted="y.out")),
        pairing.Found(out / "y.1.error.yaml", _facts(None, "2030-01-01T10:30:00+00:00", wanted="y.out")),
        pairing.Found(out / "z.out", None),  # bare: by name
        pairing.Found(out / "w.out", None),  # no test named w: extra
    ]
    refs = {"x": ref / "x.txt", "y": ref / "y.txt", "z": ref / "z.txt", "v": ref / "v.txt"}
    paired = pairing.pair(found, refs, {"x": "aa", "y": "bb", "z": "cc", "v": "dd"})
    assert [(j.name, j.output, j.refusal, j.aside) for j in paired] == [
        ("v", None, None, None),
        ("w", out / "w.out", None, None),
        ("x", out / "renamed.out", None, None),
        ("y", out / "y.1.out", None, None),
        ("y", None, out / "y.1.error.yaml", results.Aside(Status.SUPERSEDED, "superseded by y.1.out")),
        ("y", out / "y.out", None, results.Aside(Status.SUPERSEDED, "superseded by y.1.out")),
        ("z", out / "z.out", None, None),
    ]
    assert [j.reference for j in paired] == [ref / "v.txt", None, ref / "x.txt", *[ref / "y.txt"] * 3, ref / "z.txt"]
    # a refusal newer than every output is what is graded
    found[3] = pairing.Found(out / "y.1.error.yaml", _facts(None, "2030-01-01T12:00:00+00:00", wanted="y.out"))
    paired = pairing.pair(found, refs, {})
    y = [(j.output, j.refusal, j.aside) for j in paired if j.name == "y"]
    assert y[0] == (None, out / "y.1.error.yaml", None)
    # without sidecars an output without one is older than any with one, and a later version is no test's
    bare = [pairing.Found(out / "y.out", None), pairing.Found(out / "y.1.out", None)]
    assert [(j.name, j.output, j.reference) for j in pairing.pair(bare, {"y": ref / "y.txt"}, {})] == [
        ("y", out / "y.out", ref / "y.txt"),
        ("y.1", out / "y.1.out", None),
    ]


# ---------------------------------------------------------------------------
# a whole class: a folder per student


def _class(tmp_path: Path) -> tuple[Path, Path]:
    """tests/{x,y}.txt and handin/ with alice (x right, y wrong), bob (x right, y none), mmd's slurm/, a dot
    folder, a link named like a student (to alice's folder) and a stray file."""
    tests, handin = tmp_path / "tests", tmp_path / "handin"
    tests.mkdir()
    handin.mkdir()
    outs = {}
    for i, name in enumerate(("x", "y")):
        rng = np.random.default_rng(40 + i)
        a, b = random_matrix(rng, 3, 4), random_matrix(rng, 4, 2)
        (tests / f"{name}.txt").write_bytes(b"".join(input_chunks(a, b, square=False)))
        outs[name] = textformat.emit(a @ b)
    for login, files in (
        ("alice", {"x.out": outs["x"], "y.out": outs["x"]}),
        ("bob", {"x.out": outs["x"]}),
        ("slurm", {"x.out": outs["x"]}),
        (".cache", {"x.out": outs["x"]}),
    ):
        (handin / login).mkdir()
        for name, body in files.items():
            (handin / login / name).write_bytes(body)
    (handin / "mallory").symlink_to(handin / "alice")
    (handin / "notes.txt").write_text("not a student\n")
    return handin, tests


def test_a_class_by_student(tmp_path):
    handin, tests = _class(tmp_path)
    wrong = jobs.check_file(handin / "alice" / "y.out", tests / "y.txt", Options()).results[0].reason
    assert wrong.endswith(" of 6 values outside tolerance") or " of 6 values outside tolerance, worst at" in wrong
    run = jobs.check_class(handin, tests, Options(), roster=["alice", "bob", "carol"])
    got = [(r.student, r.name, r.file, r.status, r.reason) for r in run.results]
    assert got == [
        ("alice", "x", "x.out", Status.OK, ""),
        ("alice", "y", "y.out", Status.MISMATCH, wrong),
        ("bob", "x", "x.out", Status.OK, ""),
        ("bob", "y", "y.out", Status.MISSING, "no output and no error sidecar"),
        ("carol", "x", "x.out", Status.MISSING, "no folder carol"),
        ("carol", "y", "y.out", Status.MISSING, "no folder carol"),
        ("mallory", "mallory", "mallory", Status.NOT_A_FILE, "mallory is a symbolic link: not opened"),
        ("mallory", "x", "x.out", Status.MISSING, "no folder mallory"),
        ("mallory", "y", "y.out", Status.MISSING, "no folder mallory"),
    ]
    assert run.exit_status == ExitStatus.FAILED
    assert run.student_summaries() == [
        "alice: 2 jobs checked: 1 ok, 1 mismatch; 0 extra; 0 could not be checked",
        "bob: 2 jobs checked: 1 ok, 1 missing; 0 extra; 0 could not be checked",
        "carol: 2 jobs checked: 2 missing; 0 extra; 0 could not be checked",
        "mallory: 3 jobs checked: 2 missing, 1 not-a-file; 0 extra; 0 could not be checked",
    ]
    e = {r.student: "%.4g" % r.max_error for r in run.results if r.name == "x" and r.max_error is not None}
    table = reports.table(run.results).splitlines()
    assert table[0] == "student  file     shape  status      max error  reason"
    assert table[1] == f"alice    x.out    3x2    ok          {e['alice']:>9}"
    assert table[4] == "bob      y.out    -      missing             -  no output and no error sidecar"
    assert table[7] == "mallory  mallory  -      not-a-file          -  mallory is a symbolic link: not opened"
    # without a roster: the folders alone (carol unseen); never slurm/, a dot folder or a stray file
    run = jobs.check_class(handin, tests, Options())
    assert sorted({r.student for r in run.results}) == ["alice", "bob", "mallory"]


def test_a_class_s_reports_group_by_student(tmp_path):
    handin, tests = _class(tmp_path)
    run = jobs.check_class(handin, tests, Options(), roster=["alice", "bob", "carol"])
    reports.write_junit(run, tmp_path / "r.xml")
    JUNIT_SCHEMA.validate(tmp_path / "r.xml")
    root = ET.parse(tmp_path / "r.xml").getroot()
    assert (root.get("tests"), root.get("failures")) == ("9", "7")
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [f"mmd check {s}" for s in ("alice", "bob", "carol", "mallory")]
    assert [(s.get("tests"), s.get("failures")) for s in suites] == [("2", "1"), ("2", "1"), ("2", "2"), ("3", "3")]
    assert {p.get("name"): p.get("value") for p in suites[1].find("properties")}["student"] == "bob"
    assert [c.get("name") for c in suites[0].iter("testcase")] == ["x", "y"]
    reports.write_json(run, tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert "results" not in data and data["exit_status"] == 1 and data["counts"]["missing"] == 5
    assert [(s["student"], s["counts"]["ok"], s["exit_status"]) for s in data["students"]] == [
        ("alice", 1, 1),
        ("bob", 1, 1),
        ("carol", 0, 1),
        ("mallory", 0, 1),
    ]
    assert [(r["name"], r["status"]) for r in data["students"][1]["results"]] == [("x", "ok"), ("y", "missing")]


def _tf32_served(root: Path, kernel: str) -> tuple[Path, Path]:
    """A 64×64 job served by a real daemon, its output then replaced by a TF32 product of its input (the
    operands rounded to TF32's 10-bit mantissa, the products summed in float64, then float32, as a
    tensor core's TF32 path makes it) and its sidecar's kernel by ``kernel``: (tests, outbox)."""
    rng = np.random.default_rng(30)
    a = rng.uniform(-10, 10, (64, 64)).astype(np.float32)
    b = rng.uniform(-10, 10, (64, 64)).astype(np.float32)
    tests = root / "tests"
    tests.mkdir(parents=True)
    body = b"".join(input_chunks(a, b, square=True))
    (tests / "t.txt").write_bytes(body)
    _serve(root, "t.txt", body)
    out = root / "outbox"
    c = (tf32_round(a).astype(np.float64) @ tf32_round(b).astype(np.float64)).astype(np.float32)
    (out / "t.out").write_bytes(textformat.emit(c))
    sidecar = out / "t.timing.yaml"
    sidecar.write_text(re.sub(r"(?m)^kernel: .*$", f"kernel: {kernel}", sidecar.read_text()))
    assert reader.read(sidecar).kernel == kernel
    return tests, out


@pytest.mark.integration  # seconds of examples or of real runs: left out of `make quick`
def test_a_tf32_kernel_s_output_is_held_to_tf32_s_tolerance(tmp_path):
    """Every output the daemon writes as ok checks as right: a TF32 kernel's (tc1, by its sidecar) is held to
    TF32's tolerance, and the table, the JSON and the JUnit say so; the same bytes from an fp32 kernel
    (tc3: 3xTF32, fp32-class) are wrong, far beyond fp32's tolerance."""
    tests, out = _tf32_served(tmp_path / "tf32", "tc1")
    run = jobs.check_folder(out, tests, Options())
    [r] = run.results
    assert (r.status, r.kernel) == (Status.OK, "tc1"), r
    assert r.reason == "kernel tc1 is TF32: held to TF32's tolerance"
    assert tolerance.TOLERANCES["tf32"] in r.detail
    assert "kernel tc1 is TF32" in reports.table(run.results)
    data = reports.run_dict(run)["results"][0]
    assert (data["kernel"], data["precision"]) == ("tc1", "tf32")
    reports.write_junit(run, tmp_path / "r.xml")
    JUNIT_SCHEMA.validate(tmp_path / "r.xml")
    assert "kernel: tc1 (tf32)" in ET.parse(tmp_path / "r.xml").getroot().find(".//system-out").text
    one = jobs.check_file(out / "t.out", tests / "t.txt", Options()).results[0]  # one output: its sidecar too
    assert (one.status, one.kernel) == (Status.OK, "tc1")

    tests, out = _tf32_served(tmp_path / "fp32", "tc3")
    [r] = jobs.check_folder(out, tests, Options()).results
    assert (r.status, r.kernel) == (Status.MISMATCH, "tc3"), r
    assert tolerance.TOLERANCES["fp32"] in r.detail


@pytest.mark.integration  # a real daemon's run
def test_quick_holds_a_tf32_kernel_s_output_to_tf32_s_bound(tmp_path):
    """--quick reads the producing kernel from the sidecar, as the full check does: a TF32 kernel's output
    passes against TF32's bound, and the table says so; the same bytes from an fp32 kernel are refused."""
    tests, out = _tf32_served(tmp_path / "tf32", "tc1")
    for quick_options in (Options(quick=True, seed=1), Options(quick=True, seed=2)):
        [r] = jobs.check_folder(out, tests, quick_options).results
        assert (r.status, r.kernel, r.precision) == (Status.OK, "tc1", "tf32"), r
        assert "kernel tc1 is TF32: held to TF32's tolerance" in r.reason
        assert tolerance.TOLERANCES["tf32"] in r.detail
        one = jobs.check_file(out / "t.out", tests / "t.txt", quick_options).results[0]
        assert (one.status, one.kernel, one.precision) == (Status.OK, "tc1", "tf32"), one
    tests, out = _tf32_served(tmp_path / "fp32", "tc3")
    [r] = jobs.check_folder(out, tests, Options(quick=True, seed=1)).results
    assert (r.status, r.kernel) == (Status.MISMATCH, "tc3"), r
