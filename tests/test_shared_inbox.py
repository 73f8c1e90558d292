"""Several daemons on one inbox, as on a shared (NFS) filesystem: claim by rename, nothing lost or doubled.

Today the daemon holds ``inbox/.mmd.lock`` (an exclusive flock) and refuses a
second daemon on the same inbox, so several daemons cannot serve one inbox.
The tests here say what holds and what must change:

* the claim itself (one ``os.rename``) has exactly one winner, between threads
  and between processes: passes;
* N real daemon processes whose lock is patched away in the test serve one
  inbox without losing or doubling a job: passes, so the claim/commit/archive
  protocol is sound once the daemons are started together;
* the contract for a ``shared_inbox`` setting (a lock per host, and a starting
  daemon that leaves another host's jobs in ``.work`` alone) and for two
  daemons claiming files of the same stem: strict xfails until the daemon and
  spool have that change (docs/cluster.md, "Several machines, one inbox").

The daemons use the polling observer, as on NFS. No sleep synchronises:
every wait polls a condition against a deadline.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmd import config, spool, textoutput
from mmd.check import full
from mmd.generate import input_chunks, random_matrix

from . import workerhooks
from .conftest import LoggedProcess, mmd_env, wait_for

#: Real processes and daemons: left out of `make quick`, run by `make test`.
pytestmark = pytest.mark.integration

#: Whether the daemon has the shared-inbox setting this file's contract is written for.
SHARED = "shared_inbox" in {f.name for f in dataclasses.fields(config.Settings)}

ENV = {
    "MMD_LOG_FORMAT": "json",
    "MMD_BACKEND": "cpu",
    "MMD_CREATE_FOLDERS": "yes",
    "MMD_QUIET_SECONDS": "0.2",
    "MMD_RESCAN_SECONDS": "1",
    "MMD_POLL_SECONDS": "0.1",
}

# `mmd serve` with the inbox lock taken out, to test the spool protocol alone.
UNLOCKED = """
import sys
from mmd import daemon
daemon.SpoolLock.acquire = lambda self: None
daemon.SpoolLock.release = lambda self: None
from mmd.cli import main
sys.exit(main(sys.argv[1:]))
"""

# A daemon whose jobs wait, in its worker processes, for a file called "release" in the working folder: a
# claimed job certainly sits in .work while another daemon starts.
HELD = 'partial(workerhooks.hold_jobs_until, "release")'


def env(**extra: str) -> dict[str, str]:
    return mmd_env(ENV, **extra)


def host_env(i: int) -> dict[str, str]:
    """The identity of daemon ``i``: its own host, as if on another machine of the cluster."""
    return {"MMD_SHARED_INBOX": "true", "MMD_HOST_ID": f"node{i}"} if SHARED else {}


class Proc(LoggedProcess):
    """One daemon process in ``root`` with its own log."""

    def __init__(self, root: Path, argv: list[str], name: str, **extra_env: str) -> None:
        super().__init__(argv, root, root / f"{name}.log", env(**extra_env))

    def serving(self) -> bool:
        return any(e.get("event") == "serving" for e in self.events())


@pytest.fixture
def procs():
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def serve_argv(unlocked: bool) -> list[str]:
    head = [sys.executable, "-c", UNLOCKED] if unlocked else [sys.executable, "-m", "mmd"]
    return [*head, "serve", "--observer", "polling", "--backend", "cpu"]


def start(root: Path, procs: list[Proc], i: int, unlocked: bool) -> Proc:
    p = Proc(root, serve_argv(unlocked), f"daemon{i}", **({} if unlocked else host_env(i)))
    procs.append(p)
    return p


def up(p: Proc) -> bool:
    return p.serving() or p.proc.poll() is not None


def drop(root: Path, count: int, n: int = 8) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Write ``count`` inputs in a staging folder and rename each into the inbox (atomic, like a client)."""
    stage, inbox = root / "stage", root / "inbox"
    stage.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    inputs = {}
    for i in range(count):
        stem = f"job{i:04d}"
        a, b = random_matrix(rng, n, n), random_matrix(rng, n, n)
        (stage / f"{stem}.txt").write_bytes(b"".join(input_chunks(a, b, square=True)))
        inputs[stem] = (a, b)
    for stem in inputs:
        os.rename(stage / f"{stem}.txt", inbox / f"{stem}.txt")
    return inputs


