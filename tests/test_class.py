"""A class on one box: the service's state out of the students' reach, inputs no classmate can change,
who submitted each job. Real Unix users (tests/classbox.py), a real daemon."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from mmd import config, daemon
from mmd.errors import ConfigError, SpoolError
from mmd.generate import input_chunks, random_matrix

from . import classbox
from .classbox import Box
from .conftest import alongside, wait_for

users, students, grader, box = classbox.users, classbox.students, classbox.grader, classbox.box  # the fixtures
# The users and groups have fixed names, made and removed once per session: two pytest workers would
# remove them under each other's tests.
pytestmark = pytest.mark.serial


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
    with pytest.raises(ConfigError, match="CLASS_MODE needs state_dir"):
        config.load(None, environ={"MMD_CLASS_MODE": "true"})
    with pytest.raises(ConfigError, match="does not combine with shared_inbox"):
        config.load(None, environ={"MMD_CLASS_MODE": "true", "MMD_STATE_DIR": "/s", "MMD_SHARED_INBOX": "true"})


def test_a_student_squatting_the_lock_and_planting_names_stops_nothing(box, students):
    """A flock held on ``inbox/.mmd.lock``, and ``.failed``, ``.work``, ``.done`` planted: the daemon's own
    names are in its state folder, which no student can enter, and jobs run."""
    mallory, alice = students
    holder = subprocess.Popen(mallory.argv("flock", str(box.inbox / ".mmd.lock"), "sleep", "60"))
    try:
        wait_for(lambda: (box.inbox / ".mmd.lock").exists(), 10, "the squatter's lock")
        mallory.run('mkdir "$1/.failed" "$1/.work" "$1/.done" && touch "$1/.mmd-state.json"', str(box.inbox))
        alice.drop(box.inbox, "hw1.txt", small_input())
        assert serve_once(class_settings(box)) == 0
        sidecar = yaml.safe_load((box.outbox / alice.login / "hw1.timing.yaml").read_text())
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
    error = yaml.safe_load((box.outbox / alice.login / "open.error.yaml").read_text())["error"]
    assert error["kind"] == "spool"
    assert "writable by its group (mode 664)" in error["reason"] and "chmod go-w" in error["reason"]
    assert yaml.safe_load((box.outbox / alice.login / "shut.timing.yaml").read_text())["submitter"] == alice.login


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


def test_the_upload_recipe_beats_a_squatted_part_name_and_squatters_are_swept(box, students):
    """docs/operations.md's recipe, run as written: upload to an unpredictable hidden ``.part`` name, then
    rename. A name squatted in the sticky inbox blocks an upload to that name, never the recipe's; and the
    squatter's file is removed upload_max_age_s after a daemon first saw it (the next daemon's too: the first
    sighting is kept in state_dir)."""
    alice, mallory = students
    mallory.run('printf x > "$1/hw1.txt.part"', str(box.inbox))
    r = alice.run('printf "1 1 1\\n2\\n3\\n" > "$1/hw1.txt.part"', str(box.inbox), check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    alice.upload(box.inbox, "hw1.txt", small_input(6))
    (box.inbox / "folder.part").mkdir()
    assert serve_once(class_settings(box)) == 0
    assert yaml.safe_load((box.outbox / alice.login / "hw1.timing.yaml").read_text())["submitter"] == alice.login
    squatted = box.inbox / "hw1.txt.part"
    assert squatted.exists()  # young: an upload may still be running
    time.sleep(0.6)
    assert serve_once(class_settings(box, upload_max_age_s=0.5)) == 0
    assert not squatted.exists() and (box.inbox / "folder.part").is_dir()


def test_each_students_outputs_are_theirs_and_the_graders_only(box, students, grader):
    """Both drop ``hw1.txt``: each gets ``hw1.out`` in a folder of their own (the first no longer takes the
    name from the other), which the other can neither list nor read; the graders' group reads both."""
    alice, bob = students
    bob.drop(box.inbox, "hw1.txt", small_input(7))
    assert serve_once(class_settings(box, graders_group=classbox.GRADERS)) == 0
    alice.drop(box.inbox, "hw1.txt", small_input(8))
    assert serve_once(class_settings(box, graders_group=classbox.GRADERS)) == 0
    for who in (alice, bob):
        folder = box.outbox / who.login
        assert sorted(os.listdir(folder)) == ["hw1.out", "hw1.timing.yaml"]
        assert who.run('cat "$1/hw1.out" >/dev/null && ls "$1"', str(folder)).stdout.split() == [
            "hw1.out",
            "hw1.timing.yaml",
        ]
        other = bob if who is alice else alice
        for script in ('ls "$1"', 'cat "$1/hw1.out"', 'cat "$1/hw1.timing.yaml"'):
            r = other.run(script, str(folder), check=False)
            assert r.returncode != 0 and "Permission denied" in r.stderr, (other.login, script)
        assert grader.run('cat "$1/hw1.out" >/dev/null && ls "$1"', str(folder)).returncode == 0
        mode = stat.S_IMODE((folder / "hw1.out").stat().st_mode)
        assert mode & 0o007 == 0, oct(mode)


def test_an_unknown_graders_group_is_a_config_error(box, students):
    with pytest.raises(ConfigError, match="no group 'nosuchgroup-mmd'"):
        serve_once(class_settings(box, graders_group="nosuchgroup-mmd"))


def test_a_job_resumed_after_a_crash_still_goes_to_its_submitters_folder(box, students):
    alice, _ = students
    claimed = box.state / ".work" / "0123456789ab.0" / "left.txt"
    claimed.parent.mkdir(parents=True)
    claimed.write_text(small_input(9))
    os.chown(claimed, alice.uid, alice.gid)
    assert serve_once(class_settings(box)) == 0
    sidecar = yaml.safe_load((box.outbox / alice.login / "left.timing.yaml").read_text())
    assert sidecar["resumed"] is True and sidecar["submitter"] == alice.login


def test_the_inbox_is_a_drop_box_whose_drops_only_the_service_reads(box, students):
    """After the first start (which sets the inbox's default ACL): a classmate can neither list the inbox nor
    read a drop whose name he knows, whatever the dropper's umask; a drop made group-writable on purpose is
    refused as before."""
    alice, bob = students
    assert serve_once(class_settings(box)) == 0
    alice.drop(box.inbox, "mine.txt", small_input(10), umask="000")
    for script in ('ls "$1"', 'cat "$1/mine.txt"'):
        r = bob.run(script, str(box.inbox), check=False)
        assert r.returncode != 0 and "Permission denied" in r.stderr, script
    alice.drop(box.inbox, "open.txt", small_input(11))
    alice.run('chmod g+w "$1/open.txt"', str(box.inbox))
    assert serve_once(class_settings(box)) == 0
    assert yaml.safe_load((box.outbox / alice.login / "mine.timing.yaml").read_text())["submitter"] == alice.login
    assert "writable by its group" in (box.outbox / alice.login / "open.error.yaml").read_text()


def test_a_class_inbox_its_group_may_list_is_refused(box, students):
    box.inbox.chmod(0o3770)
    with pytest.raises(SpoolError, match="lets the class list it"):
        serve_once(class_settings(box))


