"""The daemon's metrics (mmd.metrics): counts from sidecar records, the text format, throttled atomic writes."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mmd import record
from mmd.fileops import FileOps
from mmd.metrics import SCRAPE_DEADLINE_S, Metrics

from .test_record import refusal, timing


def samples(text: bytes) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_jobs_are_counted_by_status_kernel_and_kind():
    m = Metrics(None, 5.0)
    for _ in range(2):
        m.job_ended(record.tally(timing()))
    m.job_ended(record.tally(refusal()))
    got = samples(m.text())
    assert got[("mmd_jobs_total", (("kernel", "tiled"), ("status", "ok")))] == 2
    assert got[("mmd_jobs_total", (("kernel", ""), ("status", "error")))] == 1
    assert got[("mmd_job_errors_total", (("kind", "input"),))] == 1
    assert got[("mmd_input_bytes_total", ())] == 3 * 12 and got[("mmd_output_bytes_total", ())] == 2 * 20
    assert got[("mmd_job_duration_seconds_count", ())] == 3
    assert got[("mmd_job_phase_seconds_count", (("phase", "kernel"),))] == 2
    assert ("mmd_job_phase_seconds_count", (("phase", "cuda"),)) not in got  # a sum of phases, not one


def test_a_refused_job_counts_with_no_kernel_even_when_it_asked_for_one():
    import dataclasses

    m = Metrics(None, 5.0)
    asked = dataclasses.replace(refusal(), requested=record.Requested("tiled", 16, "device"))
    m.job_ended(record.tally(asked))
    got = samples(m.text())
    assert got[("mmd_jobs_total", (("kernel", ""), ("status", "error")))] == 1
    assert [k for k in got if k[0] == "mmd_jobs_total"] == [("mmd_jobs_total", (("kernel", ""), ("status", "error")))]


def test_no_counter_has_a_created_twin():
    m = Metrics(None, 5.0)
    m.job_ended(record.tally(timing()))
    m.job_ended(record.tally(refusal()))
    assert b"_created" not in m.text()


def test_the_file_is_rewritten_atomically_at_most_every_period(tmp_path):
    now = [100.0]
    path = tmp_path / "mmd.prom"
    m = Metrics(path, 5.0, clock=lambda: now[0])
    m.write()
    first = path.read_bytes()
    m.job_ended(record.tally(timing()))
    now[0] += 1
    m.write()
    assert path.read_bytes() == first, "throttled"
    assert m.due_in() == 4.0
    now[0] += 4
    m.write()
    assert path.read_bytes() != first and not [p for p in tmp_path.iterdir() if p != path], "no temporary left"
    m.write(force=True)
    assert Metrics(None, 5.0).due_in() is None


def test_an_error_record_without_settings_counts_with_no_kernel():
    rec = record.ErrorRecord(
        job="x" * 12,
        input=record.FileFacts("a.txt"),
        output=record.FileFacts("a.out", written=False),
        error=record.ErrorFacts("spool", "is a link"),
    )
    m = Metrics(Path("/nonexistent/never-written"), 5.0)
    m.job_ended(record.tally(rec))
    assert samples(m.text())[("mmd_job_errors_total", (("kind", "spool"),))] == 1


def test_a_class_jobs_and_time_are_counted_by_submitter():
    import dataclasses

    m = Metrics(None, 5.0)
    alice = record.Context(submitter="alice")
    m.job_ended(record.tally(dataclasses.replace(timing(), context=alice)))
    m.job_ended(record.tally(dataclasses.replace(refusal(), context=alice)))
    m.job_ended(record.tally(timing()))  # no submitter (mmd run, Slurm): not counted by one
    got = samples(m.text())
    assert got[("mmd_submitter_jobs_total", (("status", "ok"), ("submitter", "alice")))] == 1
    assert got[("mmd_submitter_jobs_total", (("status", "error"), ("submitter", "alice")))] == 1
    assert got[("mmd_submitter_seconds_total", (("submitter", "alice"),))] > 0
    assert len([k for k in got if k[0] == "mmd_submitter_jobs_total"]) == 2


# -- the endpoint (metrics_listen): what it answers, and to how many at once --


def _free_port() -> int:
    with socket.socket() as s:  # a free port on loopback
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int, timeout: float = 5.0) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()


def test_the_endpoint_answers_no_series_by_submitter_which_the_file_holds(tmp_path):
    """metrics_listen answers any account on the machine: who submits, how often and for how long is the
    admin's to read (the file), not every student's."""
    m = Metrics(tmp_path / "mmd.prom", 5.0)
    m.job_ended(record.tally(dataclasses.replace(timing(), context=record.Context(submitter="alice"))))
    port = _free_port()
    m.listen("127.0.0.1", port)
    try:
        scraped = _scrape(port)
    finally:
        m.close()
    assert "mmd_jobs_total" in scraped and "mmd_submitter" not in scraped and "alice" not in scraped
    m.write(force=True)
    kept = samples((tmp_path / "mmd.prom").read_bytes())
    assert kept[("mmd_submitter_jobs_total", (("status", "ok"), ("submitter", "alice")))] == 1
    assert kept[("mmd_jobs_total", (("kernel", "tiled"), ("status", "ok")))] == 1


def test_the_endpoint_ends_a_connection_that_sends_its_request_a_byte_at_a_time():
    """Each read has a timeout, and the whole connection a deadline: a byte every half second keeps no read
    waiting long, and the connection still ends SCRAPE_DEADLINE_S after its accept."""
    m = Metrics(None, 5.0)
    host, port = m.listen("127.0.0.1", 0)
    stop = threading.Event()
    try:
        with socket.create_connection((host, port), timeout=SCRAPE_DEADLINE_S + 5) as slow:
            start = time.monotonic()
            slow.sendall(b"GET /metrics HTTP/1.1\r\n")

            def trickle() -> None:
                for byte in b"X-Slow: " + b"a" * 100:
                    if stop.wait(0.5):
                        return
                    with contextlib.suppress(OSError):
                        slow.send(bytes([byte]))

            threading.Thread(target=trickle, daemon=True).start()
            try:
                answer = slow.recv(4096)
            except ConnectionResetError:
                answer = b""
            waited = time.monotonic() - start
    finally:
        stop.set()
        m.close()
    assert answer == b"" and SCRAPE_DEADLINE_S - 0.5 < waited < SCRAPE_DEADLINE_S + 1.5


#: Runs ``python -m mmd serve`` with at most ``argv[1]`` descriptors (soft and hard limit), as a unit's LimitNOFILE.
LIMITED = """
import resource, runpy, sys
n = int(sys.argv.pop(1))
resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
sys.argv = ["mmd", "serve"]
runpy.run_module("mmd", run_name="__main__")
"""


@pytest.mark.integration
def test_idle_connections_to_the_endpoint_neither_take_the_daemons_descriptors_nor_keep_a_scrape_out(tmp_path):
    """Issue 44: a student held idle connections to metrics_listen until the daemon had no descriptor left and
    its main loop died (EMFILE). Here the daemon may have 256 and 400 connections are opened and held: the
    endpoint keeps MAX_SCRAPES of them, each for SCRAPE_DEADLINE_S at most; a fresh scrape answers within that,
    and the daemon serves a job meanwhile."""
    import numpy as np

    from mmd import textoutput
    from mmd.check import full
    from mmd.generate import input_chunks, random_matrix

    from .conftest import LoggedProcess, mmd_env, wait_for

    limit, port = 256, _free_port()
    env = mmd_env(MMD_LOG_FORMAT="json", MMD_BACKEND="cpu", MMD_CREATE_FOLDERS="yes", MMD_QUIET_SECONDS="0.3",
                  MMD_RESCAN_SECONDS="0.5", MMD_DEVICES="0", MMD_METRICS_LISTEN=f"127.0.0.1:{port}")  # fmt: skip
    proc = LoggedProcess([sys.executable, "-c", LIMITED, str(limit)], tmp_path, tmp_path / "daemon.log", env)
    held: list[socket.socket] = []
    try:
        wait_for(lambda: '"serving"' in proc.logs(), 60, "the daemon")
        for _ in range(400):
            with contextlib.suppress(OSError):  # a connect the endpoint's backlog had no room for
                held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        start = time.monotonic()

        def scraped() -> str:
            with contextlib.suppress(OSError):
                return _scrape(port, timeout=SCRAPE_DEADLINE_S + 1)
            return ""

        text = wait_for(scraped, SCRAPE_DEADLINE_S + 5, "a fresh scrape")
        assert "\nmmd_up 1.0\n" in text and time.monotonic() - start < SCRAPE_DEADLINE_S + 2
        rng = np.random.default_rng(5)
        a, b = random_matrix(rng, 8, 8), random_matrix(rng, 8, 8)
        (tmp_path / "m.src").write_bytes(b"".join(input_chunks(a, b, square=True)))
        os.rename(tmp_path / "m.src", tmp_path / "inbox" / "m.txt")
        wait_for(lambda: (tmp_path / "outbox" / "m.timing.yaml").exists(), 30, "the job, served meanwhile")
        got = textoutput.parse_output((tmp_path / "outbox" / "m.out").read_bytes())
        assert full.against_inputs(got, a, b).ok
        assert proc.proc.poll() is None and len(os.listdir(f"/proc/{proc.proc.pid}/fd")) < 64
    finally:
        for s in held:
            s.close()
        proc.stop()
    assert "Traceback" not in proc.logs() and "out of file descriptors" not in proc.logs()


class OutOfDescriptors(FileOps):
    """Listing ``folder`` fails with EMFILE ``left`` times more, in the process that made it (a daemon's main
    process: its workers get a copy)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.main = os.getpid()
        self.left = 0
        self.hits = 0

    def scandir(self, path: Path) -> AbstractContextManager[Iterator[os.DirEntry[str]]]:
        if os.getpid() == self.main and Path(path) == self.folder and self.left:
            self.left -= 1
            self.hits += 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(path))
        return super().scandir(path)


