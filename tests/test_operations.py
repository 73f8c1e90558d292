"""mmd as a lab service: time limits, poison jobs, exit statuses, journal priorities, metrics, hooks, the unit.

Real processes throughout: the daemon runs as ``python -m mmd serve`` (or
through a small launcher that plants a fault in the backend first, the way
a real fault would come: a kernel that never returns, a driver that kills
the process).
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmd import textoutput
from mmd.check import full
from mmd.generate import input_chunks, random_matrix

from . import workerhooks
from .conftest import ROOT, LoggedProcess, mmd_env, run_mmd, wait_for

pytestmark = pytest.mark.integration

UNIT = ROOT / "systemd" / "mmd.service"
ENV = {"MMD_LOG_FORMAT": "json", "MMD_BACKEND": "cpu", "MMD_QUIET_SECONDS": "0.2", "MMD_RESCAN_SECONDS": "0.5"}


def make(path: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a, b = random_matrix(rng, n, n), random_matrix(rng, n, n)
    path.write_bytes(b"".join(input_chunks(a, b, square=True)))
    return a, b


def sidecar(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def check_ok(outbox: Path, stem: str, a: np.ndarray, b: np.ndarray) -> None:
    assert sidecar(outbox / f"{stem}.timing.yaml")["status"] == "ok"
    report = full.against_inputs(textoutput.parse_output((outbox / f"{stem}.out").read_bytes()), a, b)
    assert report.ok, report.summary()


def faulty_daemon(tmp_path: Path, *args: str, **env: str) -> LoggedProcess:
    """A daemon whose workers' cpu backend hangs on 7×7 products (a kernel that never returns) and kills its
    own process on 6×6 ones (a driver crash): the faults mmd must survive, planted in each worker."""
    argv = workerhooks.launcher("workerhooks.faulty_cpu", "serve", "--create", *args)
    return LoggedProcess(argv, tmp_path, tmp_path / "daemon.log", mmd_env(ENV, **env))


def tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` and all its descendants (the daemon, its fork server, its workers)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(re.search(r"VmRSS:\s+(\d+) kB", status)[1]) * 1024  # type: ignore[index]
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, TypeError):
            continue
    return total


def worker_pids(pid: int) -> set[int]:
    """The daemon's workers: the children of its fork server (its only child process)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for server in (task / "children").read_text().split():
            for stask in Path(f"/proc/{server}/task").iterdir():
                out |= {int(c) for c in (stask / "children").read_text().split()}
    return out


@pytest.mark.serial  # a wall-clock bound and the daemon's memory before and after: alone on the machine
def test_a_hanging_job_is_stopped_at_its_limit_and_the_next_one_runs(tmp_path):
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    proc = faulty_daemon(tmp_path, MMD_JOB_TIMEOUT_S="1.5")
    try:
        wait_for(lambda: "serving" in proc.logs(), 30, "the daemon")
        make(inbox / "hang.txt", 7, 1)
        wait_for(lambda: (outbox / "hang.error.yaml").exists(), 30, "the time limit")
        a, b = make(inbox / "next.txt", 4, 2)
        wait_for(lambda: (outbox / "next.timing.yaml").exists(), 30, "the next job, on the replacement worker")
        err = sidecar(outbox / "hang.error.yaml")
        assert err["error"]["kind"] == "timeout" and err["error"]["limit_s"] == 1.5
        assert err["error"]["phase"] == "multiply" and "time limit of 1.5 s (in multiply)" in err["error"]["reason"]
        assert (inbox / ".failed" / "hang.txt").exists() and not (outbox / "hang.out").exists()
        check_ok(outbox, "next", a, b)
        assert proc.proc.poll() is None, "the daemon stays up"
        assert proc.stop() == 0
    finally:
        proc.stop()


