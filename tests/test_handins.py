"""A student hands in a kernel (class mode, ``student_kernels``): NAME.cu dropped in the inbox, compiled as theirs,
kept in mmd's store, answered with ``NAME.handin.yaml``; their jobs name it, no one else's do.

Real Unix accounts (tests/classbox.py): the hand-in is a student's own file in the class's drop box. NVRTC needs
no GPU, so every hand-in compiles here as on the lab box (the ``nvrtc`` extra).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import yaml

from mmd.cli.status_cmd import render_mine
from mmd.config import Settings
from mmd.errors import ConfigError, KernelError
from mmd.job import describe
from mmd.kernelfile.store import KernelStore
from mmd.record import Context
from mmd.spool import Candidate, Scanner
from mmd.spool.handins import HandInSettings, is_handin, receive
from mmd.spool.ledger import Ledger, Usage, kept_kernels, usage_of
from mmd.spool.shared import Shared

from . import classbox
from .classbox import Box, Student
from .conftest import run_mmd, wait_for
from .test_class import asks, held_for, small_input, start_class_daemon, stop_class_daemon
from .test_daemon import check_ok, error_of
from .test_kernelfile_run import SQUARE, fake_gpu, integer_input

users, students, box = classbox.users, classbox.students, classbox.box  # the fixtures

#: Each hand-in compiles in a child process (NVRTC under limits); the students are real accounts.
pytestmark = [pytest.mark.serial, pytest.mark.integration]

P1 = (
    "__global__ void MatrixMulKernel(float* Md, float* Nd, float* Pd, int Width) {\n"
    "    int Row = blockIdx.y * TILE_WIDTH + threadIdx.y;\n"
    "    int Col = blockIdx.x * TILE_WIDTH + threadIdx.x;\n"
    "    float s = 0;\n"
    "    for (int k = 0; k < Width; ++k) s += Md[Row * Width + k] * Nd[k * Width + Col];\n"
    "    Pd[Row * Width + Col] = s;\n"
    "}\n"
)
BROKEN = P1.replace("float s = 0;", "float s = 0\n")


def _settings(b: Box, allowed: bool = True) -> Settings:
    return Settings(inbox=b.inbox, outbox=b.outbox, state_dir=b.state, class_mode=True, student_kernels=allowed)


def _hand_in(
    b: Box, who: Student, name: str, text: str, allowed: bool = True, cache: Path | None = None, **limits: int
) -> dict:
    """``who`` drops ``name`` in the inbox by the docs' recipe; mmd takes it as the daemon does; its answer."""
    who.drop(b.inbox, name, text)
    shared = Shared(b.inbox, b.outbox, state_dir=b.state, class_mode=True)
    receive(b.inbox, name, who.uid, shared.make_output_folder(who.uid), KernelStore.of(b.state),
            HandInSettings(allowed, cache, **limits), Ledger(shared), failed=shared.failed)  # fmt: skip
    stem = name.removesuffix(".cu")
    return yaml.safe_load((b.outbox / who.login / f"{stem}.handin.yaml").read_text())


def _job(b: Box, who: Student, name: str, allowed: bool = True):
    return describe(b.inbox / name, b.outbox / "x.out", _settings(b, allowed), context=Context(submitter=who.login))


def test_a_hand_in_is_kept_and_answered_with_what_mmd_understood_and_the_tiles_it_runs(box, students, tmp_path):
    alice, _ = students
    answer = _hand_in(box, alice, "p1.cu", P1, cache=tmp_path)
    assert answer["status"] == "kept" and answer["handin"] == "p1.cu" and answer["kernel"] == "p1"
    assert answer["entry"] == "MatrixMulKernel" and answer["submitter"] == alice.login
    assert answer["parameters"] == ["Md A", "Nd B", "Pd C", "Width width"]
    assert [(t["tile"], t["runs"]) for t in answer["tiles"]] == [(4, True), (8, True), (16, True), (32, True)]
    assert answer["tiles"][3]["detail"] == "block 32x32x1; built for sm_90"
    assert not (box.inbox / "p1.cu").exists()  # taken: the name is free for the next hand-in


