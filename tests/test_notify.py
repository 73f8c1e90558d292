"""systemd notify: datagrams to a fake NOTIFY_SOCKET, the watchdog period and pinger."""

from __future__ import annotations

import os
import socket
import time

import pytest

from mmd import notify


def _deadline(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


@pytest.fixture
def fake_systemd(tmp_path):
    """A datagram socket standing in for systemd's; yields (env, receive)."""
    path = tmp_path / "notify.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.settimeout(5)

    def receive() -> str:
        return server.recv(4096).decode()

    yield {"NOTIFY_SOCKET": str(path)}, receive
    server.close()


def test_noop_without_socket():
    n = notify.Notifier({})
    assert not n.enabled
    assert n.ready("x") is False
    assert n.watchdog() is False
    n.close()


def test_messages_reach_the_socket(fake_systemd):
    env, receive = fake_systemd
    n = notify.Notifier(env)
    assert n.ready("serving inbox")
    assert receive() == "READY=1\nSTATUS=serving inbox"
    n.status("3 jobs\nqueued")
    assert receive() == "STATUS=3 jobs queued"
    n.stopping()
    assert receive() == "STOPPING=1"
    n.watchdog()
    assert receive() == "WATCHDOG=1"
    n.close()


def test_abstract_socket_name():
    name = f"mmd-test-{os.getpid()}-{time.monotonic_ns()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(b"\0" + name.encode())
    server.settimeout(5)
    try:
        assert notify.socket_address("@" + name) == b"\0" + name.encode()
        n = notify.Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert server.recv(100) == b"READY=1"
        n.close()
    finally:
        server.close()


def test_send_failure_is_not_an_error(tmp_path):
    n = notify.Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.enabled
    assert n.ready() is False
    n.close()


def test_watchdog_seconds():
    pid = str(os.getpid())
    assert notify.watchdog_seconds({}) is None
    assert notify.watchdog_seconds({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert notify.watchdog_seconds({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": pid}) == 30.0
    assert notify.watchdog_seconds({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert notify.watchdog_seconds({"WATCHDOG_USEC": "0"}) is None
    assert notify.watchdog_seconds({"WATCHDOG_USEC": "soon"}) is None


def test_pinger_pings_while_healthy_and_stops_when_not(fake_systemd):
    env, receive = fake_systemd
    n = notify.Notifier(env)
    health = {"ok": True}
    pinger = notify.AlivePinger.start_for(
        n, lambda: (health["ok"], "" if health["ok"] else "worker stuck"), {**env, "WATCHDOG_USEC": "40000"}
    )
    assert pinger is not None and pinger.period == pytest.approx(0.02)
    try:
        assert receive() == "WATCHDOG=1"
        assert receive() == "WATCHDOG=1"
        health["ok"] = False
        # Pings already sent may still be in the socket; then the unhealthy status comes, and no more pings.
        while (msg := receive()) == "WATCHDOG=1":
            pass
        assert msg == "STATUS=unhealthy: worker stuck"
        pings = pinger.pings
        time.sleep(0.1)  # five periods: an absence can only be shown by waiting
        assert pinger.pings == pings
    finally:
        pinger.stop()
        n.close()
    assert not pinger.is_alive()


def test_no_pinger_without_watchdog(fake_systemd):
    env, _ = fake_systemd
    n = notify.Notifier(env)
    assert notify.AlivePinger.start_for(n, lambda: (True, ""), env) is None
    n.close()
