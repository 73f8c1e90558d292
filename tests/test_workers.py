"""``mmd serve`` with several workers (worker processes, one per device), on CPU with fake devices.

What runs here: the dispatch (one shared queue in arrival order, no job
queued behind a big one while another worker is idle), the sidecar's
``device_index``, the per-worker state, and a worker reopening its backend
after a CUDA error. What does not: real GPUs (see docs/daemon.md, "Several
GPUs", for the measured run). The workers are processes: what a test plants
in them (fakes, barriers, logs) goes through tests/workerhooks.py and
reports back through files. No sleep synchronises: every wait has a deadline.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from mmd import backends, config, daemon
from mmd.daemon.tunables import GROUP_INPUT_BYTES
from mmd.generate import input_chunks, random_matrix

from . import workerhooks
from .conftest import alongside, mmd_env, wait_for

#: A square input of this size is big (over GROUP_INPUT_BYTES): a worker is given it alone, and nothing else
#: while it runs.
BIG_N = 200


def make_inputs(inbox, count: int, n: int = 4, big: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``count`` square inputs ``j00.txt`` ... of ``n``², the first ``big`` of them big (:data:`BIG_N`²), in
    arrival (mtime) order."""
    rng = np.random.default_rng(3)
    inputs = {}
    for i in range(count):
        size = BIG_N if i < big else n
        a, b = random_matrix(rng, size, size), random_matrix(rng, size, size)
        path = inbox / f"j{i:02d}.txt"
        path.write_bytes(b"".join(input_chunks(a, b, square=True)))
        # arrival order = mtime order
        os.utime(path, ns=(10**18 + i * 10**6, 10**18 + i * 10**6))
        inputs[f"j{i:02d}"] = (a, b)
        assert (path.stat().st_size > GROUP_INPUT_BYTES) == (i < big)
    return inputs


def settings_for(tmp_path, **kw) -> config.Settings:
    return config.Settings(
        inbox=tmp_path / "inbox",
        outbox=tmp_path / "outbox",
        backend="cpu",
        quiet_seconds=0.05,
        create_folders=True,
        **kw,
    )


def sidecars(outbox) -> dict[str, dict]:
    return {p.name.split(".")[0]: yaml.safe_load(p.read_text()) for p in outbox.glob("*.timing.yaml")}


def sessions(log: Path) -> list[tuple[str, int, int]]:
    """What tests/workerhooks.py's ``fake_gpus`` logged: (open or close, device, worker pid), in order."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(what, int(device), int(pid)) for what, device, pid in (line.split() for line in lines)]


def started(log: Path) -> list[tuple[str, int, int]]:
    """What tests/workerhooks.py's ``log_jobs`` logged: (input name, device index, worker pid), in start order."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(name, int(device), int(pid)) for name, device, pid in (line.split() for line in lines)]


def test_worker_devices(monkeypatch):
    """One worker per usable core on the cpu (and for auto without a GPU), ``per_device`` workers on each GPU."""
    monkeypatch.setattr(backends, "usable_cores", lambda: 3)
    assert backends.worker_devices("cpu", None) == [0, 0, 0]
    assert backends.worker_devices("cpu", (0, 1)) == [0, 1]
    assert backends.worker_devices("cuda", (2,)) == [2]
    assert backends.worker_devices("cuda", (2, 5), 2) == [2, 2, 5, 5]
    from mmd.cuda import driver

    monkeypatch.setattr(driver, "device_count", lambda: 3)
    assert backends.worker_devices("cuda", None) == [0, 1, 2]
    assert backends.worker_devices("auto", None) == [0, 1, 2]
    assert backends.worker_devices("cuda", None, 2) == [0, 0, 1, 1, 2, 2]
    monkeypatch.setattr(driver, "device_count", lambda: 0)
    assert backends.worker_devices("auto", None) == [0, 0, 0]
    assert backends.worker_devices("cuda", None) == [0]