def test_a_broken_hand_in_is_answered_with_the_compilers_lines_on_the_authors_file(box, students, tmp_path):
    alice, _ = students
    answer = _hand_in(box, alice, "p1.cu", BROKEN, cache=tmp_path)
    assert answer["status"] == "refused" and "tiles" not in answer and "version" not in answer
    assert answer["errors"] and all(line.startswith("p1.cu:") for line in answer["errors"])
    assert answer["errors"][0] == 'p1.cu:6: error: expected a ";"'
    assert answer["reason"] == answer["errors"][0]
    assert KernelStore.of(box.state).pick(alice.login, "p1") is None
    alice.rename_in(box.inbox, "p1.kernel.yaml", b"arguments: [A, B, C, \xff]\n")
    answer = _hand_in(box, alice, "p1.cu", P1, cache=tmp_path)
    assert answer["status"] == "refused" and answer["reason"] == "p1.kernel.yaml: cannot be read: not UTF-8 text"
    assert not (box.inbox / "p1.kernel.yaml").exists()  # taken with its kernel, refused or not


def test_a_students_job_names_their_own_kernel_and_no_one_elses(box, students, tmp_path):
    alice, bob = students
    _hand_in(box, alice, "p1.cu", P1, cache=tmp_path)
    job = _job(box, alice, "hw1@kernel=p1.txt")
    assert job.refusal is None and job.kernel_file is not None and job.kernel_file.read_text() == P1
    assert job.kernel_file.is_relative_to(box.state / "kernels" / alice.login)
    other = _job(box, bob, "hw1@kernel=p1.txt")
    assert isinstance(other.refusal, Exception) and other.kernel_file is None
    assert "you have handed in no p1.cu" in other.refusal.reason
    builtin = _job(box, alice, "hw1@kernel=naive.txt")
    assert builtin.refusal is None and builtin.kernel_file is None and builtin.settings.kernel == "naive"
    off = _job(box, alice, "hw1@kernel=p1.txt", allowed=False)  # the admin turned students' kernels off
    assert isinstance(off.refusal, KernelError) or off.refusal is not None
    assert off.kernel_file is None


def test_a_hand_in_under_a_built_in_kernels_name_is_refused(box, students, tmp_path):
    alice, _ = students
    answer = _hand_in(box, alice, "naive.cu", P1, cache=tmp_path)
    assert answer["status"] == "refused" and "one of mmd's own kernels" in answer["reason"]
    assert KernelStore.of(box.state).pick(alice.login, "naive") is None


