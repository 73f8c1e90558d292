"""The daemon's lock (mmd.daemon.lock): one daemon per inbox, one per host on a shared inbox, who holds it."""

from __future__ import annotations

import os

import pytest

from mmd.daemon.lock import SpoolLock, host_daemons, lock_holder
from mmd.errors import SpoolError


def test_one_daemon_per_inbox(tmp_path):
    first = SpoolLock(tmp_path)
    first.acquire()
    try:
        assert lock_holder(tmp_path) == os.getpid()
        with pytest.raises(SpoolError, match=f"another mmd daemon \\(pid {os.getpid()}\\) already serves"):
            SpoolLock(tmp_path).acquire()
        with pytest.raises(SpoolError, match="without shared_inbox"):
            SpoolLock(tmp_path, "hostb").acquire()
    finally:
        first.release()
    assert lock_holder(tmp_path) is None


def test_hosts_share_an_inbox_one_daemon_each(tmp_path):
    a, b = SpoolLock(tmp_path, "hosta"), SpoolLock(tmp_path, "hostb")
    a.acquire()
    b.acquire()
    try:
        with pytest.raises(SpoolError, match="as host hosta"):
            SpoolLock(tmp_path, "hosta").acquire()
        with pytest.raises(SpoolError, match="shared_inbox already serve"):
            SpoolLock(tmp_path).acquire()
        daemons = {d["host"]: d for d in host_daemons(tmp_path, "hosta")}
        assert daemons["hosta"]["serving"] and daemons["hosta"]["own"] and daemons["hosta"]["pid"] == os.getpid()
        assert daemons["hostb"]["serving"] and not daemons["hostb"]["own"]
    finally:
        a.release()
        b.release()
    assert not any(d["serving"] for d in host_daemons(tmp_path, "hosta"))
