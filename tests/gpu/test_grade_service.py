"""``mmd grade --service`` on a real GPU beside a running daemon, while 32×32 jobs are dropped into its inbox: the
issue's target, a student's 32×32 job served in 1 s or less during the grading, each timed case in a window the
service's GPU work waits out (mmd/daemon/windows.py).

Run with ``pytest -m gpu tests/gpu/test_grade_service.py -s`` (``-s`` shows the figures): the worst, median and
95th percentile of drop → sidecar over every job dropped while the grading ran, the windows granted and the
longest held. ``GRADE_SERVICE_STUDENTS`` sets the class's size (3: the course's three kernels each),
``GRADE_SERVICE_SIZES`` the timed sizes (the course's plan: 32 to 4096); the daemon runs with its defaults
(``workers_per_device`` workers on device 0, each holding a CUDA context).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mmd.generate import input_chunks, random_matrix

from ..conftest import mmd_env, run_mmd
from .test_grade import course_files, course_tests, student

pytestmark = pytest.mark.gpu

#: The issue's target: a 32×32 job dropped during the grading is served within this (seconds, drop → sidecar).
TARGET_S = 1.0


@pytest.fixture(scope="module", autouse=True)
def _gpu() -> None:
    pytest.importorskip("pycuda", reason="pycuda is not installed")


class Dropper:
    """Drops a 32×32 job into ``inbox`` every ``every`` seconds (a rename from a folder beside it, as a student's
    upload lands), each waited for by its sidecar in ``outbox``; records drop → sidecar for each."""

    def __init__(self, inbox: Path, outbox: Path, stage: Path, every: float = 0.25) -> None:
        self.inbox, self.outbox, self.stage, self.every = inbox, outbox, stage, every
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        rng = np.random.default_rng(32)
        self._data = b"".join(input_chunks(random_matrix(rng, 32, 32), random_matrix(rng, 32, 32), square=True))

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self.stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            staged = self.stage / f"s{n}.txt"
            staged.write_bytes(self._data)
            sidecar = self.outbox / f"s{n}.timing.yaml"
            dropped = time.monotonic()
            os.rename(staged, self.inbox / staged.name)
            while not sidecar.exists():
                if time.monotonic() - dropped > 60:
                    raise AssertionError(f"s{n}.txt not served in 60 s")
                time.sleep(0.001)
            self.latencies.append(time.monotonic() - dropped)
            self.stop.wait(self.every)


def test_a_students_32x32_job_is_served_within_a_second_while_a_class_is_graded_beside_the_service(
    tmp_path: Path,
) -> None:
    inbox, outbox, stage = tmp_path / "inbox", tmp_path / "outbox", tmp_path / "stage"
    for folder in (inbox, outbox, stage):
        folder.mkdir()
    sock = tmp_path / "mmd.sock"
    env = {"MMD_INBOX": str(inbox), "MMD_OUTBOX": str(outbox), "MMD_CONTROL_SOCKET": str(sock),
           "MMD_LOG_FORMAT": "json", "MMD_LOG_LEVEL": "debug", "MMD_BACKEND": "cuda"}  # fmt: skip
    log_path = tmp_path / "daemon.log"
    with open(log_path, "w") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "mmd", "serve"], env=mmd_env(env), stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while '"serving"' not in log_path.read_text() or not sock.exists():
            assert daemon.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.1)
        tests = course_tests(tmp_path / "tests", (32, 256, 1000))
        students = int(os.environ.get("GRADE_SERVICE_STUDENTS", "3"))
        sizes = ["--sizes", *os.environ["GRADE_SERVICE_SIZES"].split()] if os.environ.get("GRADE_SERVICE_SIZES") else []
        for i in range(students):
            student(tmp_path / "handin", f"s{i:02d}", course_files())
        dropper = Dropper(inbox, outbox, stage)
        dropper.start()
        start = time.monotonic()
        try:
            done = run_mmd("grade", "handin", "--tests", str(tests), "--service", "--json", str(tmp_path / "g.json"),
                           *sizes, cwd=tmp_path, env={"MMD_CONTROL_SOCKET": str(sock)}, timeout=900)  # fmt: skip
        finally:
            dropper.join()
        took = time.monotonic() - start
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
    assert done.returncode == 0, done.stderr[-3000:]

    events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    granted = [e for e in events if e.get("event") == "grader's window granted"]
    over = [e for e in events if e.get("event") == "grader's window over"]
    held = sorted(e["held_s"] for e in over)
    lat = sorted(dropper.latencies)
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
    print(
        f"\nmmd grade --service: {students} students x 3 kernels in {took:.1f} s; {len(granted)} windows, held "
        f"{statistics.median(held):.3f} s median, {held[-1]:.3f} s longest, "
        f"{sum(e['why'] == 'time up' for e in over)} ended by their time (grade_window_max_s)"
    )
    print(
        f"{len(lat)} 32x32 jobs dropped during the grading: drop -> sidecar median {statistics.median(lat):.3f} s, "
        f"p95 {p95:.3f} s, worst {lat[-1]:.3f} s (target {TARGET_S} s)"
    )

    report = json.loads((tmp_path / "g.json").read_text())["grade"]
    timed = [c for s in report["students"] for k in s["kernels"] for c in k["cases"] if c["kind"] == "timed"]
    timed += [c for r in report["students"][0]["references"] for c in r["cases"]]  # every part carries the same
    # the service's workers hold CUDA contexts on the GPU: counted as the service's, no case is disturbed by them
    disturbed = [c for c in timed if c["disturbed"] or c["windows"] > 1]
    print(f"{len(timed)} timed cases, {len(disturbed)} run again or disturbed")
    assert granted and len(granted) >= len(timed)
    assert not disturbed, disturbed[:3]
    assert lat and lat[-1] <= TARGET_S