def test_a_stopped_job_gives_back_its_memory_and_its_cpu(tmp_path):
    """Jobs stopped at their time limit (a name's @timeout=) end with their worker: the memory they held is
    the system's again, nothing goes on computing, and the next job runs at its normal speed."""
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    big = tmp_path / "big.src"
    make(big, 1200, 7)  # about 20 MB of text: read and parse alone take longer than the limit
    # A limit this small is below what names may set by default (a worker restart each): this admin allows it.
    proc = LoggedProcess([sys.executable, "-m", "mmd", "serve", "--create"], tmp_path, tmp_path / "daemon.log",
                         mmd_env(ENV, MMD_DEVICES="0", MMD_MIN_NAME_TIMEOUT_S="0.01"))  # fmt: skip
    try:
        wait_for(lambda: "serving" in proc.logs(), 30, "the daemon")
        make(tmp_path / "warm.src", 64, 1)
        os.rename(tmp_path / "warm.src", inbox / "warm.txt")
        wait_for(lambda: (outbox / "warm.timing.yaml").exists(), 30, "a first job")
        before = tree_rss(proc.proc.pid)
        workers = worker_pids(proc.proc.pid)
        for i in range(4):
            shutil.copy(big, tmp_path / "x.src")
            os.rename(tmp_path / "x.src", inbox / f"x{i}@timeout=0.05.txt")
            wait_for(lambda i=i: (outbox / f"x{i}@timeout=0.05.error.yaml").exists(), 60, f"stopped job {i}")
            err = sidecar(outbox / f"x{i}@timeout=0.05.error.yaml")
            assert err["error"]["kind"] == "timeout" and err["error"]["limit_s"] == 0.05
        stopped = workers - worker_pids(proc.proc.pid)
        assert stopped, "the stopped jobs' worker is gone"
        assert not any(Path(f"/proc/{pid}").exists() for pid in stopped), "nothing of a stopped job runs on"
        a, b = make(tmp_path / "after.src", 64, 2)
        os.rename(tmp_path / "after.src", inbox / "after.txt")
        t0 = time.monotonic()
        wait_for(lambda: (outbox / "after.timing.yaml").exists(), 60, "the next job")
        assert time.monotonic() - t0 < 5, "the next job waits for nothing the stopped ones left"
        check_ok(outbox, "after", a, b)
        after = tree_rss(proc.proc.pid)
        assert after <= 1.2 * before, f"{before / 2**20:.0f} MiB before, {after / 2**20:.0f} MiB after"
        assert proc.proc.poll() is None and proc.stop() == 0
    finally:
        proc.stop()


def test_a_job_that_kills_its_worker_is_failed_after_max_attempts_and_the_daemon_lives(tmp_path):
    """A crash in a job (a driver that kills the process) costs its worker, never the daemon: the job is
    resumed on a fresh worker, and failed once it has killed max_attempts of them."""
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    make(inbox / "poison.txt", 6, 1)
    os.utime(inbox / "poison.txt", ns=(10**18, 10**18))  # the oldest: it is taken first
    good = {f"g{i}": make(inbox / f"g{i}.txt", 4, 10 + i) for i in range(3)}
    proc = faulty_daemon(tmp_path, "--once", MMD_MAX_ATTEMPTS="3")
    assert proc.proc.wait(timeout=60) == 0, proc.logs()
    proc.stop()
    assert proc.logs().count('"a worker died"') == 3
    err = sidecar(outbox / "poison.error.yaml")
    assert err["error"]["kind"] == "crashed" and err["error"]["attempts"] == 3
    assert "started 3 times and its worker died each time" in err["error"]["reason"]
    assert (inbox / ".failed" / "poison.txt").exists()
    for stem, (a, b) in good.items():
        check_ok(outbox, stem, a, b)
    assert not list((inbox / ".work").glob("*/*")), "nothing left claimed"