#: A student's client for the control socket: the system's Python (this clone's venv is not theirs to read).
ASK = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\\n")
print(s.makefile().readline(), end="")
"""


def asks(who, sock, request: str) -> dict:
    return json.loads(who.run('/usr/bin/python3 -c "$1" "$2" "$3"', ASK, str(sock), request).stdout)


def test_students_see_and_cancel_their_own_jobs_only_and_remove_their_own_outputs(box, students):
    """The control socket: the kernel says who asks (SO_PEERCRED); each student sees and cancels only their
    own jobs (a running one is stopped, a queued one refused unrun, both with an error sidecar of kind
    cancelled) and removes only their own outputs."""
    from mmd.daemon.local import ask

    from . import workerhooks

    alice, bob = students
    sock, release = box.root / "mmd.sock", box.root / "release"
    env = {**os.environ, "MMD_INBOX": str(box.inbox), "MMD_OUTBOX": str(box.outbox), "MMD_STATE_DIR": str(box.state),
           "MMD_CLASS_MODE": "true", "MMD_CONTROL_SOCKET": str(sock), "MMD_BACKEND": "cpu",
           "MMD_QUIET_SECONDS": "0.05", "MMD_LOG_FORMAT": "json"}  # fmt: skip
    argv = workerhooks.launcher(f"partial(workerhooks.hold_jobs_until, {str(release)!r})")
    with open(box.root / "daemon.log", "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    try:
        wait_for(lambda: sock.exists(), 30, "the control socket")
        for name in ("a1.txt", "a2.txt"):
            alice.drop(box.inbox, name, small_input(12))
        bob.drop(box.inbox, "b1.txt", small_input(13))
        wait_for(lambda: len(ask(sock, {"op": "status"})["jobs"]) == 3, 30, "three jobs in hand")
        everyone = {j["file"]: j for j in ask(sock, {"op": "status"})["jobs"]}  # root sees all
        assert {j["submitter"] for j in everyone.values()} == {alice.login, bob.login}

        mine = asks(bob, sock, '{"op": "status"}')
        assert mine["you"] == bob.login and [j["file"] for j in mine["jobs"]] == ["b1.txt"]
        assert sorted(j["file"] for j in asks(alice, sock, '{"op": "status"}')["jobs"]) == ["a1.txt", "a2.txt"]
        for request in (
            '{"op": "cancel", "file": "a1.txt"}',
            json.dumps({"op": "cancel", "job": everyone["a1.txt"].get("job") or "0" * 12}),
        ):
            refused = asks(bob, sock, request)
            assert refused["ok"] is False and "not yours" in refused["error"]
        assert asks(bob, sock, "not json")["ok"] is False

        for name in ("a1.txt", "a2.txt"):
            answer = wait_for(lambda n=name: _cancelled(alice, sock, n), 30, f"{name} cancelled")
            assert answer["was"] in ("running", "queued")
        release.touch()
        wait_for(lambda: (box.outbox / bob.login / "b1.timing.yaml").exists(), 30, "bob's job")
        for name in ("a1", "a2"):
            error = yaml.safe_load((box.outbox / alice.login / f"{name}.error.yaml").read_text())["error"]
            assert error["kind"] == "cancelled" and alice.login in error["reason"]
        assert not (box.outbox / alice.login / "a1.out").exists()

        assert asks(bob, sock, '{"op": "rm", "name": "a1.error.yaml"}')["ok"] is False  # his folder has none
        answer = asks(alice, sock, '{"op": "rm", "name": "a1.error.yaml"}')
        assert answer == {"ok": True, "removed": ["a1.error.yaml", "input a1.txt"]}  # and the input mmd kept of it
        assert not (box.outbox / alice.login / "a1.error.yaml").exists()
        assert not (box.state / ".failed" / "a1.txt").exists()
        assert asks(alice, sock, '{"op": "rm", "name": "../mmdtstu2/b1.out"}')["ok"] is False
        assert (box.outbox / bob.login / "b1.out").exists()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, (box.root / "daemon.log").read_text()[-3000:]
    assert not sock.exists()


def _cancelled(who, sock, name: str) -> dict | None:
    answer = asks(who, sock, json.dumps({"op": "cancel", "file": name}))
    if answer["ok"]:
        return answer
    assert "again in a moment" in answer["error"], answer
    return None


def test_a_name_cannot_raise_the_time_limit_nor_pick_what_the_admin_disallowed(box, students):
    """The admin's job_timeout_s: 2 and name_settings: a student's name may lower the one and pick within the
    other, never more; what it asks beyond them is refused with the admin's limit and what is allowed."""
    alice, bob = students
    alice.drop(box.inbox, "long@timeout=99999999.txt", small_input(6))
    bob.drop(box.inbox, "pick@kernel=naive.txt", small_input(7))
    alice.drop(box.inbox, "ok@kernel=fast,timeout=1.5.txt", small_input(8))
    allowed = ("kernel=tiled", "kernel=fast", "timeout")
    assert serve_once(class_settings(box, job_timeout_s=2.0, name_settings=allowed)) == 0
    error = yaml.safe_load((box.outbox / alice.login / "long@timeout=99999999.error.yaml").read_text())["error"]
    assert error["kind"] == "jobname" and error["job_timeout_s"] == 2.0
    assert "above this service's limit, 2 s (job_timeout_s)" in error["reason"]
    error = yaml.safe_load((box.outbox / bob.login / "pick@kernel=naive.error.yaml").read_text())["error"]
    assert error["kind"] == "jobname" and error["allowed"] == list(allowed)
    assert "a name may pick kernel fast or tiled" in error["reason"]
    assert not (box.outbox / alice.login / "long@timeout=99999999.out").exists()
    assert not (box.outbox / bob.login / "pick@kernel=naive.out").exists()
    done = yaml.safe_load((box.outbox / alice.login / "ok@kernel=fast,timeout=1.5.timing.yaml").read_text())
    assert done["status"] == "ok" and done["submitter"] == alice.login


def test_a_small_input_that_would_make_a_huge_output_is_refused_unread(box, students):
    """A 64 KB ``5800 1 5800`` (a column times a row: 200 MB out, 3,163 times its input) is refused from its
    header: no output, an error sidecar of kind limit with the numbers; a course-sized job beside it runs."""
    alice, _ = students
    text = "5800 1 5800\n" + "1.250 " * 5800 + "1.25 " * 5800
    alice.drop(box.inbox, "wide.txt", text)
    alice.drop(box.inbox, "fine.txt", small_input(9, n=64))
    assert serve_once(class_settings(box)) == 0
    sidecar = yaml.safe_load((box.outbox / alice.login / "wide.error.yaml").read_text())
    assert sidecar["error"]["kind"] == "limit" and sidecar["submitter"] == alice.login
    assert sidecar["error"]["output_bytes"] == 201_845_805 and sidecar["error"]["input_bytes"] == 63_812
    assert "at most 16 times its input or 8388608 bytes" in sidecar["error"]["reason"]
    assert sidecar["timings_ms"]["read"] is None and sidecar["timings_ms"]["kernel"] is None
    assert not (box.outbox / alice.login / "wide.out").exists()
    assert yaml.safe_load((box.outbox / alice.login / "fine.timing.yaml").read_text())["status"] == "ok"


def test_a_flood_from_one_student_delays_another_by_about_a_group_of_jobs(box, students):
    """Mallory's 400 small files wait before Alice's one (they are older): fair share by use gives Alice's
    the next place once Mallory's first jobs are charged, not the last (it was 401st)."""
    alice, mallory = students
    mallory.run('i=0; while [ $i -lt 400 ]; do printf "%s" "$2" > "$1/m$i.txt"; i=$((i+1)); done',
                str(box.inbox), small_input(14))  # fmt: skip
    time.sleep(0.02)  # a later mtime: the inbox's scan puts it last
    alice.drop(box.inbox, "mine.txt", small_input(15))
    assert serve_once(class_settings(box)) == 0
    finished = {
        p.name: yaml.safe_load(p.read_text())["finished_at"]
        for who in (alice, mallory)
        for p in (box.outbox / who.login).glob("*.timing.yaml")
    }
    assert len(finished) == 401
    before = sum(1 for name, at in finished.items() if name != "mine.timing.yaml" and at < finished["mine.timing.yaml"])
    assert before <= 4 * 16, f"{before} of the flood's jobs went before alice's"


def test_a_full_quota_refuses_that_students_next_job_only_until_they_make_room(box, students):
    """max_submitter_bytes: what mmd keeps for Alice fills hers, so her next job is refused before any work with
    how to make room; Bob's goes on; once she removes an output (and with it its input), hers runs again."""
    from mmd.spool import Shared, Spool

    alice, bob = students
    settings = class_settings(box, max_submitter_bytes=40_000)
    # a job keeps 36 KiB in blocks: its 17.6 KB input (20 KiB), its 9.6 KB output (12 KiB), its sidecar (4 KiB)
    alice.drop(box.inbox, "a1.txt", small_input(16, n=40))
    assert serve_once(settings) == 0
    alice.drop(box.inbox, "a2.txt", small_input(17, n=40))
    bob.drop(box.inbox, "b1.txt", small_input(18, n=40))
    assert serve_once(settings) == 0
    error = yaml.safe_load((box.outbox / alice.login / "a2.error.yaml").read_text())["error"]
    assert error["kind"] == "limit" and error["setting"] == "max_submitter_bytes" and "mmd rm" in error["reason"]
    assert (box.outbox / bob.login / "b1.out").exists()
    spool = Spool(Shared(box.inbox, box.outbox, state_dir=box.state, class_mode=True))
    for base in ("a1", "a2"):  # as `mmd rm a1.out a2.error.yaml` does
        assert spool.archive.remove_output(alice.uid, base)
    alice.drop(box.inbox, "a3.txt", small_input(19, n=40))
    assert serve_once(settings) == 0
    assert (box.outbox / alice.login / "a3.out").exists()