def assert_each_exactly_once(root: Path, inputs: dict, daemons: list[Proc]) -> None:
    inbox, outbox = root / "inbox", root / "outbox"
    expected = {f"{s}.out" for s in inputs} | {f"{s}.timing.yaml" for s in inputs}
    assert set(os.listdir(outbox)) == expected, "lost, doubled (m.1.out), refused or temporary files in the outbox"
    jobs = set()
    for stem, (a, b) in inputs.items():
        rec = yaml.safe_load((outbox / f"{stem}.timing.yaml").read_text())
        assert rec["status"] == "ok" and rec["input"]["name"] == f"{stem}.txt"
        assert rec["output"]["name"] == f"{stem}.out"
        jobs.add(rec["job"])
        report = full.against_inputs(textoutput.parse_output((outbox / f"{stem}.out").read_bytes()), a, b)
        assert report.ok, f"{stem}: {report.summary()}"
    assert len(jobs) == len(inputs)
    assert sorted(os.listdir(inbox / ".done")) == sorted(f"{s}.txt" for s in inputs), "archived once each"
    assert not (inbox / ".failed").exists() or not os.listdir(inbox / ".failed")
    assert not [n for n in os.listdir(inbox) if spool.is_job_name(n)], "files left in the inbox"
    # .work/<job>.<v>/m.txt, or .work/<host>/<job>.<v>/m.txt on a shared inbox; empty (spare) folders may stay
    left = [f for f in (inbox / ".work").rglob("*") if not f.is_dir()]
    assert left == [], f"files left in .work: {left}"
    done_by = {i: sum(1 for e in d.events() if e.get("event") == "job done") for i, d in enumerate(daemons)}
    assert sum(done_by.values()) == len(inputs), f"a job ran twice (or was lost): jobs run per daemon {done_by}"
    assert sum(1 for n in done_by.values() if n) >= 2, f"only one daemon worked, nothing was contended: {done_by}"
    errors = [e for d in daemons for e in d.events() if e.get("level") in ("error", "critical")]
    assert errors == [], errors


# ---------------------------------------------------------------------------
# the claim: one rename, one winner


