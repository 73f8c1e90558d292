"""The state file behind `mmd status` (mmd.daemon.state): what it says, throttled writes, workers."""

from __future__ import annotations

import json

import pytest

from mmd.daemon.state import State, read_state


def test_the_state_file_says_what_the_daemon_did(tmp_path):
    state = State(tmp_path / ".mmd-state.json", inbox=str(tmp_path), backend="cpu")
    state.worker(0, device_index=0, current={"job": "a" * 12, "file": "m.txt", "since": "now"})
    snap = state.snapshot()
    assert snap["current"]["file"] == "m.txt" and snap["status"] == "starting"
    state.finished({"job": "a" * 12, "file": "m.txt", "status": "ok", "overall_ms": 1.0}, worker=0)
    state.finished({"job": "b" * 12, "file": "n.txt", "status": "error", "overall_ms": 2.0}, worker=0)
    state.update(status="serving")
    state.write(force=True)
    data = json.loads((tmp_path / ".mmd-state.json").read_text())
    assert data["done"] == {"ok": 1, "error": 1} and data["current"] is None
    assert [j["file"] for j in data["recent"]] == ["n.txt", "m.txt"]
    assert data["workers"][0]["done"] == 2 and data["status"] == "serving"
    assert read_state(tmp_path) == data


def test_writes_are_throttled_unless_forced(tmp_path):
    path = tmp_path / ".mmd-state.json"
    state = State(path)
    state.write()
    first = path.read_text()
    state.update(queue=5)
    state.write()  # within STATE_EVERY of the last: not yet
    assert path.read_text() == first and state.due_in() is not None
    state.write(force=True)
    assert json.loads(path.read_text())["queue"] == 5 and state.due_in() is None


def test_what_did_not_change_is_not_written_again(tmp_path):
    """The main loop tells the state its queue every turn (an idle daemon's turns once a second): the file is
    written when something changed, within STATE_EVERY of the change, and not again for the same facts."""
    path = tmp_path / ".mmd-state.json"
    state = State(path)
    state.update(status="serving", queue=0)
    state.write(force=True)
    state.update(queue=0, status="serving")
    assert state.due_in() is None, "nothing changed: nothing to write"
    state.update(queue=1)
    assert state.due_in() is not None
    state.write(force=True)
    assert json.loads(path.read_text())["queue"] == 1


def test_status_names_each_worker_its_device_pid_and_phase():
    """Several workers on one device (the cpu's, or a GPU's workers_per_device) are told apart."""
    from mmd.cli.status_cmd import render

    job = {"job": "0123456789ab", "file": "m.txt", "since": "2026-11-27T06:00:00.000+00:00", "phase": "multiply"}
    workers = [
        {"index": 0, "device_index": 0, "device": "cpu", "pid": 41, "current": job, "done": 3},
        {"index": 1, "device_index": 0, "device": "cpu", "pid": 42, "current": None, "done": 5},
    ]
    status = {"serving": True, "inbox": "inbox", "pid": 40, "waiting_in_inbox": 0, "held": [],
              "state": {"started": "?", "observer": "inotify", "backend": "cpu", "workers": workers}}  # fmt: skip
    lines = render(status).splitlines()
    assert any(line.startswith("  worker 0: device 0 (cpu, pid 41): running m.txt") and "in multiply" in line
               for line in lines)  # fmt: skip
    assert "  worker 1: device 0 (cpu, pid 42): idle; 5 done" in lines


def test_the_state_says_the_backend_the_workers_opened_not_the_one_asked_for(tmp_path):
    """``backend: auto`` falls back to the cpu where no GPU works: the state says ``cpu`` once a worker is ready."""
    state = State(tmp_path / ".mmd-state.json", backend="auto")
    assert state.snapshot()["backend"] == "auto"  # no worker ready yet: what was asked for
    state.worker(0, backend="cpu", device="cpu")
    assert state.snapshot()["backend"] == "cpu"
    state.worker(1, backend="cuda", device="gpu")
    assert state.snapshot()["backend"] == "cpu, cuda"


@pytest.mark.integration
def test_status_of_a_daemon_that_fell_back_to_the_cpu_says_cpu(tmp_path):
    """A real daemon asked for ``auto`` on a machine without a working GPU (or told no device works)."""
    from .conftest import run_mmd

    (tmp_path / "inbox").mkdir()
    r = run_mmd("serve", "--once", "--create", cwd=tmp_path, env={"MMD_BACKEND": "auto", "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    state = read_state(tmp_path / "inbox")
    assert state is not None and state["backend"] == "cpu"


@pytest.mark.integration
def test_status_metrics_finds_the_metrics_file_from_the_daemons_state(tmp_path):
    """`mmd status --metrics` given only the inbox (no config): the daemon's state file names its metrics_file."""
    from .conftest import run_mmd

    (tmp_path / "inbox").mkdir()
    metrics = tmp_path / "elsewhere" / "mmd.prom"
    metrics.parent.mkdir()
    r = run_mmd("serve", "--once", "--create", cwd=tmp_path, env={"MMD_METRICS_FILE": str(metrics)})
    assert r.returncode == 0, r.stderr
    r = run_mmd("status", "--metrics", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == metrics.read_text() and "mmd_up" in r.stdout


@pytest.mark.integration
def test_status_metrics_says_how_to_name_the_file_where_no_daemon_wrote_one(tmp_path):
    from .conftest import run_mmd

    (tmp_path / "inbox").mkdir()
    r = run_mmd("status", "--metrics", cwd=tmp_path)
    assert r.returncode == 2
    assert "metrics_file" in r.stderr and "--config" in r.stderr and "Traceback" not in r.stderr
