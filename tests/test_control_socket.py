"""The control socket's parts alone: a submitter's places in the queue without the whole queue, each user's
token bucket, and a start excused when a worker is ended for another job. The attacks themselves, with real
accounts and a real daemon, are in tests/test_class.py."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from mmd.daemon.local import Bucket, Limits
from mmd.daemon.scheduler import Load, Scheduler
from mmd.spool import Claim, Shared, Spool

SUBMITTERS = ("ann", "bob", "cy", None)


def _claim(name: str, owner: int) -> Claim:
    return Claim("0123456789ab", name, 0, Path("/nonexistent") / name, Path("/nonexistent/out"), 0.0, owner=owner)


@given(
    offers=st.lists(st.tuples(st.sampled_from(SUBMITTERS), st.integers(0, 2)), max_size=60),
    charges=st.lists(st.tuples(st.sampled_from(SUBMITTERS), st.sampled_from((0.0, 1.0, 2.5))), max_size=6),
    resumes=st.integers(0, 3),
    taken=st.integers(0, 10),
)
def test_a_submitters_places_are_their_jobs_places_in_the_whole_queue(offers, charges, resumes, taken):
    """Scheduler.places (a status's view, from the asker's jobs and the submitters only) gives each job the
    place the whole queue's order (Scheduler.queued) gives it, ties of use included (equal charges, and
    submitters never charged), with resumes first."""
    s = Scheduler(max_queue=1000)
    for i, (who, size) in enumerate(offers):
        s.offer(f"{who}-{i}.txt", (10, 10_000_000, None)[size], who)
    for who, seconds in charges:
        s.charge(who, seconds, 5.0)
    s.resume(_claim(f"r{i}.txt", 0) for i in range(resumes))  # root's
    for _ in range(taken):  # some given out to an idle worker (a group of small ones, or a big one)
        s.assign([Load(0, 0)], 7.0)
    whole = s.queued(7.0)
    for who in (*SUBMITTERS, "root"):
        expected = [(place, item) for place, item in enumerate(whole, 1) if item.submitter == who]
        assert s.places(who, 7.0) == expected, who
    assert s.queued(7.0, limit=5) == whole[:5]


def test_a_bucket_lets_a_burst_through_then_one_request_per_period():
    limits = Limits(connections=8, per_s=5.0)
    bucket = Bucket(limits.burst, 0.0)
    assert [bucket.take(0.0, limits) for _ in range(11)] == [True] * 10 + [False]
    assert bucket.wait(0.0, limits) == 0.2 and bucket.wait(0.0, limits, ahead=4) == 1.0
    assert not bucket.take(0.19, limits) and bucket.take(0.2, limits)
    assert bucket.full(2.2, limits)
    slow = Limits(connections=1, per_s=0.1)  # a bucket holds at least one request
    assert slow.burst == 1.0


def test_a_start_cut_short_for_another_job_is_excused_and_crashes_still_count(tmp_path):
    """A job that had run in a group when its worker was ended for another job: its next start counts as its
    first unfinished one (a job never excused counts a crash); a real crash after that still counts."""
    spool = Spool(Shared(tmp_path / "in", tmp_path / "out"))
    spool.shared.prepare()
    claims = {}
    for name in ("excused.txt", "crashed.txt"):
        (spool.shared.inbox / name).write_text("1 1 1\n2\n3\n")
        claims[name] = spool.claims.claim(name)
    spool.attempts.excuse(claims["excused.txt"])
    again = {c.name: c for c in spool.claims.in_work()}  # as a worker's recovery finds them
    assert spool.attempts.record_start(again["crashed.txt"]) == 2
    assert spool.attempts.record_start(again["excused.txt"]) == 1
    assert spool.attempts.record_start(again["excused.txt"]) == 2  # that start never ended: its worker died running it
    spool.attempts.excuse(again["excused.txt"])
    assert spool.attempts.record_start(again["excused.txt"]) == 2  # the crash still counts, the excused start does not


#: A control socket alone in a process of its own with 64 descriptors; its main loop answers at once.
SERVER = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from mmd.daemon.local import Limits, LocalSocket

class Log:
    def warning(self, message, **facts):
        print("warning:", message, facts, file=sys.stderr, flush=True)

def hints(asked):
    asked.reply.set_result({"ok": True, "you": asked.uid})

sock = LocalSocket(sys.argv[1], hints, Log(), Limits(8, 5.0))
sock.start()
print("ready", flush=True)
sys.stdin.read()
sock.close()
"""


def test_a_socket_out_of_descriptors_says_so_once_and_serves_again_once_they_are_back(tmp_path):
    """100 connections held open against a daemon with 64 descriptors: its accepts fail (EMFILE), which it says
    once, without a traceback, and retries without spinning; once they are closed it answers again."""
    import socket
    import subprocess
    import sys

    from mmd.daemon.local import ask

    from .conftest import mmd_env, wait_for

    path = tmp_path / "mmd.sock"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(path)], env=mmd_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        held = []
        for _ in range(100):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(path))
            held.append(s)
        for s in held:
            s.close()
        answer = wait_for(lambda: _answer(path, ask), 30, "an answer once the descriptors are back")
        assert answer == {"ok": True, "you": os.geteuid()}
    finally:
        _out, err = proc.communicate("", timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and err.count("cannot accept a connection") == 1, err


def _answer(path, ask):
    try:
        return ask(path, {"op": "status"}, timeout=5)
    except OSError:
        return None