def test_a_worker_that_dies_with_a_group_in_hand_loses_and_doubles_nothing(tmp_path):
    """Small jobs are given to a worker in groups and committed together: when a job of the group kills
    the worker, the jobs of its group it had run but not yet published are resumed, those it had not
    claimed go back to the scheduler, and every job ends once, under its plain name."""
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    good = {}
    for i in range(60):
        good[f"g{i:02d}"] = make(inbox / f"g{i:02d}.txt", 4, 100 + i)
        os.utime(inbox / f"g{i:02d}.txt", ns=(10**18 + i * 10**6, 10**18 + i * 10**6))
    make(inbox / "poison.txt", 6, 1)
    os.utime(inbox / "poison.txt", ns=(10**18 + 30 * 10**6 + 1, 10**18 + 30 * 10**6 + 1))  # mid-group
    proc = faulty_daemon(tmp_path, "--once", MMD_MAX_ATTEMPTS="3")
    assert proc.proc.wait(timeout=120) == 0, proc.logs()
    proc.stop()
    assert proc.logs().count('"a worker died"') == 3
    assert sidecar(outbox / "poison.error.yaml")["error"]["kind"] == "crashed"
    for stem, (a, b) in good.items():
        check_ok(outbox, stem, a, b)
    assert sorted(p.name for p in (inbox / ".done").iterdir()) == sorted(f"{s}.txt" for s in good)
    assert not list(outbox.glob("*.1.*")), "a job was done twice"
    assert not list(outbox.glob(".*.tmp")) and not list(outbox.glob(".*.claim")), "a temporary or reservation left"
    assert not list((inbox / ".work").glob("*/*")), "nothing left claimed"


def test_a_bad_config_exits_with_the_config_status_that_the_unit_does_not_restart(tmp_path):
    r = run_mmd("serve", "--once", "--create", cwd=tmp_path, env={"MMD_TILE": "abc"})
    assert r.returncode == 78 and r.stderr.count("\n") == 1 and "MMD_TILE must be int" in r.stderr
    (tmp_path / "c.yaml").write_text("kernel: bogus\n")
    r = run_mmd("serve", "--once", "--create", "--config", str(tmp_path / "c.yaml"), cwd=tmp_path)
    assert r.returncode == 78 and "unknown kernel 'bogus'" in r.stderr
    r = run_mmd("serve", "--frob", cwd=tmp_path)
    assert r.returncode == 2
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(UNIT)
    assert "78" in unit["Service"]["RestartPreventExitStatus"].split()
    assert "2" in unit["Service"]["RestartPreventExitStatus"].split()
    assert unit["Service"]["Restart"] == "on-failure"


def test_serve_refuses_folders_that_do_not_exist_unless_asked_to_create_them(tmp_path):
    r = run_mmd("serve", "--once", "--inbox", "nosuch", cwd=tmp_path)
    assert r.returncode == 78 and "the inbox folder 'nosuch' does not exist" in r.stderr
    assert not (tmp_path / "nosuch").exists(), "a typo is not a new folder"
    r = run_mmd("serve", "--once", "--inbox", "in", "--outbox", "out", "--create", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "in").is_dir() and (tmp_path / "out").is_dir()


