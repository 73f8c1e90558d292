"""mmd.daemon.service: what a daemon holds while it serves is given back whatever ends the serving.

In this process (the daemon's signal handlers and umask are this process's): a start that fails half way,
after the lock, the signal handlers, the observer and the state file are taken, gives each back.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from mmd import config, daemon, spawning
from mmd.errors import ConfigError

#: A daemon in this process: left out of `make quick`, run by `make test`.
pytestmark = pytest.mark.integration


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_start_that_fails_half_way_gives_back_all_it_took(tmp_path: Path) -> None:
    """The metrics' port is taken: the start fails after the lock, the signals, the observer and the state file
    were taken, before any worker. Each is given back: the lock is free for the next daemon, this process's
    signal handlers and umask are its own again, no descriptor is left open, the state file says stopped."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        s = config.Settings(inbox=tmp_path / "inbox", outbox=tmp_path / "outbox", backend="cpu", create_folders=True,
                            metrics_listen=f"127.0.0.1:{port}", metrics_file=tmp_path / "mmd.prom")  # fmt: skip
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        umask = os.umask(0o002)
        try:
            spawning.context()  # the fork server and its pipes are the process's, kept for the next daemon
            fds = open_fds()
            with pytest.raises(ConfigError, match=f"metrics_listen: cannot listen on 127.0.0.1:{port}"):
                daemon.Daemon(s).serve()
            assert open_fds() == fds, "an observer, a pipe or a lock file left open"
            assert os.umask(0o002) == 0o002, "the daemon gives back the caller's umask"
        finally:
            os.umask(umask)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert daemon.lock_holder(s.inbox) is None
    assert daemon.read_state(s.inbox)["status"] == "stopped"
    lock = daemon.SpoolLock(s.inbox)
    lock.acquire(wait_for_dead=0)
    lock.release()