def test_no_student_can_read_or_list_the_store(box, students, tmp_path):
    alice, bob = students
    _hand_in(box, alice, "p1.cu", P1, cache=tmp_path)
    box.state.chmod(0o755)  # even where an admin opened state_dir, the store is mmd's alone
    own = box.state / "kernels" / alice.login
    path = KernelStore.of(box.state).pick(alice.login, "p1")
    assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.geteuid()
    for folder in (box.state / "kernels", own, path.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for who in (alice, bob):
        assert who.run('cat "$1"', str(own / "p1.cu"), check=False).returncode != 0
        assert who.run('ls "$1"', str(box.state / "kernels"), check=False).returncode != 0


def test_a_new_hand_in_replaces_the_old_and_a_queued_job_keeps_its_version(box, students, tmp_path):
    alice, _ = students
    first = _hand_in(box, alice, "p1.cu", P1, cache=tmp_path)
    queued = _job(box, alice, "hw1@kernel=p1.txt")
    second = _hand_in(box, alice, "p1.cu", P1.replace("float s = 0;", "float s = 0.0f;"), cache=tmp_path)
    assert second["status"] == "kept" and second["version"] != first["version"]
    assert queued.kernel_file is not None and queued.kernel_file.parent.name == first["version"]
    assert queued.kernel_file.read_text() == P1  # the version it was queued with, by its hash
    later = _job(box, alice, "hw1@kernel=p1.txt")
    assert later.kernel_file is not None and later.kernel_file.parent.name == second["version"]
    refused = _hand_in(box, alice, "p1.cu", BROKEN, cache=tmp_path)
    assert refused["status"] == "refused"
    now = _job(box, alice, "hw1@kernel=p1.txt")  # a refused hand-in leaves the kept one current
    assert now.kernel_file == later.kernel_file


def test_with_students_kernels_off_a_hand_in_is_refused_with_a_sidecar_saying_so(box, students, tmp_path):
    alice, _ = students
    answer = _hand_in(box, alice, "p1.cu", P1, allowed=False, cache=tmp_path)
    assert answer["status"] == "refused" and "(setting student_kernels)" in answer["reason"]
    assert not (box.inbox / "p1.cu").exists() and not (box.state / "kernels").exists()
    assert [p.read_text() for p in (box.state / ".failed").glob("p1.*.cu")] == [P1], "archived as a refused input"
    assert Settings().student_kernels is False


def test_the_store_counts_toward_the_students_quota_and_a_recount_finds_it(box, students, tmp_path):
    alice, bob = students
    shared = Shared(box.inbox, box.outbox, state_dir=box.state, class_mode=True)
    ledger = Ledger(shared)
    _hand_in(box, alice, "p1.cu", P1, cache=tmp_path)
    _hand_in(box, alice, "p1.cu", P1 + "// v2\n", cache=tmp_path)
    kept = [(login, path) for login, path, _ in kept_kernels(box.state / "kernels")]
    assert len(kept) == 2 and {login for login, _ in kept} == {alice.login}
    store = Usage()
    for _, path in kept:
        store += usage_of(os.lstat(path))
    answers = Usage()
    for path in (box.outbox / alice.login).iterdir():
        answers += usage_of(os.lstat(path))
    assert answers.files == 1  # p1.handin.yaml, the second answer in place of the first
    assert ledger.usage(alice.login) == store + answers  # counted as they are kept, each answer in place of the last
    assert ledger.recount()[alice.login] == store + answers
    assert ledger.usage(bob.login) == Usage()
    full = _hand_in(box, alice, "p3.cu", P1, cache=tmp_path, max_files=ledger.usage(alice.login).files)
    assert full["status"] == "refused" and "(outputs, sidecars, inputs, kernels; max_submitter_files)" in full["reason"]
    over = _hand_in(box, alice, "p3.cu", P1, cache=tmp_path, max_bytes=ledger.usage(alice.login).bytes + 4095)
    assert over["status"] == "refused" and "bytes (max_submitter_bytes); remove some" in over["reason"]
    assert KernelStore.of(box.state).pick(alice.login, "p3") is None
    assert _hand_in(box, bob, "p3.cu", P1, cache=tmp_path, max_files=2)["status"] == "kept"  # his share, not hers


def test_the_drop_box_tells_hand_ins_from_jobs(tmp_path):
    for name in ("p1.cu", "my_kernel-2.cu"):
        assert is_handin(name)
    for name in ("p1.txt", "p1.cu.part", ".p1.cu", "a b.cu", "p1.kernel.yaml", ".cu"):
        assert not is_handin(name)
    for name in ("p1.cu", "hw1.txt", "p1.kernel.yaml"):
        (tmp_path / name).write_text("x")
    seen = Scanner(tmp_path).survey()
    assert [c.name for c in seen.jobs] == ["hw1.txt"] and [c.name for c in seen.handins] == ["p1.cu"]
    assert [c.name for c in seen.uploads] == ["p1.kernel.yaml"]  # waits for its kernel; swept as an upload
    assert all(isinstance(c, Candidate) for c in seen.handins)


def test_students_kernels_need_class_mode():
    with pytest.raises(ConfigError, match="student_kernels needs class_mode"):
        Settings().replace(student_kernels=True)


def test_the_daemon_takes_a_hand_in_and_runs_the_students_jobs_on_it_and_no_one_elses(box, students, tmp_path):
    """A real class daemon (the stand-in GPU, tests/fakegpu, runs the kernel named square): Alice's p1.cu is
    answered in her outbox folder; her hw1@kernel=p1.txt runs it; Bob's names no p1 of his; naive is mmd's own."""
    alice, bob = students
    proc, _sock = start_class_daemon(box, **fake_gpu(MMD_STUDENT_KERNELS="true"))
    try:
        alice.drop(box.inbox, "p1.cu", SQUARE)
        answer = box.outbox / alice.login / "p1.handin.yaml"
        wait_for(answer.exists, 60, "the hand-in's answer")
        kept = yaml.safe_load(answer.read_text())
        assert kept["status"] == "kept" and kept["entry"] == "square", kept
        assert not list((box.outbox / alice.login).glob("p1.*.yaml"))[1:]  # its answer alone: never run as a job
        inputs = {}
        for who, stem in ((alice, "hw1@kernel=p1,tile=4"), (bob, "hw1@kernel=p1"), (alice, "hw2@kernel=naive")):
            inputs[who.login, stem] = integer_input(tmp_path / "in.txt", 8, 8, 8, seed=len(inputs))
            who.drop(box.inbox, f"{stem}.txt", (tmp_path / "in.txt").read_text())
        mine, theirs = box.outbox / alice.login, box.outbox / bob.login
        wait_for(lambda: len(list(mine.glob("hw*.yaml"))) == 2 and len(list(theirs.glob("hw*.yaml"))) == 1, 60,
                 "three sidecars")  # fmt: skip
        ran = check_ok(mine, "hw1@kernel=p1,tile=4", *inputs[alice.login, "hw1@kernel=p1,tile=4"])
        assert ran["kernel"] == "p1.cu" and ran["kernel_file"]["sha256"] == kept["sha256"]
        builtin = check_ok(mine, "hw2@kernel=naive", *inputs[alice.login, "hw2@kernel=naive"])
        assert builtin["requested"]["kernel"] == "naive" and "kernel_file" not in builtin  # mmd's own (the cpu's)
        refused = error_of(theirs, "hw1@kernel=p1")["error"]
        assert refused["kind"] == "jobname" and "you have handed in no p1.cu" in refused["reason"]
    finally:
        stop_class_daemon(box, proc)


def test_a_job_queued_before_a_new_hand_in_runs_the_version_it_was_queued_with(box, students, tmp_path):
    """One worker, held by Bob's job: Alice's hw1@kernel=p1 waits in the queue while she hands in a new p1.cu
    (answered at once: hand-ins are not jobs); once the worker is free her job runs the version it was queued
    with, by its hash, and her next job the new one."""
    alice, bob = students
    release = box.root / "release"
    proc, _sock = start_class_daemon(box, held_for(bob, release),
                                     **fake_gpu(MMD_STUDENT_KERNELS="true", MMD_DEVICES="0"))  # fmt: skip
    try:
        answer = box.outbox / alice.login / "p1.handin.yaml"
        alice.drop(box.inbox, "p1.cu", SQUARE)
        wait_for(answer.exists, 60, "the first hand-in's answer")
        first = yaml.safe_load(answer.read_text())
        bob.drop(box.inbox, "hold.txt", small_input())
        wait_for(lambda: not (box.inbox / "hold.txt").exists(), 30, "Bob's job to hold the worker")
        a, b = integer_input(tmp_path / "in.txt", 8, 8, 8)
        alice.drop(box.inbox, "hw1@kernel=p1,tile=4.txt", (tmp_path / "in.txt").read_text())
        time.sleep(0.5)  # offered to the scheduler: queued behind Bob's job
        alice.drop(box.inbox, "p1.cu", SQUARE + "// the second version\n")
        wait_for(lambda: yaml.safe_load(answer.read_text())["version"] != first["version"], 60, "the second answer")
        second = yaml.safe_load(answer.read_text())
        assert not (box.outbox / alice.login / "hw1@kernel=p1,tile=4.timing.yaml").exists()  # still queued
        release.touch()
        mine = box.outbox / alice.login
        wait_for(lambda: (mine / "hw1@kernel=p1,tile=4.timing.yaml").exists(), 60, "Alice's job")
        ran = check_ok(mine, "hw1@kernel=p1,tile=4", a, b)
        assert ran["kernel_file"]["sha256"] == first["sha256"] != second["sha256"]
        alice.drop(box.inbox, "hw2@kernel=p1,tile=4.txt", (tmp_path / "in.txt").read_text())
        wait_for(lambda: (mine / "hw2@kernel=p1,tile=4.timing.yaml").exists(), 60, "Alice's next job")
        assert check_ok(mine, "hw2@kernel=p1,tile=4", a, b)["kernel_file"]["sha256"] == second["sha256"]
    finally:
        release.touch()
        stop_class_daemon(box, proc)


def test_a_students_status_lists_their_own_kernels_and_no_one_elses(box, students):
    """Alice hands in p1.cu, Bob p2.cu: each one's status (the control socket, asked as them) lists their own
    kernel with its version and when it was handed in, and `mmd status` prints it; root's lists no one's."""
    from mmd.daemon.local import ask

    alice, bob = students
    proc, sock = start_class_daemon(box, MMD_STUDENT_KERNELS="true")
    try:
        for who, name in ((alice, "p1.cu"), (bob, "p2.cu")):
            who.drop(box.inbox, name, P1)
        answers = {}
        for who, stem in ((alice, "p1"), (bob, "p2")):
            path = box.outbox / who.login / f"{stem}.handin.yaml"
            wait_for(path.exists, 60, f"{who.login}'s hand-in answer")
            answers[who.login] = yaml.safe_load(path.read_text())
            assert answers[who.login]["status"] == "kept", answers[who.login]
        for who, stem in ((alice, "p1"), (bob, "p2")):
            mine = asks(who, sock, '{"op": "status"}')
            assert [(k["name"], k["version"]) for k in mine["kernels"]] == [(stem, answers[who.login]["version"])]
            assert mine["kernels"][0]["handed_in"][:16] >= answers[who.login]["received_at"][:16]
            assert mine["kernels_total"] == 1
            line = render_mine(mine).splitlines()[-1]
            when = mine["kernels"][0]["handed_in"][:16].replace("T", " ")
            assert line == f"your kernels: {stem} (version {answers[who.login]['version'][:8]}, handed in {when})"
        assert "kernels" not in ask(sock, {"op": "status"})  # root's status: everyone's jobs, no one's kernels
    finally:
        stop_class_daemon(box, proc)


def test_the_daemon_takes_a_declaration_dropped_before_its_kernel_with_it(box, students):
    """Alice drops p2.kernel.yaml, then p2.cu (docs/examples' notebook: its parameters are declared): the
    declaration is never a job; it waits for its kernel, which reads it."""
    alice, _ = students
    proc, _sock = start_class_daemon(box, MMD_STUDENT_KERNELS="true")
    try:
        examples = Path(__file__).resolve().parent.parent / "docs" / "examples"
        alice.drop(box.inbox, "p2.kernel.yaml", (examples / "notebook.kernel.yaml").read_text())
        time.sleep(0.5)  # seen alone first: an arrival of its own
        alice.drop(box.inbox, "p2.cu", (examples / "notebook.cu").read_text())
        mine = box.outbox / alice.login
        wait_for((mine / "p2.handin.yaml").exists, 60, "the hand-in's answer")
        answer = yaml.safe_load((mine / "p2.handin.yaml").read_text())
        assert answer["status"] == "kept" and answer["declared_in"] == "p2.kernel.yaml", answer
        assert answer["signature"] == "declared"
        assert sorted(p.name for p in mine.iterdir()) == ["p2.handin.yaml"]  # no error sidecar of a "job"
        assert not list(box.inbox.iterdir())
    finally:
        stop_class_daemon(box, proc)


def test_retention_removes_old_versions_but_the_current_one_and_uncounts_them(box, students, tmp_path):
    """Versions kept more than retention_days ago go (by when mmd wrote them), but each name's current one,
    however old; the ledger stops counting what went."""
    from mmd.daemon.handins import HandInDesk
    from mmd.logs import get_logger

    alice, _ = students
    first = _hand_in(box, alice, "p1.cu", P1, cache=tmp_path)
    second = _hand_in(box, alice, "p1.cu", P1 + "// v2\n", cache=tmp_path)
    old = time.time() - 200 * 86400
    for _login, path, _info in kept_kernels(box.state / "kernels"):
        os.utime(path, (old, old))
    ledger = Ledger(Shared(box.inbox, box.outbox, state_dir=box.state, class_mode=True))
    before = ledger.usage(alice.login)
    going = Usage()
    for _login, path, info in kept_kernels(box.state / "kernels"):
        if path.parent.name == first["version"]:
            going += usage_of(info)
    desk = HandInDesk(_settings(box), box.state, get_logger())
    desk.sweep(120 * 86400)
    desk.close()
    left = [path for _login, path, _info in kept_kernels(box.state / "kernels")]
    assert [p.parent.name for p in left] == [second["version"]] != [first["version"]]
    assert KernelStore.of(box.state).pick(alice.login, "p1") == left[0]
    assert going.files == 1 and ledger.usage(alice.login) == before + -going


def test_a_personal_daemon_keeps_a_kernel_dropped_in_its_inbox_as_a_refused_input(tmp_path):
    """No setting lets a personal inbox run a kernel handed in: the .cu is answered as refused and kept in
    .failed, as a refused job's input is; nothing dropped is lost."""
    (tmp_path / "inbox").mkdir()
    (tmp_path / "outbox").mkdir()
    (tmp_path / "inbox" / "p1.cu").write_text(P1)
    done = run_mmd("serve", "--once", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    answer = yaml.safe_load((tmp_path / "outbox" / "p1.handin.yaml").read_text())
    assert answer["status"] == "refused" and "(setting student_kernels)" in answer["reason"]
    kept = list((tmp_path / "inbox" / ".failed").glob("p1.*.cu"))
    assert [p.read_text() for p in kept] == [P1], os.listdir(tmp_path / "inbox")


def test_a_students_kernels_stop_at_their_gpu_time_and_no_one_elses_do(box, students, tmp_path):
    """student_kernel_gpu_s: 0.8 s, each launch held to 0.5 s. Alice's kernel spins: her first two jobs are killed
    at their limit (0.5 s charged each, the second while under her 0.8), her third is refused unrun (`limit`,
    saying what she used); mmd's own kernels still run for her, and Bob's kernel for him."""
    alice, bob = students
    proc, sock = start_class_daemon(box, **fake_gpu(MMD_STUDENT_KERNELS="true", MMD_DEVICES="0",
                                                    MMD_KERNEL_FILE_LAUNCH_TIMEOUT_S="0.5",
                                                    MMD_STUDENT_KERNEL_GPU_S="0.8"))  # fmt: skip
    try:
        alice.drop(box.inbox, "s.cu", SQUARE.replace("square", "spin"))
        bob.drop(box.inbox, "p1.cu", SQUARE)
        for who, stem in ((alice, "s"), (bob, "p1")):
            wait_for((box.outbox / who.login / f"{stem}.handin.yaml").exists, 60, f"{who.login}'s hand-in")
        mine, theirs = box.outbox / alice.login, box.outbox / bob.login
        for n in (1, 2, 3):
            alice.drop(box.inbox, f"hw{n}@kernel=s,tile=4.txt", small_input(n))
            wait_for((mine / f"hw{n}@kernel=s,tile=4.error.yaml").exists, 60, f"Alice's hw{n}")
        killed = [error_of(mine, f"hw{n}@kernel=s,tile=4")["error"] for n in (1, 2)]
        assert [e["kind"] for e in killed] == ["kernel-launch", "kernel-launch"], killed
        over = error_of(mine, "hw3@kernel=s,tile=4")["error"]
        assert over["kind"] == "limit" and "student_kernel_gpu_s" in over["reason"], over
        assert 1.0 <= over["used_s"] < 1.5 and over["student_kernel_gpu_s"] == 0.8
        mine_now, bobs = asks(alice, sock, '{"op": "status"}'), asks(bob, sock, '{"op": "status"}')
        assert mine_now["kernel_gpu_s"] == over["used_s"] and mine_now["kernel_gpu_limit_s"] == 0.8
        assert f"your kernels have used {over['used_s']:.1f} s of GPU time of the 0.8 s you may use" in render_mine(
            mine_now)  # fmt: skip
        assert bobs["kernel_gpu_s"] == 0.0  # Bob's kernel has not run yet
        a, b = integer_input(tmp_path / "a.txt", 8, 8, 8, seed=4)
        alice.drop(box.inbox, "hw4@kernel=naive.txt", (tmp_path / "a.txt").read_text())
        bob.drop(box.inbox, "hw1@kernel=p1,tile=4.txt", (tmp_path / "a.txt").read_text())
        wait_for(lambda: (mine / "hw4@kernel=naive.timing.yaml").exists()
                 and (theirs / "hw1@kernel=p1,tile=4.timing.yaml").exists(), 60, "mmd's kernel and Bob's")  # fmt: skip
        check_ok(mine, "hw4@kernel=naive", a, b)
        check_ok(theirs, "hw1@kernel=p1,tile=4", a, b)
    finally:
        stop_class_daemon(box, proc)