def test_journal_lines_carry_their_syslog_priority(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "bad.txt").write_text("2\n1 2\n3 x\n1 2 3 4\n")
    make(inbox / "good.txt", 3, 1)
    log = tmp_path / "journal.log"
    with open(log, "w") as out:
        info = os.fstat(out.fileno())
        env = mmd_env(ENV, JOURNAL_STREAM=f"{info.st_dev}:{info.st_ino}", MMD_CREATE_FOLDERS="yes")
        done = subprocess.run([sys.executable, "-m", "mmd", "serve", "--once"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=out, timeout=60)  # fmt: skip
    assert done.returncode == 0
    lines = log.read_text().splitlines()
    assert lines and all(re.match(r"<[2-7]>\{", line) for line in lines), lines[:3]
    by_event = {json.loads(line[3:])["event"]: line[:3] for line in lines}
    assert by_event["job done"] == "<6>" and by_event["job refused"] == "<4>"
    # without JOURNAL_STREAM (or when it names another stream) the lines are plain
    r = run_mmd("serve", "--once", cwd=tmp_path, env={"JOURNAL_STREAM": "1:1", "MMD_CREATE_FOLDERS": "yes"})
    assert r.returncode == 0 and not r.stderr.startswith("<")


def test_metrics_file_counts_good_and_bad_jobs(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for i in range(3):
        make(inbox / f"g{i}.txt", 4, i)
    (inbox / "bad1.txt").write_text("2\n1 2\n3 x\n1 2 3 4\n")
    (inbox / "bad2@kernel=bogus.txt").write_text("1\n2\n3\n")
    metrics = tmp_path / "mmd.prom"
    r = run_mmd("serve", "--once", "--create", cwd=tmp_path, env={"MMD_METRICS_FILE": str(metrics)})
    assert r.returncode == 0, r.stderr
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.read_text())
        for s in family.samples
    }
    assert samples[("mmd_jobs_total", (("kernel", "cpu"), ("status", "ok")))] == 3
    assert samples[("mmd_job_errors_total", (("kind", "input"),))] == 1
    assert samples[("mmd_job_errors_total", (("kind", "jobname"),))] == 1
    assert samples[("mmd_job_duration_seconds_count", ())] == 5
    assert samples[("mmd_job_phase_seconds_count", (("phase", "parse"),))] == 3
    assert samples[("mmd_input_bytes_total", ())] == sum(p.stat().st_size for p in (inbox / ".done").iterdir()) + (
        sum(p.stat().st_size for p in (inbox / ".failed").iterdir())
    )
    assert samples[("mmd_output_bytes_total", ())] == sum(p.stat().st_size for p in (tmp_path / "outbox").glob("*.out"))
    assert samples[("mmd_up", ())] == 0  # written once more as the daemon stopped
    assert samples[("mmd_daemon_start_time_seconds", ())] > 1.7e9
    r = run_mmd("status", "--metrics", cwd=tmp_path, env={"MMD_METRICS_FILE": str(metrics)})
    assert r.returncode == 0 and r.stdout == metrics.read_text()


def metric_samples(path: Path) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for family in text_string_to_metric_families(path.read_text()) for s in family.samples}


def stale(samples: dict[str, float], now: float) -> bool:
    """The alert docs/operations.md gives for a daemon that stopped writing its metrics file, whatever
    its last ``mmd_up`` said: ``time() - mmd_last_update_timestamp_seconds > 12 * mmd_metrics_interval_seconds``."""
    return now - samples["mmd_last_update_timestamp_seconds"] > 12 * samples["mmd_metrics_interval_seconds"]


