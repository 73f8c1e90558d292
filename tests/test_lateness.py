"""A deadline (``mmd check --before``) judged by times no student can set: a hand-in's sidecar is a claim.

A student's hand-in folder holds the student's own sidecars: a ``finished_at`` edited to before the deadline
(and mtimes set back with ``touch -d``) must not make an output made after it count. What judges is
mmd.check.lateness: the arrival ``mmd collect`` recorded in the grader's copy, else the files' ctime. Real
files, the real CLI; the class's tests at the end use real Unix accounts (root only, serial).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from mmd.check import lateness

from . import classbox
from .conftest import run_mmd

users, students = classbox.users, classbox.students  # the fixtures of the real accounts' tests

pytestmark = pytest.mark.integration  # real `mmd check` and `mmd collect` processes

#: Longer than the kernel's clock tick (ctime is stamped from a clock that lags by up to one, 1-10 ms).
TICK_S = 0.05


def _deadline() -> datetime:
    """A deadline between what was made before this call and what is made after it."""
    time.sleep(TICK_S)
    now = datetime.now(timezone.utc)
    time.sleep(TICK_S)
    return now


def _forge(sidecar: Path, before: datetime, **fields: str) -> str:
    """The text of ``sidecar`` with its ``finished_at`` (and ``fields``) set as a student would set them."""
    text = sidecar.read_text()
    text = re.sub(r"(?m)^finished_at: .*$", f"finished_at: '{before.isoformat(timespec='milliseconds')}'", text)
    for key, value in fields.items():
        text = re.sub(rf"(?m)^{key}: .*$", f"{key}: {value}", text)
    return text


def _made(tests: Path, name: str, into: Path) -> None:
    """``into/name.out`` and its sidecar, made by a real ``mmd run`` of ``tests/name.txt``."""
    r = run_mmd("run", str(tests / f"{name}.txt"), "-o", str(into / f"{name}.out"), "-q")
    assert r.returncode == 0, r.stderr


def _check(folder: Path, tests: Path, deadline: datetime, *more: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = folder.parent / f"{folder.name}.json"
    r = run_mmd(
        "check", str(folder), "--inputs", str(tests), "--by-student", "--before", deadline.isoformat(),
        "--json", str(report), *more,
    )  # fmt: skip
    return r, json.loads(report.read_text())


def _of(report: dict, login: str, test: str) -> list[tuple[str, str | None]]:
    """(status, arrived_by) of each row of ``login``'s ``test`` in a class's JSON report, in the table's order."""
    (student,) = (s for s in report["students"] if s["student"] == login)
    return [(r["status"], r.get("arrived_by")) for r in student["results"] if r["name"] == test]


def _reasons(report: dict, login: str, test: str) -> list[str]:
    (student,) = (s for s in report["students"] if s["student"] == login)
    return [r["reason"] for r in student["results"] if r["name"] == test]


@pytest.fixture
def course(tmp_path: Path) -> tuple[Path, Path]:
    """tests/{x,y}.txt (from mmd gen) and an empty hand-in folder."""
    tests, handin = tmp_path / "tests", tmp_path / "handin"
    tests.mkdir()
    handin.mkdir()
    for seed, name in ((1, "x"), (2, "y")):
        assert run_mmd("gen", "6", "--seed", str(seed), "-o", str(tests / f"{name}.txt")).returncode == 0
    return tests, handin


def test_a_sidecar_edited_to_before_the_deadline_leaves_an_output_made_after_it_late(course):
    """Bob hands in x in time. Alice makes hers after the deadline, edits its sidecar's finished_at to an hour
    before it and sets both files' mtimes back: her x is late by its files' ctime, and x is missing."""
    tests, handin = course
    for login in ("alice", "bob"):
        (handin / login).mkdir()
    _made(tests, "x", handin / "bob")
    deadline = _deadline()
    _made(tests, "x", handin / "alice")
    sidecar = handin / "alice" / "x.timing.yaml"
    early = deadline - timedelta(hours=1)
    sidecar.write_text(_forge(sidecar, early))
    for path in (sidecar, handin / "alice" / "x.out"):
        os.utime(path, (early.timestamp(), early.timestamp()))

    r, report = _check(handin, tests, deadline)
    assert r.returncode == 1, r.stdout + r.stderr
    assert _of(report, "alice", "x") == [("missing", None), ("late", "ctime")]
    missing, late = _reasons(report, "alice", "x")
    assert missing == f"no output and no error sidecar arrived before {lateness.shown_time(deadline)}"
    assert re.fullmatch(
        rf"arrived \S+ \(its files' ctime\), not before the deadline {re.escape(lateness.shown_time(deadline))}", late
    )
    assert _of(report, "bob", "x") == [("ok", "ctime")]
    # the table says what judged each answer: an arrived column, the time and its source
    head, *lines = r.stdout.splitlines()
    assert head.split()[:5] == ["student", "file", "shape", "status", "arrived"]
    assert any(line.split()[:3] == ["alice", "x.out", "-"] and "late" in line and "(ctime)" in line for line in lines)
    assert any(line.split()[:4] == ["bob", "x.out", "6x6", "ok"] and "(ctime)" in line for line in lines)


