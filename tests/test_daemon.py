"""The daemon as a real process: real files, real signals, outputs checked against float64.

No sleep is used to synchronise: every wait polls a condition against a
deadline and fails the test when the deadline passes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmd import daemon, record, spool, textoutput
from mmd.check import full
from mmd.generate import input_chunks, random_matrix

from . import workerhooks
from .conftest import LoggedProcess, mmd_env, run_mmd, wait_for

#: Real processes and daemons: left out of `make quick`, run by `make test`.
pytestmark = pytest.mark.integration

ENV = {
    "MMD_LOG_FORMAT": "json",
    "MMD_BACKEND": "cpu",
    "MMD_CREATE_FOLDERS": "yes",
    "MMD_QUIET_SECONDS": "0.3",
    "MMD_RESCAN_SECONDS": "1",
    "MMD_POLL_SECONDS": "0.1",
}


def env(**extra: str) -> dict[str, str]:
    return mmd_env(ENV, **extra)


class Served(LoggedProcess):
    """``python -m mmd serve`` in ``root`` (inbox/ and outbox/ inside)."""

    def __init__(self, root: Path, *args: str, **extra_env: str) -> None:
        self.root = root
        self.inbox = root / "inbox"
        self.outbox = root / "outbox"
        argv = [sys.executable, "-m", "mmd", "serve", *args]
        super().__init__(argv, root, root / f"daemon-{time.monotonic_ns()}.log", env(**extra_env))

    def state(self) -> dict:
        return daemon.read_state(self.inbox) or {}

    def wait_serving(self) -> Served:
        def up() -> bool:
            state = self.state()
            return (state.get("status") == "serving" and state.get("pid") == self.proc.pid) or (
                self.proc.poll() is not None
            )

        wait_for(up, 30, "the daemon to serve")
        assert self.proc.poll() is None, self.logs()
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        return super().stop(sig, timeout)


@pytest.fixture
def served(tmp_path):
    procs: list[Served] = []

    def start(*args: str, **extra_env: str) -> Served:
        s = Served(tmp_path, *args, **extra_env)
        procs.append(s)
        return s

    yield start
    for s in procs:
        s.kill()


def make_input(path: Path, m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    path.write_bytes(b"".join(input_chunks(a, b, square=(m == k == n))))
    return a, b


def check_ok(outbox: Path, stem: str, a: np.ndarray, b: np.ndarray, input_name: str | None = None) -> dict:
    out = outbox / f"{stem}.out"
    values = textoutput.parse_output(out.read_bytes())
    report = full.against_inputs(values, a, b)
    assert report.ok, f"{stem}: {report.summary()}"
    rec = yaml.safe_load(record.timing_path(out).read_text())
    assert rec["status"] == "ok" and rec["output"]["name"] == out.name
    if input_name:
        assert rec["input"]["name"] == input_name
    return rec


def error_of(outbox: Path, stem: str) -> dict:
    rec = yaml.safe_load((outbox / f"{stem}.error.yaml").read_text())
    assert rec["status"] == "error"
    return rec


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


def work_files(inbox: Path) -> list[Path]:
    """Claimed files in the job folders under ``inbox/.work`` (a running daemon renames them as we look).

    Hidden names there are mmd's own bookkeeping (a job's attempt count), not jobs.
    """
    found: list[Path] = []
    for folder in (inbox / ".work").glob("*"):
        try:
            found.extend(p for p in folder.iterdir() if not p.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            continue  # renamed or removed between the listing and the look inside
    return found


# ---------------------------------------------------------------------------


def test_once_drains_backlog_names_refusals_and_versions(tmp_path):
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    good = {f"m{i}": make_input(inbox / f"m{i}.txt", 8 + i, 5 + i, 7, i) for i in range(5)}
    good["x@kernel=aplus,tile=16"] = make_input(inbox / "x@kernel=aplus,tile=16.txt", 16, 16, 16, 9)
    (inbox / "bad.txt").write_text("2\n1 2\n3\n")
    (inbox / "y@foo=1.txt").write_bytes((inbox / "m0.txt").read_bytes())
    os.symlink("/etc/passwd", inbox / "link.txt")
    (inbox / "skip.part").write_text("not yet")
    (outbox / "m1.out").write_text("a user's file\n")  # must not be overwritten
    good["m1.1"] = good.pop("m1")

    r = run_mmd("serve", "--once", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr

    for stem, (a, b) in good.items():
        check_ok(outbox, stem, a, b)
    assert (outbox / "m1.out").read_text() == "a user's file\n"
    rec = yaml.safe_load((outbox / "m1.1.timing.yaml").read_text())
    assert rec["collision"] == {"wanted": "m1.out", "existing": ["m1.out"], "used": "m1.1.out"}
    assert rec["input"]["name"] == "m1.txt"
    named = yaml.safe_load((outbox / "x@kernel=aplus,tile=16.timing.yaml").read_text())
    assert named["name_settings"] == {"kernel": "aplus", "tile": 16}
    assert named["requested"]["kernel"] == "aplus" and named["requested"]["tile"] == 16
    assert error_of(outbox, "bad")["error"]["kind"] == "input"
    assert error_of(outbox, "y@foo=1")["error"]["kind"] == "jobname"
    assert error_of(outbox, "link")["error"]["kind"] == "spool"
    assert names(inbox / ".failed") == {"bad.txt", "y@foo=1.txt", "link.txt"}
    assert names(inbox / ".done") == {f"m{i}.txt" for i in range(5)} | {"x@kernel=aplus,tile=16.txt"}
    own = {".work", ".done", ".failed", ".mmd.lock", ".mmd-state.json", ".mmd-arrivals.json"}
    assert names(inbox) - own == {"skip.part"}
    assert work_files(inbox) == []
    lines = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
    per_job = [e for e in lines if e.get("event") in ("job done", "job refused")]
    assert len(per_job) == 9 and all(e.get("job") and e.get("file") for e in per_job)


@pytest.mark.serial  # a wall-clock bound: alone on the machine
def test_once_on_empty_inbox_returns_at_once(tmp_path):
    t0 = time.monotonic()
    r = run_mmd("serve", "--once", "--inbox", "in", "--outbox", "out", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 10
    assert (tmp_path / "in").is_dir() and (tmp_path / "out").is_dir()


@pytest.mark.integration
def test_200_files_by_cp_and_slow_writers(tmp_path, served):
    stage = tmp_path / "stage"
    stage.mkdir()
    inputs = {}
    for i in range(196):
        m, k, n = 4 + i % 29, 3 + (i * 7) % 31, 5 + (i * 5) % 23
        inputs[f"f{i:03d}"] = make_input(stage / f"f{i:03d}.txt", m, k, n, 1000 + i)
    bad = {"bad1": "3\n1 2 3\n", "bad2": "x y z\n", "bad3": "2 2 2\n1 2 3 4\n5 6 7 nan?\n", "bad4": ""}
    for stem, text in bad.items():
        (stage / f"{stem}.txt").write_text(text)
    big = {f"big{j}": make_input(tmp_path / f"big{j}.src", 200, 180, 190, 7 + j) for j in range(3)}

    d = served().wait_serving()
    writers = [
        subprocess.Popen([sys.executable, "-c", SLOW_WRITER, f"{tmp_path}/{stem}.src", f"{d.inbox}/{stem}.txt"])
        for stem in big
    ]
    cp = subprocess.run(f"cp {stage}/*.txt {d.inbox}/", shell=True, check=True, timeout=60)
    assert cp.returncode == 0
    for w in writers:
        assert w.wait(timeout=60) == 0
    inputs.update(big)
    total = len(inputs) + len(bad)
    wait_for(lambda: len(list(d.outbox.glob("*.yaml"))) >= total, 120, f"{total} sidecars")
    wait_for(
        lambda: d.state().get("done", {}).get("ok", 0) + d.state().get("done", {}).get("error", 0) >= total,
        30,
        "the state file to count every job",
    )

    for stem, (a, b) in inputs.items():
        check_ok(d.outbox, stem, a, b, input_name=f"{stem}.txt")
    for stem in bad:
        assert error_of(d.outbox, stem)["error"]["kind"] == "input"
    assert d.proc.poll() is None, "a bad file killed the daemon"
    assert len(names(d.inbox / ".done")) == len(inputs)
    assert names(d.inbox / ".failed") == {f"{s}.txt" for s in bad}
    assert not list(d.outbox.glob("*.1.*")), "a file was processed twice"
    assert d.stop() == 0


def held_open_in(folder: Path) -> dict[str, int]:
    """Path → pid: the files in ``folder`` that any process holds open (an unnamed one reads
    ``folder/#<inode> (deleted)``)."""
    found = {}
    prefix = f"{os.path.realpath(folder)}/"
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix):
                found[target] = int(pid)
    return found


