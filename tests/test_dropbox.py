"""What lies in the drop box that is not a job: a folder under a job's name, a file held open, an upload.

Each is judged by when the daemon first saw it (kept in state_dir across
restarts), never by its mtime, and set aside (or, an upload, removed) after a
bound the admin sets; the docs' upload recipe cannot be turned against its
user. The class tests use real Unix accounts (tests/classbox.py) and a real
daemon; the others look at the parts alone.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from mmd import config
from mmd.errors import ConfigError
from mmd.fileops import OPS, FileOps
from mmd.spool import Arrivals, Candidate, Scanner, Shared, Spool

from . import classbox, workerhooks
from .classbox import Box
from .conftest import wait_for
from .test_class import small_input, start_class_daemon, stop_class_daemon

users, students, box = classbox.users, classbox.students, classbox.box  # the fixtures

#: The daemon's settings in these tests: rescans often, so that a bound is seen soon after it passes.
FAST = {"MMD_RESCAN_SECONDS": "0.2"}


def _sidecar(b: Box, who, stem: str, kind: str = "error") -> dict:
    return yaml.safe_load((b.outbox / who.login / f"{stem}.{kind}.yaml").read_text())


def _squat_folder(b: Box, who, name: str) -> None:
    """``who`` puts a folder at ``inbox/name`` that anyone may write into (made outside, where no default ACL
    applies, and renamed in), ready to receive a classmate's file."""
    who.run('d=$(mktemp -d) && chmod 777 "$d" && mv "$d" "$1/$2"', str(b.inbox), name)


@pytest.mark.serial
def test_the_upload_recipe_run_against_a_squatting_folder_hands_the_file_to_no_one(box, students):
    """Mallory's folder (mode 777) sits at hw1.txt. Alice runs docs/operations.md's recipe: its mv fails, the
    file goes nowhere near Mallory's folder, and its upload, left under its unguessable name, is Alice's alone.
    Before, `mv $tmp inbox/hw1.txt` moved Alice's file into Mallory's folder, where it never ran."""
    alice, mallory = students
    Shared(box.inbox, box.outbox, state_dir=box.state, class_mode=True).prepare()  # the drop box's ACL, as served
    _squat_folder(box, mallory, "hw1.txt")
    r = alice.upload(box.inbox, "hw1.txt", small_input(70), check=False)
    assert r.returncode != 0, r
    assert os.listdir(box.inbox / "hw1.txt") == [], "the recipe handed alice's file to the squatter's folder"
    [left] = [p for p in box.inbox.iterdir() if p.name.startswith(".hw1.txt.")]
    assert left.read_text() == small_input(70) and os.lstat(left).st_uid == alice.uid
    assert mallory.run('cat "$1"', str(left), check=False).returncode != 0, "a classmate reads the upload"


@pytest.mark.serial
def test_a_folder_squatting_a_name_is_set_aside_after_the_bound_and_a_classmates_file_then_runs(box, students):
    """Mallory's folder at hw1.txt blocks the name (Alice's recipe fails) until drop_box_grace_s after the
    daemon first saw it; then it is set aside into state_dir's .failed, out of everyone's reach, Mallory gets an
    error sidecar saying why, and Alice's hw1.txt, uploaded again, runs. Before, the folder stayed for good."""
    alice, mallory = students
    _squat_folder(box, mallory, "hw1.txt")
    proc, _sock = start_class_daemon(box, MMD_DROP_BOX_GRACE_S="3", **FAST)
    try:
        assert alice.upload(box.inbox, "hw1.txt", small_input(71), check=False).returncode != 0
        assert (box.inbox / "hw1.txt").is_dir(), "set aside before its bound"
        wait_for(lambda: not os.path.lexists(box.inbox / "hw1.txt"), 20, "the squatting folder to be set aside")
        [aside] = [p for p in (box.state / ".failed").iterdir() if p.name.startswith("hw1.")]
        assert aside.is_dir() and os.lstat(aside).st_uid == mallory.uid
        wait_for(lambda: (box.outbox / mallory.login / "hw1.error.yaml").exists(), 10, "mallory's note")
        error = _sidecar(box, mallory, "hw1")["error"]
        assert error["kind"] == "spool" and "is a folder, not a file" in error["reason"], error
        alice.upload(box.inbox, "hw1.txt", small_input(72))
        wait_for(lambda: (box.outbox / alice.login / "hw1.timing.yaml").exists(), 20, "alice's hw1.txt")
        side = _sidecar(box, alice, "hw1", "timing")
        assert side["status"] == "ok" and side["submitter"] == alice.login
    finally:
        stop_class_daemon(box, proc)