def test_a_sidecar_changed_after_the_deadline_makes_its_answer_late(course):
    """An output made in time whose sidecar is changed after the deadline (claiming a TF32 kernel, whose
    tolerance is wider) is a late answer: the answer's arrival is its latest file's."""
    tests, handin = course
    (handin / "alice").mkdir()
    _made(tests, "x", handin / "alice")
    deadline = _deadline()
    sidecar = handin / "alice" / "x.timing.yaml"
    sidecar.write_text(_forge(sidecar, deadline - timedelta(minutes=5), kernel="tc1"))
    r, report = _check(handin, tests, deadline)
    assert r.returncode == 1, r.stdout + r.stderr
    assert _of(report, "alice", "x") == [("missing", None), ("late", "ctime")]


def test_collect_at_the_deadline_keeps_the_hand_in_and_judges_each_file_by_its_arrival(course, tmp_path):
    """mmd collect at the deadline copies the hand-in with each file's arrival (its ctime there). Alice
    overwrites her right x with a wrong one after the deadline, with a forged sidecar and mtimes: the copy made
    at the deadline grades her right x in time; a collection after it has her new x late, and Bob's x, untouched
    since before the deadline, in time (its ctime in his folder, not the collection's time)."""
    tests, handin = course
    for login in ("alice", "bob"):
        (handin / login).mkdir()
        _made(tests, "x", handin / login)
    at_deadline = tmp_path / "at-deadline"
    r = run_mmd("collect", str(handin), str(at_deadline))
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout.splitlines() == [
        f"collected 4 files of 2 students into {at_deadline} ({at_deadline / lateness.MANIFEST_NAME})"
    ]
    deadline = _deadline()
    alice = handin / "alice"
    (alice / "x.out").write_bytes((alice / "x.out").read_bytes().replace(b".", b"9", 1))  # wrong, made late
    early = deadline - timedelta(hours=1)
    (alice / "x.timing.yaml").write_text(_forge(alice / "x.timing.yaml", early))
    for path in alice.iterdir():
        os.utime(path, (early.timestamp(), early.timestamp()))

    r, report = _check(at_deadline, tests, deadline)
    assert _of(report, "alice", "x") == _of(report, "bob", "x") == [("ok", "collected")], r.stdout
    assert r.returncode == 1  # y is missing for both

    later = tmp_path / "later"
    assert run_mmd("collect", str(handin), str(later)).returncode == 0
    r, report = _check(later, tests, deadline)
    assert _of(report, "alice", "x") == [("missing", None), ("late", "collected")]
    assert _of(report, "bob", "x") == [("ok", "collected")]
    manifest = json.loads((later / lateness.MANIFEST_NAME).read_text())
    bob = manifest["files"]["bob/x.out"]
    assert bob["arrived_at"] == bob["changed_at"] < manifest["collected_at"]
    assert (os.stat(later).st_mode & 0o777, os.stat(later / lateness.MANIFEST_NAME).st_mode & 0o777) == (0o700, 0o600)


def test_a_plain_copy_is_a_new_inode_so_its_answers_arrived_when_it_was_made(course, tmp_path):
    """`cp -a` keeps mtimes, which a student sets, never the ctime: the grader's plain copy made after the
    deadline has every answer late (docs/grading.md says to use mmd collect)."""
    tests, handin = course
    (handin / "bob").mkdir()
    _made(tests, "x", handin / "bob")
    deadline = _deadline()
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(handin), str(copy)], check=True)
    _, report = _check(copy, tests, deadline)
    assert _of(report, "bob", "x") == [("missing", None), ("late", "ctime")]


def test_a_collected_file_changed_since_is_late_and_a_manifest_others_may_write_is_not_used(course, tmp_path):
    tests, handin = course
    (handin / "bob").mkdir()
    _made(tests, "x", handin / "bob")
    _made(tests, "y", handin / "bob")
    graded = tmp_path / "graded"
    assert run_mmd("collect", str(handin), str(graded)).returncode == 0
    deadline = _deadline()
    out = graded / "bob" / "y.out"
    out.write_bytes(out.read_bytes().replace(b".", b"9", 1))
    os.utime(out, (0, 0))
    r, report = _check(graded, tests, deadline)
    assert _of(report, "bob", "x") == [("ok", "collected")]
    assert _of(report, "bob", "y") == [("missing", None), ("late", "none")]
    when = lateness.shown_time(deadline)
    assert _reasons(report, "bob", "y")[1] == (
        f"y.out changed since mmd collect copied it: not shown to be before the deadline {when}"
    )
    # a manifest another user could have written is no record of the grader's: ctime judges, the copies' own
    # (made before the deadline, so in time; the changed y.out after it)
    (graded / lateness.MANIFEST_NAME).chmod(0o666)
    r, report = _check(graded, tests, deadline)
    assert _of(report, "bob", "x") == [("ok", "ctime")]
    assert _of(report, "bob", "y") == [("missing", None), ("late", "ctime")]
    assert r.stderr == (
        f"mmd: warning: {graded / lateness.MANIFEST_NAME} is not used (it or its folder is not the grader's alone: "
        "writable by others (mode 666)): lateness is judged by ctime\n"
    )