def test_the_outbox_shows_its_readers_outputs_and_sidecars_only_while_it_serves(served):
    """A daemon keeps nothing of its own where a reader of the outbox looks, and holds no file open there
    between jobs (an admin may remount the outbox read-only while it serves): after a burst and a refusal,
    the outbox of a daemon still serving holds results only. A commit's temporaries (``.<name>.<pid>.tmp``)
    exist only while it commits."""
    d = served().wait_serving()
    stems = [f"j{i:02d}" for i in range(24)]
    for i, stem in enumerate(stems):
        make_input(d.root / f"{stem}.src", 4, 4, 4, i)
    (d.root / "bad.src").write_text("2\n1 2\n3 x\n5 6\n7 8\n")
    for stem in [*stems, "bad"]:
        os.rename(d.root / f"{stem}.src", d.inbox / f"{stem}.txt")
    results = {f"{s}{suffix}" for s in stems for suffix in (".out", ".timing.yaml")} | {"bad.error.yaml"}
    wait_for(lambda: results <= set(os.listdir(d.outbox)), 60, "every job's results")
    done = len(stems) + 1
    wait_for(lambda: sum(d.state().get("done", {}).get(k, 0) for k in ("ok", "error")) >= done, 30,
             "the state file to count every job")  # fmt: skip
    assert d.proc.poll() is None
    assert sorted(os.listdir(d.outbox)) == sorted(results)
    assert held_open_in(d.outbox) == {}
    assert d.stop() == 0