def _capless(launcher):
    """``launcher`` (:func:`workerhooks.launcher`) run as the unit runs mmd, with no capabilities
    (``CapabilityBoundingSet=``): the test's root keeps its uid, which owns the spool, and loses its power over
    the students' folders, as the service's own user has none."""

    def launch(*args, **kw) -> list[str]:
        return ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--", *launcher(*args, **kw)]

    return launch


def _own_files(b: Box, who) -> list[str]:
    folder = b.outbox / who.login
    return sorted(os.listdir(folder)) if folder.exists() else []


@pytest.mark.serial
def test_a_team_folder_of_any_name_in_the_drop_box_is_set_aside_and_a_teammates_file_never_runs_in_her_name(
    box, students
):
    """Mallory's folder .team (mode 777; a hidden name, never a job's) sits in the inbox, and Alice copies her
    hw1.txt into it. drop_box_grace_s after the daemon first saw it, the folder is set aside into state_dir's
    .failed, Mallory's note says so, and neither its old path nor where it lies now lets Mallory rename Alice's
    file into the inbox, where it would be a job in Alice's name. Before, a folder under a name that is not a
    job's stayed in the drop box for good, and the rename made the job Alice's."""
    alice, mallory = students
    _squat_folder(box, mallory, ".team")
    alice.run('printf %s "$2" > "$1/.team/hw1.txt"', str(box.inbox), small_input(74))
    proc, _sock = start_class_daemon(box, MMD_DROP_BOX_GRACE_S="3", **FAST)
    try:
        wait_for(lambda: not os.path.lexists(box.inbox / ".team"), 20, "the team folder to be set aside")
        [aside] = [p for p in (box.state / ".failed").iterdir() if p.is_dir()]
        assert os.lstat(aside).st_uid == mallory.uid and os.listdir(aside) == ["hw1.txt"]
        for where in (box.inbox / ".team", aside):
            r = mallory.run('mv "$1/hw1.txt" "$2/hw1.txt"', str(where), str(box.inbox), check=False)
            assert r.returncode != 0, f"mallory renamed alice's file from {where} into the inbox"
        wait_for(lambda: (box.outbox / mallory.login / "team.error.yaml").exists(), 10, "mallory's note")
        error = _sidecar(box, mallory, "team")["error"]
        assert error["kind"] == "spool" and ".team is a folder, not a file" in error["reason"], error
        time.sleep(1.0)
        assert _own_files(box, alice) == [], "a job in alice's name"
    finally:
        stop_class_daemon(box, proc)


