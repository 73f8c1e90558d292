"""The spool protocol: names, completeness, claim races, output versions, archive, recovery."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from mmd import spool
from mmd.errors import SpoolError
from mmd.fileops import FileOps
from mmd.spool import CLAIM_SUFFIX, SPARE_DIR, Readiness, Scanner, Shared, Spool, finished


@pytest.mark.parametrize("name", ["m.txt", "m", "a b.txt", "m@tile=16.txt", "x.out"])
def test_job_names(name):
    assert spool.is_job_name(name)


@pytest.mark.parametrize("name", [".m.txt", ".work", ".mmd.lock", "m.txt.tmp", "m.part", "m.txt~", ""])
def test_ignored_names(name):
    assert not spool.is_job_name(name)


def test_resolve_output_versions_past_any_taken_name(tmp_path):
    assert spool.resolve_output(tmp_path, "m") == (0, [])
    (tmp_path / "m.error.yaml").write_text("old refusal")
    version, collided = spool.resolve_output(tmp_path, "m")
    assert (version, collided) == (1, ["m.error.yaml"])
    (tmp_path / "m.1.out").write_text("")
    assert spool.resolve_output(tmp_path, "m") == (2, ["m.error.yaml", "m.1.out"])
    assert spool.output_path(tmp_path, "m", 2).name == "m.2.out"


def test_resolve_output_with_injected_exists(tmp_path):
    taken = {tmp_path / "m.out", tmp_path / "m.1.timing.yaml"}
    assert spool.resolve_output(tmp_path, "m", exists=taken.__contains__) == (2, ["m.out", "m.1.timing.yaml"])


def test_scan_skips_folders_and_ignored_names_and_sorts_by_mtime(tmp_path):
    for i, name in enumerate(["b.txt", "a.txt", ".hidden", "c.part", "d.tmp"]):
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, ns=(10**18 + i, 10**18 + i))
    (tmp_path / "sub").mkdir()
    os.symlink("/etc/passwd", tmp_path / "link.txt")
    names = [c.name for c in Scanner(tmp_path).scan()]
    assert names[:2] == ["b.txt", "a.txt"]
    assert set(names) == {"a.txt", "b.txt", "link.txt"}
    assert Scanner(tmp_path / "missing").scan() == []


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_readiness_waits_for_quiet():
    clock, wall = Clock(), Clock()
    r = Readiness(0.5, clock=clock, wall=wall)
    fresh = int(wall.t * 1e9)
    assert not r.observe("m", 10, fresh)
    assert r.pending == ["m"] and r.due_in() == pytest.approx(0.5)
    clock.t += 0.3
    wall.t += 0.3
    grown = int(wall.t * 1e9)
    assert not r.observe("m", 20, grown)  # it grew: the wait starts again
    clock.t += 0.4
    wall.t += 0.4
    assert not r.observe("m", 20, grown)
    clock.t += 0.2
    wall.t += 0.2
    assert r.observe("m", 20, grown)
    assert r.pending == [] and r.due_in() is None


def test_readiness_old_mtime_is_quiet_at_once():
    wall = Clock()
    r = Readiness(0.5, clock=Clock(), wall=wall)
    assert r.observe("old", 5, int((wall.t - 10) * 1e9))


def test_readiness_waits_for_a_file_being_written_until_its_close():
    """A write seen and no close yet: a quiet moment (a paused scp) does not make it complete; only
    WRITING_QUIET_S unchanged does (its close missed), or the daemon's close or rename event."""
    from mmd.spool.scanning import WRITING_QUIET_S

    clock, wall = Clock(), Clock()
    r = Readiness(0.5, clock=clock, wall=wall)
    r.writing("m")
    paused = int(wall.t * 1e9)
    assert not r.observe("m", 10, paused)
    assert r.due_in() == pytest.approx(WRITING_QUIET_S)
    clock.t += 10
    wall.t += 10
    assert not r.observe("m", 10, paused)
    clock.t += WRITING_QUIET_S
    wall.t += WRITING_QUIET_S
    assert r.observe("m", 10, paused)
    assert r.pending == []
    r.writing("gone")
    assert r.pending == ["gone"]
    r.forget("gone")
    assert not r.observe("gone", 1, int(wall.t * 1e9)) and r.due_in() == pytest.approx(0.5)


