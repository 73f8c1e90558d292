"""The state file a daemon keeps for `mmd status`."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..atomic import write_atomic
from ..errors import OutputError
from ..logs import get_logger
from ..record import now_iso
from ..spool import Scanner, held_jobs, pid_alive, state_name
from .lock import host_daemons, lock_holder
from .tunables import RECENT_JOBS, STATE_EVERY


class State:
    """What `mmd status` shows; written atomically to ``inbox/.mmd-state.json``, throttled.

    ``workers`` lists each worker (its device, backend and the job in hand);
    ``current`` is the job in hand of the first busy one. ``backend`` is the one
    asked for until a worker has opened one, then the backends the workers opened
    (``auto`` is ``cpu`` where no GPU works).
    """

    def __init__(self, path: Path, **facts: Any) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {
            "pid": os.getpid(),
            "started": now_iso(),
            **facts,
            "status": "starting",
            "queue": 0,
            "current": None,
            "workers": [],
            "done": {"ok": 0, "error": 0},
            "recent": [],
        }
        self._workers: dict[int, dict[str, Any]] = {}
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT_JOBS)
        self._dirty = True
        self._written = 0.0

    def update(self, **changes: Any) -> None:
        """Set facts; only a change is written (the main loop says its queue every turn, idle or not)."""
        with self._lock:
            if all(key in self._data and self._data[key] == value for key, value in changes.items()):
                return
            self._data.update(changes)
            self._dirty = True

    def worker(self, index: int, **changes: Any) -> None:
        """Update what worker ``index`` is doing (``current``: its job in hand, or None)."""
        with self._lock:
            entry = self._workers.setdefault(index, {"index": index, "current": None, "done": 0})
            entry.update(changes)
            if "backend" in changes:
                opened = sorted({w["backend"] for w in self._workers.values() if w.get("backend")})
                self._data["backend"] = ", ".join(opened)
            self._dirty = True

    def finished(self, entry: dict[str, Any], worker: int | None = None) -> None:
        with self._lock:
            self._recent.appendleft(entry)
            self._data["done"]["ok" if entry["status"] == "ok" else "error"] += 1
            self._data["current"] = None
            if worker is not None:
                w = self._workers.setdefault(worker, {"index": worker, "current": None, "done": 0})
                w["current"] = None
                w["done"] += 1
            self._dirty = True

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            workers = [dict(self._workers[i]) for i in sorted(self._workers)]
            busy = [w["current"] for w in workers if w.get("current")]
            current = busy[0] if busy else self._data.get("current")
            return {
                **self._data,
                "current": current,
                "workers": workers,
                "recent": list(self._recent),
                "updated": now_iso(),
            }

    def due_in(self) -> float | None:
        """Seconds until a pending write is allowed (None: nothing to write)."""
        if not self._dirty:
            return None
        return max(0.0, self._written + STATE_EVERY - time.monotonic())

    def write(self, force: bool = False) -> None:
        """Write the file if something changed and the throttle allows (or ``force``)."""
        if not force and (not self._dirty or time.monotonic() - self._written < STATE_EVERY):
            return
        snap = self.snapshot()
        self._dirty = False
        self._written = time.monotonic()
        # Not durable: a status for `mmd status`, written again within STATE_EVERY; in the inbox, which users
        # write, so through the commit's temporary, never a link planted there.
        try:
            write_atomic(self.path, [json.dumps(snap, indent=1).encode() + b"\n"], durable=False)
        except OutputError as exc:
            get_logger().warning("cannot write the state file", reason=exc.reason)


def read_state(private: Path, host_id: str | None = None) -> dict[str, Any] | None:
    """The last state a daemon wrote in ``private`` (its state_dir, else its inbox; None when there is none);
    ``host_id``: a shared inbox's host."""
    try:
        return json.loads((Path(private) / state_name(host_id)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def status_of(inbox: Path, host_id: str | None = None, state_dir: Path | None = None) -> dict[str, Any]:
    """Whether a daemon serves ``inbox`` (lock held and its pid alive), its last state, and the held jobs.

    ``held``: the jobs kept in ``.work`` because the outbox refused them
    (:class:`mmd.spool.HeldJob`: file, job, reason, since, holds), every
    host's on a shared inbox. On a shared inbox every ``.mmd.<host>.lock`` is listed under ``hosts``
    with its state file; pids are checked only for ``host_id`` (this host).
    ``serving`` is true when any daemon serves it. ``state_dir``: the daemon's private folder, where its lock,
    state and held jobs are (default: the inbox).
    """
    private = inbox if state_dir is None else state_dir
    pid = lock_holder(private)
    single = pid is not None and (pid == -1 or pid_alive(pid))
    hosts = host_daemons(private, host_id)
    for entry in hosts:
        entry["state"] = read_state(private, entry["host"])
    state = read_state(private)
    if not single and hosts:
        own = [h for h in hosts if h["own"]] or [h for h in hosts if h["serving"]] or hosts
        state = own[0]["state"]
        pid = own[0]["pid"]
    serving = single or any(h["serving"] for h in hosts)
    waiting = len(Scanner(inbox).scan())
    return {
        "inbox": str(inbox),
        "serving": serving,
        "pid": pid if serving else None,
        "waiting_in_inbox": waiting,
        # Read from .work itself, not from the daemon: held jobs are there whether a daemon runs or not.
        "held": [dataclasses.asdict(job) for job in held_jobs(private)],
        "state": state,
        "hosts": hosts,
    }