def test_devices_setting():
    assert config.load(None, environ={"MMD_DEVICES": "0,1"}).devices == (0, 1)
    assert config.load(None, environ={"MMD_DEVICES": "[2, 3]"}).devices == (2, 3)
    assert config.load(None, environ={"MMD_DEVICES": "all"}).devices is None
    assert config.Settings().devices is None
    with pytest.raises(config.ConfigError, match="MMD_DEVICES"):
        config.load(None, environ={"MMD_DEVICES": "0,0"})
    with pytest.raises(config.ConfigError, match="MMD_DEVICES"):
        config.load(None, environ={"MMD_DEVICES": "gpu0"})


def test_two_cpu_workers_serve_one_queue_together(tmp_path):
    """devices [0, 1] on the cpu backend: two worker processes, each its own backend, jobs in parallel.

    The first two jobs wait for each other (a barrier in files): only two workers running at once pass it.
    They are big, so that each is given to a worker alone (small ones may go to one worker in a group)."""
    (tmp_path / "inbox").mkdir()
    inputs = make_inputs(tmp_path / "inbox", 12, big=2)
    met, log = tmp_path / "met", tmp_path / "jobs.log"
    met.mkdir()
    setup = workerhooks.partial(
        workerhooks.chain,
        workerhooks.partial(workerhooks.meet, str(met), 2),
        workerhooks.partial(workerhooks.log_jobs, str(log)),
    )
    d = daemon.Daemon(settings_for(tmp_path, devices=(0, 1)), worker_setup=setup)
    assert d.serve(once=True) == 0
    pids = {int(p.name) for p in met.iterdir()}
    assert len(pids) == 2, "the first two jobs ran in two worker processes at once"
    assert os.getpid() not in pids, "jobs run in worker processes, not in the daemon's"
    ran = started(log)
    assert {pid for name, _, pid in ran if name in ("j00.txt", "j01.txt")} == pids
    device_of = {pid: {device for _, device, p in ran if p == pid} for pid in pids}
    assert sorted(map(sorted, device_of.values())) == [[0], [1]], f"one device per worker: {device_of}"
    assert len(ran) == 12, "each job ran once"
    recs = sidecars(tmp_path / "outbox")
    assert set(recs) == set(inputs)
    assert {r["device_index"] for r in recs.values()} == {0, 1}
    assert all(r["status"] == "ok" and r["output"]["name"] == f"{s}.out" for s, r in recs.items())
    workers = d.state.snapshot()["workers"]
    assert [w["device_index"] for w in workers] == [0, 1]
    assert sum(w["done"] for w in workers) == 12


def test_no_job_waits_behind_a_big_one_while_another_worker_is_idle(tmp_path):
    """The first (oldest) job is big and held in its worker until every other job has started: every later job
    goes to the other, idle worker, in arrival order. (With a thread per device this was "the next idle device
    takes the next job"; workers are now also given small jobs in groups, but never while they have a big job
    in hand.)"""
    (tmp_path / "inbox").mkdir()
    make_inputs(tmp_path / "inbox", 6, big=1)
    release, jobs, gpus = tmp_path / "release", tmp_path / "jobs.log", tmp_path / "gpus.log"
    setup = workerhooks.partial(
        workerhooks.chain,
        workerhooks.partial(workerhooks.fake_gpus, str(gpus)),
        workerhooks.partial(workerhooks.hold_jobs_until, str(release), ("j00.txt",)),
        workerhooks.partial(workerhooks.log_jobs, str(jobs)),  # logs before the hold
    )

    def all_started() -> None:
        wait_for(lambda: len(started(jobs)) >= 6, 60, "every job to start while j00 is held")

    def serve() -> int:
        return daemon.Daemon(settings_for(tmp_path, devices=(0, 1)), worker_setup=setup).serve(once=True)

    assert alongside(serve, all_started, release.touch, 10) == 0
    order = started(jobs)
    first_device = next(device for name, device, _ in order if name == "j00.txt")
    rest = [(name, device) for name, device, _ in order if name != "j00.txt"]
    assert [name for name, _ in rest] == [f"j{i:02d}.txt" for i in range(1, 6)], "arrival order kept"
    assert {device for _, device in rest} == {1 - first_device}, "the idle worker took every later job"
    recs = sidecars(tmp_path / "outbox")
    assert recs["j00"]["device_index"] == first_device
    assert recs["j00"]["device"] == f"Fake GPU {first_device} (sm_90)"
    assert {recs[f"j{i:02d}"]["device_index"] for i in range(1, 6)} == {1 - first_device}
    opened = [(device, pid) for what, device, pid in sessions(gpus) if what == "open"]
    assert sorted(device for device, _ in opened) == [0, 1], "one backend per worker"
    assert len({pid for _, pid in opened}) == 2 and os.getpid() not in {pid for _, pid in opened}, (
        "each worker process opened its own backend"
    )
    closed = [(device, pid) for what, device, pid in sessions(gpus) if what == "close"]
    assert sorted(closed) == sorted(opened), "each worker closed its own backend"