def jobs_in(work):
    return sorted(p.name for p in work.iterdir() if not p.name.startswith("."))


def spares(work):
    """The emptied job folders this process keeps for its later claims."""
    return sorted(p for p in work.iterdir() if p.name.startswith(spool.SPARE_DIR))


def _drop(inbox, name="m.txt", text="2\n1 2\n3 4\n1 0\n0 1\n"):
    inbox.mkdir(exist_ok=True)
    (inbox / name).write_text(text)


def test_claim_moves_into_work_with_id_and_version(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    assert c is not None and c.regular and not c.resumed
    assert c.path == s.shared.work / f"{c.job_id}.0" / "m.txt"
    assert c.output == s.shared.outbox / "m.out"
    assert not (s.shared.inbox / "m.txt").exists()
    assert s.claims.claim("m.txt") is None  # gone: harmless
    assert jobs_in(s.shared.work) == [c.path.parent.name]


def test_claim_race_has_one_winner(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    for round_ in range(20):
        _drop(s.shared.inbox, f"r{round_}.txt")
    results: list = []
    barrier = threading.Barrier(4)

    def claimer():
        mine = Spool(Shared(s.shared.inbox, s.shared.outbox))
        barrier.wait()
        for round_ in range(20):
            results.append(mine.claims.claim(f"r{round_}.txt"))

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [c for c in results if c is not None]
    assert sorted(c.name for c in won) == sorted(f"r{i}.txt" for i in range(20))
    assert len(jobs_in(s.shared.work)) == 20  # losers left no job folders


def test_claim_versions_output_and_reports_collision(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    (s.shared.outbox / "m.out").write_text("someone else's")
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    assert c.output.name == "m.1.out" and c.version == 1
    assert c.collision() == {"wanted": "m.out", "existing": ["m.out"], "used": "m.1.out"}


def test_claim_symlink_moves_the_link_never_the_target(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    os.symlink(secret, s.shared.inbox / "link.txt")
    c = s.claims.claim("link.txt")
    assert c is not None and not c.regular
    assert c.path.is_symlink() and secret.read_text() == "do not read"


def test_archive_done_failed_and_no_overwrite(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    first = s.claims.claim("m.txt")
    assert s.archive.add(first, True) == s.shared.done / "m.txt"
    _drop(s.shared.inbox, text="second")
    second = s.claims.claim("m.txt")
    target = s.archive.add(second, True)
    assert target == s.shared.done / f"m.{second.job_id}.txt" and target.read_text() == "second"
    _drop(s.shared.inbox, "bad.txt")
    assert s.archive.add(s.claims.claim("bad.txt"), False) == s.shared.failed / "bad.txt"
    assert jobs_in(s.shared.work) == []
    assert [list(p.iterdir()) for p in spares(s.shared.work)] == [[]]  # the emptied folder, kept for the next claim


def test_a_group_frees_no_inode_its_reservations_and_folders_are_used_again(tmp_path):
    """A group's jobs are all claimed before the first is archived: their reservations and job folders are
    kept by the process and taken by the next group's jobs, never removed (on ext4 without a journal each
    freed inode makes new files slower for seconds). A process's spares go when it stops; a dead one's are
    swept with its temporaries."""
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()

    def group(tag: str) -> set[int]:
        names = [f"{tag}{i}.txt" for i in range(16)]
        for name in names:
            _drop(s.shared.inbox, name)
        claims = [s.claims.claim(name) for name in names]
        inodes = {c.reservation.stat().st_ino for c in claims} | {c.path.parent.stat().st_ino for c in claims}
        for c in claims:
            s.archive.add(c, True)
        return inodes

    def kept() -> list[Path]:
        return [p for p in [*s.shared.outbox.iterdir(), *s.shared.work.iterdir()] if ".spare" in p.name]

    first = group("a")
    assert len(first) == 32 and {p.stat().st_ino for p in kept()} == first
    assert os.listdir(s.shared.outbox) == [], "the outbox shows its readers results only: the spares are in .work"
    assert group("b") == first  # the same inodes, written anew
    assert not [p for p in s.shared.outbox.iterdir() if p.name.endswith(CLAIM_SUFFIX)], "every reservation released"
    s.spares.drop()
    assert kept() == []
    dead = subprocess.Popen(["true"])  # a pid that has exited
    dead.wait()
    (s.shared.work / f"{SPARE_DIR}.{dead.pid}.0").mkdir()
    (s.shared.work / f"..spare0{CLAIM_SUFFIX}.{dead.pid}.tmp").write_text("x - 1\n")
    (s.shared.outbox / f"..spare0{CLAIM_SUFFIX}.{dead.pid}.tmp").write_text("x - 1\n")  # where an older mmd kept them
    s.archive.sweep_temporaries()
    assert kept() == []


def test_where_work_is_on_another_filesystem_released_reservations_are_removed(tmp_path):
    """A spare reservation is kept by a rename into .work, which cannot cross filesystems."""
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        if os.stat(other).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm is on the test folder's filesystem")
        s = Spool(Shared(Path(other) / "in", tmp_path / "out"))
        s.shared.prepare()
        for name in ("a.txt", "b.txt"):
            _drop(s.shared.inbox, name)
            c = s.claims.claim(name)
            assert c.reservation is not None and c.reservation.exists()
            s.archive.add(c, True)
            assert not c.reservation.exists()
        assert os.listdir(s.shared.outbox) == [] and not [p for p in s.shared.work.iterdir() if p.is_file()]


def test_a_spare_reservation_holds_only_its_new_text(tmp_path):
    """A spare is written over from its start, not emptied first (freeing its block costs a discard where the
    filesystem is mounted with it): what a longer text left past the new one is cut off."""
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox, "a.txt")
    s.archive.add(s.claims.claim("a.txt"), True)
    [spare] = [p for p in s.shared.work.iterdir() if p.name.endswith(".tmp")]
    spare.write_bytes(b"0123456789ab a-longer-host-name-than-any 4194304 and more\n")  # what another owner left
    inode = spare.stat().st_ino
    _drop(s.shared.inbox, "b.txt")
    c = s.claims.claim("b.txt")
    assert c.reservation.stat().st_ino == inode  # the spare, written anew
    assert c.reservation.read_bytes() == f"{c.job_id} - {os.getpid()}\n".encode()
    assert spool.read_reservation(c.reservation) == (c.job_id, "-", os.getpid())


def _sidecar(path, job):
    path.write_text(yaml.safe_dump({"status": "ok", "job": job}))


def test_resume_finds_work_and_knows_finished_jobs(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    for name in ("a.txt", "b.txt", "c.txt"):
        _drop(s.shared.inbox, name)
    a, _b, _c = (s.claims.claim(n) for n in ("a.txt", "b.txt", "c.txt"))
    (s.shared.work / "0123456789ab.0").mkdir()  # killed between mkdir and rename
    (s.shared.work / "not-ours").mkdir()
    _sidecar(s.shared.outbox / "a.timing.yaml", a.job_id)  # finished, not archived
    (s.shared.outbox / "b.out").write_text("partial commit")  # output, no sidecar
    _sidecar(s.shared.outbox / "c.timing.yaml", "ffffffffffff")  # someone else's sidecar

    resumed = {r.name: r for r in Spool(Shared(s.shared.inbox, s.shared.outbox)).claims.resumable()}
    assert set(resumed) == {"a.txt", "b.txt", "c.txt"}
    assert all(r.resumed for r in resumed.values())
    assert resumed["a.txt"].job_id == a.job_id and resumed["a.txt"].output == a.output
    assert finished(resumed["a.txt"]) == (True, s.shared.outbox / "a.timing.yaml")
    assert finished(resumed["b.txt"]) is None
    assert finished(resumed["c.txt"]) is None
    assert not (s.shared.work / "0123456789ab.0").exists()
    assert (s.shared.work / "not-ours").exists()


def test_error_sidecar_counts_as_finished(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    _sidecar(s.shared.outbox / "m.error.yaml", c.job_id)
    assert finished(c) == (False, s.shared.outbox / "m.error.yaml")


def test_sweep_removes_temporaries_of_dead_processes(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    dead = s.shared.outbox / ".m.out.999999999.tmp"
    dead_spare = s.shared.outbox / "..spare.out.999999999.tmp"  # an empty file an older mmd's killed worker made ahead
    mine = s.shared.outbox / f".m.out.{os.getpid()}.tmp"
    other = s.shared.outbox / ".notes.tmp"
    for p in (dead, dead_spare, mine, other):
        p.write_text("")
    assert sorted(s.archive.sweep_temporaries()) == sorted([dead, dead_spare])
    assert mine.exists() and other.exists()


# ---------------------------------------------------------------------------
# hostile entries and names (see also tests/test_reliability.py)


@pytest.mark.parametrize(
    "name",
    [
        "m.txt",
        "with space.txt",
        "données.txt",
        "-rf.txt",
        "a..b.txt",
        "new\nline.txt",
        "x\udcff.txt",
        "evil\u202etxt.exe",
        "x" * 300,
        "é" * 200 + ".txt",
        "y" * 250 + "." + "z" * 40,
    ],
)
def test_safe_name_is_one_short_printable_name(name):
    safe = spool.safe_name(name)
    assert "/" not in safe and safe not in (".", "..") and safe.isprintable()
    assert len(safe.encode()) <= spool.MAX_NAME_BYTES
    assert len(f".{safe}.9999.timing.yaml.4194304.tmp".encode()) <= 255 + 1  # the longest derived name
    if name.isprintable() and len(name.encode()) <= spool.MAX_NAME_BYTES and "\u202e" not in name:
        assert safe == name


def test_safe_names_of_long_names_stay_apart():
    assert spool.safe_name("a" * 300 + "1.txt") != spool.safe_name("a" * 300 + "2.txt")


def test_shown_escapes_controls():
    assert spool.shown("a\nb\x1b\udcff") == "a\\nb\\x1b\\udcff"
    assert spool.shown("données x.txt") == "données x.txt"


@given(st.text(alphabet=st.sampled_from("a .~\t\x7f\x85é\u202e\udcff"), max_size=8))
def test_plain_names_are_kept_and_shown_as_they_are(name):
    """A printable ASCII name needs no escape nor replacement; any other is looked at character by character."""
    slow_shown = "".join(ch if ch.isprintable() and ch not in "\u202e" else ascii(ch)[1:-1] for ch in name)
    assert spool.shown(name) == slow_shown
    assert (spool.safe_name(name) == name) == (slow_shown == name)  # this alphabet's unprintables are controls


def test_claim_refuses_hard_links_and_renames_hostile_names(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    outside = tmp_path / "outside.txt"
    outside.write_text("1\n2\n3\n")
    os.link(outside, s.shared.inbox / "hard.txt")
    c = s.claims.claim("hard.txt")
    assert c.regular and "hard links" in c.problem
    assert outside.read_text() == "1\n2\n3\n"
    _drop(s.shared.inbox, "a\nb.txt")
    c = s.claims.claim("a\nb.txt")
    assert c.name == "a_b.txt" and c.original == "a\nb.txt" and c.output.name == "a_b.out" and c.problem is None


def test_entry_replaced_between_event_and_claim(tmp_path):
    """What the claim's rename takes is what is there at that moment; links are found by lstat after it."""
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox, "m.txt", "first")
    (tmp_path / "other").write_text("second")
    os.rename(tmp_path / "other", s.shared.inbox / "m.txt")  # replaced after the event
    c = s.claims.claim("m.txt")
    assert c.path.read_text() == "second" and c.problem is None
    os.symlink(tmp_path / "other-target", s.shared.inbox / "n.txt")
    c = s.claims.claim("n.txt")
    assert "symbolic link" in c.problem and c.path.is_symlink()
    _drop(s.shared.inbox, "gone.txt")
    os.unlink(s.shared.inbox / "gone.txt")
    assert s.claims.claim("gone.txt") is None


def test_holding_keeps_the_job_and_its_reservation_and_take_back_returns_it(tmp_path):
    """Nothing is put back into the inbox any more (a hard link there is refused for another user's file under
    fs.protected_hardlinks): a job the outbox refuses stays claimed in .work, held, and is taken back."""
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox, "m.txt", "old")
    c = s.claims.claim("m.txt")
    _drop(s.shared.inbox, "m.txt", "new")
    held = s.attempts.hold(c, "cannot write out/m.out: No space left on device", output_failed=True)
    assert (held.holds, held.output_failures, held.reason) == (1, 1, "cannot write out/m.out: No space left on device")
    assert c.path.read_text() == "old" and (s.shared.inbox / "m.txt").read_text() == "new"
    assert spool.read_reservation(c.reservation)[0] == c.job_id, "the held job keeps its output name"
    assert s.reservations.sweep(s.claims.in_work()) == []
    [job] = spool.held_jobs(s.shared.inbox)
    assert (job.job, job.file, job.holds, job.host) == (c.job_id, "m.txt", 1, None)
    [back] = s.claims.take_back()
    assert back.again and not back.resumed and back.path == c.path
    assert s.claims.take_back() == []
    assert s.archive.add(back, True) == s.shared.done / "m.txt"
    assert jobs_in(s.shared.work) == [] and spool.held_jobs(s.shared.inbox) == []
    assert not c.reservation.exists() and [list(p.iterdir()) for p in spares(s.shared.work)] == [[]]


def test_prepare_refuses_planted_links_and_world_writable_outbox(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.inbox.mkdir()
    os.symlink(tmp_path, s.shared.inbox / ".failed")
    with pytest.raises(SpoolError, match="not a folder"):
        s.shared.prepare()
    os.unlink(s.shared.inbox / ".failed")
    s.shared.outbox.mkdir(exist_ok=True)
    os.chmod(s.shared.outbox, 0o777)
    with pytest.raises(SpoolError, match="world-writable"):
        s.shared.prepare()


# ---------------------------------------------------------------------------
# stale reservations (issue 15: an empty .x.claim blocked x.out for good)

DEAD_PID = 2**22 + 12345  # above pid_max's default: never alive


def _reservation(outbox, stem, text, age_s=0.0):
    path = outbox / f".{stem}.claim"
    path.write_text(text)
    if age_s:
        old = os.stat(path).st_mtime - age_s
        os.utime(path, (old, old))
    return path


def test_an_empty_reservation_left_by_a_kill_is_taken_over_by_its_job(tmp_path):
    """Killed between creating ``.m.claim`` and writing it: the resumed job takes it and keeps ``m.out``."""
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    c.reservation.write_bytes(b"")  # what a kill -9 between O_CREAT and write leaves
    later = Spool(Shared(s.shared.inbox, s.shared.outbox))
    [resumed] = later.claims.resumable()
    assert later.reservations.sweep(later.claims.resumable()) == [], "an empty reservation its job maps to is kept"
    settled = later.reservations.settle(resumed)
    assert (settled.version, settled.output.name) == (0, "m.out")
    assert spool.read_reservation(s.shared.outbox / ".m.claim")[0] == c.job_id
    assert not (s.shared.outbox / ".m.1.claim").exists()


def test_a_reservation_is_never_seen_half_written(tmp_path, monkeypatch):
    """The reservation is written in full under a temporary name and linked into place: a kill between
    its creation and its write cannot leave an empty ``.m.claim``."""
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    seen = []
    real_write = os.write

    def write(fd, data):
        seen.extend(p.name for p in s.shared.outbox.iterdir() if p.name.endswith(".claim"))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    monkeypatch.undo()
    assert seen == [] and spool.read_reservation(c.reservation)[0] == c.job_id


def test_stale_reservations_are_recognised_by_their_owner(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    for name in ("c.txt", "h.txt"):
        _drop(s.shared.inbox, name)
    c, h = s.claims.claim("c.txt"), s.claims.claim("h.txt")
    h.reservation.write_bytes(b"")  # its job is in .work: the job's own, left for it to take over
    gone = _reservation(s.shared.outbox, "a", f"aaaaaaaaaaaa - {DEAD_PID}\n")  # its daemon is dead, its job gone
    ours = _reservation(s.shared.outbox, "b", f"bbbbbbbbbbbb - {os.getpid()}\n")  # this process's, its job gone
    other_host = _reservation(s.shared.outbox, "d", f"dddddddddddd node9 {DEAD_PID}\n")  # another host's: never ours
    other_live = _reservation(s.shared.outbox, "e", "eeeeeeeeeeee - 1\n")  # a live process (another daemon) holds it
    empty_old = _reservation(s.shared.outbox, "f", "", age_s=3600)  # killed between create and write, long ago
    empty_new = _reservation(s.shared.outbox, "g", "")  # perhaps being written this instant
    later = Spool(Shared(s.shared.inbox, s.shared.outbox))
    removed = later.reservations.sweep(later.claims.in_work())
    assert sorted(p.name for p in removed) == sorted(p.name for p in (gone, ours, empty_old))
    for kept in (c.reservation, h.reservation, other_host, other_live, empty_new):
        assert kept.exists(), kept.name


def test_on_a_shared_inbox_only_this_hosts_reservations_are_swept(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out", "node0"))
    s.shared.prepare()
    mine = _reservation(s.shared.outbox, "a", f"aaaaaaaaaaaa node0 {DEAD_PID}\n")
    theirs = _reservation(s.shared.outbox, "b", f"bbbbbbbbbbbb node1 {DEAD_PID}\n")
    unowned = _reservation(s.shared.outbox, "c", f"cccccccccccc - {DEAD_PID}\n")
    empty_old = _reservation(s.shared.outbox, "f", "", age_s=3600)  # whose? another host's, perhaps: left alone
    assert s.reservations.sweep(s.claims.in_work()) == [mine]
    assert theirs.exists() and unowned.exists() and empty_old.exists()


# ---------------------------------------------------------------------------
# the attempt counter (what the daemon's limit on crashing jobs counts)


def test_attempt_counts_starts_and_a_hold_ends_one_cleanly(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    assert s.attempts.read(c) == spool.Attempts()
    assert s.attempts.record_start(c) == 1  # the first start
    record = c.path.parent / spool.ATTEMPTS_NAME
    assert not record.exists(), "a fresh claim's first start writes nothing: small jobs pay no fsync for it"
    later = Spool(Shared(s.shared.inbox, s.shared.outbox))  # the process running it died
    [c] = later.claims.resumable()
    assert later.attempts.record_start(c) == 2  # started again
    later.attempts.hold(c, "disk full", output_failed=True)  # this start ended cleanly: not a crash
    assert later.attempts.record_start(c) == 1  # taken back after the pause
    a = later.attempts.read(c)
    assert (a.starts, a.settled, a.holds, a.output_failures, a.unfinished) == (3, 2, 1, 1, 1)
    assert json.loads(record.read_text())["starts"] == 3
    assert [p.name for p in c.path.parent.iterdir()] == ["m.txt", spool.ATTEMPTS_NAME], "no temporary left"
    again = Spool(Shared(s.shared.inbox, s.shared.outbox))
    assert [r.name for r in again.claims.resumable()] == ["m.txt"], "the record is not a job"


def test_attempts_go_with_the_job_when_its_folder_is_renamed(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    s.attempts.record_start(c)
    os.unlink(c.reservation)  # a kill before the reservation; another job then took m.out's version
    _sidecar(s.shared.outbox / "m.timing.yaml", "ffffffffffff")
    later = Spool(Shared(s.shared.inbox, s.shared.outbox))
    [resumed] = later.claims.resumable()
    moved = later.reservations.settle(resumed)
    assert moved.version == 1 and moved.path.parent != c.path.parent
    assert later.attempts.record_start(moved) == 2


def test_an_archived_job_leaves_no_record_for_the_next_one(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    s.attempts.record_start(c)
    s.archive.add(c, True)
    _drop(s.shared.inbox, "n.txt")
    n = s.claims.claim("n.txt")  # in the spare folder m.txt's job left
    assert n.path.parent.name.startswith(n.job_id) and s.attempts.read(n) == spool.Attempts()


def test_a_folder_whose_record_cannot_be_removed_is_no_later_jobs(tmp_path):
    """An archived job's folder whose attempts record cannot be removed (EIO) is never a later claim's: a later
    job held once counts its own hold only; the record is removed at the next release."""

    class RecordStays(FileOps):
        fail = True

        def unlink(self, path: Path) -> None:
            if self.fail and path.name == spool.ATTEMPTS_NAME:
                raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
            super().unlink(path)

    ops = RecordStays()
    s = Spool(Shared(tmp_path / "in", tmp_path / "out", ops=ops))
    s.shared.prepare()
    _drop(s.shared.inbox, "a.txt")
    s.attempts.hold(s.claims.claim("a.txt"), "cannot write out/a.out: No space left on device", output_failed=True)
    [a] = s.claims.take_back()
    s.archive.add(a, True)  # done; its folder keeps the record of its hold
    ops.fail = False
    _drop(s.shared.inbox, "b.txt")
    b = s.claims.claim("b.txt")
    held = s.attempts.hold(b, "cannot write out/b.out: No space left on device", output_failed=True)
    assert (held.holds, held.output_failures) == (1, 1)
    [b] = s.claims.take_back()
    s.archive.add(b, True)
    assert [p for p in s.shared.work.rglob("*") if p.parent != s.shared.work] == []  # every job folder empty
    assert spool.held_jobs(s.shared.inbox) == []


ATTEMPT_THEN_KILL = """
import os, signal, sys
from pathlib import Path
from mmd.spool import Shared, Spool
s = Spool(Shared(Path(sys.argv[1]), Path(sys.argv[2])))
[claim] = s.claims.resumable()
print(s.attempts.record_start(claim), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.integration
def test_the_attempt_count_survives_kill_9(tmp_path):
    """Each start is on disk before attempts.record_start() returns: a process killed at once leaves it counted."""
    import subprocess
    import sys

    from .conftest import mmd_env

    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")  # the claim is the first start (it writes nothing); each resumed start is written
    for expected in (2, 3, 4):
        r = subprocess.run(
            [sys.executable, "-c", ATTEMPT_THEN_KILL, str(s.shared.inbox), str(s.shared.outbox)],
            env=mmd_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == -9 and r.stdout.strip() == str(expected), r.stderr
    assert Spool(Shared(s.shared.inbox, s.shared.outbox)).attempts.read(c).unfinished == 4


def test_a_job_without_its_reservation_never_removes_that_versions_output(tmp_path):
    """Held before it could reserve (the outbox refused): m.out may be another job's by now, never removed."""
    import dataclasses

    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    os.unlink(c.reservation)
    unreserved = dataclasses.replace(c, reservation=None, unreserved="cannot reserve .m.claim: No space left on device")
    (s.shared.outbox / "m.out").write_text("another job's")
    _sidecar(s.shared.outbox / "m.timing.yaml", "ffffffffffff")
    assert s.attempts.discard_outputs(unreserved) == []
    assert (s.shared.outbox / "m.out").read_text() == "another job's" and (s.shared.outbox / "m.timing.yaml").exists()
    _sidecar(s.shared.outbox / "m.error.yaml", c.job_id)  # its own sidecar (it carries its job id) does go
    s.attempts.discard_outputs(unreserved)
    assert not (s.shared.outbox / "m.error.yaml").exists() and (s.shared.outbox / "m.out").exists()


# ---------------------------------------------------------------------------
# what the daemon's worker processes need: a given job id, an owner pid, jobs expected in hand


def test_claim_takes_the_job_id_it_is_given_and_has_it_in_hand_at_once(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt", job_id="0123456789ab")
    assert c.job_id == "0123456789ab" and c.path.parent.name == "0123456789ab.0"
    assert spool.read_reservation(c.reservation)[0] == "0123456789ab"
    assert s.reservations.sweep([]) == [], "in hand from the claim on: its reservation is not stale"
    assert s.claims.claim("gone.txt", job_id="ba9876543210") is None  # nothing to claim: the id is not kept in hand
    stray = _reservation(s.shared.outbox, "gone", f"ba9876543210 - {os.getpid()}\n")
    assert s.reservations.sweep([]) == [stray]


def test_reservations_are_written_and_swept_in_the_owner_pids_name(tmp_path):
    """A worker process reserves in its daemon's name (``owner_pid``); the daemon's sweep takes it for its own."""
    daemon = Spool(Shared(tmp_path / "in", tmp_path / "out", owner_pid=DEAD_PID))
    daemon.shared.prepare()
    assert daemon.shared.owner_pid == DEAD_PID and Shared(tmp_path / "in", tmp_path / "out").owner_pid == os.getpid()
    _drop(daemon.shared.inbox)
    worker = Spool(Shared(daemon.shared.inbox, daemon.shared.outbox, owner_pid=DEAD_PID))
    c = worker.claims.claim("m.txt")
    assert c.reservation.read_text() == f"{c.job_id} - {DEAD_PID}\n"
    live = _reservation(daemon.shared.outbox, "x", f"cccccccccccc - {os.getpid()}\n")  # another daemon, alive
    assert daemon.reservations.sweep([]) == [c.reservation], "the owner's own reservation, its job not in hand"
    assert live.exists()


def test_the_attempts_temporary_carries_the_owner_pid(tmp_path):
    made = []

    class Recording(FileOps):
        def open_exclusive(self, path, mode=0o644):
            made.append(path.name)
            return super().open_exclusive(path, mode)

    s = Spool(Shared(tmp_path / "in", tmp_path / "out", ops=Recording(), owner_pid=DEAD_PID))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    s.attempts.hold(c, "disk full")
    assert f"{spool.ATTEMPTS_NAME}.{DEAD_PID}.tmp" in made
    assert [p.name for p in c.path.parent.iterdir()] == ["m.txt", spool.ATTEMPTS_NAME]


def test_a_job_expected_in_hand_keeps_the_reservation_another_process_makes_for_it(tmp_path):
    """The daemon expects a job id, a worker claims with it in the daemon's name: no sweep takes it for stale."""
    daemon = Spool(Shared(tmp_path / "in", tmp_path / "out", owner_pid=DEAD_PID))
    daemon.shared.prepare()
    for name in ("a.txt", "b.txt"):
        _drop(daemon.shared.inbox, name)
    daemon.in_hand.expect("aaaaaaaaaaaa")
    # another process's spool, as far as it knows
    worker = Spool(Shared(daemon.shared.inbox, daemon.shared.outbox, owner_pid=DEAD_PID))
    a = worker.claims.claim("a.txt", job_id="aaaaaaaaaaaa")
    b = worker.claims.claim("b.txt", job_id="bbbbbbbbbbbb")
    assert daemon.reservations.sweep([]) == [b.reservation], "only the job the daemon does not expect"
    assert a.reservation.exists()
    daemon.in_hand.forget("aaaaaaaaaaaa")
    assert daemon.reservations.sweep([]) == [a.reservation]


def test_in_work_lists_the_jobs_in_work_without_taking_them_in_hand(tmp_path):
    s = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    s.shared.prepare()
    _drop(s.shared.inbox)
    c = s.claims.claim("m.txt")
    (s.shared.work / "0123456789ab.0").mkdir()  # an empty job folder: listed by no one, and left as it is
    other = Spool(Shared(s.shared.inbox, s.shared.outbox))
    [found] = other.claims.in_work()
    assert (found.job_id, found.path, found.resumed) == (c.job_id, c.path, True)
    assert (s.shared.work / "0123456789ab.0").is_dir()
    assert other.reservations.sweep([]) == [c.reservation], "listed, not in hand"


def test_a_zombie_is_not_alive(tmp_path):
    """A process that has exited but is not reaped yet owns nothing: its temporaries and reservations are
    stale (a killed daemon's workers stay zombies where init does not reap them)."""
    import subprocess
    import time
    from pathlib import Path

    from mmd.spool import pid_alive

    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # exited, not waited for: a zombie
        if Path(f"/proc/{child.pid}/stat").read_bytes().split(b") ")[1][:1] == b"Z":
            break
        time.sleep(0.01)
    assert not pid_alive(child.pid)
    child.wait()
    assert not pid_alive(child.pid)
    assert pid_alive(os.getpid())
