"""A class on one box: the service's state out of the students' reach, inputs no classmate can change,
who submitted each job. Real Unix users (tests/classbox.py), a real daemon."""

from __future__ import annotations

import os
import stat
import subprocess
import time

import pytest
import yaml

from mmd import config, daemon
from mmd.errors import ConfigError, SpoolError
from mmd.generate import input_chunks, random_matrix

from . import classbox
from .classbox import Box
from .conftest import wait_for

students, box = classbox.students, classbox.box  # the fixtures


def small_input(seed: int = 0, n: int = 4) -> str:
    import numpy as np

    rng = np.random.default_rng(seed)
    return b"".join(input_chunks(random_matrix(rng, n, n), random_matrix(rng, n, n), square=True)).decode()


def class_settings(b: Box, **kw) -> config.Settings:
    return config.Settings(inbox=b.inbox, outbox=b.outbox, state_dir=b.state, class_mode=True, backend="cpu",
                           quiet_seconds=0.05, **kw)  # fmt: skip


def serve_once(settings: config.Settings) -> int:
    return daemon.Daemon(settings).serve(once=True)


def test_class_mode_needs_a_state_dir_and_one_box():
    with pytest.raises(ConfigError, match="class_mode needs state_dir"):
        config.load(None, environ={"MMD_CLASS_MODE": "true"})
    with pytest.raises(ConfigError, match="does not combine with shared_inbox"):
        config.load(None, environ={"MMD_CLASS_MODE": "true", "MMD_STATE_DIR": "/s", "MMD_SHARED_INBOX": "true"})


def test_a_student_squatting_the_lock_and_planting_names_stops_nothing(box, students):
    """A flock held on ``inbox/.mmd.lock``, and ``.failed``, ``.work``, ``.done`` planted: the daemon's own
    names are in its state folder, which no student can enter, and jobs run."""
    mallory, alice = students
    holder = subprocess.Popen(
        ["setpriv", f"--reuid={mallory.uid}", f"--regid={mallory.gid}", "--init-groups", "--reset-env",
         "flock", str(box.inbox / ".mmd.lock"), "sleep", "60"])  # fmt: skip
    try:
        wait_for(lambda: (box.inbox / ".mmd.lock").exists(), 10, "the squatter's lock")
        mallory.run('mkdir "$1/.failed" "$1/.work" "$1/.done" && touch "$1/.mmd-state.json"', str(box.inbox))
        alice.drop(box.inbox, "hw1.txt", small_input())
        assert serve_once(class_settings(box)) == 0
        sidecar = yaml.safe_load((box.outbox / "hw1.timing.yaml").read_text())
        assert sidecar["submitter"] == alice.login
        assert (box.state / ".done" / "hw1.txt").exists() and (box.state / ".mmd.lock").exists()
        assert sorted(os.listdir(box.inbox / ".failed")) == []  # the planted folders mean nothing
        for path in (box.state, box.state / ".mmd.lock", box.state / ".done" / "hw1.txt"):
            r = mallory.run('cat "$1" || ls "$1"', str(path), check=False)
            assert r.returncode != 0 and "Permission denied" in r.stderr, path
    finally:
        holder.kill()
        holder.wait()