def test_the_disk_reserve_is_kept_for_everyone(tmp_path):
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    (inbox / "m.txt").write_text(small_input(20))
    settings = config.Settings(inbox=inbox, outbox=outbox, backend="cpu", min_free_bytes=1 << 62)
    assert serve_once(settings) == 0
    error = yaml.safe_load((outbox / "m.error.yaml").read_text())["error"]
    assert error["kind"] == "limit" and error["setting"] == "min_free_bytes" and "for everyone" in error["reason"]
    assert not (outbox / "m.out").exists()


def age_the_archive_log(b: Box, seconds: float) -> None:
    """Make what the daemon logged as archived so far look archived ``seconds`` earlier (its log of archived
    inputs, by the hour: the daemon's own record, which no student can reach)."""
    from mmd.spool.ledger import LEDGER_DIR, LOG_SPAN_S

    logs = b.state / LEDGER_DIR / "archived"
    for log in sorted(logs.iterdir()):
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        log.unlink()
        older = logs / str(int(log.name) - int(seconds // LOG_SPAN_S))
        older.write_text("".join(json.dumps([*line[:3], line[3] - seconds]) + "\n" for line in lines))


def test_retention_removes_what_is_older_than_its_days_and_nothing_newer(box, students):
    alice, _ = students
    alice.drop(box.inbox, "old.txt", small_input(21))
    assert serve_once(class_settings(box)) == 0
    two_days_ago = time.time() - 2 * 86400
    for path in (box.outbox / alice.login).iterdir():  # mmd's files: their mtime is mmd's clock
        os.utime(path, (two_days_ago, two_days_ago))
    age_the_archive_log(box, 2 * 86400)  # an archived input: judged by when mmd archived it
    alice.drop(box.inbox, "new.txt", small_input(22))
    assert serve_once(class_settings(box, retention_days=1.0)) == 0
    assert sorted(os.listdir(box.outbox / alice.login)) == ["new.out", "new.timing.yaml"]
    assert os.listdir(box.state / ".done") == ["new.txt"]


def test_one_students_long_jobs_do_not_hold_back_anothers_short_one(box, students):
    """Bob's three big jobs came first (the middle one long); Alice's small one after. Old order: Bob's third
    took the first worker that came free, Alice waited for a second. Fair share: the first free worker is
    Alice's, since Bob has used one job's time and she none."""
    import numpy as np

    alice, bob = students
    rng = np.random.default_rng(23)
    for i, (name, n) in enumerate((("big1", 500), ("big2", 1200), ("big3", 500))):
        path = box.inbox / f"{name}.txt"
        a, b = random_matrix(rng, n, n), random_matrix(rng, n, n)
        path.write_bytes(b"".join(input_chunks(a, b, square=True)))
        os.chown(path, bob.uid, bob.gid)
        os.utime(path, ns=(10**18 + i * 10**6, 10**18 + i * 10**6))
    alice.drop(box.inbox, "small.txt", small_input(24))
    os.utime(box.inbox / "small.txt", ns=(10**18 + 3 * 10**6, 10**18 + 3 * 10**6))  # after Bob's, and complete
    assert serve_once(class_settings(box, devices=(0, 1))) == 0

    def claimed(who, stem: str) -> float:
        side = yaml.safe_load((box.outbox / who.login / f"{stem}.timing.yaml").read_text())
        from datetime import datetime

        return datetime.fromisoformat(side["finished_at"]).timestamp() - side["timings_ms"]["overall"] / 1e3

    assert claimed(alice, "small") < claimed(bob, "big3")


def test_outputs_from_before_class_mode_are_set_aside_out_of_the_class_reach(box, students):
    """A spool served before class mode has its outputs in the outbox itself, readable by the whole class:
    the first class-mode start moves them into a folder only the service may enter."""
    alice, _ = students
    for name in ("old.out", "old.timing.yaml"):
        (box.outbox / name).write_text("x\n")
        (box.outbox / name).chmod(0o644)
    assert serve_once(class_settings(box)) == 0
    aside = box.outbox / ".before-class-mode"
    assert sorted(os.listdir(aside)) == ["old.out", "old.timing.yaml"] and not (box.outbox / "old.out").exists()
    assert stat.S_IMODE(aside.stat().st_mode) == 0o700
    r = alice.run('cat "$1/old.out"', str(aside), check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr


def test_a_graded_students_sidecar_names_a_kernel_as_a_claim_and_is_never_followed(box, students, tmp_path):
    """Grading a class's hand-in (`mmd check --by-student`), each student's folder and files theirs: a sidecar
    naming tc1 gets TF32's tolerance and the table says it was claimed; a kernel name that is not mmd's
    widens nothing and reaches the reports escaped; a sidecar that is a link to the grader's private file
    is not followed, and no byte of that file is shown."""
    import numpy as np

    from mmd import record, textformat
    from mmd.backends import CpuBackend
    from mmd.check import jobs, reports
    from mmd.check.results import Options, Status

    from .conftest import run_file
    from .fakes import tf32_round

    alice, bob = students
    rng = np.random.default_rng(3)
    a, b = random_matrix(rng, 24, 24), random_matrix(rng, 24, 24)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "t.txt").write_bytes(b"".join(input_chunks(a, b, square=True)))
    tf32 = (tf32_round(a).astype(np.float64) @ tf32_round(b).astype(np.float64)).astype(np.float32)
    (tmp_path / "made").mkdir()
    made = run_file(tests / "t.txt", tmp_path / "made" / "t.out", CpuBackend())  # a real sidecar to forge from
    assert made.ok
    real = record.timing_path(tmp_path / "made" / "t.out").read_text()
    secret = tmp_path / "grader-only.yaml"
    secret.write_text(real.replace("kernel: cpu", "kernel: tc1") + "# do-not-print-me\n")
    secret.chmod(0o600)
    handin = box.root / "handin"
    handin.mkdir(mode=0o755)
    hostile = "tc1\x1b[2K\x1b[1A"  # not a kernel of mmd's, and a terminal's control sequence
    quoted = hostile.encode("unicode_escape").decode()
    for who, kernel in ((alice, "tc1"), (bob, f'"{quoted}"')):
        mine = handin / who.login
        mine.mkdir()
        os.chown(mine, who.uid, who.gid)
        who.run('printf %s "$2" > "$1/t.out" && printf %s "$3" > "$1/t.timing.yaml"', str(mine),
                textformat.emit(tf32).decode(), real.replace("kernel: cpu", f"kernel: {kernel}"))  # fmt: skip
    alice.run('cp "$1/t.out" "$1/u.out" && ln -s "$2" "$1/u.timing.yaml"', str(handin / alice.login), str(secret))
    (tests / "u.txt").write_bytes((tests / "t.txt").read_bytes())

    run = jobs.check_class(handin, tests, Options(), roster=None)
    got = {(r.student, r.name): r for r in run.results}
    claimed = got[(alice.login, "t")]
    assert (claimed.status, claimed.kernel) == (Status.OK, "tc1") and "held to TF32's tolerance" in claimed.reason
    forged = got[(bob.login, "t")]
    assert forged.status is Status.MISMATCH and forged.precision == "fp32"
    followed = got[(alice.login, "u")]
    assert followed.kernel is None and followed.precision == "fp32"  # the linked sidecar was not read
    table = reports.table(run.results)
    shown = json.dumps(reports.run_dict(run))
    for text in (table, shown):
        assert "\x1b" not in text and "do-not-print-me" not in text


def test_a_workers_files_are_out_of_a_students_reach_in_their_folder(box, students):
    """A worker's commit makes its temporaries in the folder of its job's output, in class mode a student's
    own, only while it commits; between jobs it holds nothing open there, and the reservation it keeps for the
    next claim is in the state folder: the student sees results only, and has nothing to write into, replace
    by a link or remove; their next job's output is theirs, right to the byte, and a classmate's job goes to
    the classmate's folder."""
    import numpy as np

    from mmd import textformat

    from .test_daemon import held_open_in

    alice, bob = students
    env = {**os.environ, "MMD_INBOX": str(box.inbox), "MMD_OUTBOX": str(box.outbox), "MMD_STATE_DIR": str(box.state),
           "MMD_CLASS_MODE": "true", "MMD_BACKEND": "cpu", "MMD_DEVICES": "0", "MMD_QUIET_SECONDS": "0.05"}  # fmt: skip
    mine = box.outbox / alice.login
    with open(box.root / "daemon.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mmd", "serve"], env=env, stdout=log, stderr=log)
    try:
        alice.drop(box.inbox, "hw1.txt", small_input(21))
        wait_for(lambda: (mine / "hw1.timing.yaml").exists(), 30, "alice's first job")
        # the job's reservation (.hw1.claim) goes with its archive, just after its sidecar
        wait_for(lambda: sorted(alice.run('ls -A "$1"', str(mine)).stdout.split()) == ["hw1.out", "hw1.timing.yaml"],
                 30, "alice's folder to hold her results only")  # fmt: skip
        assert held_open_in(mine) == {}
        text = small_input(22)
        alice.drop(box.inbox, "hw2.txt", text)
        wait_for(lambda: (mine / "hw2.timing.yaml").exists(), 30, "alice's second job")
        mats = textformat.parse(text.encode())
        want = textformat.format_reference(mats.a.astype(np.float64) @ mats.b.astype(np.float64))
        assert (mine / "hw2.out").read_bytes() == want
        assert alice.run('cat "$1/hw2.out"', str(mine)).stdout.encode() == want
        theirs = small_input(23)
        bob.drop(box.inbox, "hw1.txt", theirs)
        wait_for(lambda: (box.outbox / bob.login / "hw1.timing.yaml").exists(), 30, "bob's job")
        mats = textformat.parse(theirs.encode())
        want = textformat.format_reference(mats.a.astype(np.float64) @ mats.b.astype(np.float64))
        assert (box.outbox / bob.login / "hw1.out").read_bytes() == want
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, (box.root / "daemon.log").read_text()[-3000:]
    assert held_open_in(mine) == {}


def test_students_hostile_names_reach_a_serving_daemon_as_events_and_end_as_safe_names_in_their_own_folders(
    box, students
):
    """A serving daemon (its main loop reads the inbox's inotify watch itself): a name with a bidi override, one
    with a terminal escape, a plain one and a folder named like a job, renamed in by two students. Each file is
    served at once from its event, under a safe name, into its submitter's folder; the folder is left alone; no
    raw control character reaches the log; the daemon serves on."""
    alice, bob = students
    env = {**os.environ, "MMD_INBOX": str(box.inbox), "MMD_OUTBOX": str(box.outbox), "MMD_STATE_DIR": str(box.state),
           "MMD_CLASS_MODE": "true", "MMD_BACKEND": "cpu", "MMD_QUIET_SECONDS": "0.05",
           "MMD_RESCAN_SECONDS": "3600", "MMD_LOG_FORMAT": "json"}  # fmt: skip  # no rescan: events only
    log_path = box.root / "daemon.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mmd", "serve"], env=env, stdout=log, stderr=log)
    try:
        wait_for(lambda: '"serving"' in log_path.read_text(), 60, "the daemon to serve")
        alice.drop(box.inbox, "hw\u202etxt.exe.txt", small_input(21))
        alice.drop(box.inbox, "a\x1b[2Kb.txt", small_input(22))
        bob.drop(box.inbox, "plain-name.txt", small_input(23))
        bob.run('mkdir "$1/.d" && mv "$1/.d" "$1/dir.txt"', str(box.inbox))
        mine = {alice: ["hw_txt.exe.timing.yaml", "a_[2Kb.timing.yaml"], bob: ["plain-name.timing.yaml"]}
        for who, names in mine.items():
            for name in names:
                wait_for(lambda w=who, n=name: (box.outbox / w.login / n).exists(), 30, f"{name} from its event")

        def shown_in(folder):  # a job's reservation there is a dot file until its archive
            return sorted(n for n in os.listdir(folder) if not n.startswith("."))

        assert shown_in(box.outbox / alice.login) == ["a_[2Kb.out", "a_[2Kb.timing.yaml", "hw_txt.exe.out",
                                                      "hw_txt.exe.timing.yaml"]  # fmt: skip
        assert shown_in(box.outbox / bob.login) == ["plain-name.out", "plain-name.timing.yaml"]
        text = (box.outbox / alice.login / "hw_txt.exe.timing.yaml").read_text()
        sidecar = yaml.safe_load(text)
        assert sidecar["status"] == "ok" and sidecar["submitter"] == alice.login
        assert sidecar["original_name"] == "hw\\u202etxt.exe.txt" and "\u202e" not in text  # named, escaped
        assert (box.inbox / "dir.txt").is_dir(), "a folder named like a job is not a job"
        assert proc.poll() is None
        text = log_path.read_text()
        assert "\x1b" not in text and "\u202e" not in text
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]


