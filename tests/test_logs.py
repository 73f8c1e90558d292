"""Logs (mmd.logs): JSON lines, and syslog priorities when stderr is the journal."""

from __future__ import annotations

import io
import json
import os

from mmd import logs


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