def test_an_input_its_group_could_change_is_refused_with_how_to_fix_it(box, students):
    alice, bob = students
    alice.drop(box.inbox, "open.txt", small_input(1), umask="002")
    alice.drop(box.inbox, "shut.txt", small_input(2), umask="022")
    # bob cannot change alice's queued input (0644 in a setgid inbox of their group) ...
    r = bob.run('printf "1 1 1\\n9\\n9\\n" > "$1/shut.txt"', str(box.inbox), check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    # ... nor link it (fs.protected_hardlinks: neither his nor writable by him)
    r = bob.run('ln "$1/shut.txt" "$1/x.txt"', str(box.inbox), check=False)
    assert r.returncode != 0
    assert serve_once(class_settings(box)) == 0
    error = yaml.safe_load((box.outbox / "open.error.yaml").read_text())["error"]
    assert error["kind"] == "spool"
    assert "writable by its group (mode 664)" in error["reason"] and "chmod go-w" in error["reason"]
    assert yaml.safe_load((box.outbox / "shut.timing.yaml").read_text())["submitter"] == alice.login


def test_hooks_get_the_submitter_and_an_escaped_name(box, students, tmp_path):
    alice, _ = students
    log = box.root / "hook.log"
    hook = ["sh", "-c", f'printf "%s|%s\\n" "$MMD_JOB_INPUT" "$MMD_JOB_SUBMITTER" >> {log}']
    alice.drop(box.inbox, "a\nBcc: mallory.txt", small_input(3))
    assert serve_once(class_settings(box, on_done=tuple(hook))) == 0
    wait_for(lambda: log.exists() and log.read_text().endswith("\n"), 30, "the hook")
    assert log.read_text() == f"a\\nBcc: mallory.txt|{alice.login}\n"


@pytest.mark.parametrize(
    ("mode", "why"),
    [(0o770, "open to others or to the inbox's group"), (0o705, "open to others"), (0o720, "open to others")],
)
def test_a_state_folder_others_could_reach_is_refused(box, students, mode, why):
    os.chown(box.state, 0, box.inbox.stat().st_gid)
    box.state.chmod(mode)
    with pytest.raises(SpoolError, match=why):
        serve_once(class_settings(box))


def test_a_state_folder_is_made_private_and_must_share_the_inbox_filesystem(box, students):
    box.state.rmdir()
    assert serve_once(class_settings(box)) == 0
    assert stat.S_IMODE(box.state.stat().st_mode) == 0o700
    elsewhere = "/dev/shm"
    if not os.path.isdir(elsewhere) or os.stat(elsewhere).st_dev == box.inbox.stat().st_dev:
        pytest.skip("no second filesystem at /dev/shm")
    other = os.path.join(elsewhere, f"mmd-state-{os.getpid()}-{time.monotonic_ns()}")
    os.mkdir(other, 0o700)
    try:
        with pytest.raises(SpoolError, match="not on the inbox's filesystem"):
            serve_once(class_settings(box).replace(state_dir=other))
    finally:
        os.rmdir(other)


def test_a_spool_of_the_inbox_only_layout_moves_into_the_state_folder(tmp_path):
    """Jobs a daemon without state_dir left claimed in ``inbox/.work`` resume from the state folder, and its
    archives move there too; nothing stays behind in the inbox."""
    inbox, outbox, state = tmp_path / "inbox", tmp_path / "outbox", tmp_path / "state"
    for folder in (inbox / ".work" / "0123456789ab.0", inbox / ".done", outbox):
        folder.mkdir(parents=True)
    (inbox / ".work" / "0123456789ab.0" / "left.txt").write_text(small_input(4))
    (inbox / ".done" / "old.txt").write_text(small_input(5))
    settings = config.Settings(inbox=inbox, outbox=outbox, state_dir=state, backend="cpu", quiet_seconds=0.05)
    assert serve_once(settings) == 0
    assert yaml.safe_load((outbox / "left.timing.yaml").read_text())["resumed"] is True
    assert sorted(os.listdir(state / ".done")) == ["left.txt", "old.txt"]
    assert not (inbox / ".work").exists() and not (inbox / ".done").exists()


def test_a_name_cannot_raise_the_time_limit_nor_pick_what_the_admin_disallowed(box, students):
    """The admin's job_timeout_s: 2 and name_settings: a student's name may lower the one and pick within the
    other, never more; what it asks beyond them is refused with the admin's limit and what is allowed."""
    alice, bob = students
    alice.drop(box.inbox, "long@timeout=99999999.txt", small_input(6))
    bob.drop(box.inbox, "pick@kernel=naive.txt", small_input(7))
    alice.drop(box.inbox, "ok@kernel=fast,timeout=1.5.txt", small_input(8))
    allowed = ("kernel=tiled", "kernel=fast", "timeout")
    assert serve_once(class_settings(box, job_timeout_s=2.0, name_settings=allowed)) == 0
    error = yaml.safe_load((box.outbox / "long@timeout=99999999.error.yaml").read_text())["error"]
    assert error["kind"] == "jobname" and error["job_timeout_s"] == 2.0
    assert "above this service's limit, 2 s (job_timeout_s)" in error["reason"]
    error = yaml.safe_load((box.outbox / "pick@kernel=naive.error.yaml").read_text())["error"]
    assert error["kind"] == "jobname" and error["allowed"] == list(allowed)
    assert "a name may pick kernel fast or tiled" in error["reason"]
    assert not (box.outbox / "long@timeout=99999999.out").exists()
    assert not (box.outbox / "pick@kernel=naive.out").exists()
    done = yaml.safe_load((box.outbox / "ok@kernel=fast,timeout=1.5.timing.yaml").read_text())
    assert done["status"] == "ok" and done["submitter"] == alice.login


def test_a_small_input_that_would_make_a_huge_output_is_refused_unread(box, students):
    """A 64 KB ``5800 1 5800`` (a column times a row: 200 MB out, 3,163 times its input) is refused from its
    header: no output, an error sidecar of kind limit with the numbers; a course-sized job beside it runs."""
    alice, _ = students
    text = "5800 1 5800\n" + "1.250 " * 5800 + "1.25 " * 5800
    alice.drop(box.inbox, "wide.txt", text)
    alice.drop(box.inbox, "fine.txt", small_input(9, n=64))
    assert serve_once(class_settings(box)) == 0
    sidecar = yaml.safe_load((box.outbox / "wide.error.yaml").read_text())
    assert sidecar["error"]["kind"] == "limit" and sidecar["submitter"] == alice.login
    assert sidecar["error"]["output_bytes"] == 201_845_805 and sidecar["error"]["input_bytes"] == 63_812
    assert "at most 16 times its input or 8388608 bytes" in sidecar["error"]["reason"]
    assert sidecar["timings_ms"]["read"] is None and sidecar["timings_ms"]["kernel"] is None
    assert not (box.outbox / "wide.out").exists()
    assert yaml.safe_load((box.outbox / "fine.timing.yaml").read_text())["status"] == "ok"
