"""Logs (mmd.logs): JSON lines, and syslog priorities when stderr is the journal."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from mmd import logs

from .conftest import mmd_env


def test_journal_stream_is_recognised_by_device_and_inode(tmp_path):
    with open(tmp_path / "j", "w") as fh:
        info = os.fstat(fh.fileno())
        assert logs.journal_stream(fh, {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"})
        assert not logs.journal_stream(fh, {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino + 1}"})
        assert not logs.journal_stream(fh, {})
        assert not logs.journal_stream(fh, {"JOURNAL_STREAM": "garbage"})
    assert not logs.journal_stream(io.StringIO(), {"JOURNAL_STREAM": "1:2"})  # no file descriptor


def test_lines_to_the_journal_carry_their_priority(tmp_path):
    with open(tmp_path / "j", "w") as fh:
        info = os.fstat(fh.fileno())
        logs.configure("json", "debug", stream=fh, environ={"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"})
        log = logs.get_logger(job="abc")
        log.debug("d")
        log.info("i", x=1)
        log.warning("w")
        log.error("e")
    lines = (tmp_path / "j").read_text().splitlines()
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>"]
    assert json.loads(lines[1][3:])["x"] == 1 and json.loads(lines[1][3:])["job"] == "abc"
    logs.configure("json", "info")


def test_lines_elsewhere_are_plain_json():
    out = io.StringIO()
    logs.configure("json", "info", stream=out)
    logs.get_logger().info("hello")
    assert json.loads(out.getvalue())["event"] == "hello"
    logs.configure("json", "info")


def _logged_on_a_terminal(tmp_path: Path, **env: str) -> bytes:
    """What `mmd run -v` logs where stderr is a terminal (a pseudo-terminal here)."""
    (tmp_path / "m.txt").write_text("1\n2\n3\n")
    leader, follower = pty.openpty()
    full = mmd_env({"MMD_BACKEND": "cpu", "TERM": "xterm-256color"}, **env)
    full.pop("MMD_LOG_FORMAT", None)  # auto: the console's format on a terminal
    argv = [sys.executable, "-m", "mmd", "run", "-v", "--force", "m.txt"]
    with subprocess.Popen(argv, cwd=tmp_path, env=full, stdout=subprocess.DEVNULL, stderr=follower) as proc:
        os.close(follower)
        got = b""
        while True:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            got += chunk
        assert proc.wait(timeout=120) == 0, got
    os.close(leader)
    return got


@pytest.mark.integration  # runs mmd as a real process
def test_no_color_keeps_the_console_logs_plain(tmp_path):
    """https://no-color.org: NO_COLOR set and not empty: no colour, whatever the terminal."""
    coloured = _logged_on_a_terminal(tmp_path)
    assert b"job done" in coloured and b"\x1b[" in coloured, coloured
    for value in ("1", "yes"):
        plain = _logged_on_a_terminal(tmp_path, NO_COLOR=value)
        assert b"job done" in plain and b"\x1b[" not in plain, plain
    assert b"\x1b[" in _logged_on_a_terminal(tmp_path, NO_COLOR=""), "an empty NO_COLOR is not set"


def test_no_color_is_read_from_the_environment_given():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for environ, coloured in (({}, True), ({"NO_COLOR": "1"}, False), ({"NO_COLOR": ""}, True)):
        out = Terminal()
        logs.configure("console", "info", stream=out, environ=environ)
        logs.get_logger().info("hello")
        assert ("\x1b[" in out.getvalue()) == coloured, (environ, out.getvalue())
    logs.configure("json", "info")
