"""systemd's notify protocol: READY, STATUS, STOPPING and WATCHDOG over ``$NOTIFY_SOCKET``.

A datagram of ``KEY=value`` lines to the ``AF_UNIX`` socket systemd names in
``NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace). Without
that variable every call is a no-op, so the daemon calls it unconditionally.
The pinger (:class:`AlivePinger`) tells systemd's watchdog the service is
alive: it sends ``WATCHDOG=1`` at half of ``WATCHDOG_USEC`` only while a
health check passes: a worker that died or a loop that stopped turning stops
the pings, and systemd restarts the service.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Mapping

#: Health check: (healthy, reason when not).
HealthCheck = Callable[[], "tuple[bool, str]"]


def socket_address(value: str) -> str | bytes:
    """``NOTIFY_SOCKET``'s value as a ``sendto`` address (``@x`` → abstract ``\\0x``)."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def watchdog_seconds(environ: Mapping[str, str] | None = None) -> float | None:
    """The watchdog period systemd expects, or None when no watchdog is set for this process."""
    environ = os.environ if environ is None else environ
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None  # meant for another process (our parent, say)
    return int(usec) / 1e6


class Notifier:
    """Sends notify messages; a no-op when there is no ``NOTIFY_SOCKET``."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        value = environ.get("NOTIFY_SOCKET", "")
        self._address = socket_address(value) if value else None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        if self._address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *lines: str) -> bool:
        """Send ``KEY=value`` lines as one datagram; False when disabled or the send failed."""
        if self._sock is None or self._address is None:
            return False
        data = "\n".join(line.replace("\n", " ") for line in lines).encode()
        try:
            with self._lock:
                self._sock.sendto(data, self._address)
        except OSError:
            return False  # systemd gone or the socket full: never a reason to stop serving
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self, status: str | None = None) -> bool:
        return self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> bool:
        return self.send("RELOADING=1")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class AlivePinger(threading.Thread):
    """Tells systemd's watchdog the service is alive: ``WATCHDOG=1`` every ``period`` seconds while ``healthy()``
    says so."""

    def __init__(self, notifier: Notifier, period: float, healthy: HealthCheck) -> None:
        super().__init__(name="mmd-alive", daemon=True)
        self.notifier = notifier
        self.period = period
        self.healthy = healthy
        self._stop_event = threading.Event()
        self.pings = 0
        self.unhealthy: str | None = None

    @classmethod
    def start_for(
        cls, notifier: Notifier, healthy: HealthCheck, environ: Mapping[str, str] | None = None
    ) -> AlivePinger | None:
        """Start a pinger at half the systemd watchdog period; None when there is no watchdog."""
        seconds = watchdog_seconds(environ)
        if seconds is None or not notifier.enabled:
            return None
        pinger = cls(notifier, seconds / 2, healthy)
        pinger.start()
        return pinger

    def run(self) -> None:
        while True:
            ok, reason = self.healthy()
            if ok:
                self.unhealthy = None
                if self.notifier.watchdog():
                    self.pings += 1
            elif self.unhealthy != reason:
                self.unhealthy = reason
                self.notifier.status(f"unhealthy: {reason}")
            if self._stop_event.wait(self.period):
                return

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join()
