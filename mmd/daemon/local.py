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
REASON}``, taken within :data:`REQUEST_S`. The socket's thread only reads,
asks the main loop (an :class:`~.messages.Asked` hint, answered through a
future) and writes: what the answer says is decided where the queue and the
workers are.

A grader's window (``{"op": "window", "device": D, "seconds": S}``,
:mod:`.windows`) is the one request whose connection outlives its answer:
once granted, the connection holds the window until its asker sends
``{"op": "release"}`` (answered, then closed), closes it, or is
``S`` + :data:`REQUEST_S` seconds late; the socket names each window it
carries (never the asker), and tells the main loop of its release however
the connection ends.

**Many clients at once, each user their share.** One thread serves every
connection through a ``selectors`` loop and never waits on any one of them.
Each user (the peer's uid) may hold :attr:`Limits.connections` at once (one
more is answered at once that it is one too many, and closed), and their
requests reach the main loop at :attr:`Limits.per_s` a second: a token
bucket of :data:`BURST_S` seconds' worth lets a burst through at once, then
each request waits its turn (refused only where its wait would pass
:data:`ANSWER_S`). Root and the service's own user are not capped. So a
student who holds idle connections, or asks back to back, holds up no one
else's request and costs the main loop no more than their rate.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Settings
from ..errors import ConfigError
from .messages import Asked, Hint
from .windows import new_token

#: The longest request read (a name is at most 255 bytes; JSON escapes at most ×6).
MAX_REQUEST = 4096
#: How long one client may take to send its request, and to take its answer: a slow one holds up no one.
REQUEST_S = 2.0
#: How long a request may wait for the main loop's answer (and for its turn under its user's rate).
ANSWER_S = 10.0
#: A user's bucket holds this many seconds' worth of requests: a burst (a script's few cancels) passes at once.
BURST_S = 2.0
#: The most connections served at once, every user's together (root's and the service's aside): a bound on the
#: descriptors the socket may take, however many accounts ask.
MAX_CONNECTIONS = 512
OPS = ("status", "cancel", "rm", "window")


@dataclass(frozen=True)
class Limits:
    """Each user's share of the socket (root and the service's own user are not capped)."""

    #: Connections one user may hold open at once (``control_connections_per_user``).
    connections: int
    #: Requests a second one user's requests reach the main loop at, on average (``control_requests_per_s``).
    per_s: float

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.control_connections_per_user, settings.control_requests_per_s)

    @property
    def burst(self) -> float:
        return max(1.0, self.per_s * BURST_S)


@dataclass
class Bucket:
    """A token bucket (pure: the time and the rate are given): a request takes a token, tokens come back at
    the rate, up to the burst."""

    tokens: float
    at: float

    def _fill(self, now: float, limits: Limits) -> None:
        self.tokens = min(limits.burst, self.tokens + (now - self.at) * limits.per_s)
        self.at = now

    def take(self, now: float, limits: Limits) -> bool:
        self._fill(now, limits)
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def wait(self, now: float, limits: Limits, ahead: int = 0) -> float:
        """Seconds until there is a token for a request behind ``ahead`` others waiting."""
        self._fill(now, limits)
        return max(0.0, (ahead + 1 - self.tokens) / limits.per_s)

    def full(self, now: float, limits: Limits) -> bool:
        self._fill(now, limits)
        return self.tokens >= limits.burst


@dataclass(eq=False)
class _Conn:
    """One client's connection, from its accept to its answer's last byte."""

    sock: socket.socket
    uid: int
    capped: bool  # counted toward its user's limits (not root's, not the service's)
    deadline: float  # monotonic: it is dropped (with a word where it can take one) at this time
    data: bytearray = field(default_factory=bytearray)
    request: dict[str, Any] | None = None
    reply: concurrent.futures.Future[dict[str, Any]] | None = None
    out: memoryview | None = None
    events: int = 0  # what the selector watches it for (0: nothing, while it waits for its turn or its answer)
    window: str | None = None  # the window it asks for or holds (released when the connection ends)
    holding: bool = False  # its window is granted: the connection waits for its release


@dataclass
class _User:
    bucket: Bucket
    connections: int = 0
    waiting: deque[_Conn] = field(default_factory=deque)  # requests waiting for a token, in order