def test_collect_copies_no_link_nor_fifo_and_never_enters_a_folder_that_is_a_link(tmp_path):
    handin, secret = tmp_path / "handin", tmp_path / "answers"
    (handin / "alice").mkdir(parents=True)
    secret.mkdir()
    (secret / "x.out").write_text("1\n  1.00\n")
    (handin / "alice" / "x.out").symlink_to(secret / "x.out")
    os.mkfifo(handin / "alice" / "y.out")
    (handin / "alice" / "notes.md").write_text("not read\n")
    (handin / "mallory").symlink_to(secret)
    r = run_mmd("collect", str(handin), str(tmp_path / "graded"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "mallory is a symbolic link: not collected",
        "alice/x.out is a symbolic link: not collected",
        "alice/y.out is a FIFO: not collected",
        f"collected 0 files of 1 students into {tmp_path / 'graded'} ({tmp_path / 'graded' / lateness.MANIFEST_NAME})",
    ]
    assert sorted(p.name for p in (tmp_path / "graded").rglob("*")) == [lateness.MANIFEST_NAME, "alice"]
    r = run_mmd("collect", str(handin), str(tmp_path / "graded"))
    assert (r.returncode, r.stderr) == (2, f"mmd collect: {tmp_path / 'graded'} exists: collect into a new folder\n")


# ---------------------------------------------------------------------------
# real Unix accounts: a student's own folder, files and clock tricks


@pytest.fixture
def shared(students) -> Iterator[Path]:
    """A hand-in folder as a course may set one up: sticky and world-writable (each student makes their own
    folder in it), under /tmp where the students can reach it."""
    root = Path(tempfile.mkdtemp(prefix="mmd-handin-"))
    root.chmod(0o755)
    handin = root / "handin"
    handin.mkdir()
    handin.chmod(0o1777)
    yield handin
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.serial
def test_a_student_forging_finished_at_mtimes_and_the_record_after_the_deadline_is_late(students, shared, tmp_path):
    """Alice (a real account) makes her folder and hands in x after the deadline: the right output, a sidecar
    whose finished_at says an hour before the deadline, both files' mtimes set back with `touch -d`, and a
    manifest of her own in the hand-in folder that records her files as arrived before the deadline. The
    grader's check in place has her x late (the manifest is not the grader's: not used); so has the grader's
    mmd collect afterwards; Bob's x, handed in before the deadline, is in time both ways."""
    alice, bob = students
    tests = tmp_path / "tests"
    tests.mkdir()
    assert run_mmd("gen", "6", "--seed", "1", "-o", str(tests / "x.txt")).returncode == 0
    made = tmp_path / "made"
    made.mkdir()
    _made(tests, "x", made)
    out, sidecar = (made / "x.out").read_text(), (made / "x.timing.yaml").read_text()
    write = 'mkdir -p "$1" && printf %s "$2" > "$1/x.out" && printf %s "$3" > "$1/x.timing.yaml"'
    bob.run(write, str(shared / bob.login), out, sidecar)
    deadline = _deadline()
    early = deadline - timedelta(hours=1)
    forged = _forge(made / "x.timing.yaml", early)
    alice.run(write + ' && touch -d "$4" "$1/x.out" "$1/x.timing.yaml"', str(shared / alice.login), out, forged,
              early.isoformat())  # fmt: skip
    assert os.stat(shared / alice.login / "x.out").st_mtime < deadline.timestamp()  # her mtimes: an hour early
    files = {
        f"{alice.login}/{name}": {
            "sha256": hashlib.sha256((shared / alice.login / name).read_bytes()).hexdigest(),
            "bytes": (shared / alice.login / name).stat().st_size,
            "arrived_at": early.isoformat(),
            "changed_at": early.isoformat(),
        }
        for name in ("x.out", "x.timing.yaml")
    }
    record = {"mmd_collect": 1, "source": str(shared), "collected_at": early.isoformat(), "files": files}
    alice.run('printf %s "$2" > "$1/.mmd-collect.json"', str(shared), json.dumps(record))

    r, report = _check(shared, tests, deadline)
    assert _of(report, alice.login, "x") == [("missing", None), ("late", "ctime")], r.stdout
    assert _of(report, bob.login, "x") == [("ok", "ctime")]
    assert "is not used (it or its folder is not the grader's alone: owned by uid" in r.stderr
    assert r.returncode == 1

    graded = tmp_path / "graded"
    assert run_mmd("collect", str(shared), str(graded)).returncode == 0
    r, report = _check(graded, tests, deadline)
    assert (r.returncode, r.stderr) == (1, "")
    assert _of(report, bob.login, "x") == [("ok", "collected")]
    assert _of(report, alice.login, "x") == [("missing", None), ("late", "collected")]