def test_claim_race_between_threads_has_one_winner(tmp_path):
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    names = [f"f{i:03d}.txt" for i in range(200)]
    for name in names:
        (inbox / name).write_text("1\n1\n1\n")
    claimers = 8
    barrier = threading.Barrier(claimers)
    won: list[list[spool.Claim]] = [[] for _ in range(claimers)]

    def claim_all(k: int) -> None:
        s = spool.Spool(spool.Shared(inbox, outbox))  # one Spool per "daemon"
        order = names[:]
        random.Random(k).shuffle(order)
        barrier.wait()
        for name in order:
            c = s.claims.claim(name)
            if c is not None:
                won[k].append(c)

    threads = [threading.Thread(target=claim_all, args=(k,)) for k in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    claims = [c for w in won for c in w]
    assert sorted(c.name for c in claims) == names, "every file claimed exactly once"
    assert len({c.path.parent for c in claims}) == len(claims), "one job folder per claim"
    assert all(c.path.read_text() == "1\n1\n1\n" for c in claims)
    assert sum(1 for w in won if w) >= 2, "the claimers did not overlap"


def _claim_in_process(inbox: str, outbox: str, names: list[str], seed: int, go, results) -> None:
    s = spool.Spool(spool.Shared(Path(inbox), Path(outbox)))
    order = names[:]
    random.Random(seed).shuffle(order)
    go.wait()
    results.put([c.name for name in order if (c := s.claims.claim(name)) is not None])


def test_claim_race_between_processes_has_one_winner(tmp_path):
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    names = [f"f{i:03d}.txt" for i in range(300)]
    for name in names:
        (inbox / name).write_text("1\n1\n1\n")
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    go, results = ctx.Event(), ctx.Queue()
    workers = [
        ctx.Process(target=_claim_in_process, args=(str(inbox), str(outbox), names, k, go, results)) for k in range(6)
    ]
    for w in workers:
        w.start()
    go.set()
    won = [results.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    assert sorted(n for w in won for n in w) == names, "every file claimed exactly once"
    work = [f for d in (inbox / ".work").iterdir() if d.is_dir() for f in d.iterdir()]
    assert sorted(f.name for f in work) == names


def test_two_daemons_claiming_the_same_stem_get_two_outputs(tmp_path):
    """The output version is reserved at the claim (outbox/.m.claim, O_EXCL), so the second claimer takes m.1.out."""
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    for name in ("m.txt", "m.dat"):
        (inbox / name).write_text("1\n1\n1\n")
    first = spool.Spool(spool.Shared(inbox, outbox)).claims.claim("m.txt")
    second = spool.Spool(spool.Shared(inbox, outbox)).claims.claim("m.dat")
    assert first is not None and second is not None
    assert first.output != second.output
    assert sorted(p.name for p in outbox.iterdir()) == [".m.1.claim", ".m.claim"]


# ---------------------------------------------------------------------------
# daemons


@pytest.mark.integration
def test_daemons_without_their_lock_share_an_inbox(tmp_path, procs):
    """The protocol alone: 4 daemons (lock patched away), started together, 300 files."""
    (tmp_path / "inbox").mkdir()
    daemons = [start(tmp_path, procs, i, unlocked=True) for i in range(4)]
    for d in daemons:
        wait_for(lambda d=d: up(d), 60, "the daemons to serve")
        assert d.proc.poll() is None, d.log_path.read_text()
    inputs = drop(tmp_path, 300)
    wait_for(lambda: len(list((tmp_path / "outbox").glob("*.timing.yaml"))) >= 300, 120, "300 sidecars")
    wait_for(lambda: len(os.listdir(tmp_path / "inbox" / ".done")) >= 300, 30, "300 archives")
    assert [d.stop() for d in daemons] == [0] * 4
    assert_each_exactly_once(tmp_path, inputs, daemons)


@pytest.mark.integration
def test_several_daemons_serve_one_inbox(tmp_path, procs):
    """The shared-inbox contract: 4 real `mmd serve` processes, each its own host, two of them
    started while the others already work; 300 files; each exactly once."""
    (tmp_path / "inbox").mkdir()
    early = [start(tmp_path, procs, i, unlocked=False) for i in range(2)]
    for d in early:
        wait_for(lambda d=d: up(d), 60, "the first daemons to serve")
    assert all(d.proc.poll() is None for d in early), [d.log_path.read_text() for d in early]
    inputs = drop(tmp_path, 300)
    late = [start(tmp_path, procs, i, unlocked=False) for i in range(2, 4)]
    for d in late:
        wait_for(lambda d=d: up(d), 60, "the later daemons to serve")
    daemons = early + late
    assert all(d.proc.poll() is None for d in daemons), [d.log_path.read_text() for d in daemons]
    wait_for(lambda: len(list((tmp_path / "outbox").glob("*.timing.yaml"))) >= 300, 120, "300 sidecars")
    wait_for(lambda: len(os.listdir(tmp_path / "inbox" / ".done")) >= 300, 30, "300 archives")
    assert [d.stop() for d in daemons] == [0] * 4
    assert_each_exactly_once(tmp_path, inputs, daemons)


@pytest.mark.skipif(not SHARED, reason="needs the shared_inbox setting")
def test_second_daemon_of_one_host_is_still_refused(tmp_path, procs):
    (tmp_path / "inbox").mkdir()
    first = start(tmp_path, procs, 0, unlocked=False)
    wait_for(lambda: up(first), 60, "the first daemon to serve")
    twin = Proc(tmp_path, serve_argv(False), "twin", **host_env(0))
    procs.append(twin)
    assert twin.proc.wait(timeout=60) == 1
    assert "already serves" in twin.log_path.read_text()
    assert first.stop() == 0


@pytest.mark.skipif(not SHARED, reason="needs the shared_inbox setting")
def test_a_starting_daemon_leaves_another_hosts_job_in_hand_alone(tmp_path, procs):
    """Recovery resumes every .work folder at start: on a shared inbox those may be another host's jobs in hand."""
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    rng = np.random.default_rng(1)
    a, b = random_matrix(rng, 5, 5), random_matrix(rng, 5, 5)
    (inbox / "held.txt").write_bytes(b"".join(input_chunks(a, b, square=True)))
    holder = Proc(tmp_path, workerhooks.launcher(HELD, "serve", "--observer", "polling"), "holder", **host_env(0))
    procs.append(holder)
    wait_for(
        lambda: list((inbox / ".work").glob("**/held.txt")) if (inbox / ".work").exists() else [],
        60,
        "the holder to claim its job",
    )
    other = subprocess.run(
        [sys.executable, "-m", "mmd", "serve", "--once", "--observer", "polling"],
        cwd=tmp_path,
        env=env(**host_env(1)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode == 0, other.stderr
    assert not (outbox / "held.out").exists(), "the starting daemon ran a job another daemon holds"
    assert list((inbox / ".work").glob("**/held.txt")), "the starting daemon took a job another daemon holds"
    (tmp_path / "release").write_text("")
    wait_for(lambda: (outbox / "held.timing.yaml").exists(), 60, "the holder to finish")
    assert holder.stop() == 0
    assert full.against_inputs(textoutput.parse_output((outbox / "held.out").read_bytes()), a, b).ok


# ---------------------------------------------------------------------------
# the pieces of shared_inbox, in process


def test_locks_of_a_shared_inbox(tmp_path):
    from mmd.daemon import SpoolLock, status_of
    from mmd.errors import SpoolError

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    a, b = SpoolLock(inbox, "node0"), SpoolLock(inbox, "node1")
    a.acquire()
    b.acquire()  # two hosts serve together
    assert (inbox / ".mmd.node0.lock").read_text() == f"node0 {os.getpid()}\n"
    with pytest.raises(SpoolError, match="already serves"):
        SpoolLock(inbox, "node0").acquire()  # a second daemon of one host
    with pytest.raises(SpoolError, match="shared_inbox"):
        SpoolLock(inbox).acquire()  # a daemon without the setting
    status = status_of(inbox, "node0")
    assert status["serving"] and [(h["host"], h["serving"], h["own"]) for h in status["hosts"]] == [
        ("node0", True, True),
        ("node1", True, False),
    ]
    a.release()
    b.release()
    single = SpoolLock(inbox)
    single.acquire()
    with pytest.raises(SpoolError, match="without shared_inbox"):
        SpoolLock(inbox, "node2").acquire()
    single.release()
    assert not status_of(inbox, "node0")["serving"]


def test_each_host_sweeps_only_its_own_temporaries(tmp_path):
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    dead = 2**22 + 12345  # above pid_max's default: never alive
    mine = outbox / f".m.out.node0.{dead}.tmp"
    theirs = outbox / f".m.out.node1.{dead}.tmp"
    state_mine = inbox / f"..mmd-state.node0.json.{dead}.tmp"  # _write_state: .<name>.<pid>.tmp
    state_theirs = inbox / f"..mmd-state.node1.json.{dead}.tmp"
    for p in (mine, theirs, state_mine, state_theirs):
        p.write_text("")
    node0 = spool.Spool(spool.Shared(inbox, outbox, "node0"))
    assert sorted(node0.archive.sweep_temporaries()) == sorted([mine, state_mine])
    assert theirs.exists() and state_theirs.exists()


def test_archive_never_replaces_and_reservations_go_with_the_job(tmp_path):
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    (inbox / "m.txt").write_text("first")
    first = spool.Spool(spool.Shared(inbox, outbox, "node0")).claims.claim("m.txt")
    (inbox / "m.txt").write_text("second")
    second = spool.Spool(spool.Shared(inbox, outbox, "node1")).claims.claim("m.txt")
    assert first is not None and second is not None
    assert first.path.parent.parent.name == "node0" and second.path.parent.parent.name == "node1"
    assert (first.output.name, second.output.name) == ("m.out", "m.1.out")
    hosts = (("node0", first), ("node1", second))
    done = [spool.Spool(spool.Shared(inbox, outbox, h)).archive.add(c, True) for h, c in hosts]
    assert [p.name for p in done] == ["m.txt", f"m.{second.job_id}.txt"]
    assert [p.read_text() for p in done] == ["first", "second"]
    assert not [p for p in outbox.iterdir() if p.name.endswith(".claim")], "reservations dropped at the archive"
    assert spool.Spool(spool.Shared(inbox, outbox, "node0")).claims.resumable() == []
