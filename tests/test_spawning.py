"""A daemon whose workers cannot start ends with one line and the README's status, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mmd.errors import ExitStatus

from .conftest import mmd_env

pytestmark = [pytest.mark.process]

#: ``mmd ARGS`` with the interpreter the fork server runs (``multiprocessing.set_executable``) set to argv[1]:
#: what a venv made from an interpreter the service user cannot run (a pyenv under /root) does to its workers.
SERVE_WITH_INTERPRETER = (
    "import multiprocessing, sys; multiprocessing.set_executable(sys.argv.pop(1)); from mmd.cli import entry; entry()"
)


@pytest.mark.parametrize("once", [True, False], ids=["once", "serving"])
@pytest.mark.parametrize("interpreter", ["not-executable", "exits-at-once"])
def test_workers_that_cannot_start_end_serve_with_one_line_and_status_78(
    tmp_path: Path, once: bool, interpreter: str
) -> None:
    """An interpreter this user cannot run is seen before anything starts; one that runs and dies at once (its
    libraries unreadable, say) when multiprocessing's helpers it started (fork server, resource tracker) fail."""
    cannot_run = tmp_path / "python3"
    cannot_run.write_text("#!/bin/sh\nexit 1\n")
    cannot_run.chmod(0o644 if interpreter == "not-executable" else 0o755)  # 0644: not even root runs it
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    (inbox / "m.txt").write_text("1 1 1\n1.00\n2.00\n")
    done = subprocess.run(
        [sys.executable, "-c", SERVE_WITH_INTERPRETER, str(cannot_run), "serve", "--inbox", str(inbox),
         "--outbox", str(outbox), "--backend", "cpu", *(["--once"] if once else [])],
        cwd=tmp_path, env=mmd_env(MMD_LOG_FORMAT="json"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == ExitStatus.CONFIG, done.stderr  # an install to mend: the unit does not restart it
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("mmd serve: configuration: workers cannot start: "), last
    assert f"their interpreter {cannot_run} " in last and "this user" in last
    assert (inbox / "m.txt").is_file(), "the job waits in the inbox for a daemon that can run it"