SLOW_WRITER = """
import sys, time
data = open(sys.argv[1], 'rb').read()
with open(sys.argv[2], 'wb') as fh:          # one open: the close comes once, at the end
    for start in range(0, len(data), 32768):
        fh.write(data[start:start + 32768]); fh.flush()
        time.sleep(0.01)                      # slower than the daemon, well under quiet_seconds
"""


PAUSED_WRITER = """
import sys, time
data = open(sys.argv[1], 'rb').read()
with open(sys.argv[2], 'wb') as fh:          # scp over a slow link: one open, a long pause halfway
    fh.write(data[: len(data) // 2]); fh.flush()
    time.sleep(float(sys.argv[3]))
    fh.write(data[len(data) // 2 :])
"""


def test_a_writer_that_pauses_is_waited_for_until_it_closes(tmp_path, served):
    """A pause longer than quiet_seconds and the rescan period: the half-written file is not taken (it was
    refused before: "header promises ... can hold at most ..."), the whole one is."""
    a, b = make_input(tmp_path / "slow.src", 60, 50, 40, 11)
    d = served(MMD_RESCAN_SECONDS="0.2").wait_serving()
    writer = subprocess.Popen([sys.executable, "-c", PAUSED_WRITER, str(tmp_path / "slow.src"),
                               str(d.inbox / "slow.txt"), "1.5"])  # fmt: skip
    assert writer.wait(timeout=60) == 0
    wait_for(lambda: list(d.outbox.glob("slow.*.yaml")), 30, "the slow job's sidecar")
    check_ok(d.outbox, "slow", a, b)
    assert d.stop() == 0


