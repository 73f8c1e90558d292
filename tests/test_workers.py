"""``mmd serve`` with several workers (one per device), on CPU with fake devices.

What runs here: the dispatch (one shared queue in arrival order, the next idle
worker takes the next job), the sidecar's ``device_index``, the per-worker
state, and a worker reopening its backend after a CUDA error. What does not:
real GPUs (see docs/daemon.md, "Several GPUs", for the measured run).
No sleep synchronises: every wait has a deadline.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import yaml

from mmd import backends, config, daemon
from mmd.generate import input_chunks, random_matrix

from .fakes import FakeSession, fake_gpu_opener


def make_inputs(inbox, count: int, n: int = 4) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    inputs = {}
    for i in range(count):
        a, b = random_matrix(rng, n, n), random_matrix(rng, n, n)
        path = inbox / f"j{i:02d}.txt"
        path.write_bytes(b"".join(input_chunks(a, b, square=True)))
        # arrival order = mtime order
        os.utime(path, ns=(10**18 + i * 10**6, 10**18 + i * 10**6))
        inputs[f"j{i:02d}"] = (a, b)
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


@pytest.fixture
def fake_devices(monkeypatch):
    """Every backend a worker opens is the CUDA backend on a fake GPU; jobs whose A is 5×5 fault in the kernel.

    Returns the list of sessions made, in order (the set of faulty shapes is on each session).
    """
    FakeSession.made = []
    fail: set = set()
    monkeypatch.setattr(backends, "open_backend", fake_gpu_opener(fault=lambda a, b: bool(fail) and a.shape == (5, 5)))
    return fail


def test_worker_devices():
    assert backends.worker_devices("cpu", None) == [0]
    assert backends.worker_devices("cpu", (0, 1)) == [0, 1]
    assert backends.worker_devices("cuda", (2,)) == [2]
    from mmd.cuda import driver

    real = driver.device_count
    try:
        driver.device_count = lambda: 3
        assert backends.worker_devices("cuda", None) == [0, 1, 2]
        assert backends.worker_devices("auto", None) == [0, 1, 2]
        driver.device_count = lambda: 0
        assert backends.worker_devices("auto", None) == [0]
    finally:
        driver.device_count = real


def test_devices_setting():
    assert config.load(None, environ={"MMD_DEVICES": "0,1"}).devices == (0, 1)
    assert config.load(None, environ={"MMD_DEVICES": "[2, 3]"}).devices == (2, 3)
    assert config.load(None, environ={"MMD_DEVICES": "all"}).devices is None
    assert config.Settings().devices is None
    with pytest.raises(config.ConfigError, match="devices"):
        config.load(None, environ={"MMD_DEVICES": "0,0"})
    with pytest.raises(config.ConfigError, match="devices"):
        config.load(None, environ={"MMD_DEVICES": "gpu0"})


def test_two_cpu_workers_serve_one_queue_together(tmp_path, monkeypatch):
    """devices [0, 1] on the cpu backend: two workers, each its own backend in its own thread, jobs in parallel."""
    (tmp_path / "inbox").mkdir()
    inputs = make_inputs(tmp_path / "inbox", 12)
    both_busy = threading.Barrier(2, timeout=20)
    real = daemon.worker.run_job
    seen: list[int] = []

    def paired(job, backend_for, *args, **kw):
        # the first two jobs wait for each other: only two workers at once can pass
        if len(seen) < 2:
            seen.append(threading.get_ident())
            both_busy.wait()
        return real(job, backend_for, *args, **kw)

    monkeypatch.setattr(daemon.worker, "run_job", paired)
    d = daemon.Daemon(settings_for(tmp_path, devices=(0, 1)))
    assert d.serve(once=True) == 0
    assert len(set(seen)) == 2, "the first two jobs ran in two threads at once"
    recs = sidecars(tmp_path / "outbox")
    assert set(recs) == set(inputs)
    assert {r["device_index"] for r in recs.values()} == {0, 1}
    assert all(r["status"] == "ok" and r["output"]["name"] == f"{s}.out" for s, r in recs.items())
    workers = d.state.snapshot()["workers"]
    assert [w["device_index"] for w in workers] == [0, 1]
    assert sum(w["done"] for w in workers) == 12


def test_next_idle_worker_takes_the_next_job(tmp_path, fake_devices, monkeypatch):
    """Device 0 is held by the first (oldest) job; every later job goes to the idle device 1, in arrival order."""
    (tmp_path / "inbox").mkdir()
    make_inputs(tmp_path / "inbox", 6)
    release = threading.Event()
    order: list[tuple[str, int]] = []
    real = daemon.worker.run_job

    def held_first(job, backend_for, *args, **kw):
        order.append((job.input.name, job.context.device_index))
        if job.input.name == "j00.txt":
            assert release.wait(20)
        elif len(order) >= 6:
            release.set()
        return real(job, backend_for, *args, **kw)

    monkeypatch.setattr(daemon.worker, "run_job", held_first)
    d = daemon.Daemon(settings_for(tmp_path, devices=(0, 1)))
    assert d.serve(once=True) == 0
    first_device = dict(order)["j00.txt"]
    rest = [(name, dev) for name, dev in order if name != "j00.txt"]
    assert [name for name, _ in rest] == [f"j{i:02d}.txt" for i in range(1, 6)], "arrival order kept"
    assert {dev for _, dev in rest} == {1 - first_device}, "the idle device took every later job"
    recs = sidecars(tmp_path / "outbox")
    assert recs["j00"]["device_index"] == first_device
    assert recs["j00"]["device"] == f"Fake GPU {first_device} (sm_90)"
    assert {recs[f"j{i:02d}"]["device_index"] for i in range(1, 6)} == {1 - first_device}
    opened_threads = {s.device: s.thread for s in FakeSession.made}
    assert len(FakeSession.made) == 2 and len(set(opened_threads.values())) == 2, "one backend per worker thread"
    assert all(s.closed for s in FakeSession.made), "each worker closed its own backend"


def test_worker_reopens_its_backend_after_a_cuda_error(tmp_path, fake_devices):
    """A CUDA error (a sticky one leaves the context unusable): the job is refused, the backend closed and
    reopened, and the next job runs."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, 5, 5), random_matrix(rng, 5, 5)
    (inbox / "a_bad.txt").write_bytes(b"".join(input_chunks(a, b, square=True)))
    a, b = random_matrix(rng, 4, 4), random_matrix(rng, 4, 4)
    (inbox / "b_good.txt").write_bytes(b"".join(input_chunks(a, b, square=True)))
    os.utime(inbox / "a_bad.txt", ns=(10**18, 10**18))
    fake_devices.add("on")
    assert daemon.Daemon(settings_for(tmp_path, devices=(0,))).serve(once=True) == 0
    err = yaml.safe_load((tmp_path / "outbox" / "a_bad.error.yaml").read_text())
    assert err["error"]["kind"] == "cuda" and err["device_index"] == 0
    ok = yaml.safe_load((tmp_path / "outbox" / "b_good.timing.yaml").read_text())
    assert ok["status"] == "ok"
    assert [s.device for s in FakeSession.made] == [0, 0], "opened at start, reopened after the CUDA error"
    assert all(s.closed for s in FakeSession.made), "closed after the error, and at the end"


def test_bench_devices_counts_throughput_from_the_sidecars():
    """benchmarks/bench_devices.py: claim = finished_at - overall; steady leaves out each device's first job."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_devices.py"
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