# -- the control socket under attack: many clients at once, each user's share, cancel by the job it checked --

#: A client that times its own request (connect to answer, in seconds), as a student's would run: the system's
#: Python, a deadline of its own. Prints ``<seconds> <answer>``, or ``<seconds> ERROR <reason>``.
TIMED_ASK = """
import json, socket, sys, time
t = time.monotonic()
try:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(sys.argv[1])
    s.sendall(sys.argv[2].encode() + b"\\n")
    line = s.makefile().readline().strip()
    print(f"{time.monotonic() - t:.4f} {line}")
except OSError as exc:
    print(f"{time.monotonic() - t:.4f} ERROR {exc!r}")
"""

#: A student who holds ``N`` connections open without a word for ``S`` seconds, opening a new one whenever the
#: daemon closes one. Prints how many connections it made and how many the daemon answered at once (refused).
HOLDER = """
import select, socket, sys, time
path, n, end = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
held, made, refused = [], 0, 0
while time.monotonic() < end:
    while len(held) < n:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(0.2)
        try:
            s.connect(path)
        except OSError:
            s.close()
            break
        held.append((s, time.monotonic()))
        made += 1
    readable, _, _ = select.select([s for s, _ in held], [], [], 0.05)
    for s in readable:
        at = next(t for h, t in held if h is s)
        if time.monotonic() - at < 1.0:
            refused += 1  # answered before its request could have timed out: refused at once
        held = [(h, t) for h, t in held if h is not s]
        s.close()
print(made, refused)
"""

#: A student who asks for their status back to back, on ``T`` connections at once, for ``S`` seconds. Prints
#: how many answers came, and how many of them were refusals.
HAMMER = """
import json, socket, sys, threading, time
path, threads, end = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
answers, refusals = [0], [0]
def ask():
    while time.monotonic() < end:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(15)
        try:
            s.connect(path)
            s.sendall(b'{"op": "status"}\\n')
            line = s.makefile().readline()
        except OSError:
            continue
        finally:
            s.close()
        if line and time.monotonic() < end:
            answers[0] += 1
            refusals[0] += not json.loads(line)["ok"]
ts = [threading.Thread(target=ask) for _ in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(answers[0], refusals[0])
"""


def timed_ask(who, sock, request: str) -> tuple[float, dict]:
    """(seconds from connect to answer, the answer) of ``request`` asked by ``who``; fails on no answer."""
    out = who.run('/usr/bin/python3 -c "$1" "$2" "$3"', TIMED_ASK, str(sock), request).stdout.split(" ", 1)
    assert not out[1].startswith("ERROR"), f"{who.login}'s request got no answer after {out[0]} s: {out[1]}"
    return float(out[0]), json.loads(out[1])


def start_class_daemon(b: Box, setup: str = "workerhooks.chain", before: str | None = None, **env: str):
    """``mmd serve`` of a class box with a control socket, as a process (its workers call ``setup`` first,
    its main process ``before``); returns it and the socket once it listens."""
    from . import workerhooks

    sock = b.root / "mmd.sock"
    full = {**os.environ, "MMD_INBOX": str(b.inbox), "MMD_OUTBOX": str(b.outbox), "MMD_STATE_DIR": str(b.state),
            "MMD_CLASS_MODE": "true", "MMD_CONTROL_SOCKET": str(sock), "MMD_BACKEND": "cpu",
            "MMD_QUIET_SECONDS": "0.05", "MMD_LOG_FORMAT": "json", **env}  # fmt: skip
    with open(b.root / "daemon.log", "w") as log:
        proc = subprocess.Popen(workerhooks.launcher(setup, before=before), env=full, stdout=log, stderr=log)
    wait_for(lambda: sock.exists() or proc.poll() is not None, 60, "the control socket")
    assert proc.poll() is None, (b.root / "daemon.log").read_text()[-3000:]
    return proc, sock


