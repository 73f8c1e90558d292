"""The state file behind `mmd status` (mmd.daemon.state): what it says, throttled writes, workers."""

from __future__ import annotations

import json

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