@pytest.mark.serial  # a serving daemon must rewrite its metrics every 0.2 s to pass as alive: alone
def test_a_daemon_killed_with_sigkill_is_seen_as_dead_by_its_metrics_files_age(tmp_path):
    """kill -9 leaves ``mmd_up 1`` in the file for good; its timestamp stops, and the documented rule fires."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    metrics = tmp_path / "mmd.prom"
    env = mmd_env(ENV, MMD_DEVICES="0", MMD_METRICS_FILE=str(metrics), MMD_METRICS_SECONDS="0.2")
    proc = LoggedProcess([sys.executable, "-m", "mmd", "serve", "--create"], tmp_path, tmp_path / "daemon.log", env)
    workers: set[int] = set()
    try:
        wait_for(lambda: "serving" in proc.logs() and metrics.exists(), 30, "the daemon and its metrics")
        first = metric_samples(metrics)
        wait_for(lambda: metric_samples(metrics)["mmd_last_update_timestamp_seconds"] > first[
            "mmd_last_update_timestamp_seconds"], 10, "a rewrite")  # fmt: skip
        alive = metric_samples(metrics)
        assert alive["mmd_up"] == 1 and alive["mmd_metrics_interval_seconds"] == 0.2
        assert not stale(alive, time.time()), "a serving daemon is not flagged"
        workers = worker_pids(proc.proc.pid)
        proc.proc.kill()
        proc.proc.wait(timeout=10)
        time.sleep(12 * 0.2 + 0.5)
        dead = metric_samples(metrics)
        assert dead["mmd_up"] == 1, "the file still says up: only its age can tell"
        assert stale(dead, time.time())
    finally:
        proc.stop()
        for pid in workers:  # orphans of the killed daemon, if they outlive it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_hooks_run_with_the_jobs_facts_and_no_shell(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    make(inbox / "good.txt", 3, 1)
    (inbox / "bad.txt").write_text("2\n1 2\n3 x\n1 2 3 4\n")
    record = tmp_path / "hooks.jsonl"
    script = (
        "import json, os, sys; "
        f"open({str(record)!r}, 'a').write(json.dumps([sys.argv[1:], "
        "{k: v for k, v in os.environ.items() if k.startswith('MMD_JOB_')}]) + '\\n')"
    )
    hook = json.dumps([sys.executable, "-c", script, "done;", "$(touch PWNED)"])
    (tmp_path / "c.yaml").write_text(
        f"on_done: {hook}\non_error: {json.dumps([sys.executable, '-c', script, 'error'])}\n"
    )
    r = run_mmd("serve", "--once", "--create", "--config", str(tmp_path / "c.yaml"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    by_status = {env["MMD_JOB_STATUS"]: (argv, env) for argv, env in calls}
    argv, env = by_status["ok"]
    assert argv == ["done;", "$(touch PWNED)"] and not (tmp_path / "PWNED").exists(), "no shell"
    assert env["MMD_JOB_INPUT"] == "good.txt" and env["MMD_JOB_OUTPUT"].endswith("outbox/good.out")
    assert env["MMD_JOB_SIDECAR"].endswith("good.timing.yaml") and env["MMD_JOB_KERNEL"] == "cpu"
    argv, env = by_status["error"]
    assert argv == ["error"] and env["MMD_JOB_INPUT"] == "bad.txt" and env["MMD_JOB_OUTPUT"] == ""
    assert "'x' is not a number" in env["MMD_JOB_REASON"] and len(env["MMD_JOB_ID"]) == 12


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    """The unit with its install paths pointed at real files here: systemd's own check of every directive."""
    text = UNIT.read_text()
    text = text.replace("/opt/mmd/venv/bin/mmd", shutil.which("true") or "/bin/true")
    text = re.sub(r"file:\S+", lambda m: "file:" + str(ROOT / "docs" / "operations.md"), text)
    unit = tmp_path / "mmd.service"
    unit.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in done.stderr.splitlines() if "mmd.service" in ln]
    assert done.returncode == 0 and not problems, done.stderr


def test_the_metrics_endpoint_answers_while_the_daemon_serves_and_fails_once_it_is_killed(tmp_path):
    """metrics_listen: Prometheus scrapes the daemon itself, so a daemon killed with SIGKILL fails its
    scrape (Prometheus' own ``up`` is 0 and the docs' alert fires), whatever its last words were."""
    import socket
    import urllib.request

    with socket.socket() as s:  # a free port on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    env = mmd_env(ENV, MMD_DEVICES="0", MMD_METRICS_LISTEN=f"127.0.0.1:{port}")
    proc = LoggedProcess([sys.executable, "-m", "mmd", "serve", "--create"], tmp_path, tmp_path / "daemon.log", env)
    url = f"http://127.0.0.1:{port}/metrics"
    workers: set[int] = set()
    try:
        wait_for(lambda: "serving" in proc.logs(), 30, "the daemon")
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        assert "\nmmd_up 1.0\n" in text and "mmd_jobs_total" in text
        workers = worker_pids(proc.proc.pid)
        proc.proc.kill()
        proc.proc.wait(timeout=10)
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=5)
    finally:
        proc.stop()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_units_exposure_stays_at_most_2_9(tmp_path):
    """The unit allows AF_INET for metrics_listen, from loopback only: systemd-analyze's exposure stays
    at 2.9 or below (2.8 with AF_UNIX alone)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(UNIT)], capture_output=True,
                         text=True, timeout=60).stdout  # fmt: skip
    level = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out)[1])
    assert level <= 2.9, out[-2000:]