def stop_class_daemon(b: Box, proc) -> None:
    proc.terminate()
    assert proc.wait(timeout=30) == 0, (b.root / "daemon.log").read_text()[-3000:]


def test_a_student_holding_idle_connections_silences_no_one_elses_status(box, students, grader):
    """Mallory holds 40 connections to the control socket open without a word (more than the old listen
    backlog of 16), opening a new one whenever one is closed: the socket serves many clients at once and caps
    her at control_connections_per_user (the rest are refused at once), so the TA's and Alice's status answer
    at once, every time."""
    alice, mallory = students
    proc, sock = start_class_daemon(box, MMD_CONTROL_CONNECTIONS_PER_USER="8")
    try:
        holder = subprocess.Popen(
            mallory.argv("/usr/bin/python3", "-c", HOLDER, str(sock), "40", "8"),
            cwd="/tmp",
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)  # her connections are open, and the first have not timed out yet
        for _ in range(5):
            for who in (grader, alice):
                took, answer = timed_ask(who, sock, '{"op": "status"}')
                assert answer["ok"] and answer["you"] == who.login, answer
                assert took < 1.0, f"{who.login}'s status took {took} s"
            time.sleep(0.4)
        made, refused = map(int, holder.communicate(timeout=30)[0].split())
        assert made > 40 and refused > 0, (made, refused)  # she tried for more, and was refused past her cap
    finally:
        stop_class_daemon(box, proc)


def test_a_student_asking_back_to_back_is_rate_limited_and_slows_no_one_else(box, students, grader):
    """Mallory asks for her status back to back on 4 connections at once for 3 s: the daemon serves her at
    control_requests_per_s (a bucket of two seconds' worth, then one every 1/rate s; her requests wait their
    turn, never refused), while Alice's status, asked meanwhile, answers at once every time."""
    alice, mallory = students
    proc, sock = start_class_daemon(box, MMD_CONTROL_REQUESTS_PER_S="5")
    try:
        hammer = subprocess.Popen(
            mallory.argv("/usr/bin/python3", "-c", HAMMER, str(sock), "4", "3"),
            cwd="/tmp",
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.5)
        for _ in range(6):
            took, answer = timed_ask(alice, sock, '{"op": "status"}')
            assert answer["ok"] and took < 0.5, (took, answer)
            time.sleep(0.3)
        answered, refused = map(int, hammer.communicate(timeout=60)[0].split())
        assert refused == 0, f"{refused} of her requests were refused, not delayed"
        assert 10 <= answered <= 10 + 5 * 3 + 3, f"{answered} answers in 3 s at 5 a second (a bucket of 10)"
        took, answer = timed_ask(grader, sock, '{"op": "status"}')
        assert answer["ok"] and took < 0.5, (took, answer)
    finally:
        stop_class_daemon(box, proc)


def test_a_students_status_costs_their_own_jobs_not_the_whole_queue(box, students):
    """8,000 of Mallory's files wait in the queue (the workers are held): Alice's status shows her one job
    with its place (after all of Mallory's, which came first) without sorting the queue or looking at its
    files in the inbox: what it costs the main loop is her own jobs, not the queue's."""
    from mmd.daemon.local import ask

    alice, mallory = students
    release = box.root / "release"
    count = 8_000
    text = small_input(30).encode()
    for i in range(count):
        path = box.inbox / f"m{i:05d}.txt"
        path.write_bytes(text)
        os.chown(path, mallory.uid, mallory.gid)
        os.utime(path, ns=(10**18 + i * 10**6, 10**18 + i * 10**6))
    proc, sock = start_class_daemon(box, f"partial(workerhooks.hold_jobs_until, {str(release)!r})",
                                    MMD_DEVICES="0", MMD_RESCAN_SECONDS="3600")  # fmt: skip
    try:
        wait_for(lambda: ask(sock, {"op": "status"})["queued_total"] == count - 16, 60, "mallory's files queued")
        alice.drop(box.inbox, "mine.txt", small_input(31))
        mine = wait_for(lambda: timed_ask(alice, sock, '{"op": "status"}')[1]["jobs"], 60, "alice's job queued")
        assert [(j["file"], j["state"]) for j in mine] == [("mine.txt", "queued")]
        assert mine[0]["position"] == count - 16 + 1  # the worker holds a group of 16 of Mallory's
        took = min(timed_ask(alice, sock, '{"op": "status"}')[0] for _ in range(5))
        assert took < 0.02, f"alice's status took {took * 1e3:.1f} ms with {count} files queued"
    finally:
        release.touch()
        stop_class_daemon(box, proc)


def test_a_students_status_shows_their_places_by_share_and_how_long_theirs_has_run_and_a_graders_counts(
    box, students, grader
):
    """One worker. Bob's b0 has run (he has used the worker), his big b1 runs (held), his b2 waits; Alice drops
    a1 and a2 after b2. Alice's status: her two jobs at places 1 and 2, before Bob's older b2 (fair share: she
    has used nothing), and nothing of his; Bob's: b1 running, for longer at each ask, and b2 at place 3; `mmd
    status` prints each as such. The grader's text is counts only. Then the worker runs them in those places."""
    from mmd.cli.status_cmd import render_mine
    from mmd.daemon.local import ask

    alice, bob = students
    release = box.root / "release"
    proc, sock = start_class_daemon(box, f"partial(workerhooks.hold_jobs_until, {str(release)!r}, ('b1.txt',))",
                                    MMD_DEVICES="0", MMD_GRADERS_GROUP=classbox.GRADERS)  # fmt: skip
    try:
        bob.drop(box.inbox, "b0.txt", small_input(70))
        wait_for((box.outbox / bob.login / "b0.timing.yaml").exists, 30, "bob's first job")
        wait_for(lambda: asks(bob, sock, '{"op": "status"}')["jobs"] == [], 30, "b0 ended (and charged)")
        bob.rename_in(box.inbox, "b1.txt", big_input(71))
        wait_for(lambda: [(j["file"], j["state"]) for j in asks(bob, sock, '{"op": "status"}')["jobs"]]
                 == [("b1.txt", "running")], 30, "b1 running")  # fmt: skip
        bob.rename_in(box.inbox, "b2.txt", big_input(72))
        wait_for(lambda: ask(sock, {"op": "status"})["queued_total"] == 1, 30, "b2 queued")
        for n, name in enumerate(("a1.txt", "a2.txt"), 2):
            alice.drop(box.inbox, name, small_input(73 + n))
            wait_for(lambda n=n: ask(sock, {"op": "status"})["queued_total"] == n, 30, f"{name} queued")

        mine = asks(alice, sock, '{"op": "status"}')
        assert mine["everyone"] is False and mine["queued_total"] == 3
        assert [(j["file"], j["state"], j["position"]) for j in mine["jobs"]] == [
            ("a1.txt", "queued", 1),
            ("a2.txt", "queued", 2),
        ]
        shown = render_mine(mine)
        assert "place 1 in the queue (0 jobs start before it)" in shown and "(1 job starts before it)" in shown
        assert "b1.txt" not in shown and "b2.txt" not in shown

        first = asks(bob, sock, '{"op": "status"}')
        time.sleep(0.3)
        then = asks(bob, sock, '{"op": "status"}')
        assert [(j["file"], j["state"], j.get("position")) for j in then["jobs"]] == [
            ("b1.txt", "running", None),
            ("b2.txt", "queued", 3),
        ]
        assert then["jobs"][0]["running_s"] >= first["jobs"][0]["running_s"] + 0.3
        running, queued = render_mine(then).splitlines()[1:3]
        took = then["jobs"][0]["running_s"]
        assert running.startswith("  running  b1.txt (job ") and f"running for {took:.1f} s" in running
        assert queued.startswith("  queued   b2.txt") and queued.endswith(
            "place 3 in the queue (2 jobs start before it)"
        )
        assert "a1.txt" not in render_mine(then) and "a2.txt" not in render_mine(then)

        theirs = asks(grader, sock, '{"op": "status"}')
        assert theirs["everyone"] is True and len(theirs["jobs"]) == 4
        shown = render_mine(theirs)
        assert shown.endswith(": 1 running, 0 handed to a worker, 3 queued") and grader.login in shown
        assert not [name for name in ("a1", "a2", "b1", "b2") if name in shown]

        release.touch()
        done = {}
        for who, stem in ((alice, "a1"), (alice, "a2"), (bob, "b2")):
            path = box.outbox / who.login / f"{stem}.timing.yaml"
            wait_for(path.exists, 60, stem)
            done[stem] = yaml.safe_load(path.read_text())["finished_at"]
        assert done["a1"] <= done["a2"] < done["b2"], done
    finally:
        release.touch()
        stop_class_daemon(box, proc)