def test_worker_reopens_its_backend_after_a_cuda_error(tmp_path):
    """A CUDA error (a sticky one leaves the context unusable): the job is refused, the backend closed and
    reopened in the same worker for the next job, and that fresh backend warmed up again once no order waits
    (its kept buffers and small jobs' device memory went with the old one), never on the job's path."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, 5, 5), random_matrix(rng, 5, 5)
    (inbox / "a_bad.txt").write_bytes(b"".join(input_chunks(a, b, square=True)))
    a, b = random_matrix(rng, 4, 4), random_matrix(rng, 4, 4)
    (inbox / "b_good.txt").write_bytes(b"".join(input_chunks(a, b, square=True)))
    os.utime(inbox / "a_bad.txt", ns=(10**18, 10**18))
    gpus = tmp_path / "gpus.log"
    setup = workerhooks.partial(
        workerhooks.chain,
        workerhooks.partial(workerhooks.fake_gpus, str(gpus), fault_shape=5),  # 5×5 products fault
        workerhooks.partial(workerhooks.log_jobs, str(gpus)),  # each job's start, in the same log
    )
    assert daemon.Daemon(settings_for(tmp_path, devices=(0,)), worker_setup=setup).serve(once=True) == 0
    err = yaml.safe_load((tmp_path / "outbox" / "a_bad.error.yaml").read_text())
    assert err["error"]["kind"] == "cuda" and err["device_index"] == 0
    ok = yaml.safe_load((tmp_path / "outbox" / "b_good.timing.yaml").read_text())
    assert ok["status"] == "ok"
    log = sessions(gpus)
    assert [(what, device) for what, device, _ in log] == [
        ("open", 0),
        ("a_bad.txt", 0),
        ("close", 0),
        ("b_good.txt", 0),  # logged as it starts: its backend is opened in the job
        ("open", 0),
        ("keep", 0),
        ("close", 0),
    ], (
        "opened at start, the jobs waiting run before any warm-up, closed after the CUDA error, reopened for "
        "the next job, warmed up once no order waits, closed"
    )
    assert len({pid for _, _, pid in log}) == 1, "the same worker reopened it (the error did not cost the worker)"


def test_bench_devices_counts_throughput_from_the_sidecars(monkeypatch):
    """benchmarks/bench_devices.py: claim = finished_at - overall; steady leaves out each device's first job."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_devices.py"
    monkeypatch.syspath_prepend(str(path.parent))  # as when it runs: its folder's modules (child_env) importable
    spec = importlib.util.spec_from_file_location("bench_devices", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def rec(device: int, finished_s: float, overall_ms: float = 1000.0) -> dict:
        at = f"2026-01-01T00:00:{finished_s:06.3f}+00:00"
        timings = {"read": 100.0, "parse": 50.0, "kernel": 10.0, "emit": 20.0, "write": 300.0, "overall": overall_ms}
        return {"device_index": device, "finished_at": at, "timings_ms": timings}

    # two devices, a job a second each, offset by half a second; first claims at 0.0 and 0.5
    recs = [rec(0, 1.0 + i) for i in range(4)] + [rec(1, 1.5 + i) for i in range(4)]
    batch, steady, counted = bench.throughput(recs)
    assert batch == pytest.approx(8 / 4.5)
    # the last first job finishes at 1.5; 6 jobs finish after it, by 4.5
    assert (steady, counted) == (pytest.approx(6 / 3.0), 6)
    ph = bench.phases(recs)
    assert ph["overall"] == 1000.0 and ph["other"] == pytest.approx(520.0)


def serving(tmp_path: Path, setup: str, **env: str) -> tuple[subprocess.Popen, Path, Any]:
    """``mmd serve --create`` in ``tmp_path`` as a process whose workers call ``setup`` first (a
    tests/workerhooks.py expression), its log (JSON lines) in ``daemon.log``, and READY=1 awaited on a
    NOTIFY_SOCKET of its own: (the process, its log, a function that waits for READY=1 and returns when it came)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(60)
    full = mmd_env(MMD_LOG_FORMAT="json", MMD_QUIET_SECONDS="0.05", NOTIFY_SOCKET=str(tmp_path / "notify.sock"), **env)
    log = tmp_path / "daemon.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(workerhooks.launcher(setup, "serve", "--create"), cwd=tmp_path, env=full,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip

    def ready() -> float:
        try:
            while b"READY=1" not in sock.recv(4096).split(b"\n"):
                pass
            return time.monotonic()
        finally:
            sock.close()

    return proc, log, ready


def stopped(proc: subprocess.Popen, signals: int = 1) -> int:
    """SIGTERM ``signals`` times (a second one ends the workers at once), then its exit status."""
    for _ in range(signals):
        proc.terminate()
        time.sleep(0.2)
    return proc.wait(60)


def logged(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


@pytest.mark.integration
def test_the_workers_of_a_device_open_their_backends_one_at_a_time(tmp_path):
    """Three workers of one device open their backends in turn (CUDA contexts made at once on one GPU are each
    made as slowly as all of them together: the first worker would be ready only with the last), and serve."""
    (tmp_path / "inbox").mkdir()
    inputs = make_inputs(tmp_path / "inbox", 3)
    log = tmp_path / "open.log"
    setup = workerhooks.partial(workerhooks.slow_open, str(log), 0.3)
    assert daemon.Daemon(settings_for(tmp_path, devices=(0, 0, 0)), worker_setup=setup).serve(once=True) == 0
    opened = sorted(
        (float(start), float(end)) for _, _, start, end in (line.split() for line in log.read_text().splitlines())
    )
    assert len(opened) == 3, opened
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(opened)), f"opened at once: {opened}"
    assert set(sidecars(tmp_path / "outbox")) == set(inputs)


def test_the_first_worker_ready_takes_the_first_job_while_another_still_starts(tmp_path):
    """A fresh daemon's first job goes to the first worker that has opened its backend, and runs before that
    worker's warm-up, while another worker has not even opened its backend; READY=1 comes with the first
    worker, and a file dropped then is served by it too (issue 48: a fresh daemon's first job)."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    make_inputs(inbox, 1)
    again = (inbox / "j00.txt").read_bytes()  # dropped once more after READY=1 (its archived copy comes late)
    gpus, first = tmp_path / "gpus.log", tmp_path / "first-worker"
    setup = (
        f"partial(workerhooks.chain, partial(workerhooks.slow_start, {str(first)!r}, 120), "
        f"partial(workerhooks.fake_gpus, {str(gpus)!r}), partial(workerhooks.log_jobs, {str(gpus)!r}))"
    )
    proc, _, ready = serving(tmp_path, setup, MMD_DEVICES="0", MMD_WORKERS_PER_DEVICE="2", MMD_WARM_UP_MIB="8")
    try:
        ready()
        outbox = tmp_path / "outbox"
        wait_for(lambda: (outbox / "j00.timing.yaml").exists(), 60, "the first job's sidecar")
        staged = tmp_path / "j01.txt"
        staged.write_bytes(again)
        os.rename(staged, inbox / "j01.txt")
        wait_for(lambda: (outbox / "j01.timing.yaml").exists(), 60, "the sidecar of a job dropped after READY=1")
        wait_for(lambda: ("keep", 0) in [(w, d) for w, d, _ in sessions(gpus)], 60, "the first worker's warm-up")
        log_lines = sessions(gpus)
    finally:
        assert stopped(proc, signals=2) == 1, "the second SIGTERM ends the worker still asleep at once"
    done = [what for what, _, _ in log_lines]
    # the warm-up comes once no order waits: before or after the second job, as that job's drop falls
    assert done[:2] == ["open", "j00.txt"] and sorted(done[2:]) == ["j01.txt", "keep"], (
        "one worker opened its backend and ran both jobs, the first before its warm-up (made once no order "
        "waited); the other never opened one"
    )
    assert len({pid for _, _, pid in log_lines}) == 1
    assert all(yaml.safe_load((outbox / f"{s}.timing.yaml").read_text())["status"] == "ok" for s in ("j00", "j01"))


@pytest.mark.integration
@pytest.mark.parametrize("fail", [None, "reserve_host"])
def test_a_gpu_worker_warms_up_once_and_a_failed_warm_up_costs_only_that(tmp_path, fail):
    """Each GPU worker sets aside the buffers warm_up_mib allows once no order waits (issue 33's first job); a
    warm-up that fails is logged and the worker serves as it would have without one. A process, so that its
    workers' log is its own."""
    (tmp_path / "inbox").mkdir()
    make_inputs(tmp_path / "inbox", 3)
    setup = f"partial(workerhooks.fake_gpus, {str(tmp_path / 'gpus.log')!r}, None, {fail!r})"
    want = "warmed up" if fail is None else "warm-up failed; the first job pays for its buffers"
    proc, log, ready = serving(tmp_path, setup, MMD_DEVICES="0", MMD_WORKERS_PER_DEVICE="2", MMD_WARM_UP_MIB="8")
    try:
        ready()
        wait_for(lambda: len(list((tmp_path / "outbox").glob("*.timing.yaml"))) == 3, 60, "the three jobs")
        wait_for(lambda: sum(e["event"] == want for e in logged(log)) == 2, 60, "each worker's warm-up")
    finally:
        assert stopped(proc) == 0
    warmed = [e for e in logged(log) if str(e.get("event")).startswith(("warmed up", "warm-up failed"))]
    assert [e["event"] for e in warmed] == [want, want], "once by each worker"
    assert all(("pinned_mib" in e, "reason" in e) == (fail is None, fail is not None) for e in warmed)
    recs = sidecars(tmp_path / "outbox")
    assert len(recs) == 3 and all(r["status"] == "ok" for r in recs.values())


def test_the_sidecar_counts_a_jobs_wait_in_the_queue_in_its_turnaround_not_in_overall(tmp_path):
    """Issue 48: turnaround_ms counts from when the daemon first saw the file, so a job that waited behind
    another (held 0.5 s in the one worker) has that wait in it; overall keeps counting from its claim."""
    (tmp_path / "inbox").mkdir()
    make_inputs(tmp_path / "inbox", 2)
    release, log = tmp_path / "release", tmp_path / "jobs.log"
    setup = workerhooks.partial(
        workerhooks.chain,
        workerhooks.partial(workerhooks.hold_jobs_until, str(release), ("j00.txt",)),
        workerhooks.partial(workerhooks.log_jobs, str(log)),  # logs before the hold
    )

    def serve() -> int:
        return daemon.Daemon(settings_for(tmp_path, devices=(0,)), worker_setup=setup).serve(once=True)

    def hold() -> None:
        wait_for(lambda: started(log), 30, "j00 to start")
        time.sleep(0.5)

    assert alongside(serve, hold, release.touch, 30) == 0
    recs = sidecars(tmp_path / "outbox")
    first, second = (recs[s] for s in ("j00", "j01"))
    assert first["turnaround_ms"] >= first["timings_ms"]["overall"] >= 400, "j00 was held in its job"
    assert second["timings_ms"]["overall"] < 400, "j01 ran at once from its claim"
    assert second["turnaround_ms"] - second["timings_ms"]["overall"] >= 400, "j01 waited behind j00 for its claim"
