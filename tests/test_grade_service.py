"""Graders' timed windows on the class's service (``mmd grade --service``, mmd/daemon/windows.py): a real daemon on
a class box of real accounts, asked over its real control socket.

The daemon runs on the cpu backend (one worker, device 0): a window holds its workers from new jobs the same way
on a GPU, where the grant also counts the workers' CUDA contexts. tests/gpu/test_grade_service.py grades a class
on a GPU beside a daemon while students drop 32×32 jobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mmd.daemon.local import ask_window, release_window

from . import classbox
from .classbox import Box, Student
from .conftest import mmd_env, run_mmd, wait_for
from .test_class import asks, big_input, small_input, start_class_daemon, stop_class_daemon
from .test_grade import data_sets
from .test_kernelfile_run import fake_gpu, kernel

users, students, box, grader = classbox.users, classbox.students, classbox.box, classbox.grader  # the fixtures

pytestmark = [pytest.mark.serial, pytest.mark.integration]

#: The daemon's workers: a job whose input is named ``held*`` waits until ``<its inbox>/../go-<stem>`` exists.
HELD = "__import__('tests.test_grade_service').test_grade_service.hold_named"


def hold_named() -> None:
    """A worker hook (tests/workerhooks.py): jobs named ``held*`` wait for their go file beside the inbox."""
    from mmd.daemon import worker

    real = worker.run_job

    def held(job: Any, *args: Any, **kw: Any) -> Any:
        name = Path(job.input).name
        if name.startswith("held"):
            go = Path(os.environ["MMD_INBOX"]).parent / f"go-{name.removesuffix('.txt')}"
            while not go.exists():
                time.sleep(0.01)
        return real(job, *args, **kw)

    worker.run_job = held


def served(b: Box, who: Student, stem: str) -> bool:
    return (b.outbox / who.login / f"{stem}.timing.yaml").exists()


def go(b: Box, stem: str) -> None:
    (b.root / f"go-{stem}").touch()


class Asking:
    """A window asked for in a thread of its own (the grant comes once the device's workers are idle)."""

    def __init__(self, sock: Path) -> None:
        self.answer: dict[str, Any] | None = None
        self.at: float | None = None
        self.sock: Any = None
        self._thread = threading.Thread(target=self._ask, args=(sock,), daemon=True)
        self._thread.start()

    def _ask(self, path: Path) -> None:
        self.sock, self.answer = ask_window(path, 0, 60.0)
        self.at = time.monotonic()

    def granted(self) -> bool:
        return self.answer is not None and self.answer.get("granted") is True


def test_a_window_is_a_graders_alone(box, students, grader) -> None:
    """A student asking for a window is refused with a reason; a grader (graders_group) is granted one at once on
    an idle daemon, told how many of its workers hold a CUDA context on the device (none on the cpu backend); a
    device no worker serves, or no seconds, is refused; a release on a fresh connection is no request."""
    alice, _ = students
    proc, sock = start_class_daemon(box, MMD_GRADERS_GROUP=classbox.GRADERS)
    try:
        window = '{"op": "window", "device": 0, "seconds": 1}'
        refused = asks(alice, sock, window)
        assert refused["ok"] is False and "graders" in refused["error"]
        granted = asks(grader, sock, window)
        assert granted == {"ok": True, "granted": True, "device": 0, "seconds": 1, "gpu_processes": 0}
        assert "the service's workers: 0" in asks(grader, sock, '{"op": "window", "device": 3, "seconds": 1}')["error"]
        assert "seconds" in asks(grader, sock, '{"op": "window", "device": 0, "seconds": -1}')["error"]
        assert "op is one of" in asks(grader, sock, '{"op": "release"}')["error"]
    finally:
        stop_class_daemon(box, proc)


def test_a_window_waits_for_idle_workers_and_ends_on_release_disconnect_or_expiry(box, students) -> None:
    """A window is granted only once the device's workers are idle; a job dropped while it is held waits, and is
    served within a second of its end: a release (answered: not expired), the connection closing, or its time up
    (grade_window_max_s; the late release is answered: expired)."""
    alice, _ = students
    proc, sock = start_class_daemon(box, HELD, MMD_GRADE_WINDOW_MAX_S="1.0", MMD_LOG_LEVEL="debug")
    try:
        alice.drop(box.inbox, "held1.txt", small_input(1))
        wait_for(lambda: not (box.inbox / "held1.txt").exists(), 10, "the held job to be taken")
        asking = Asking(sock)
        time.sleep(0.5)
        assert asking.answer is None, "granted while the worker had a job in hand"
        go(box, "held1")
        wait_for(asking.granted, 5, "the window, once the worker is idle")
        assert served(box, alice, "held1")  # the job ended before the window began
        assert asking.answer is not None and asking.answer["seconds"] == 1.0  # capped by grade_window_max_s

        # released: a job dropped meanwhile waits, then is served at once
        alice.drop(box.inbox, "a.txt", small_input(2))
        time.sleep(0.4)
        assert not served(box, alice, "a"), "a job ran during a window"
        released_at = time.monotonic()
        answer = release_window(asking.sock)
        assert answer is not None and answer["ok"] and answer["expired"] is False and answer["held_s"] > 0.3
        wait_for(lambda: served(box, alice, "a"), 5, "the job after the release")
        assert time.monotonic() - released_at < 1.0

        # the connection closed without a word
        sock2, granted = ask_window(sock, 0, 60.0)
        assert sock2 is not None, granted
        alice.drop(box.inbox, "b.txt", small_input(3))
        time.sleep(0.3)
        assert not served(box, alice, "b")
        closed_at = time.monotonic()
        sock2.close()
        wait_for(lambda: served(box, alice, "b"), 5, "the job after the window's connection closed")
        assert time.monotonic() - closed_at < 1.0

        # its time up: the job is served at its end, with no release
        sock3, granted = ask_window(sock, 0, 60.0)
        assert sock3 is not None, granted
        granted_at = time.monotonic()
        alice.drop(box.inbox, "c.txt", small_input(4))
        wait_for(lambda: served(box, alice, "c"), 5, "the job once the window's time is up")
        assert 0.9 < time.monotonic() - granted_at < 2.0
        late = release_window(sock3)
        assert late is not None and late["expired"] is True and late["held_s"] == pytest.approx(1.0, abs=0.2)
    finally:
        stop_class_daemon(box, proc)
    log = (box.root / "daemon.log").read_text()
    assert log.count("grader's window granted") == 3 and log.count("grader's window over") == 3


def test_jobs_queued_before_a_window_and_of_those_who_used_less_go_first(box, students) -> None:
    """One worker. Alice has used it for about a second. While Bob's big job runs (nothing is given beside it), she
    drops a job, then root (a grader, who has used nothing yet) asks for a window: her job was queued first, so it
    is served first, and the window is granted after it. Root then holds windows for about two seconds; root asks
    for another while Bob's next job runs, and Alice drops a job after it: she has used less than root now, so her
    job is served first again. Without the windows charged to root, root would have used less, and her job would
    wait out the window."""
    alice, bob = students
    proc, sock = start_class_daemon(box, HELD, MMD_GRADE_WINDOW_MAX_S="1.0", MMD_DEVICES="0")  # one worker
    try:
        alice.drop(box.inbox, "held-a.txt", small_input(1))
        wait_for(lambda: not (box.inbox / "held-a.txt").exists(), 10, "alice's first job to be taken")
        time.sleep(1.0)
        go(box, "held-a")
        wait_for(lambda: served(box, alice, "held-a"), 10, "alice's first job")

        bob.rename_in(box.inbox, "held-b1.txt", big_input(2))  # a big job: the worker is given nothing beside it
        wait_for(lambda: not (box.inbox / "held-b1.txt").exists(), 10, "bob's big job to be taken")
        alice.drop(box.inbox, "before.txt", small_input(3))
        time.sleep(0.3)
        asking = Asking(sock)
        time.sleep(0.3)
        go(box, "held-b1")
        wait_for(asking.granted, 5, "the window")
        assert served(box, alice, "before"), "a job queued before the window waited for it"
        release_window(asking.sock)

        for _ in range(2):
            held, answer = ask_window(sock, 0, 60.0)
            assert held is not None, answer
            time.sleep(1.05)  # its time is up: 1 s charged
            release_window(held)
        bob.drop(box.inbox, "held-b2.txt", small_input(4))
        wait_for(lambda: not (box.inbox / "held-b2.txt").exists(), 10, "bob's next job to be taken")
        asking = Asking(sock)
        time.sleep(0.3)
        alice.drop(box.inbox, "after.txt", small_input(5))
        time.sleep(0.3)
        go(box, "held-b2")
        wait_for(asking.granted, 5, "the window")
        assert served(box, alice, "after"), "alice's job waited for the window of a grader who had used more"
        release_window(asking.sock)
    finally:
        stop_class_daemon(box, proc)


def test_grading_beside_the_service_serves_students_jobs_between_windows(box, students, tmp_path) -> None:
    """``mmd grade --service`` (root: a grader) grades a class on the stand-in GPU beside the class's daemon, each
    timed case in a window of the service's, while Alice drops small jobs: every one is served within a second
    of its drop (the bound generous here, 1 s on the GPU machine), and the grading is the same as alone."""
    alice, _ = students
    proc, sock = start_class_daemon(box, MMD_LOG_LEVEL="debug")
    latencies: list[float] = []
    try:
        tests = data_sets(tmp_path)
        for who in ("ann", "ben"):
            (tmp_path / "handin" / who).mkdir(parents=True)
            kernel(tmp_path / "handin" / who, "p1.cu")
        grading = subprocess.Popen(
            [sys.executable, "-m", "mmd", "grade", "handin", "--tests", str(tests), "--tiles", "8", "--sizes", "16",
             "32", "--service", "--json", str(tmp_path / "g.json")],
            cwd=tmp_path, env=mmd_env(fake_gpu(), MMD_CONTROL_SOCKET=str(sock)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        n = 0
        while grading.poll() is None:
            n += 1
            dropped = time.monotonic()
            alice.drop(box.inbox, f"j{n}.txt", small_input(n, 32))
            wait_for(lambda i=n: served(box, alice, f"j{i}"), 10, f"job {n}")
            latencies.append(time.monotonic() - dropped)
            time.sleep(0.05)
        out, err = grading.communicate()
        assert grading.returncode == 0, out + err
    finally:
        stop_class_daemon(box, proc)
    granted = (box.root / "daemon.log").read_text().count("grader's window granted")
    report = json.loads((tmp_path / "g.json").read_text())["grade"]
    timed = [c for s in report["students"] for k in s["kernels"] for c in k["cases"] if c["kind"] == "timed"]
    # one window to check, then one a timed case (the references' too), none run again
    assert timed and all(c["windows"] == 1 and c["status"] == "ok" for c in timed)
    assert granted >= 1 + len(timed)
    print(f"{len(latencies)} jobs dropped during the grading, {granted} windows: worst drop to sidecar "
          f"{max(latencies, default=0):.3f} s")  # fmt: skip
    assert latencies and max(latencies) < 2.0, latencies  # generous: 2 cores shared with the grading's compiles


def test_a_timed_case_longer_than_the_services_window_is_disturbed_and_not_run_again(box, tmp_path) -> None:
    """The service's windows end almost at once (grade_window_max_s 0.001): every timed case's hold ends before its
    launches do, so the service's work may have run beside them: each is disturbed, in one window (another would end
    the same way), and graded all the same."""
    proc, sock = start_class_daemon(box, MMD_GRADE_WINDOW_MAX_S="0.001")
    try:
        tests = data_sets(tmp_path)
        (tmp_path / "handin" / "ann").mkdir(parents=True)
        kernel(tmp_path / "handin" / "ann", "p1.cu")
        done = run_mmd("grade", "handin", "--tests", str(tests), "--tiles", "8", "--sizes", "16", "--service",
                       "--json", str(tmp_path / "g.json"), cwd=tmp_path, env=fake_gpu(MMD_CONTROL_SOCKET=str(sock)),
                       timeout=300)  # fmt: skip
    finally:
        stop_class_daemon(box, proc)
    assert done.returncode == 0, done.stdout + done.stderr
    (part,) = json.loads((tmp_path / "g.json").read_text())["grade"]["students"]
    timed = [c for k in part["kernels"] for c in k["cases"] if c["kind"] == "timed"]
    timed += [c for r in part["references"] for c in r["cases"]]
    assert timed and all(c["disturbed"] and c["windows"] == 1 and c["status"] == "ok" for c in timed), timed[:2]


def test_grading_beside_no_service_stops_before_any_kernel(tmp_path: Path) -> None:
    """``--service`` where no daemon answers on the control socket: exit status 3, nothing graded; without a
    control_socket: bad configuration (78)."""
    tests = data_sets(tmp_path)
    (tmp_path / "handin" / "ann").mkdir(parents=True)
    kernel(tmp_path / "handin" / "ann", "p1.cu")
    argv = ("grade", "handin", "--tests", str(tests), "--service")
    gone = run_mmd(*argv, cwd=tmp_path, env=fake_gpu(MMD_CONTROL_SOCKET=str(tmp_path / "none.sock")))
    assert gone.returncode == 3 and "no daemon answers" in gone.stderr and "ann" not in gone.stderr
    unset = run_mmd(*argv, cwd=tmp_path, env=fake_gpu())
    assert unset.returncode == 78 and "control_socket" in unset.stderr