@pytest.mark.serial
def test_a_team_folder_mmd_may_not_move_is_hidden_where_its_owner_cannot_find_it_and_set_aside_once(
    box, students, monkeypatch
):
    """The service as the unit runs it (no capabilities): Mallory's team.part (770, the class's group: Alice may
    write it, the service may not) cannot leave the inbox, so it is renamed there, hidden, once the bound has
    passed. Its new name is nowhere Mallory can read it (her note's job id does not make it; the drop box
    cannot be listed), so Alice's file in it cannot be renamed into the inbox; and it is set aside once, not
    again at every bound. Before, it stayed under its name for good."""
    alice, mallory = students
    mallory.run('d=$(mktemp -d) && chmod 770 "$d" && mv "$d" "$1/team.part"', str(box.inbox))
    alice.run('printf %s "$2" > "$1/team.part/hw1.txt"', str(box.inbox), small_input(75))
    monkeypatch.setattr(workerhooks, "launcher", _capless(workerhooks.launcher))
    proc, _sock = start_class_daemon(box, MMD_DROP_BOX_GRACE_S="2", **FAST)
    try:
        wait_for(lambda: not os.path.lexists(box.inbox / "team.part"), 20, "the team folder to be set aside")
        [hidden] = [p for p in box.inbox.iterdir() if p.is_dir()]
        assert hidden.name.startswith(".team.") and os.lstat(hidden).st_uid == mallory.uid
        wait_for(lambda: (box.outbox / mallory.login / "team.error.yaml").exists(), 10, "mallory's note")
        job = _sidecar(box, mallory, "team")["job"]
        assert job not in hidden.name, "her note gives the folder's new name away"
        assert mallory.run('ls -a "$1"', str(box.inbox), check=False).returncode != 0
        for name in ("team.part", f".team.{job}.part", f".team.part.{job}"):
            r = mallory.run('mv "$1/$2/hw1.txt" "$1/hw1.txt"', str(box.inbox), name, check=False)
            assert r.returncode != 0, f"mallory renamed alice's file from {name} into the inbox"
        time.sleep(5.0)  # two bounds more
        assert [p for p in box.inbox.iterdir() if p.is_dir()] == [hidden], "set aside again"
        assert _own_files(box, mallory) == ["team.error.yaml"]
        assert _own_files(box, alice) == [], "a job in alice's name"
    finally:
        stop_class_daemon(box, proc)


@pytest.mark.serial
def test_a_file_kept_open_and_written_to_is_set_aside_after_the_bound(box, students):
    """Mallory opens hw1.txt and writes a byte to it every 0.5 s, never closing it: it is never complete. Once
    drop_box_grace_s has passed since the daemon first saw it, it is set aside unread (her writes go on into
    state_dir) with an error sidecar telling her how to upload; Alice's hw1.txt then runs. Before, it held the
    name for as long as Mallory liked."""
    alice, mallory = students
    proc, _sock = start_class_daemon(box, MMD_DROP_BOX_GRACE_S="3", **FAST)
    writer = subprocess.Popen(
        mallory.argv("sh", "-c", 'exec 3>"$1"; i=0; while [ $i -lt 60 ]; do printf x >&3; sleep 0.5; i=$((i+1)); done',
                     "sh", str(box.inbox / "hw1.txt")), cwd="/tmp", start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: not os.path.lexists(box.inbox / "hw1.txt"), 20, "the file held open to be set aside")
        assert writer.poll() is None, "the writer still writes, into the file set aside"
        wait_for(lambda: (box.outbox / mallory.login / "hw1.error.yaml").exists(), 10, "mallory's note")
        error = _sidecar(box, mallory, "hw1")["error"]
        assert error["kind"] == "spool" and "still being written" in error["reason"], error
        alice.upload(box.inbox, "hw1.txt", small_input(73))
        wait_for(lambda: (box.outbox / alice.login / "hw1.timing.yaml").exists(), 20, "alice's hw1.txt")
        assert _sidecar(box, alice, "hw1", "timing")["status"] == "ok"
    finally:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
        stop_class_daemon(box, proc)


@pytest.mark.serial
def test_an_upload_dated_2099_is_swept_by_when_the_daemon_first_saw_it_not_by_its_mtime(box, students):
    """`touch -d 2099-01-01 hw1.txt.part` is removed upload_max_age_s after the daemon first saw it, and one
    dated 2001 is not removed before that; a folder named .part is not an upload. Before, the sweep judged by
    mtime: the 2099 one stayed for good (and the 2001 one went at the first sweep)."""
    _alice, mallory = students
    mallory.run('printf x > "$1/hw1.txt.part" && touch -d 2099-01-01 "$1/hw1.txt.part" && '
                'printf x > "$1/.old.part" && touch -d 2001-01-01 "$1/.old.part" && mkdir "$1/dir.part"',
                str(box.inbox))  # fmt: skip
    proc, _sock = start_class_daemon(box, MMD_UPLOAD_MAX_AGE_S="3", **FAST)
    try:
        time.sleep(1.0)
        assert (box.inbox / ".old.part").exists(), "judged by its mtime"
        wait_for(lambda: not (box.inbox / "hw1.txt.part").exists(), 20, "the 2099 upload to be swept")
        wait_for(lambda: not (box.inbox / ".old.part").exists(), 5, "the 2001 upload to be swept")
        assert (box.inbox / "dir.part").is_dir()
    finally:
        stop_class_daemon(box, proc)


