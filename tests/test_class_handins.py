"""Hostile hand-ins on a class box, with real Unix accounts (tests/classbox.py): a student's kernels are theirs
alone, a hand-in reaches no file but its own, and no hand-in's name can take a built-in kernel's or leave its
folder.

Each hand-in is a student's own file in the class's drop box, written as they would write it, and taken as the
daemon takes it (:func:`mmd.spool.handins.receive`); NVRTC needs no GPU, so it compiles here as on the lab box.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from mmd.cli import main
from mmd.config import Settings
from mmd.job import describe
from mmd.kernelfile.store import KernelStore
from mmd.kernels import NAMES
from mmd.record import Context
from mmd.spool.handins import HandInSettings, receive
from mmd.spool.ledger import Ledger
from mmd.spool.shared import Shared

from . import classbox
from .classbox import Box, Student
from .test_class import class_settings, serve_once
from .test_handins import P1  # the course's first kernel, as a student writes it

users, students, box = classbox.users, classbox.students, classbox.box  # the fixtures

#: Real accounts (made once per session: the serial tier), and each hand-in compiles in a child process.
pytestmark = [pytest.mark.serial, pytest.mark.integration]


def answer_of(b: Box, who: Student, stem: str) -> dict:
    return yaml.safe_load((b.outbox / who.login / f"{stem}.handin.yaml").read_text())


def take(b: Box, who: Student, name: str, cache: Path) -> dict:
    """Hand-in ``name``, which ``who`` dropped, taken as the daemon takes it; mmd's answer in their folder."""
    shared = Shared(b.inbox, b.outbox, state_dir=b.state, class_mode=True)
    receive(b.inbox, name, who.uid, shared.make_output_folder(who.uid), KernelStore.of(b.state),
            HandInSettings(True, cache), Ledger(shared), failed=shared.failed)  # fmt: skip
    return answer_of(b, who, name.removesuffix(".cu"))


def hand_in(b: Box, who: Student, name: str, text: str, cache: Path) -> dict:
    """``who`` drops ``name`` as ``mmd hand-in`` does (mode 0640, a hidden name, then its own) and mmd takes it."""
    who.drop(b.inbox, name, text, umask="027")
    return take(b, who, name, cache)


def job(b: Box, who: Student, name: str):
    settings = Settings(inbox=b.inbox, outbox=b.outbox, state_dir=b.state, class_mode=True, student_kernels=True)
    return describe(b.inbox / name, b.outbox / "x.out", settings, context=Context(submitter=who.login))


def test_a_classmate_can_neither_run_read_list_nor_overwrite_anothers_kernel(box, students, tmp_path):
    """Alice hands in p1.cu. Bob's job naming p1 finds none of his; he cannot list or read the store or her
    answer; his own p1.cu is his, and leaves hers, and her jobs, as they were."""
    alice, bob = students
    hers = hand_in(box, alice, "p1.cu", P1, tmp_path)
    assert hers["status"] == "kept", hers
    store = box.state / "kernels"
    path = KernelStore.of(box.state).pick(alice.login, "p1")
    assert path is not None
    box.state.chmod(0o755)  # even where an admin opened state_dir, the store is mmd's alone
    for script, args in (
        ('cat "$1"', [str(path)]),
        ('ls "$1"', [str(store)]),
        ('ls "$1"', [str(store / alice.login)]),
        ('cat "$1"', [str(box.outbox / alice.login / "p1.handin.yaml")]),
        ('printf x >> "$1"', [str(path)]),  # overwrite her kept copy in place
        ('mkdir -p "$1"', [str(store / bob.login / "sneak")]),
    ):
        done = bob.run(script, *args, check=False)
        assert done.returncode != 0, (script, args, done.stdout)
        assert "__global__" not in done.stdout

    # run: his job names p1, and he has handed in none; the names of hers are no names a job can give
    for name in ("hw1@kernel=p1.txt", f"hw1@kernel={alice.login}-p1.txt", "hw1@kernel=..p1.txt"):
        theirs = job(box, bob, name)
        assert theirs.refusal is not None and theirs.kernel_file is None, name
    assert "you have handed in no p1.cu" in str(job(box, bob, "hw1@kernel=p1.txt").refusal)

    # overwrite: his p1.cu is kept as his; hers, and what her jobs run, stay hers
    his = hand_in(box, bob, "p1.cu", P1.replace("float s = 0;", "float s = 0; // bob"), tmp_path)
    assert his["status"] == "kept" and his["submitter"] == bob.login and his["version"] != hers["version"]
    assert path.read_text() == P1
    mine = job(box, alice, "hw1@kernel=p1.txt")
    assert mine.kernel_file is not None and mine.kernel_file.read_text() == P1
    assert mine.kernel_file.is_relative_to(store / alice.login)
    assert answer_of(box, alice, "p1") == hers


def test_a_hand_in_waiting_in_the_drop_box_is_out_of_a_classmates_reach(box, students):
    """Until mmd takes it, Alice's p1.cu lies in the inbox (dropped as ``mmd hand-in`` drops it, into an inbox the
    daemon has started on: its default ACL set): Bob cannot list the inbox, read her file, replace it by a rename,
    remove it or append to it."""
    alice, bob = students
    assert serve_once(class_settings(box, student_kernels=True)) == 0
    alice.drop(box.inbox, "p1.cu", P1, umask="027")
    his = f"/tmp/mmd-bob-{os.getpid()}.cu"
    bob.run('printf %s "$1" > "$2"', "// bob's\n" + P1, his)
    try:
        for script in (
            'ls "$1"',
            'cat "$1/p1.cu"',
            'mv -f "$2" "$1/p1.cu"',
            'rm -f "$1/p1.cu"',
            'printf x >> "$1/p1.cu"',
        ):
            assert bob.run(script, str(box.inbox), his, check=False).returncode != 0, script
    finally:
        os.unlink(his)
    assert (box.inbox / "p1.cu").read_text() == P1 and os.lstat(box.inbox / "p1.cu").st_uid == alice.uid


