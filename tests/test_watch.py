"""A worker on a watch: an idle daemon's next arrival is claimed by a worker itself (``messages.Watch``).

Real ``mmd serve`` processes, real files and signals. Their workers log each
watch they start and each arrival they take on one (tests/workerhooks.py's
``log_watches``), so a test sees which way each job came: taken on a watch,
or given as an order by the main process. What the runner does with a watch
in one process (what it tells, a claim that fails) is in
tests/test_spool_faults.py.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from mmd import daemon

from . import workerhooks
from .conftest import LoggedProcess, mmd_env, wait_for
from .test_daemon import ENV, check_ok, make_input, names, work_files


class Watched(LoggedProcess):
    """``mmd serve`` in ``root`` whose workers log their watches to ``root/watches.log`` (and run ``also``)."""

    def __init__(self, root: Path, *also: str, **extra_env: str) -> None:
        self.root, self.inbox, self.outbox = root, root / "inbox", root / "outbox"
        self.watch_log = root / "watches.log"
        self.seen = 0  # watches started when watching() last returned
        setups = [f"partial(workerhooks.log_watches, {str(self.watch_log)!r})", *also]
        argv = workerhooks.launcher(f"partial(workerhooks.chain, {', '.join(setups)})", "serve")
        super().__init__(argv, root, root / f"daemon-{time.monotonic_ns()}.log", mmd_env(ENV, **extra_env))

    def lines(self) -> list[list[str]]:
        text = self.watch_log.read_text() if self.watch_log.exists() else ""
        return [line.split() for line in text.splitlines()]

    def taken(self) -> list[str]:
        """The inputs taken on a watch, in order (each logged once its job is done: after its sidecar)."""
        return [parts[1] for parts in self.lines() if parts[0] == "took"]

    def took(self, *expected: str) -> None:
        """Wait until the inputs taken on a watch are ``expected``, failing if one more is logged."""
        wait_for(lambda: len(self.taken()) >= len(expected), 30, f"{expected} logged as taken on watches")
        assert self.taken() == list(expected)

    def watches(self) -> int:
        return sum(parts[0] == "watch" for parts in self.lines())

    def watcher(self) -> int | None:
        """The live worker whose last line is a watch (each worker logs its own in order), or None."""
        last = {parts[-1]: parts[0] for parts in self.lines()}
        for pid, what in last.items():
            if what == "watch":
                try:
                    os.kill(int(pid), 0)
                except ProcessLookupError:
                    continue  # a worker killed on its watch's job
                return int(pid)
        return None

    def watching(self) -> None:
        """Wait until a worker is on a watch that has taken nothing yet, a later one than the last call saw."""

        def up() -> bool:
            return (self.watcher() is not None and self.watches() > self.seen) or self.proc.poll() is not None

        wait_for(up, 30, "a watch")
        assert self.proc.poll() is None, self.logs()
        self.seen = self.watches()


@pytest.fixture
def serve(tmp_path):
    procs: list[Watched] = []

    def start(*also: str, **extra_env: str) -> Watched:
        d = Watched(tmp_path, *also, **extra_env)
        procs.append(d)
        return d

    yield start
    for d in procs:
        d.kill()


def drop(d: Watched, stem: str, seed: int, n: int = 8):
    """Rename a complete input into the inbox; its matrices."""
    a, b = make_input(d.root / f"{stem}.src", n, n, n, seed)
    os.rename(d.root / f"{stem}.src", d.inbox / f"{stem}.txt")
    return a, b


def sidecar_of(d: Watched, stem: str) -> bool:
    return (d.outbox / f"{stem}.timing.yaml").exists()


def lone_on_a_new_watch(d: Watched, stem: str, seed: int, *taken_before: str) -> None:
    """Once a new watch is on, drop ``stem``: it is done right, and taken on the watch (after
    ``taken_before``)."""
    d.watching()
    a, b = drop(d, stem, seed)
    wait_for(lambda: sidecar_of(d, stem), 30, f"{stem}'s sidecar")
    check_ok(d.outbox, stem, a, b)
    d.took(*taken_before, f"{stem}.txt")


def test_lone_arrivals_are_taken_on_watches_and_a_burst_goes_out_as_orders(serve, tmp_path):
    """Each lone arrival on an idle daemon is claimed by the watching worker. Of a burst the watch takes the
    first (held in its job here): the main process gives every other one to the other worker meanwhile, none
    waits behind the job the watch took. Each job runs once; stopping leaves nothing behind."""
    release = tmp_path / "release"
    d = serve(f"partial(workerhooks.hold_jobs_until, {str(release)!r}, ('b00.txt',))", MMD_DEVICES="0,1")
    lone = [f"lone{i}" for i in range(3)]
    for i, stem in enumerate(lone):
        lone_on_a_new_watch(d, stem, i, *(f"{s}.txt" for s in lone[:i]))
    d.watching()
    burst = {f"b{i:02d}": make_input(d.root / f"b{i:02d}.src", 8, 8, 8, 100 + i) for i in range(20)}
    for stem in burst:
        os.rename(d.root / f"{stem}.src", d.inbox / f"{stem}.txt")
    wait_for(lambda: all(sidecar_of(d, f"b{i:02d}") for i in range(1, 20)), 60, "the burst's sidecars but b00's")
    assert not sidecar_of(d, "b00"), "b00 is held in the watching worker's job"
    release.touch()
    wait_for(lambda: sidecar_of(d, "b00"), 30, "b00's sidecar")
    d.took("lone0.txt", "lone1.txt", "lone2.txt", "b00.txt")
    for stem, (a, b) in burst.items():
        check_ok(d.outbox, stem, a, b)
    assert not list(d.outbox.glob("*.1.*")), "a job ran twice"
    assert names(d.inbox / ".done") == {f"{stem}.txt" for stem in (*lone, *burst)}
    assert d.stop() == 0
    assert work_files(d.inbox) == []
    assert not [p.name for p in d.outbox.iterdir() if p.name.endswith(".tmp") or p.name.endswith(".claim")]


def test_a_file_the_watch_cannot_see_is_given_by_the_main_process(serve):
    """A name linked into the inbox (its first name then removed: mmd refuses a file with two) makes no event
    the watch asks for: the rescan finds it, the watch is asked to end, and the main process gives it as an
    order."""
    d = serve(MMD_RESCAN_SECONDS="0.2")
    d.watching()
    a, b = make_input(d.root / "linked.src", 8, 8, 8, 7)
    os.link(d.root / "linked.src", d.inbox / "linked.txt")
    os.unlink(d.root / "linked.src")
    wait_for(lambda: sidecar_of(d, "linked"), 30, "the linked file's sidecar")
    check_ok(d.outbox, "linked", a, b)
    assert d.taken() == []
    lone_on_a_new_watch(d, "after", 8)  # a new watch once idle again
    assert d.stop() == 0


def test_a_watching_worker_killed_after_its_claim_loses_and_doubles_nothing(serve, tmp_path):
    """The worker dies (SIGKILL) after claiming an arrival on its watch, before telling anyone: the daemon finds
    the job in .work by the watch's job id, a fresh worker resumes it, and it is done once."""
    marker = tmp_path / "died"
    d = serve(f"partial(workerhooks.die_once, {str(marker)!r}, 'm.txt')")
    d.watching()
    a, b = drop(d, "m", 3)
    wait_for(lambda: sidecar_of(d, "m"), 60, "the resumed job's sidecar")
    assert marker.exists(), "the worker died in the job"
    rec = check_ok(d.outbox, "m", a, b)
    assert rec["resumed"] is True
    assert [e["event"] for e in d.events() if e.get("event") == "a worker died"]
    assert d.stop() == 0
    assert names(d.inbox / ".done") == {"m.txt"} and work_files(d.inbox) == []
    assert not list(d.outbox.glob("m.1.*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_the_watch(serve, sig):
    """SIGTERM: the watch ends and the daemon exits at once (nothing in hand). SIGHUP: the new settings end
    the watch, and the next arrival is taken on a new one."""
    d = serve()
    d.watching()
    t0 = time.monotonic()
    if sig == signal.SIGTERM:
        assert d.stop(sig) == 0
        assert time.monotonic() - t0 < 10, "an idle daemon stops at once"
        assert not list(d.outbox.glob(".*.tmp"))
        return
    seen = d.watches()
    d.proc.send_signal(sig)
    wait_for(lambda: d.watches() > seen, 30, "a new watch after the reload")
    a, b = drop(d, "m", 4)
    wait_for(lambda: sidecar_of(d, "m"), 30, "the sidecar")
    check_ok(d.outbox, "m", a, b)
    d.took("m.txt")
    assert d.stop() == 0


def test_a_job_taken_on_a_watch_is_stopped_at_its_limit_and_the_next_is_taken_on_a_new_watch(serve):
    """A small job (told only when it ends) hangs past its limit: the supervisor reads it from the worker's
    control block, ends the worker, refuses the job with ``timeout``, and a fresh worker watches again."""
    d = serve("workerhooks.faulty_cpu")  # a 7×7 product never returns
    d.watching()
    drop(d, "hang@timeout=1", 5, n=7)
    wait_for(lambda: (d.outbox / "hang@timeout=1.error.yaml").exists(), 60, "the timeout's error sidecar")
    rec = yaml.safe_load((d.outbox / "hang@timeout=1.error.yaml").read_text())
    assert rec["error"]["kind"] == "timeout", rec
    lone_on_a_new_watch(d, "next", 6)
    assert d.stop() == 0
    assert names(d.inbox / ".failed") == {"hang@timeout=1.txt"} and work_files(d.inbox) == []


def test_new_settings_reach_an_arrival_the_watcher_sees_with_them(serve, tmp_path):
    """The watching worker is stopped (SIGSTOP) while the daemon reloads its settings and a file arrives: when
    it runs again, its order (the new settings) and the arrival wait together, and the job runs with the new
    settings (a watcher that took its arrivals first ran it with the old ones)."""
    cfg = tmp_path / "mmd.yaml"
    cfg.write_text("kernel: naive\n")
    d = serve(MMD_CONFIG=str(cfg))
    d.watching()
    pid = d.watcher()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        cfg.write_text("kernel: coarse\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: any(e.get("event") == "SIGHUP: settings reloaded" for e in d.events()), 30, "the reload")
        a, b = drop(d, "m", 9)
        time.sleep(0.05)  # the main process holds the arrival back for the watch (WATCH_GRACE_S) and asks it to end
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: sidecar_of(d, "m"), 30, "the sidecar")
    rec = check_ok(d.outbox, "m", a, b)
    assert rec["requested"]["kernel"] == "coarse"
    assert d.stop() == 0


def test_a_job_taken_on_a_watch_is_shown_and_cancelled_before_it_tells(serve, tmp_path):
    """A small job tells the main process what it took only at its end; one that hangs is still shown running
    (found in .work by the watch's job id), on the control socket and in the state file, and can be
    cancelled."""
    from mmd.daemon.local import ask

    sock = tmp_path / "mmd.sock"
    d = serve("workerhooks.faulty_cpu", MMD_CONTROL_SOCKET=str(sock))  # a 7×7 product never returns
    d.watching()
    drop(d, "hang", 5, n=7)
    jobs = wait_for(lambda: ask(sock, {"op": "status"})["jobs"], 30, "the hung job shown")
    assert [(j["file"], j["state"]) for j in jobs] == [("hang.txt", "running")]

    def current() -> list[str]:
        state = daemon.read_state(d.inbox) or {}
        return [w["current"]["file"] for w in state.get("workers", []) if w.get("current")]

    assert wait_for(current, 30, "the state file's current job") == ["hang.txt"]
    answer = ask(sock, {"op": "cancel", "file": "hang.txt"})
    assert answer["ok"] and answer["was"] == "running", answer
    wait_for(lambda: (d.outbox / "hang.error.yaml").exists(), 30, "the cancelled job's error sidecar")
    assert yaml.safe_load((d.outbox / "hang.error.yaml").read_text())["error"]["kind"] == "cancelled"
    lone_on_a_new_watch(d, "next", 6)
    assert d.stop() == 0


def test_an_event_read_late_for_a_file_already_taken_does_not_end_the_next_watch(serve, tmp_path):
    """While the daemon waits for a slow worker it reads no inbox event, but a ready worker watches: a file
    taken then has its event read once the daemon serves, under the next watch. That watch waits for nothing
    and goes on (it was asked to end, and the next lone arrival lost its watch)."""
    d = serve(f"partial(workerhooks.slow_start, {str(tmp_path / 'first')!r}, 3.0)", MMD_DEVICES="0,1")
    d.watching()
    a, b = drop(d, "early", 1)
    wait_for(lambda: sidecar_of(d, "early"), 30, "the early job's sidecar")
    d.watching()
    wait_for(lambda: any(e.get("event") == "serving" for e in d.events()), 30, "the daemon serving")
    time.sleep(0.3)  # many times WATCH_GRACE_S: a stop for the early event would have come
    a2, b2 = drop(d, "late", 2)
    wait_for(lambda: sidecar_of(d, "late"), 30, "the late job's sidecar")
    d.took("early.txt", "late.txt")
    before = [parts[0] for parts in d.lines()][: [" ".join(p[:2]) for p in d.lines()].index("took late.txt")]
    assert before.count("watch") == 2, f"the watch that took late.txt was the second: {d.lines()}"
    check_ok(d.outbox, "early", a, b)
    check_ok(d.outbox, "late", a2, b2)
    assert d.stop() == 0