class LocalSocket:
    """The listening socket and the thread that serves it, many connections at once."""

    def __init__(self, path: Path, hints: Callable[[Hint], None], log: Any, limits: Limits) -> None:
        self.path = Path(path)
        self.hints = hints
        self.log = log
        #: Each user's share; replaced whole when the settings are reloaded (read by the socket's thread).
        self.limits = limits
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._uncapped = {0, os.geteuid()}
        self._conns: set[_Conn] = set()
        self._users: dict[int, _User] = {}
        self._accept_at = 0.0  # monotonic: accept no one before (out of descriptors a moment ago)
        self._starved = False  # the last accept failed (said once, until one succeeds)

    def start(self) -> None:
        """Bind (replacing a socket no daemon answers on), open it to every local user, and serve it."""
        self._remove_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            sock.bind(str(self.path))
            # Anyone on the box may connect: the kernel says who they are, and each gets only what is theirs.
            os.chmod(self.path, 0o666)
            sock.listen(128)
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
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _wake(self, _future: object = None) -> None:
        """Wake the socket's thread (an answer is ready, or it should stop); safe from any thread."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\0")

    # -- the socket's thread --
    def _serve(self) -> None:
        assert self._sock is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            listening = True
            while not self._stop.is_set():
                now = time.monotonic()
                if not listening and now >= self._accept_at:
                    sel.register(self._sock, selectors.EVENT_READ)
                    listening = True
                for key, mask in sel.select(self._timeout(now, listening)):
                    if key.fileobj is self._sock:
                        if not self._accept(sel):
                            sel.unregister(self._sock)
                            listening = False
                    elif key.fileobj == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                    else:
                        conn: _Conn = key.data
                        try:
                            if mask & selectors.EVENT_READ:
                                self._read(sel, conn)
                            elif mask & selectors.EVENT_WRITE:
                                self._write(sel, conn)
                        except Exception as exc:  # one client's trouble never ends the socket
                            self.log.warning("control socket: a request failed", reason=repr(exc))
                            self._drop(sel, conn)
                try:
                    self._tend(sel, time.monotonic())
                except Exception as exc:  # never the end of the socket: the next turn tends again
                    self.log.warning("control socket: tending the connections failed", reason=repr(exc))
            for conn in list(self._conns):
                self._drop(sel, conn)

    def _timeout(self, now: float, listening: bool) -> float:
        dues = [1.0]
        if not listening:
            dues.append(self._accept_at - now)
        dues += (c.deadline - now for c in self._conns)
        limits = self.limits
        dues += (u.bucket.wait(now, limits) for u in self._users.values() if u.waiting)
        return max(0.0, min(dues))

    def _accept(self, sel: selectors.BaseSelector) -> bool:
        """Take every connection waiting; False when out of descriptors (try again in a moment, never spin)."""
        assert self._sock is not None
        while True:
            try:
                sock, _ = self._sock.accept()
            except BlockingIOError:
                return True
            except OSError as exc:
                if not self._starved:
                    self.log.warning("control socket: cannot accept a connection; trying again every 0.1 s",
                                     reason=exc.strerror or repr(exc))  # fmt: skip
                self._starved = True
                self._accept_at = time.monotonic() + 0.1
                return False
            self._starved = False
            sock.setblocking(False)
            now = time.monotonic()
            try:
                uid = peer_uid(sock)
            except OSError:
                sock.close()
                continue
            capped = uid not in self._uncapped
            user = self._users.setdefault(uid, _User(Bucket(self.limits.burst, now)))
            refusal = None
            most = self.limits.connections
            if capped and user.connections >= most:
                refusal = (f"you have {user.connections} connections open to the daemon already "
                           f"(control_connections_per_user: {most}); close one and ask again")  # fmt: skip
            elif capped and len(self._conns) >= MAX_CONNECTIONS:
                refusal = "the daemon serves as many connections as it may; ask again in a moment"
            if refusal is not None:
                with contextlib.suppress(OSError):  # a fresh socket's buffer takes one line
                    sock.send(_line({"ok": False, "error": refusal}))
                sock.close()
                continue
            conn = _Conn(sock, uid, capped, now + REQUEST_S)
            user.connections += 1
            self._conns.add(conn)
            self._watch(sel, conn, selectors.EVENT_READ)

    def _watch(self, sel: selectors.BaseSelector, conn: _Conn, events: int) -> None:
        if conn.events == events:
            return
        if not conn.events:
            sel.register(conn.sock, events, conn)
        elif not events:
            sel.unregister(conn.sock)
        else:
            sel.modify(conn.sock, events, conn)
        conn.events = events

    def _read(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(MAX_REQUEST + 1 - len(conn.data))
        except BlockingIOError:
            return
        except OSError:
            self._drop(sel, conn)
            return
        conn.data += chunk
        if len(conn.data) > MAX_REQUEST:
            self._answer(sel, conn, {"ok": False, "error": f"a request is at most {MAX_REQUEST} bytes"})
        elif b"\n" in conn.data or not chunk:
            if not conn.data:
                self._drop(sel, conn)  # gone without a word
                return
            try:
                conn.request = _parse(bytes(conn.data), ("release",) if conn.holding else OPS)
            except ValueError as exc:
                self._answer(sel, conn, {"ok": False, "error": str(exc)})
                return
            self._watch(sel, conn, 0)
            if conn.holding:  # its release: at once, whatever its user's rate (it ends a hold on the GPU)
                conn.request, conn.window, conn.holding = {"op": "release", "window": conn.window}, None, False
                self._ask(conn, time.monotonic())
                return
            if conn.request["op"] == "window":
                conn.window = conn.request["window"] = new_token()
            self._admit(sel, conn, time.monotonic())

    def _admit(self, sel: selectors.BaseSelector, conn: _Conn, now: float) -> None:
        """Ask the main loop now, or once its user's rate allows (refused where that is too far off)."""
        user = self._users[conn.uid]
        if not conn.capped or (not user.waiting and user.bucket.take(now, self.limits)):
            self._ask(conn, now)
            return
        wait = user.bucket.wait(now, self.limits, len(user.waiting))
        if wait > ANSWER_S:
            why = f"you asked too often; ask again in {wait:.0f} s (control_requests_per_s: {self.limits.per_s:g})"
            self._answer(sel, conn, {"ok": False, "error": why})
            return
        conn.deadline = now + ANSWER_S
        user.waiting.append(conn)

    def _ask(self, conn: _Conn, now: float) -> None:
        assert conn.request is not None
        conn.reply = concurrent.futures.Future()
        conn.reply.add_done_callback(self._wake)
        conn.deadline = now + ANSWER_S
        self.hints(Asked(conn.request.get("op", ""), conn.uid, conn.request, conn.reply))

    def _answer(self, sel: selectors.BaseSelector, conn: _Conn, answer: dict[str, Any]) -> None:
        conn.holding = conn.window is not None and conn.reply is not None and answer.get("granted") is True
        if conn.holding:  # its asker has the window's seconds and one request's time to release it
            conn.deadline = time.monotonic() + float(answer["seconds"]) + REQUEST_S
        elif conn.reply is not None and conn.reply.done():
            conn.window = None  # refused by the main loop, which holds nothing of it
        conn.reply = None
        conn.out = memoryview(_line(answer))
        if not conn.holding:
            conn.deadline = time.monotonic() + REQUEST_S
        self._watch(sel, conn, selectors.EVENT_WRITE)

    def _write(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError:  # the client left: nothing to tell
            self._drop(sel, conn)
            return
        conn.out = conn.out[sent:]
        if conn.out:
            return
        if conn.holding:  # a window granted: its release comes on this connection
            conn.out, conn.request = None, None
            conn.data.clear()
            self._watch(sel, conn, selectors.EVENT_READ)
        else:
            self._drop(sel, conn)

    def _drop(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        self._watch(sel, conn, 0)
        conn.sock.close()
        if conn.window is not None:  # gone without releasing its window (or before it was granted): released here
            release = {"op": "release", "window": conn.window}
            self.hints(Asked("release", conn.uid, release, concurrent.futures.Future()))
        user = self._users[conn.uid]
        user.connections -= 1
        with contextlib.suppress(ValueError):
            user.waiting.remove(conn)

    def _tend(self, sel: selectors.BaseSelector, now: float) -> None:
        """Answers ready, turns come, time up; users with nothing open and a full bucket forgotten."""
        limits = self.limits
        for user in self._users.values():
            while user.waiting and user.bucket.take(now, limits):
                self._ask(user.waiting.popleft(), now)
        for conn in list(self._conns):
            if conn.reply is not None and conn.reply.done():
                self._answer(sel, conn, conn.reply.result())
            elif now >= conn.deadline:
                if conn.out is not None:
                    self._drop(sel, conn)  # it does not take its answer
                elif conn.reply is not None or conn.request is not None:
                    self._answer(sel, conn, {"ok": False, "error": "the daemon is busy; ask again"})
                else:
                    self._answer(sel, conn, {"ok": False, "error": "the request took too long"})
        idle = [uid for uid, u in self._users.items() if not u.connections and u.bucket.full(now, limits)]
        for uid in idle:
            del self._users[uid]


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end (Linux's ``SO_PEERCRED``: pid, uid, gid)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def _parse(data: bytes, ops: tuple[str, ...]) -> dict[str, Any]:
    try:
        request = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        raise ValueError("a request is one JSON object on one line") from None
    if not isinstance(request, dict) or request.get("op") not in ops:
        raise ValueError(f"a request is a JSON object whose op is one of {', '.join(ops)}")
    return request


def _line(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer).encode() + b"\n"


def ask(path: Path, request: dict[str, Any], timeout: float = ANSWER_S + REQUEST_S) -> dict[str, Any]:
    """Send ``request`` to the daemon listening on ``path`` and return its answer; OSError when no daemon
    answers there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        return _exchange(sock, request, path)


def ask_window(path: Path, device: int, seconds: float) -> tuple[socket.socket | None, dict[str, Any]]:
    """Ask the daemon at ``path`` for a window on ``device`` (:mod:`.windows`): (the connection that holds it,
    the grant), or (None, the refusal: ``again`` where it may be asked again); OSError when no daemon answers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(ANSWER_S + REQUEST_S)
        sock.connect(str(path))
        answer = _exchange(sock, {"op": "window", "device": device, "seconds": seconds}, path)
    except BaseException:
        sock.close()
        raise
    if answer.get("granted") is not True:
        sock.close()
        return None, answer
    return sock, answer


def release_window(sock: socket.socket) -> dict[str, Any] | None:
    """Release the window ``sock`` holds, and close it: the daemon's answer (``expired``: its time was up first),
    or None where it gave none (it is gone)."""
    with sock:
        try:
            return _exchange(sock, {"op": "release"}, "the control socket")
        except (OSError, ValueError):
            return None


def _exchange(sock: socket.socket, request: dict[str, Any], path: object) -> dict[str, Any]:
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
