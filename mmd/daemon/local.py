"""The daemon's local socket: a class's students ask about, cancel and remove their own jobs.

Students never read the service's files (its state folder is private):
they ask the daemon over an ``AF_UNIX`` socket (``control_socket``), and
the daemon answers each for what is theirs. Who asks is the kernel's word
(``SO_PEERCRED``), never the request's.

The protocol is one request per connection: a JSON object on one line
(``{"op": "status"}``, ``{"op": "cancel", "job": ID}``, ``{"op": "cancel",
"file": NAME}``, ``{"op": "rm", "name": OUTPUT}``), at most
:data:`MAX_REQUEST` bytes, sent within :data:`REQUEST_S`; the answer is one
JSON object on one line, ``{"ok": true, ...}`` or ``{"ok": false, "error":
REASON}``. The socket's thread only reads, asks the main loop (an
:class:`~.messages.Asked` hint, answered through a future) and writes: what
the answer says is decided where the queue and the workers are.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .messages import Asked, Hint

#: The longest request read (a name is at most 255 bytes; JSON escapes at most ×6).
MAX_REQUEST = 4096
#: How long one client may take to send its request: a slow one holds up no one for longer.
REQUEST_S = 2.0
#: How long the socket's thread waits for the main loop's answer.
ANSWER_S = 10.0
OPS = ("status", "cancel", "rm")


class LocalSocket:
    """The listening socket and the thread that serves it, one connection at a time."""

    def __init__(self, path: Path, hints: Callable[[Hint], None], log: Any) -> None:
        self.path = Path(path)
        self.hints = hints
        self.log = log
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Bind (replacing a socket no daemon answers on), open it to every local user, and serve it."""
        self._remove_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(str(self.path))
            # Anyone on the box may connect: the kernel says who they are, and each gets only what is theirs.
            os.chmod(self.path, 0o666)
            sock.listen(16)
            sock.settimeout(0.5)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"control_socket: cannot listen on {self.path}: {exc.strerror or exc}") from None
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="mmd-local-socket", daemon=True)
        self._thread.start()

    def _remove_stale(self) -> None:
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(info.st_mode):
            raise ConfigError(f"control_socket: {self.path} exists and is not a socket; remove it or pick another")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            probe.connect(str(self.path))
        except OSError:
            os.unlink(self.path)  # a dead daemon's; the lock says no other daemon serves this spool
            return
        finally:
            probe.close()
        raise ConfigError(f"control_socket: a process already answers on {self.path}")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.1)  # out of descriptors, say: try again, never spin
                continue
            with conn:
                try:
                    self._handle(conn)
                except Exception as exc:  # one client's trouble never ends the socket
                    self.log.warning("control socket: a request failed", reason=repr(exc))

    def _handle(self, conn: socket.socket) -> None:
        uid = peer_uid(conn)
        try:
            request = _read_request(conn)
        except ValueError as exc:
            _send(conn, {"ok": False, "error": str(exc)})
            return
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self.hints(Asked(request.get("op", ""), uid, request, future))
        try:
            answer = future.result(timeout=ANSWER_S)
        except concurrent.futures.TimeoutError:
            answer = {"ok": False, "error": "the daemon is busy; ask again"}
        _send(conn, answer)


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end (Linux's ``SO_PEERCRED``: pid, uid, gid)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def _read_request(conn: socket.socket) -> dict[str, Any]:
    deadline = time.monotonic() + REQUEST_S
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ValueError("the request took too long")
        conn.settimeout(left)
        try:
            chunk = conn.recv(MAX_REQUEST + 1 - len(data))
        except TimeoutError:
            raise ValueError("the request took too long") from None
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ValueError(f"a request is at most {MAX_REQUEST} bytes")
    try:
        request = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        raise ValueError("a request is one JSON object on one line") from None
    if not isinstance(request, dict) or request.get("op") not in OPS:
        raise ValueError(f"a request is a JSON object whose op is one of {', '.join(OPS)}")
    return request


def _send(conn: socket.socket, answer: dict[str, Any]) -> None:
    conn.settimeout(REQUEST_S)
    with contextlib.suppress(OSError):  # the client left: nothing to tell
        conn.sendall(json.dumps(answer).encode() + b"\n")


def ask(path: Path, request: dict[str, Any], timeout: float = ANSWER_S + REQUEST_S) -> dict[str, Any]:
    """Send ``request`` to the daemon listening on ``path`` and return its answer; OSError when no daemon
    answers there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    answer = json.loads(data) if data else None
    if not isinstance(answer, dict):
        raise OSError(f"the daemon at {path} gave no answer")
    return answer