@pytest.mark.serial
def test_first_sightings_survive_a_daemon_restart(box, students):
    """Mallory's folder at hw1.txt, drop_box_grace_s 8: the daemon is stopped (SIGTERM) 5 s after it first saw
    the folder and started again; the folder is set aside at its first sighting's bound (by 11 s), not 8 s
    after the restart. Without the record in state_dir the restart would give it 8 s more."""
    _alice, mallory = students
    _squat_folder(box, mallory, "hw1.txt")
    env = {"MMD_DROP_BOX_GRACE_S": "8", **FAST}
    record = box.state / ".mmd-arrivals.json"
    proc, _sock = start_class_daemon(box, **env)
    seen = time.monotonic()  # the start's first rescan saw it (at the latest now)
    try:
        wait_for(lambda: record.exists() and "hw1.txt" in record.read_text(), 10, "the record of its first sighting")
        time.sleep(max(0.0, seen + 5 - time.monotonic()))
    finally:
        stop_class_daemon(box, proc)
    assert (box.inbox / "hw1.txt").is_dir()
    proc, _sock = start_class_daemon(box, **env)
    try:
        wait_for(lambda: not os.path.lexists(box.inbox / "hw1.txt"), max(0.5, seen + 11 - time.monotonic()),
                 "the folder to be set aside at its first sighting's bound")  # fmt: skip
    finally:
        stop_class_daemon(box, proc)


# -- the parts --
def test_a_survey_tells_jobs_folders_and_uploads_apart(tmp_path):
    (tmp_path / "b.txt").write_text("x")
    (tmp_path / "a.txt").write_text("x")
    os.utime(tmp_path / "a.txt", (1, 1))
    (tmp_path / "hw1.txt").mkdir()
    (tmp_path / "up.part").write_text("x")
    (tmp_path / ".hidden.tmp").write_text("x")
    (tmp_path / "dir.part").mkdir()
    (tmp_path / ".work").mkdir()
    (tmp_path / "link.txt").symlink_to("/etc")
    found = Scanner(tmp_path).survey()
    assert found.jobs[0].name == "a.txt", "oldest mtime first"
    assert {c.name for c in found.jobs} == {"a.txt", "b.txt", "link.txt"}
    assert [(c.name, c.folder) for c in found.folders] == [("hw1.txt", True)]
    assert {c.name for c in found.uploads} == {"up.part", ".hidden.tmp"}
    (tmp_path / ".team").mkdir()
    (tmp_path / ".dotfile").write_text("x")
    every = Scanner(tmp_path, every_folder=True).survey()  # class mode: every folder but the spool's own (.work, ours)
    assert sorted(c.name for c in every.folders) == [".team", "dir.part", "hw1.txt"]
    assert every.jobs == found.jobs and {c.name for c in every.uploads} == {"up.part", ".hidden.tmp"}


def test_arrivals_keep_the_first_sighting_of_an_entry_and_a_new_inode_is_a_new_arrival():
    arrivals = Arrivals({"kept.txt": (7, 100.0)})
    assert arrivals.seen(Candidate("kept.txt", 1, 0, ino=7), 500.0) == 100.0
    assert arrivals.seen(Candidate("a.txt", 1, 0, ino=1), 200.0) == 200.0
    arrivals.completed("a.txt")
    assert arrivals.seen(Candidate("a.txt", 1, 0, ino=1), 300.0) == 200.0 and arrivals.is_complete("a.txt")
    assert arrivals.seen(Candidate("a.txt", 1, 0, ino=2), 400.0) == 400.0 and not arrivals.is_complete("a.txt")
    assert arrivals.record({"kept.txt", "gone.txt"}) == {"kept.txt": (7, 100.0)}
    arrivals.keep({"a.txt"})
    assert arrivals.record({"kept.txt", "a.txt"}) == {"a.txt": (2, 400.0)}
    arrivals.hidden(".team.tag", 9)  # set aside in place: no bound ever passes
    assert arrivals.seen(Candidate(".team.tag", 1, 0, ino=9), 1e12) == math.inf