#: Includes that name a file outside the kernel: each refused by the guard, with its line, before any compile.
REACHING = {
    "abs": '#include "/etc/shadow"\n',
    "up": "#include <../../x>\n",
    "quoted": '#include "../secret.h"\n',
    "has": '#if __has_include("/etc/shadow")\n#endif\n',
    "macro": '#define F "/etc/shadow"\n#include F\n',
}


@pytest.mark.parametrize("how", sorted(REACHING))
def test_a_hand_in_that_includes_another_file_is_refused_in_its_authors_own_answer(box, students, tmp_path, how):
    alice, bob = students
    source = REACHING[how] + P1
    answer = hand_in(box, alice, "p1.cu", source, tmp_path)
    assert answer["status"] == "refused" and answer["submitter"] == alice.login, answer
    assert answer["reason"].startswith("p1.cu:") and "include" in answer["reason"].lower(), answer
    assert "root:" not in yaml.safe_dump(answer)  # nothing of /etc/shadow
    assert KernelStore.of(box.state).pick(alice.login, "p1") is None
    assert not (box.outbox / bob.login).exists() or not list((box.outbox / bob.login).iterdir())
    assert alice.run('cat "$1"', str(box.outbox / alice.login / "p1.handin.yaml")).stdout  # hers to read


@pytest.mark.parametrize("builtin", sorted(NAMES))
def test_a_hand_in_under_a_built_in_kernels_name_is_refused_and_the_name_still_picks_mmds(
    box, students, tmp_path, builtin
):
    alice, _ = students
    answer = hand_in(box, alice, f"{builtin}.cu", P1, tmp_path)
    assert answer["status"] == "refused" and "is one of mmd's own kernels" in answer["reason"], answer
    assert KernelStore.of(box.state).pick(alice.login, builtin) is None
    picked = job(box, alice, f"hw1@kernel={builtin}.txt")
    assert picked.kernel_file is None and picked.settings.kernel == builtin


#: Names ``mmd hand-in`` refuses before anything reaches the inbox, each with its reason.
BAD_NAMES = {
    "naive.cu": "naive is one of mmd's own kernels",
    "x" * 65 + ".cu": "a hand-in is NAME.cu",
    "-p1.cu": "a hand-in is NAME.cu",
    "p 1.cu": "a hand-in is NAME.cu",
    "p1.c": "a hand-in is NAME.cu",
    "..cu": "a hand-in is NAME.cu",
    "p.1.cu": "a hand-in is NAME.cu",
}


@pytest.mark.parametrize("name", sorted(BAD_NAMES))
def test_mmd_hand_in_refuses_a_name_that_is_no_kernels_name_with_a_reason(tmp_path, capsys, name):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / name).write_text(P1)
    assert main(["hand-in", str(tmp_path / "src" / name), "--inbox", str(inbox)]) == 2
    assert BAD_NAMES[name] in capsys.readouterr().err
    assert not list(inbox.iterdir())


def test_a_name_with_a_slash_or_a_nul_cannot_reach_the_inbox_as_a_hand_in(tmp_path, capsys):
    """A path's folders are never part of the name handed in (``../x.cu`` hands in ``x.cu``); a NUL is no
    file name at all."""
    inbox, src = tmp_path / "inbox", tmp_path / "src" / "sub"
    inbox.mkdir()
    src.mkdir(parents=True)
    (tmp_path / "src" / "x.cu").write_text(P1)
    assert main(["hand-in", str(src / ".." / "x.cu"), "--inbox", str(inbox)]) == 0
    assert sorted(p.name for p in inbox.iterdir()) == ["x.cu"]
    capsys.readouterr()
    assert main(["hand-in", str(src / "x\0.cu"), "--inbox", str(inbox)]) == 2
    assert "a hand-in is NAME.cu" in capsys.readouterr().err
    assert sorted(p.name for p in inbox.iterdir()) == ["x.cu"]


def test_a_dropped_cu_that_is_no_hand_in_name_is_refused_with_a_reason_and_runs_nothing(box, students, tmp_path):
    """Dropped straight in the drop box, past ``mmd hand-in``: a ``.cu`` whose name is not a kernel's (too long,
    a space) is no hand-in; the daemon takes it as a job, refuses it as an input it cannot read (in its dropper's
    folder), and neither keeps nor compiles it."""
    alice, bob = students
    names = ("x" * 65 + ".cu", "p 1.cu")
    for name in names:
        alice.drop(box.inbox, name, P1)
    assert serve_once(class_settings(box, student_kernels=True)) == 0
    for name in names:
        stem = name.removesuffix(".cu")
        error = yaml.safe_load((box.outbox / alice.login / f"{stem}.error.yaml").read_text())["error"]
        assert error["kind"] == "input" and error["reason"].startswith("line 1: header must be"), error
        assert not (box.outbox / alice.login / f"{stem}.handin.yaml").exists()
    assert not (box.state / "kernels").exists() or not list((box.state / "kernels").rglob("*.cu"))
    assert not (box.outbox / bob.login).exists()