def test_a_cancel_whose_worker_moved_on_stops_nothing_of_anothers(box, students):
    """Alice's a1 and Bob's b1 are one worker's group. Alice cancels a1 while it runs, and (made certain by
    a hook of the main loop) the worker moves on to Bob's b1 between the desk's check and the stop: the stop
    finds the worker on another job and does nothing to it. Bob's job ends well, and Alice's, finished, is
    committed (max_attempts 1: a start charged for it would fail it)."""
    alice, bob = students
    armed, go, release = box.root / "armed", box.root / "go", box.root / "release"
    alice.drop(box.inbox, "a1.txt", small_input(32))
    bob.drop(box.inbox, "b1.txt", small_input(33))
    for i, name in enumerate(("a1.txt", "b1.txt")):
        os.utime(box.inbox / name, ns=(10**18 + i * 10**6, 10**18 + i * 10**6))
    holds = (f"partial(workerhooks.chain, partial(workerhooks.hold_jobs_until, {str(go)!r}, ('a1.txt',)), "
             f"partial(workerhooks.hold_jobs_until, {str(release)!r}, ('b1.txt',)))")  # fmt: skip
    proc, sock = start_class_daemon(
        box, holds, before=f"partial(workerhooks.move_on_after_the_desk_looks, {str(armed)!r}, {str(go)!r})",
        MMD_DEVICES="0", MMD_MAX_ATTEMPTS="1",
    )  # fmt: skip
    try:
        wait_for(lambda: [j["state"] for j in asks(alice, sock, '{"op": "status"}')["jobs"]] == ["running"], 30,
                 "a1 running")  # fmt: skip
        armed.touch()
        answer = asks(alice, sock, '{"op": "cancel", "file": "a1.txt"}')
        assert go.exists()
        assert answer["ok"] is False and "finished" in answer["error"], answer
        release.touch()
        wait_for(lambda: (box.outbox / bob.login / "b1.timing.yaml").exists(), 30, "bob's job")
        wait_for(lambda: (box.outbox / alice.login / "a1.timing.yaml").exists(), 30, "alice's job")
        assert not (box.outbox / bob.login / "b1.error.yaml").exists()
        assert yaml.safe_load((box.outbox / bob.login / "b1.timing.yaml").read_text())["status"] == "ok"
        assert not (box.outbox / alice.login / "a1.error.yaml").exists()
    finally:
        release.touch()
        stop_class_daemon(box, proc)


def test_a_cancel_errs_only_its_job_and_charges_its_batch_mates_nothing(box, students):
    """One worker's group: Alice's a1 (done, waiting for the group's commit), her a2 (running) and Bob's b1
    (not begun). Alice cancels a2: its worker is ended, a2 gets its cancelled sidecar, and a1 and b1 go back
    to the queue without a start charged (max_attempts 1: one charged start would fail them as crashed)."""
    alice, bob = students
    release = box.root / "release"
    alice.drop(box.inbox, "a1.txt", small_input(34))
    alice.drop(box.inbox, "a2.txt", small_input(35))
    bob.drop(box.inbox, "b1.txt", small_input(36))
    for i, name in enumerate(("a1.txt", "a2.txt", "b1.txt")):
        os.utime(box.inbox / name, ns=(10**18 + i * 10**6, 10**18 + i * 10**6))
    proc, sock = start_class_daemon(box, f"partial(workerhooks.hold_jobs_until, {str(release)!r}, ('a2.txt',))",
                                    MMD_DEVICES="0", MMD_MAX_ATTEMPTS="1")  # fmt: skip
    try:
        wait_for(lambda: ("a2.txt", "running") in [(j["file"], j["state"]) for j in
                 asks(alice, sock, '{"op": "status"}')["jobs"]], 30, "a2 running")  # fmt: skip
        answer = asks(alice, sock, '{"op": "cancel", "file": "a2.txt"}')
        assert answer["ok"] and answer["was"] == "running", answer
        for who, stem in ((alice, "a1"), (bob, "b1")):
            wait_for(lambda w=who, s=stem: any((box.outbox / w.login / f"{s}.{k}.yaml").exists()
                                               for k in ("timing", "error")), 30, stem)  # fmt: skip
            refused = box.outbox / who.login / f"{stem}.error.yaml"
            assert not refused.exists(), refused.read_text()
            assert yaml.safe_load((box.outbox / who.login / f"{stem}.timing.yaml").read_text())["status"] == "ok"
        error = yaml.safe_load((box.outbox / alice.login / "a2.error.yaml").read_text())["error"]
        assert error["kind"] == "cancelled" and alice.login in error["reason"]
    finally:
        release.touch()
        stop_class_daemon(box, proc)


# -- one student's share of the workers and of the queue; jobs keyed by submitter and name --


def big_input(seed: int) -> bytes:
    """A 200×200 pair: over 256 KiB, a big job (given alone to an idle worker)."""
    return small_input(seed, n=200).encode()


def serving(b: Box, setup: str, **env: str) -> tuple[subprocess.Popen, os.PathLike]:
    """``mmd serve`` on the class box with two cpu workers, its workers set up by ``setup`` (a workerhooks
    launcher expression); returns it once it serves, and its log."""
    from . import workerhooks

    environ = {**os.environ, "MMD_INBOX": str(b.inbox), "MMD_OUTBOX": str(b.outbox), "MMD_STATE_DIR": str(b.state),
               "MMD_CLASS_MODE": "true", "MMD_BACKEND": "cpu", "MMD_DEVICES": "0,1", "MMD_QUIET_SECONDS": "0.05",
               "MMD_LOG_FORMAT": "json", **env}  # fmt: skip
    log_path = b.root / "daemon.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(workerhooks.launcher(setup), env=environ, stdout=log, stderr=log)
    wait_for(lambda: '"serving"' in log_path.read_text() or proc.poll() is not None, 60, "the daemon to serve")
    assert proc.poll() is None, log_path.read_text()[-3000:]
    return proc, log_path


def held_for(who, release: os.PathLike) -> str:
    """The launcher's setup: ``who``'s jobs wait until ``release`` exists."""
    return f"partial(__import__('tests.classbox').classbox.hold_owners_until, {str(release)!r}, ({who.uid},))"


def test_one_student_with_a_big_job_per_worker_leaves_a_classmate_a_worker(box, students):
    """Mallory drops two big jobs on an idle daemon of two workers (hers run until released); Alice's small
    job, dropped after, runs at once: Mallory's big jobs hold at most max_workers_per_submitter workers (a class:
    half of them), her second waits in the inbox. Before, it took the second worker and Alice waited for one."""
    alice, mallory = students
    release = box.root / "release"
    proc, log_path = serving(box, held_for(mallory, release))
    try:
        for i, name in enumerate(("big1.txt", "big2.txt")):
            mallory.rename_in(box.inbox, name, big_input(40 + i))
        wait_for(lambda: not (box.inbox / "big1.txt").exists(), 30, "mallory's first big job to be taken")
        time.sleep(0.5)  # time for her second to be given out, where it may be
        alice.drop(box.inbox, "small.txt", small_input(42))
        wait_for(lambda: (box.outbox / alice.login / "small.timing.yaml").exists(), 20, "alice's job, at once")
        assert (box.inbox / "big2.txt").exists(), "mallory's second big job waits for her first"
        release.touch()
        for stem in ("big1", "big2"):
            wait_for(lambda s=stem: (box.outbox / mallory.login / f"{s}.timing.yaml").exists(), 60, stem)
    finally:
        release.touch()
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]


