"""A daemon whose workers cannot start ends with one line and the README's status, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mmd.errors import ExitStatus

from .conftest import mmd_env

pytestmark = [pytest.mark.integration]

#: ``mmd ARGS`` with the interpreter the fork server runs (``multiprocessing.set_executable``) set to argv[1]:
#: what a venv made from an interpreter the service user cannot run (a pyenv under /root) does to its workers.
SERVE_WITH_INTERPRETER = (
    "import multiprocessing, sys; multiprocessing.set_executable(sys.argv.pop(1)); from mmd.cli import entry; entry()"
)
#: ``mmd ARGS`` with a fork server that dies once started: it also imports the module named in argv[1].
SERVE_WITH_PRELOAD = (
    "import sys, mmd.spawning as s; s.PRELOAD.append(sys.argv.pop(1)); from mmd.cli import entry; entry()"
)


def serve(tmp_path: Path, how: list[str], once: bool, **env: str) -> subprocess.CompletedProcess[str]:
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    (inbox / "m.txt").write_text("1 1 1\n1.00\n2.00\n")
    return subprocess.run(
        [sys.executable, "-c", *how, "serve", "--inbox", str(inbox), "--outbox", str(outbox), "--backend", "cpu",
         *(["--once"] if once else [])],
        cwd=tmp_path, env=mmd_env(MMD_LOG_FORMAT="json", **env), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def assert_one_line_78(done: subprocess.CompletedProcess[str], tmp_path: Path) -> str:
    assert done.returncode == ExitStatus.CONFIG, done.stderr  # an install to mend: the unit does not restart it
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("mmd serve: configuration: workers cannot start: "), last
    assert (tmp_path / "inbox" / "m.txt").is_file(), "the job waits in the inbox for a daemon that can run it"
    return last


@pytest.mark.parametrize("once", [True, False], ids=["once", "serving"])
@pytest.mark.parametrize("interpreter", ["not-executable", "exits-at-once"])
def test_an_interpreter_that_cannot_run_ends_serve_with_one_line_and_status_78(
    tmp_path: Path, once: bool, interpreter: str
) -> None:
    """Seen before anything starts: not executable, or dying at once (its libraries unreadable, say)."""
    cannot_run = tmp_path / "python3"
    cannot_run.write_text("#!/bin/sh\nexit 1\n")
    cannot_run.chmod(0o644 if interpreter == "not-executable" else 0o755)  # 0644: not even root runs it
    last = assert_one_line_78(serve(tmp_path, [SERVE_WITH_INTERPRETER, str(cannot_run)], once), tmp_path)
    assert f"their interpreter {cannot_run} cannot be run by this user" in last


def test_a_fork_server_that_dies_ends_serve_with_one_line_and_status_78(tmp_path: Path) -> None:
    """The interpreter runs, the fork server it started does not answer: seen when a worker starts."""
    (tmp_path / "dies_on_import.py").write_text("import os\nos._exit(1)\n")
    done = serve(tmp_path, [SERVE_WITH_PRELOAD, "dies_on_import"], once=True, PYTHONPATH=str(tmp_path))
    last = assert_one_line_78(done, tmp_path)
    assert "the processes that start them do not answer" in last


def test_exit_status_says_how_a_child_ended():
    from mmd.spawning import exit_status

    assert [exit_status(r) for r in (None, 0, 3, -9, -200)] == [
        "not ended", "exit status 0", "exit status 3", "SIGKILL", "signal 200"
    ]  # fmt: skip


def test_a_turn_waits_for_the_lock_and_past_its_time_runs_anyway():
    import multiprocessing
    import time

    from mmd.spawning import in_turn

    lock = multiprocessing.get_context("spawn").Lock()
    with in_turn(lock, 5.0):
        assert not lock.acquire(block=False), "held for the block"
    assert lock.acquire(block=False), "given back after it"
    start = time.monotonic()
    with in_turn(lock, 0.2):  # held by another (here, this test) past the time: the block runs anyway
        waited = time.monotonic() - start
    assert 0.2 <= waited < 2
    lock.release()
    assert lock.acquire(block=False), "a turn it never got is not given back"
    with in_turn(None, 0.0):
        pass


def test_mmd_serve_starts_its_fork_server_before_it_reads_its_command_line(monkeypatch: pytest.MonkeyPatch):
    # everything else of the daemon's start runs beside the fork server's imports, which its first job waits for
    from mmd import cli, spawning

    seen: list[str] = []
    build = cli.build_parser
    monkeypatch.setattr(spawning, "context", lambda: seen.append("fork server"))
    monkeypatch.setattr(cli, "build_parser", lambda: seen.append("command line") or build())
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert seen == ["fork server", "command line"]
    seen.clear()
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert seen == ["command line"], "only the daemon starts one"