@pytest.mark.integration
def test_kill9_then_restart_loses_and_doubles_nothing(tmp_path, served):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    inputs = {f"k{i:02d}": make_input(inbox / f"k{i:02d}.txt", 150, 150, 150, 50 + i) for i in range(30)}
    d = served().wait_serving()
    wait_for(lambda: work_files(inbox) and len(names(d.outbox)) >= 6, 60, "jobs under way")
    d.proc.kill()  # SIGKILL, mid-job most likely
    d.proc.wait(timeout=10)

    r = run_mmd("serve", "--once", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr
    for stem, (a, b) in inputs.items():
        check_ok(tmp_path / "outbox", stem, a, b)
    assert not list((tmp_path / "outbox").glob("*.1.*")), "a job was done twice"
    assert not list((tmp_path / "outbox").glob(".*.tmp")), "a temporary was left behind"
    assert names(inbox / ".done") == {f"{s}.txt" for s in inputs}
    assert work_files(inbox) == []


@pytest.mark.parametrize("stage", ["nothing", "output", "output+sidecar"])
def test_recovery_at_each_commit_stage(tmp_path, stage):
    """A job killed before its output, after its output, or after its sidecar ends with exactly one result."""
    s = spool.Spool(spool.Shared(tmp_path / "inbox", tmp_path / "outbox"))
    s.shared.prepare()
    a, b = make_input(s.shared.inbox / "m.txt", 6, 4, 5, 3)
    claim = s.claims.claim("m.txt")
    if stage != "nothing":
        claim.output.write_text("half-committed by the killed daemon")
    if stage == "output+sidecar":
        r = run_mmd("run", str(claim.path), "-o", str(tmp_path / "ref.out"), env=ENV)
        assert r.returncode == 0, r.stderr
        os.replace(tmp_path / "ref.out", claim.output)
        rec = yaml.safe_load((tmp_path / "ref.timing.yaml").read_text())
        rec["job"] = claim.job_id
        rec["output"]["name"] = claim.output.name
        sidecar_path = record.timing_path(claim.output)
        sidecar_path.write_text(yaml.safe_dump(rec))
        before = sidecar_path.read_bytes()

    r = run_mmd("serve", "--once", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr
    rec = check_ok(s.shared.outbox, "m", a, b, input_name="m.txt")
    assert rec["job"] == claim.job_id
    if stage == "output+sidecar":
        assert record.timing_path(claim.output).read_bytes() == before  # only the archive was left
    else:
        assert rec["resumed"] is True
    assert names(s.shared.outbox) == {"m.out", "m.timing.yaml"}
    assert names(s.shared.inbox / ".done") == {"m.txt"}
    assert work_files(s.shared.inbox) == []


@pytest.mark.serial  # a wall-clock bound on the shutdown: alone on the machine
def test_sigterm_finishes_the_job_in_hand_and_exits_zero(tmp_path, served):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for i in range(40):
        make_input(inbox / f"t{i:02d}.txt", 120, 120, 120, i)
    d = served().wait_serving()
    wait_for(lambda: len(names(d.outbox)) >= 2, 30, "the first jobs")
    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    assert time.monotonic() - t0 < 5
    assert work_files(inbox) == [], "a job was left half done"
    done = names(inbox / ".done")
    waiting = {n for n in names(inbox) if spool.is_job_name(n)}
    assert done | waiting == {f"t{i:02d}.txt" for i in range(40)} and not done & waiting
    for name in done:
        assert (d.outbox / (name[:-4] + ".timing.yaml")).exists()
    assert any(e.get("event") == "stopping after the jobs in hand" for e in d.events())
    assert d.state()["status"] == "stopped"


def test_second_daemon_is_refused_and_status_reports(tmp_path, served):
    d = served().wait_serving()
    r = run_mmd("serve", cwd=tmp_path, env=ENV, timeout=30)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"mmd serve: another mmd daemon (pid {d.proc.pid}) already serves inbox"
    )
    make_input(tmp_path / "s.src", 8, 8, 8, 1)
    os.rename(tmp_path / "s.src", d.inbox / "s.txt")  # a rename into the inbox: complete at once
    wait_for(lambda: (d.outbox / "s.timing.yaml").exists(), 30, "the job")
    wait_for(lambda: d.state().get("done", {}).get("ok") == 1, 10, "the state file")

    r = run_mmd("status", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["serving"] and st["pid"] == d.proc.pid
    assert st["state"]["observer"] == "inotify" and st["state"]["queue"] == 0
    assert st["state"]["recent"][0]["file"] == "s.txt" and st["state"]["recent"][0]["status"] == "ok"
    text = run_mmd("status", cwd=tmp_path)
    assert text.returncode == 0 and f"pid {d.proc.pid}" in text.stdout and "s.txt" in text.stdout

    assert d.stop() == 0
    r = run_mmd("status", cwd=tmp_path)
    assert r.returncode == 3 and "no daemon serves" in r.stdout


def test_polling_observer_and_startup_backlog(tmp_path, served):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    early = make_input(inbox / "early.txt", 9, 9, 9, 1)
    d = served("--observer", "polling").wait_serving()
    assert d.state()["observer"] == "polling"
    late = make_input(tmp_path / "late.src", 7, 3, 5, 2)
    subprocess.run(["cp", str(tmp_path / "late.src"), str(inbox / "late.txt")], check=True)
    wait_for(
        lambda: (d.outbox / "late.timing.yaml").exists() and (d.outbox / "early.timing.yaml").exists(), 30, "both jobs"
    )
    check_ok(d.outbox, "early", *early)
    check_ok(d.outbox, "late", *late)
    assert d.stop() == 0


def test_sighup_reloads_settings(tmp_path, served):
    cfg = tmp_path / "mmd.yaml"
    cfg.write_text("kernel: naive\n")
    d = served("--config", str(cfg)).wait_serving()
    make_input(tmp_path / "a.src", 4, 4, 4, 1)
    make_input(tmp_path / "b.src", 4, 4, 4, 2)
    os.rename(tmp_path / "a.src", d.inbox / "a.txt")
    wait_for(lambda: (d.outbox / "a.timing.yaml").exists(), 30, "job a")
    cfg.write_text("kernel: coarse\ninbox: elsewhere\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: any(e.get("event") == "SIGHUP: settings reloaded" for e in d.events()), 30, "the reload")
    assert any("need a restart" in e.get("event", "") for e in d.events())
    os.rename(tmp_path / "b.src", d.inbox / "b.txt")
    wait_for(lambda: (d.outbox / "b.timing.yaml").exists(), 30, "job b")
    assert yaml.safe_load((d.outbox / "a.timing.yaml").read_text())["requested"]["kernel"] == "naive"
    assert yaml.safe_load((d.outbox / "b.timing.yaml").read_text())["requested"]["kernel"] == "coarse"
    assert d.stop() == 0


def test_unexpected_exception_becomes_internal_refusal(tmp_path):
    """A bug in a job (raised in its worker) writes kind `internal` and the daemon goes on."""
    from mmd import config

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    make_input(inbox / "boom.txt", 3, 3, 3, 1)
    a, b = make_input(inbox / "fine.txt", 3, 3, 3, 2)
    settings = config.Settings(
        inbox=inbox, outbox=tmp_path / "outbox", backend="cpu", quiet_seconds=0.05, create_folders=True
    )
    setup = workerhooks.partial(workerhooks.raise_in_job, "boom.txt")
    assert daemon.Daemon(settings, worker_setup=setup).serve(once=True) == 0
    rec = error_of(tmp_path / "outbox", "boom")
    assert rec["error"]["kind"] == "internal" and "simulated bug" in rec["error"]["reason"]
    check_ok(tmp_path / "outbox", "fine", a, b)
    assert names(inbox / ".failed") == {"boom.txt"}


# A daemon whose jobs wait for a file called "release" in the working folder: a job is
# then certainly "in hand" when the signals come.


def _held_daemon(tmp_path) -> subprocess.Popen:
    argv = workerhooks.launcher('partial(workerhooks.hold_jobs_until, "release")')
    with open(tmp_path / "held.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(argv, cwd=tmp_path, env=env(), stdout=log, stderr=log)


def _held_log(tmp_path) -> list[dict]:
    text = (tmp_path / "held.log").read_text()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("second_signal", [False, True])
def test_two_stage_shutdown(tmp_path, second_signal):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    inputs = {f"h{i}": make_input(inbox / f"h{i}.txt", 5, 5, 5, i) for i in range(3)}
    proc = _held_daemon(tmp_path)
    try:
        wait_for(lambda: work_files(inbox), 30, "a job in hand")
        proc.send_signal(signal.SIGTERM)
        wait_for(
            lambda: any(e.get("event") == "stopping after the jobs in hand" for e in _held_log(tmp_path)),
            30,
            "the first stage",
        )
        if second_signal:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 1
            assert 1 <= len(work_files(inbox)) <= 2, "the jobs in hand (one per worker) stay in .work"
            assert "stopping at once" in (tmp_path / "held.log").read_text()
        else:
            (tmp_path / "release").write_text("")
            assert proc.wait(timeout=10) == 0
            assert work_files(inbox) == []
            assert 1 <= len(names(inbox / ".done")) <= 2, "the jobs in hand (one per worker) are done"
        assert {n for n in names(inbox) if spool.is_job_name(n)}, "unstarted jobs stay in the inbox"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    r = run_mmd("serve", "--once", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr
    for stem, (a, b) in inputs.items():
        check_ok(tmp_path / "outbox", stem, a, b)
    assert names(inbox / ".done") == {f"{s}.txt" for s in inputs}
    assert not list((tmp_path / "outbox").glob("*.1.*"))