def test_one_students_running_hw1_holds_back_no_one_elses(box, students):
    """Bob's hw1.txt runs (until released); Alice's hw1.txt, dropped meanwhile, runs at once on the idle worker
    and leaves the name free in the drop box. Before, it waited for Bob's to end (jobs were keyed by name
    class-wide), and no third student could drop a hw1.txt meanwhile."""
    alice, bob = students
    release = box.root / "release"
    proc, log_path = serving(box, held_for(bob, release))
    try:
        bob.rename_in(box.inbox, "hw1.txt", big_input(43))
        wait_for(lambda: not (box.inbox / "hw1.txt").exists(), 30, "bob's hw1.txt to be taken")
        time.sleep(0.5)  # the daemon knows it runs
        alice.drop(box.inbox, "hw1.txt", small_input(44))
        wait_for(lambda: (box.outbox / alice.login / "hw1.timing.yaml").exists(), 20, "alice's hw1.txt, at once")
        assert not (box.inbox / "hw1.txt").exists(), "the name is free for the next student"
        assert not (box.outbox / bob.login / "hw1.timing.yaml").exists(), "bob's still runs"
        release.touch()
        wait_for(lambda: (box.outbox / bob.login / "hw1.timing.yaml").exists(), 60, "bob's hw1.txt")
        assert yaml.safe_load((box.outbox / alice.login / "hw1.timing.yaml").read_text())["submitter"] == alice.login
    finally:
        release.touch()
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]


def test_a_small_drop_swapped_for_a_big_one_is_given_back_and_runs_alone(box, students):
    """Alice's small s.txt is given to a worker with a group of Bob's small jobs; just before its claim she
    renames a big input of hers over the name. The worker gives it back unrun and goes on with Bob's; the big
    one runs alone (held until released here, it holds back none of Bob's). Before, the worker ran it inside
    the group, and Bob's jobs given to that worker after it waited for it though the other worker was free."""
    from . import workerhooks

    alice, bob = students
    release = box.root / "release"
    alice.drop(box.inbox, "s.txt", small_input(45))
    staged = box.inbox / ".swap.part"
    staged.write_bytes(big_input(46))
    os.chown(staged, alice.uid, alice.gid)
    for i in range(12):
        bob.drop(box.inbox, f"b{i:02d}.txt", small_input(50 + i))
    setup = workerhooks.partial(
        workerhooks.chain,
        workerhooks.partial(workerhooks.hold_jobs_until, str(release), ("s.txt",)),
        workerhooks.partial(classbox.swap_at_claim, "s.txt", str(staged)),
    )
    bobs = [box.outbox / bob.login / f"b{i:02d}.timing.yaml" for i in range(12)]

    def bobs_are_done() -> None:
        wait_for(lambda: all(p.exists() for p in bobs), 30, "bob's jobs while alice's big one is held")

    def serve() -> int:
        return daemon.Daemon(class_settings(box, devices=(0, 1)), worker_setup=setup).serve(once=True)

    assert alongside(serve, bobs_are_done, release.touch, 10) == 0
    side = yaml.safe_load((box.outbox / alice.login / "s.timing.yaml").read_text())
    assert side["status"] == "ok" and side["shape"] == {"m": 200, "k": 200, "n": 200}, "the big input, run once"
    assert not (box.outbox / alice.login / "s.1.out").exists() and not staged.exists()


def test_a_flood_that_fills_the_queue_with_old_mtimes_leaves_room_for_a_classmates_file(box, students):
    """Mallory's 40 files, their mtimes set in 2001, fill a queue of 8 (max_queue) before Alice's one is seen.
    Her share of the queue is 4 (max_waiting_per_submitter), the inbox is offered by share, not by age: Alice's
    goes among the first. Before, the flood's files were offered oldest mtime first at every refill, and hers
    came last."""
    alice, mallory = students
    mallory.run('i=0; while [ $i -lt 40 ]; do printf "%s" "$2" > "$1/m$i.txt"; touch -d 2001-01-01 "$1/m$i.txt"; '
                'i=$((i+1)); done', str(box.inbox), small_input(60))  # fmt: skip
    alice.drop(box.inbox, "mine.txt", small_input(61))
    assert serve_once(class_settings(box, max_queue=8, max_waiting_per_submitter=4)) == 0
    finished = {
        p.name: yaml.safe_load(p.read_text())["finished_at"]
        for who in (alice, mallory)
        for p in (box.outbox / who.login).glob("*.timing.yaml")
    }
    assert len(finished) == 41
    before = sum(1 for name, at in finished.items() if name != "mine.timing.yaml" and at < finished["mine.timing.yaml"])
    assert before <= 8, f"{before} of the flood's jobs went before alice's"


def moved_in_by_a_teammate(alice, bob, team, inbox) -> None:
    """Bob keeps his work in the team folder (0644: his, his group reads it); Alice moves it into the inbox."""
    bob.run('printf %s "$2" > "$1/work.txt"', str(team), small_input(50))
    alice.run('mv "$1/work.txt" "$2/hw1.txt"', str(team), str(inbox))


def test_a_team_folder_on_the_inbox_filesystem_is_named_at_start(students, capfd):
    """A rename keeps a file's owner: where a team folder (group-writable and setgid, not sticky) shares the
    inbox's filesystem, Alice moves Bob's file from it into the inbox, and it is a job in Bob's name. The
    daemon cannot tell a moved file from a dropped one: at start it names the folder and says how to give the
    spool a filesystem of its own. Old code: nothing said."""
    alice, bob = students
    with classbox.filesystem_of_its_own() as fs:
        b = classbox.lay_out(fs)
        team = classbox.team_folder(fs / "team")
        moved_in_by_a_teammate(alice, bob, team, b.inbox)
        assert (b.inbox / "hw1.txt").stat().st_uid == bob.uid, "a rename keeps the owner"
        assert serve_once(class_settings(b)) == 0
        said = "".join(capfd.readouterr())  # structlog prints to stdout until configured, then to stderr
        assert f"the inbox's filesystem (from {fs}) holds 1 folder where one user may move another's file" in said
        assert f"{team} (2770 root:{classbox.GROUP})" in said and "systemd/install.sh --spool-image SIZE" in said
        assert yaml.safe_load((b.outbox / bob.login / "hw1.timing.yaml").read_text())["submitter"] == bob.login


def test_on_a_filesystem_of_its_own_the_inbox_takes_a_teammates_file_only_as_its_copiers(students, capfd):
    """The spool on a mount of its own, the team folder elsewhere: Alice cannot rename (nor link) Bob's file
    into the inbox (EXDEV); ``mv`` then copies it, and the copy is hers, so the job is hers and none is made
    in Bob's name. The daemon says at start that its inbox's filesystem holds no such folder."""
    alice, bob = students
    parent = Path(tempfile.mkdtemp(prefix="mmd-team-"))  # on /tmp's filesystem
    try:
        parent.chmod(0o755)
        team = classbox.team_folder(parent / "team")
        with classbox.filesystem_of_its_own() as fs:
            b = classbox.lay_out(fs)
            bob.run('printf %s "$2" > "$1/work.txt"', str(team), small_input(50))
            rename = alice.run('/usr/bin/python3 -c "import os, sys; os.rename(sys.argv[1], sys.argv[2])" '
                               '"$1/work.txt" "$2/hw1.txt"', str(team), str(b.inbox), check=False)  # fmt: skip
            assert rename.returncode != 0 and "Invalid cross-device link" in rename.stderr, rename.stderr
            link = alice.run('ln "$1/work.txt" "$2/hw1.txt"', str(team), str(b.inbox), check=False)
            assert link.returncode != 0 and "Invalid cross-device link" in link.stderr, link.stderr
            alice.run('mv "$1/work.txt" "$2/hw1.txt"', str(team), str(b.inbox))
            assert (b.inbox / "hw1.txt").stat().st_uid == alice.uid, "a copy is its copier's"
            assert serve_once(class_settings(b)) == 0
            said = "".join(capfd.readouterr())  # structlog prints to stdout until configured, then to stderr
            assert f"the inbox's filesystem (from {fs}) holds no folder where one user may move another's" in said
            assert yaml.safe_load((b.outbox / alice.login / "hw1.timing.yaml").read_text())["submitter"] == alice.login
            assert not (b.outbox / bob.login).exists(), "no job in Bob's name"
    finally:
        shutil.rmtree(parent)