@pytest.mark.integration
def test_a_main_loop_out_of_descriptors_logs_pauses_and_serves_on(tmp_path):
    """EMFILE in the main loop's rescan (the listing of the inbox) is logged and the loop taken up again after a
    pause, never a traceback: the daemon serves the next job."""
    from mmd import config, daemon, spool

    from .conftest import alongside, wait_for

    s = config.Settings(inbox=tmp_path / "inbox", outbox=tmp_path / "outbox", backend="cpu", devices=[0],
                        quiet_seconds=0.05, rescan_seconds=0.05)  # fmt: skip
    spool.Shared(s.inbox, s.outbox).prepare()
    ops = OutOfDescriptors(s.inbox)
    d = daemon.Daemon(s, ops=ops)

    def drive() -> None:
        wait_for(lambda: d.state.snapshot()["status"] == "serving", 30, "the daemon")
        ops.left = 3
        wait_for(lambda: ops.hits == 3, 30, "three rescans out of descriptors")
        (s.inbox / "m.txt").write_text("2\n1 2\n3 4\n5 6\n7 8\n")
        wait_for(lambda: (s.inbox / ".done" / "m.txt").exists(), 30, "the next job")

    assert alongside(d.serve, drive, lambda: d.request_stop("test")) == 0
    assert (s.outbox / "m.out").read_bytes() == b"2\n 19.00 22.00\n 43.00 50.00\n"