def test_the_record_of_arrivals_survives_as_written_and_a_planted_or_broken_one_is_not_read(tmp_path):
    inbox, outbox, state = tmp_path / "in", tmp_path / "out", tmp_path / "state"
    spool = Spool(Shared(inbox, outbox, state_dir=state))
    spool.shared.prepare()
    odd = os.fsdecode(b"bad\xffname.txt")
    spool.dropbox.write_arrivals({"hw1.txt": (5, 1.5), odd: (None, 2.5), ".team.tag": (9, math.inf)})
    assert Spool(Shared(inbox, outbox, state_dir=state)).dropbox.read_arrivals() == {
        "hw1.txt": (5, 1.5),
        odd: (None, 2.5),
        ".team.tag": (9, math.inf),
    }
    path = state / ".mmd-arrivals.json"
    assert not [p for p in state.iterdir() if p.name.endswith(".tmp")]
    path.write_text("{not json")
    assert spool.dropbox.read_arrivals() == {}
    path.unlink()
    (tmp_path / "planted.json").write_text(json.dumps({"version": 1, "seen": [["hw1.txt", 5, 0.0]]}))
    path.symlink_to(tmp_path / "planted.json")
    assert spool.dropbox.read_arrivals() == {}


class _NoMovingFolders(FileOps):
    """mmd as its own user, before a student's folder: it may rename it within the inbox, not out of it."""

    def rename(self, src: Path, dst: Path) -> None:
        if src.is_dir() and src.parent != dst.parent:
            raise PermissionError(13, "Permission denied")
        OPS.rename(src, dst)


def test_a_folder_mmd_may_not_move_out_is_hidden_in_place_under_an_unguessable_name(tmp_path):
    inbox, outbox, state = tmp_path / "in", tmp_path / "out", tmp_path / "state"
    spool = Spool(Shared(inbox, outbox, state_dir=state, ops=_NoMovingFolders()))
    spool.shared.prepare()
    (inbox / "hw1.txt").mkdir()
    [folder] = spool.scanner.survey().folders
    claim = spool.dropbox.set_aside(folder, "0123456789ab")
    assert claim is not None and re.fullmatch(r"\.hw1\.[0-9a-f]{16}\.txt", claim.path.name) and claim.path.is_dir()
    assert claim.path.parent == inbox and "0123456789ab" not in claim.path.name, "the job id (in its note) names it"
    assert claim.reservation == outbox / ".hw1.claim" and claim.output == outbox / "hw1.out"
    assert spool.scanner.survey().folders == [] and spool.scanner.scan() == []
    spool.reservations.release(claim)
    (inbox / "f.txt").write_text("x")
    [held] = spool.scanner.scan()
    moved = spool.dropbox.set_aside(held, "ba9876543210")
    assert moved is not None and moved.path == state / ".failed" / "f.ba9876543210.txt"
    (inbox / "g.txt").write_text("x")
    [seen] = spool.scanner.scan()
    (inbox / ".g.part").write_text("y")
    (inbox / ".g.part").rename(inbox / "g.txt")  # another file under the name since: judged again, not set aside
    assert spool.dropbox.set_aside(seen, "aaaaaaaaaaaa") is None and (inbox / "g.txt").exists()


def test_a_drop_box_grace_no_longer_than_quiet_seconds_is_a_config_error():
    with pytest.raises(ConfigError, match="drop_box_grace_s must be longer than quiet_seconds"):
        config.Settings(quiet_seconds=2.0).replace(drop_box_grace_s=1.0)