# -- the spool's disk: what each student keeps, in bytes and files (issue 44) ------------------------------------


def kept_by(b: Box, who) -> tuple[int, int]:
    """What the ledger counts for ``who`` now (allocated bytes, files), and it must be what a recount finds."""
    from mmd.spool import Shared, Spool

    ledger = Spool(Shared(b.inbox, b.outbox, state_dir=b.state, class_mode=True)).ledger
    assert ledger is not None
    counted = ledger.usage(who.login)
    recounted = ledger.recount().get(who.login)
    assert recounted == counted, "the counts kept as files came and went differ from a recount"
    return counted.bytes, counted.files


def test_a_students_tiny_jobs_never_list_their_folder(box, students):
    """A student keeping 2,000 files: each of their 1x1 jobs reads their usage from the ledger. Old code: a
    worker listed the student's folder and lstat'ed each file, once a second (130,000 files took over a
    second, so every job listed it again)."""
    from functools import partial

    from . import workerhooks

    alice, _ = students
    folder = box.outbox / alice.login
    alice.drop(box.inbox, "first.txt", "1 1 1\n2\n3\n")
    assert serve_once(class_settings(box)) == 0
    for k in range(2000):  # what earlier jobs left (mmd's files in her folder)
        (folder / f"old{k}.timing.yaml").write_text("x")
    for k in range(20):
        alice.drop(box.inbox, f"t{k}.txt", "1 1 1\n2\n3\n")
    log = box.root / "listings"
    setup = partial(workerhooks.count_listings, str(folder), str(log))
    assert daemon.Daemon(class_settings(box), worker_setup=setup).serve(once=True) == 0
    assert len(list(folder.glob("t*.out"))) == 20
    assert not log.exists(), f"a worker listed the student's folder {len(log.read_text().splitlines())} times"
    assert kept_by(box, alice)[1] == 3 * 21 + 2000


def test_junk_drops_count_against_the_students_bytes_and_refuse_them_once_over_while_classmates_are_served(
    box, students
):
    """Inputs mmd archives are the student's share too: junk refused and kept in state_dir fills Alice's
    quota, her next job is refused for it, Bob's runs. Old code: the quota counted outputs only (the junk's
    error sidecars), so she could fill the spool's disk with junk for everyone."""
    alice, bob = students
    settings = class_settings(box, max_submitter_bytes=600_000)  # four of the junk, and a little
    for k in range(5):
        alice.drop(box.inbox, f"junk{k}.txt", "9 9 9\n" + "junk " * 25_000)  # 125 KB each, read, refused, kept
    assert serve_once(settings) == 0
    used, files = kept_by(box, alice)
    assert used > 4 * 125_000 and files == 10  # the fifth was refused for her quota already: kept as 64 KiB
    alice.drop(box.inbox, "a.txt", small_input(30, n=40))
    bob.drop(box.inbox, "b.txt", small_input(31, n=40))
    assert serve_once(settings) == 0
    error = yaml.safe_load((box.outbox / alice.login / "a.error.yaml").read_text())["error"]
    assert error["kind"] == "limit" and error["setting"] == "max_submitter_bytes" and "mmd rm" in error["reason"]
    assert (box.outbox / bob.login / "b.out").exists()


def test_a_refused_input_is_kept_up_to_its_cap_and_one_refused_unread_is_never_kept_whole(box, students):
    """archive_refused_bytes: a refused input is kept as its first bytes and a note (mmd's file, counted as the
    student's); one refused unread, far larger than its values could take, keeps no more than its header's
    window. Old code: both archived whole."""
    alice, _ = students
    settings = class_settings(box, archive_refused_bytes=10_000)
    alice.rename_in(box.inbox, "junk.txt", b"9 9 9\n" + b"junk " * 40_000)  # read and refused
    alice.rename_in(box.inbox, "huge.txt", b"1 1 1\n1\n1\n" + b" " * (3 << 20))  # refused from its size
    assert serve_once(settings) == 0
    kept = {p.name.split(".")[0]: p for p in (box.state / ".failed").iterdir()}
    assert sorted(kept) == ["huge", "junk"]
    junk = kept["junk"].read_bytes()
    assert junk.startswith(b"9 9 9\njunk junk") and len(junk) < 10_200
    assert junk.endswith(f"of this input's 200006 bytes (archive_refused_bytes); submitted by {alice.login} "
                         f"(uid {alice.uid})\n".encode())  # fmt: skip
    assert kept["huge"].stat().st_size < 10_200 and kept["huge"].stat().st_uid == os.geteuid()
    assert kept_by(box, alice)[1] == 4  # the two heads and the two error sidecars


def test_a_flood_of_tiny_jobs_stops_at_max_submitter_files_and_classmates_are_served(box, students):
    """max_submitter_files: each job keeps three files (its input, output, sidecar); Alice's 1x1 flood is refused
    once hers are at the bound (a burst passes it at most by the jobs of hers that the other workers have in hand,
    not yet archived);
    Bob's job runs. Old code: files were not counted (a 6-byte job's three 4 KiB files read as a few bytes)."""
    alice, bob = students
    settings = class_settings(box, max_submitter_files=30)
    for k in range(60):
        alice.drop(box.inbox, f"f{k}.txt", "1 1 1\n2\n3\n")
    bob.drop(box.inbox, "mine.txt", "1 1 1\n2\n3\n")
    assert serve_once(settings) == 0
    served = len(list((box.outbox / alice.login).glob("*.out")))
    refused = [yaml.safe_load(p.read_text())["error"] for p in (box.outbox / alice.login).glob("*.error.yaml")]
    assert 10 <= served <= 2 * 10 and served + len(refused) == 60
    assert all(e["kind"] == "limit" and e["setting"] == "max_submitter_files" for e in refused)
    assert (box.outbox / bob.login / "mine.out").exists()
    assert kept_by(box, alice)[1] == 3 * served + 2 * len(refused)


def _mount_tmpfs(where, options: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    return r.returncode == 0


def test_free_inodes_below_min_free_inodes_refuse_jobs_as_min_free_bytes_does(tmp_path):
    """A disk with bytes to spare and few inodes left: a job is refused while its free inodes are under
    min_free_inodes, and served once some are free again. Old code: inodes were not looked at, so a flood of
    tiny files used them up and then no one could drop a file nor get a result."""
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, "size=64m,nr_inodes=400"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        inbox, outbox = disk / "inbox", disk / "outbox"
        inbox.mkdir()
        outbox.mkdir()
        settings = config.Settings(inbox=inbox, outbox=outbox, backend="cpu", quiet_seconds=0.05, min_free_inodes=300)
        (inbox / "a.txt").write_text(small_input(40))
        assert serve_once(settings) == 0
        assert (outbox / "a.out").exists()
        filler = disk / "filler"
        filler.mkdir()
        while os.statvfs(disk).f_favail >= 300:
            (filler / str(len(os.listdir(filler)))).touch()
        (inbox / "b.txt").write_text(small_input(41))
        assert serve_once(settings) == 0
        error = yaml.safe_load((outbox / "b.error.yaml").read_text())["error"]
        assert error["kind"] == "limit" and error["setting"] == "min_free_inodes" and "for everyone" in error["reason"]
        for path in list(filler.iterdir())[:20]:
            path.unlink()
        (inbox / "c.txt").write_text(small_input(42))
        assert serve_once(settings) == 0
        assert (outbox / "c.out").exists()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_an_archived_input_dated_2099_is_removed_by_retention_like_any_other(box, students):
    """Retention judges an archived input by when mmd archived it (its own log), never by the mtime its
    dropper set. Old code: an input touched to 2099 was never removed."""
    alice, _ = students
    part = '"$1/.f.part"'
    script = f'printf "1 1 1\\n2\\n3\\n" > {part} && touch -d 2099-01-01 {part} && mv {part} "$1/f.txt"'
    alice.run(script, str(box.inbox))
    assert serve_once(class_settings(box)) == 0
    assert (box.state / ".done" / "f.txt").stat().st_mtime > time.time() + 3600 * 24 * 365
    age_the_archive_log(box, 2 * 86400)
    assert serve_once(class_settings(box, retention_days=1.0)) == 0
    assert os.listdir(box.state / ".done") == []
    assert kept_by(box, alice) == (8192, 2)  # its output and sidecar, newer: kept
