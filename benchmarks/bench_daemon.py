#!/usr/bin/env python3
"""The daemon's throughput, latency, start-up and memory after stopped jobs, tree beside tree.

    python benchmarks/bench_daemon.py [--tree NAME=PATH ...] [--no-now] [--cases burst drops backlog big timeout]
        [--burst 2000] [--rounds 3] [--drops 200] [--backlog 20000] [--backlog-rounds 1]
        [--big 4096] [--repeat 5] [--timeouts 10] [--timeout-size 4096]
        [--backend cpu] [--kernel NAME] [--waiter inotify|poll] [--work DIR] [--keep] [--out DIR]

The benchmark of the daemon's reshaping (worker processes, group commit, a
scheduler). Like ``bench_wholejob.py`` (whose helpers it imports) it drives
mmd only through its command line (``python -m mmd serve`` in a spool folder,
settings in ``MMD_*`` variables, durable commits as shipped), so any checkout
is measured the same way: ``--tree before=PATH`` (repeatable) puts other
trees in the same run, and every measurement goes round the trees in turn
(these machines are noisy: compare versions in one run, never across runs).
The tree this file is in is measured too, as ``now`` (last), unless
``--no-now``. The first tree is the baseline of the ``big`` target.

Cases (``--cases``, default all), each a row group of the table printed last:

* **burst**: ``--burst`` 32×32 files written to a sibling folder, then
  renamed into the inbox at once: jobs/s from the first rename to the last
  sidecar (``.timing.yaml``, or ``.error.yaml``: counted as errors), over
  ``--rounds`` rounds (median, min, max). Each tree's daemon stays up; its
  outbox and ``inbox/.done`` are emptied between rounds, untimed.
* **flood**: ``--flood`` 32×32 files given to another uid (nobody; needs
  root) renamed into the inbox, then one of the caller's: its rename →
  sidecar, and how many of the flood's sidecars came before it (fair share
  between submitters).
* **drops**: ``--drops`` 32×32 files renamed in one at a time on an idle
  daemon: p50/p95 of rename → sidecar. The waiter sleeps on an inotify watch
  of the outbox until the sidecar is renamed in (``--waiter poll``: polls
  ``os.path.exists`` with 0.1 ms sleeps, which on 2 cores takes CPU from
  the daemon it measures); so do the other cases' waits for one sidecar.
* **backlog**: ``--backlog`` 32×32 files in the inbox before the daemon
  starts (a fresh daemon per tree and round, ``--backlog-rounds``): Popen →
  first sidecar (polled), the rate over the first tenth of the jobs (the
  tenth after the first sidecar) and over the last tenth (from the
  sidecars' mtimes), last/first, and the whole time (Popen → last mtime).
* **big**: an N×N job (``--big``) renamed in ``--repeat`` times on a warm
  daemon (after one untimed drop): rename → sidecar median and min, and the
  sidecar's ``timings_ms.overall`` median. Each copy is written and fsynced
  before its rename, untimed.
* **timeout**: a fresh daemon (``job_timeout_s`` as shipped); the RSS of it
  and all its descendants after one small warm-up job; then ``--timeouts``
  copies of the ``--timeout-size`` input named ``t{i}@timeout=1.txt`` (a name
  may not go below ``min_name_timeout_s``, 1 s: on a GPU give a size that
  takes longer, ``--timeout-size 16384``),
  one after another, each until its ``.error.yaml`` (which must say
  ``timeout``: the count is reported); RSS again (2 s settle); then a 32×32
  and a ``--timeout-size`` job dropped normally (rename → sidecar), and RSS
  after a 2 s settle: the ratio to the first RSS, whether the daemon still
  runs and what ``mmd status --json`` says. A tree that refuses the
  ``@timeout=`` name has that reported, not a crash.

**CPU ms per job** (burst, drops, backlog): the user and system time of the
daemon and all its processes (``/proc/<pid>/stat``, reaped children
included) over the round, its last archive included, divided by its jobs
(the backlog's from the daemon's start). Other load on a shared machine
moves the rates far more than this. Between rounds the outputs and archives
are moved aside, not removed (see :func:`clear`), and removed at the end.

Every wait has a limit (``--wait``) and ends the run with the tree and case
named, at once when a daemon exits; daemons are stopped (SIGTERM, then
SIGKILL) whatever happens. Spools, inputs and kernel caches go under
``--work`` (default a new folder under /tmp), removed at the end unless
``--keep``. Everything measured goes to ``--out``/daemon.json (default: $OUT, else ``bench/``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import harness  # beside this script: its folder is first on sys.path
from harness import OUT, SMALL, Served, Tree, median, pct, square_input

CASES = ("burst", "drops", "flood", "backlog", "big", "timeout")
#: The flood's files belong to this uid (nobody), the one file dropped after them to the caller: two submitters.
FLOOD_UID = 65534
#: What marks a job done in the outbox: its timing sidecar (committed last), or its error sidecar.
DONE, FAILED = ".timing.yaml", ".error.yaml"
#: The per-job time limit the timeout case puts in the names.
TIMEOUT_NAME = "@timeout=1"


# -- waiting, always with a limit and a name -------------------------------------------------


def fail(s: Served, case: str, what: str) -> SystemExit:
    """SystemExit naming the tree and the case, with the end of the daemon's log."""
    tail = ""
    log = s.root / "daemon.log"
    if log.exists():
        with contextlib.suppress(OSError):
            tail = "\n  daemon log ends: " + log.read_text(errors="replace")[-1500:].strip().replace("\n", "\n  ")
    return SystemExit(f"bench_daemon: tree {s.name}, case {case}: {what}{tail}")


def alive(s: Served, case: str) -> None:
    if s.proc is None or s.proc.poll() is not None:
        rc = None if s.proc is None else s.proc.returncode
        raise fail(s, case, f"the daemon is not running (exit status {rc})")


class OutboxWatch:
    """An inotify watch on one outbox for files renamed into it (``IN_MOVED_TO``: every tree commits a sidecar by
    rename), so that a waiter sleeps in ``poll`` until the sidecar lands instead of taking, on a 2-core machine,
    the CPU of the daemon it measures. Made once per outbox and kept: no event between two waits is lost."""

    IN_MOVED_TO, IN_Q_OVERFLOW = 0x80, 0x4000
    _libc: Any = None

    def __init__(self, folder: Path) -> None:
        import ctypes

        if OutboxWatch._libc is None:
            OutboxWatch._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = OutboxWatch._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or OutboxWatch._libc.inotify_add_watch(self.fd, os.fsencode(folder), self.IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {folder}")
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)

    def names(self, timeout_ms: int) -> list[str] | None:
        """The names moved in since the last call, waiting up to ``timeout_ms`` for one; None after an overflow."""
        if not self.poller.poll(timeout_ms):
            return []
        try:
            buf = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        names: list[str] = []
        i = 0
        while i < len(buf):
            _wd, mask, _cookie, size = struct.unpack_from("iIII", buf, i)
            if mask & self.IN_Q_OVERFLOW:
                return None
            names.append(os.fsdecode(buf[i + 16 : i + 16 + size].rstrip(b"\0")))
            i += 16 + size
        return names


#: How waits for one sidecar wait: ``inotify`` (default; see :class:`OutboxWatch`) or ``poll`` (``os.path.exists``
#: every ``sleep``, as this benchmark did first; on 2 cores the poller takes CPU from the daemon). Set by main.
WAITER = "inotify"
_watches: dict[Path, OutboxWatch] = {}


def watch(s: Served) -> OutboxWatch:
    """The outbox's watch, made the first time (before the first drop it waits for: :func:`warm`)."""
    folder = s.root / "outbox"
    if folder not in _watches:
        _watches[folder] = OutboxWatch(folder)
    return _watches[folder]


def wait_one(s: Served, case: str, stem: str, limit: float, sleep: float = 0.0001) -> tuple[float, Path]:
    """Until ``outbox/stem.timing.yaml`` or ``stem.error.yaml`` exists: (perf_counter then, that path).

    ``sleep``: the poll's period (:data:`WAITER` ``poll``); the inotify waiter sleeps until a rename.
    """
    done, failed = str(s.root / "outbox" / (stem + DONE)), str(s.root / "outbox" / (stem + FAILED))
    wanted = {stem + DONE: done, stem + FAILED: failed}
    w = watch(s) if WAITER == "inotify" else None
    end = time.perf_counter() + limit
    exists = os.path.exists
    spins = 0
    while True:
        if w is not None:
            names = w.names(50)
            now = time.perf_counter()
            for name in names or ():
                if name in wanted:
                    return now, Path(wanted[name])
            # already there before this wait, an overflow, or a quiet 50 ms: look, and check the daemon
            if names is None or not names:
                if exists(done):
                    return now, Path(done)
                if exists(failed):
                    return now, Path(failed)
                alive(s, case)
                if now > end:
                    raise fail(s, case, f"no sidecar for {stem} after {limit:.0f} s")
            continue
        if exists(done):
            return time.perf_counter(), Path(done)
        if exists(failed):
            return time.perf_counter(), Path(failed)
        spins += 1
        if spins % 256 == 0:
            alive(s, case)
            if time.perf_counter() > end:
                raise fail(s, case, f"no sidecar for {stem} after {limit:.0f} s")
        time.sleep(sleep)


def wait_all(s: Served, case: str, stems: list[str], limit: float, sleep: float) -> tuple[float, int]:
    """Poll until every stem has a sidecar: (perf_counter then, how many are error sidecars).

    The stems are checked from the front and the front moves on, so a poll is
    one or two ``stat`` calls while the jobs finish in order, and no job is
    missed when they do not.
    """
    out = str(s.root / "outbox") + os.sep
    exists = os.path.exists
    end = time.perf_counter() + limit
    errors = i = spins = 0
    while i < len(stems):
        if exists(out + stems[i] + DONE):
            i += 1
            continue
        if exists(out + stems[i] + FAILED):
            errors += 1
            i += 1
            continue
        spins += 1
        if spins % 64 == 0:
            alive(s, case)
        if time.perf_counter() > end:
            raise fail(s, case, f"{i} of {len(stems)} sidecars after {limit:.0f} s (waiting for {stems[i]})")
        time.sleep(sleep)
    return time.perf_counter(), errors


def settle(s: Served, limit: float = 10.0) -> None:
    """Until no job folder is left in ``inbox/.work`` (the last job archived); gives up quietly after ``limit``.

    Quietly: another tree may lay out ``.work`` differently; the rounds then differ a little, nothing breaks.
    """
    work = s.root / "inbox" / ".work"
    end = time.perf_counter() + limit
    while time.perf_counter() < end:
        try:
            if not [n for n in os.listdir(work) if not n.startswith(".")]:
                return
        except FileNotFoundError:
            return
        time.sleep(0.005)


def clear(s: Served, aside: Path | None = None) -> None:
    """Empty the outbox (not its dot files: reservations) and the archives; the daemon should be idle.

    ``aside``: move the files into that folder (made here) instead of removing them, and remove it at the end
    of the run. On ext4 without a journal (the project's VM) every file made in the next several seconds steps
    over each inode freed (``recently_deleted``): thousands removed between rounds slowed the next round of
    any tree, by as much as the code's differences.
    """
    if aside is not None:
        aside.mkdir(parents=True, exist_ok=True)
    for folder in (s.root / "outbox", s.root / "inbox" / ".done", s.root / "inbox" / ".failed"):
        with contextlib.suppress(FileNotFoundError), os.scandir(folder) as it:
            for entry in it:
                if entry.is_file(follow_symlinks=False) and not (folder.name == "outbox" and entry.name[0] == "."):
                    with contextlib.suppress(FileNotFoundError):
                        if aside is None:
                            os.unlink(entry.path)
                        else:
                            os.rename(entry.path, aside / f"{folder.name}-{entry.name}")


def stage(s: Served, stem: str, src: Path | bytes) -> Path:
    """Write ``src`` (a file to copy, or bytes) to the spool's ``src/stem.txt`` and fsync it: ready to rename in."""
    path = s.root / "src" / f"{stem}.txt"
    if isinstance(src, bytes):
        path.write_bytes(src)
    else:
        shutil.copyfile(src, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def put(s: Served, staged: Path) -> float:
    """Rename a staged file into the inbox (a complete drop): perf_counter of the rename."""
    t0 = time.perf_counter()
    os.rename(staged, s.root / "inbox" / staged.name)
    return t0


def sidecar(path: Path) -> dict[str, Any]:
    import yaml

    try:
        rec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return {"status": "unreadable", "error": {"kind": "unreadable", "reason": str(exc)}}
    return rec if isinstance(rec, dict) else {"status": "unreadable", "error": {"reason": repr(rec)}}


def must_be_ok(s: Served, case: str, path: Path) -> dict[str, Any]:
    rec = sidecar(path)
    if rec.get("status") != "ok":
        raise fail(s, case, f"{path.name}: {rec.get('error')}")
    return rec


def warm(s: Served, case: str, limit: float) -> None:
    """One small job, untimed: the daemon is up, its imports done, its kernels built."""
    t0 = time.perf_counter()
    s.drop(SMALL, "warm")
    _, path = wait_one(s, case, "warm", limit, sleep=0.002)
    must_be_ok(s, case, path)
    print(f"  {s.name} {case}: daemon up, warm-up job {time.perf_counter() - t0:.2f} s from its drop", flush=True)


# -- memory ------------------------------------------------------------------------------


def family(pid: int) -> list[int]:
    """``pid`` and all its descendants, from /proc/<pid>/task/*/children."""
    pids, i = [pid], 0
    while i < len(pids):
        task = Path(f"/proc/{pids[i]}/task")
        i += 1
        with contextlib.suppress(OSError):
            for t in task.iterdir():
                with contextlib.suppress(OSError):
                    pids += [int(c) for c in (t / "children").read_text().split()]
    return pids


#: Clock ticks per second of /proc/<pid>/stat's times.
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user, system) of ``pid`` and its descendants, reaped children included (/proc/<pid>/stat):
    the daemon's own cost, which the load of other processes on the machine barely changes."""
    user = system = 0
    for p in family(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = Path(f"/proc/{p}/stat").read_bytes()
            f = raw[raw.rfind(b")") + 2 :].split()
            user += int(f[11]) + int(f[13])  # utime, cutime
            system += int(f[12]) + int(f[14])  # stime, cstime
    return user / _TICK, system / _TICK


def cpu_ms_per_job(before: tuple[float, float], after: tuple[float, float], jobs: int) -> dict[str, float]:
    user, system = (after[0] - before[0]) * 1e3 / jobs, (after[1] - before[1]) * 1e3 / jobs
    return {"cpu_ms_per_job": user + system, "user_ms_per_job": user, "sys_ms_per_job": system}


def pid_of(s: Served) -> int:
    if s.proc is None:
        raise SystemExit(f"bench_daemon: tree {s.name}: no daemon started")
    return s.proc.pid


def rss_mb(pid: int) -> tuple[float, int, int]:
    """Sum of VmRSS (MiB) over ``pid`` and its descendants, how many processes that is, and their threads."""
    total_kb = count = threads = 0
    for p in family(pid):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{p}/status").read_text().splitlines())
            total_kb += int(fields.get("VmRSS", "0 kB").split()[0])
            threads += int(fields.get("Threads", "0"))
            count += 1
    return total_kb / 1024, count, threads


# -- the cases --------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, trees: list[Tree], work: Path) -> None:
        self.args = args
        self.trees = trees
        self.work = work
        self.limit: float = args.wait
        self.results: dict[str, dict[str, Any]] = {t.name: {} for t in trees}
        self.daemons: list[Served] = []  # every daemon started, stopped in main's finally
        self.asides = 0

    def aside(self) -> Path:
        """A fresh folder under the work folder for :func:`clear` to move files into (removed at the end)."""
        self.asides += 1
        return self.work / "aside" / str(self.asides)

    def served(self, tree: Tree, spool: str, start: bool = True) -> Served:
        s = Served(tree, self.work, root=self.work / f"spool-{tree.name}-{spool}", start=False)
        self.daemons.append(s)
        if start:
            s.start()
        return s

    def input(self, n: int) -> Path:
        path = self.work / f"in-{n}.txt"
        if not path.exists():
            t0 = time.perf_counter()
            square_input(path, n, n)
            print(f"  made {path.name} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
        return path

    @contextlib.contextmanager
    def warm_daemons(self, spool: str, case: str) -> Iterator[list[Served]]:
        daemons = [self.served(t, spool) for t in self.trees]
        try:
            for s in daemons:
                warm(s, case, self.limit)
            for s in daemons:
                settle(s)
                clear(s, self.aside())
            yield daemons
        finally:
            for s in daemons:
                s.stop()

    # 1. burst
    def burst(self, daemons: list[Served]) -> None:
        n, rates = self.args.burst, {s.name: [] for s in daemons}
        errors = dict.fromkeys(rates, 0)
        cpu: dict[str, list[dict[str, float]]] = {s.name: [] for s in daemons}
        for r in range(self.args.rounds):
            for s in daemons:
                stems = [f"b{r}-{i:06d}" for i in range(n)]
                src, inbox = s.root / "src", s.root / "inbox"
                for stem in stems:
                    (src / f"{stem}.txt").write_bytes(SMALL)
                c0 = cpu_s(pid_of(s))
                t0 = time.perf_counter()
                for stem in stems:
                    os.rename(src / f"{stem}.txt", inbox / f"{stem}.txt")
                end, errs = wait_all(s, "burst", stems, self.limit, 0.0005)
                settle(s)  # the last jobs' archives are the burst's CPU too
                cpu[s.name].append(cpu_ms_per_job(c0, cpu_s(pid_of(s)), n))
                rates[s.name].append(n / (end - t0))
                errors[s.name] += errs
                c = cpu[s.name][-1]
                print(f"  {s.name} burst round {r}: {rates[s.name][-1]:.1f} jobs/s ({errs} errors), CPU "
                      f"{c['cpu_ms_per_job']:.3f} ms/job (user {c['user_ms_per_job']:.3f}, system "
                      f"{c['sys_ms_per_job']:.3f})", flush=True)  # fmt: skip
                clear(s, self.aside())
        for s in daemons:
            v = rates[s.name]
            self.results[s.name]["burst"] = {
                "files": n,
                "jobs_per_s": v,
                "median": median(v),
                "min": min(v),
                "max": max(v),
                "errors": errors[s.name],
                "cpu": cpu[s.name],
                **{k: median([c[k] for c in cpu[s.name]]) for k in cpu[s.name][0]},
            }

    # 2b. flood
    def flood(self, daemons: list[Served]) -> None:
        """``--flood`` 32x32 files of one submitter renamed in, then one of another: that one's drop→sidecar.
        Fair share puts it next once the flood's first jobs are charged; first come, first served puts it last.
        Needs root (the flood's files are given to another uid)."""
        if os.geteuid() != 0:
            print("  flood: needs root to give the flood's files to another uid; not measured", flush=True)
            return
        n = self.args.flood
        for s in daemons:
            stems = [f"f-{i:06d}" for i in range(n)]
            src, inbox = s.root / "src", s.root / "inbox"
            for stem in stems:
                (src / f"{stem}.txt").write_bytes(SMALL)
                os.chown(src / f"{stem}.txt", FLOOD_UID, FLOOD_UID)
            (src / "victim.txt").write_bytes(SMALL)
            for stem in stems:
                os.rename(src / f"{stem}.txt", inbox / f"{stem}.txt")
            t0 = time.perf_counter()
            os.rename(src / "victim.txt", inbox / "victim.txt")
            t1, _ = wait_one(s, "flood", "victim", self.limit)
            wait_all(s, "flood", stems, self.limit, 0.0005)
            behind = sum(1 for stem in stems if os.path.getmtime(s.root / "outbox" / (stem + DONE)) <= os.path.getmtime(
                s.root / "outbox" / ("victim" + DONE)))  # fmt: skip
            self.results[s.name]["flood"] = {"files": n, "victim_ms": (t1 - t0) * 1e3, "flood_jobs_before": behind}
            print(f"  {s.name} flood of {n}: the other submitter's job in {(t1 - t0) * 1e3:.1f} ms "
                  f"({behind} of the flood's sidecars before it)", flush=True)  # fmt: skip
            settle(s)
            clear(s, self.aside())

    # 2. drops
    def drops(self, daemons: list[Served]) -> None:
        lat: dict[str, list[float]] = {s.name: [] for s in daemons}
        errors = dict.fromkeys(lat, 0)
        cpu = dict.fromkeys(lat, 0.0)
        left = self.args.drops
        while left > 0:
            block = min(10, left)
            left -= block
            for s in daemons:
                c0 = cpu_s(pid_of(s))
                for _ in range(block):
                    time.sleep(0.01)  # idle: the last job archived, its state written
                    t0, path = s.drop(SMALL)
                    stem = path.name[: -len(DONE)]
                    t1, got = wait_one(s, "drops", stem, self.limit)
                    lat[s.name].append((t1 - t0) * 1e3)
                    errors[s.name] += got.name.endswith(FAILED)
                settle(s)
                c1 = cpu_s(pid_of(s))
                cpu[s.name] += (c1[0] - c0[0]) + (c1[1] - c0[1])
        for s in daemons:
            v = lat[s.name]
            self.results[s.name]["drops"] = {
                "n": len(v),
                "p50_ms": pct(v, 50),
                "p95_ms": pct(v, 95),
                "max_ms": max(v),
                "errors": errors[s.name],
                "cpu_ms_per_job": cpu[s.name] * 1e3 / len(v),
                "samples_ms": v,
            }
            print(f"  {s.name} drops: p50 {pct(v, 50):.2f} ms, p95 {pct(v, 95):.2f} ms, "
                  f"CPU {cpu[s.name] * 1e3 / len(v):.3f} ms/job", flush=True)  # fmt: skip
        for s in daemons:
            settle(s)
            clear(s, self.aside())

    # 4. big
    def big(self, daemons: list[Served]) -> None:
        src = self.input(self.args.big)
        lat: dict[str, list[float]] = {s.name: [] for s in daemons}
        overall: dict[str, list[float]] = {s.name: [] for s in daemons}
        phases: dict[str, list[dict[str, float]]] = {s.name: [] for s in daemons}
        for i in range(-1, self.args.repeat):  # -1: the untimed first one
            for s in daemons:
                stem = f"big{self.args.big}-{i + 1}"
                t0 = put(s, stage(s, stem, src))
                t1, path = wait_one(s, "big", stem, self.limit, sleep=0.0002)
                rec = must_be_ok(s, "big", path)
                if i >= 0:
                    lat[s.name].append((t1 - t0) * 1e3)
                    overall[s.name].append(float(rec.get("timings_ms", {}).get("overall") or "nan"))
                    phases[s.name].append({k: float(v) for k, v in rec.get("timings_ms", {}).items() if v is not None})
                settle(s)
                clear(s)  # its input and output are big: gone before the next
        for s in daemons:
            v, o, ph = lat[s.name], overall[s.name], phases[s.name]
            ph_median = {k: median([p[k] for p in ph if k in p]) for k in ph[0]}
            self.results[s.name]["big"] = {
                "n": self.args.big,
                "drop_to_sidecar_ms": v,
                "median_ms": median(v),
                "min_ms": min(v),
                "overall_ms": o,
                "overall_median_ms": median(o),
                "phases_median_ms": ph_median,
            }
            shown = ", ".join(f"{k} {x:.1f}" for k, x in ph_median.items())
            print(f"  {s.name} big {self.args.big}: median {median(v):.1f} ms, overall {median(o):.1f} ms; "
                  f"its sidecars' phases (median ms): {shown}", flush=True)  # fmt: skip

    # 3. backlog
    def backlog(self) -> None:
        n = self.args.backlog
        stems = [f"q{i:06d}" for i in range(n)]
        rounds: dict[str, list[dict[str, float]]] = {t.name: [] for t in self.trees}
        for r in range(self.args.backlog_rounds):
            for t in self.trees:
                s = self.served(t, f"backlog{r}", start=False)
                try:
                    inbox = s.root / "inbox"
                    for stem in stems:
                        (inbox / f"{stem}.txt").write_bytes(SMALL)
                    os.sync()  # the backlog's writeback is not the daemon's
                    rounds[t.name].append(self.backlog_round(s, stems))
                finally:
                    s.stop()
                print(f"  {t.name} backlog round {r}: {json.dumps(rounds[t.name][-1])}", flush=True)
                if not self.args.keep:  # set aside, not removed: see clear()
                    aside = self.aside()
                    aside.parent.mkdir(parents=True, exist_ok=True)
                    os.rename(s.root, aside)
        for t in self.trees:
            v = rounds[t.name]
            self.results[t.name]["backlog"] = {
                "files": n,
                "rounds": v,
                **{k: median([x[k] for x in v]) for k in v[0]},
            }

    def backlog_round(self, s: Served, stems: list[str]) -> dict[str, float]:
        outbox = s.root / "outbox"
        wall0, t0 = time.time(), time.perf_counter()
        s.start()
        end = t0 + self.limit
        first = None
        while first is None:
            with os.scandir(outbox) as it:
                if any(e.name.endswith((DONE, FAILED)) for e in it):
                    first = time.perf_counter() - t0
                    break
            alive(s, "backlog")
            if time.perf_counter() > end:
                raise fail(s, "backlog", f"no sidecar {self.limit:.0f} s after the start")
            time.sleep(0.0005)
        _, errors = wait_all(s, "backlog", stems, self.limit, 0.01)
        settle(s)
        used = cpu_ms_per_job((0.0, 0.0), cpu_s(pid_of(s)), len(stems))  # its start-up included
        with os.scandir(outbox) as it:
            mt = sorted(e.stat().st_mtime_ns / 1e9 for e in it if e.name.endswith((DONE, FAILED)))
        n = len(mt)
        k = max(1, n // 10)
        first_rate = k / (mt[k] - mt[0]) if n > k and mt[k] > mt[0] else float("nan")
        last_rate = k / (mt[-1] - mt[-1 - k]) if n > k and mt[-1] > mt[-1 - k] else float("nan")
        total = mt[-1] - wall0
        return {
            "first_job_s": first,
            "first_job_mtime_s": mt[0] - wall0,
            "first_tenth_jobs_per_s": first_rate,
            "last_tenth_jobs_per_s": last_rate,
            "last_over_first": last_rate / first_rate,
            "total_s": total,
            "jobs_per_s": n / total,
            "errors": errors,
            **used,
        }

    # 5. timeout
    def timeout(self) -> None:
        size = self.args.timeout_size
        src = self.input(size)
        daemons = [self.served(t, "timeout") for t in self.trees]
        res: dict[str, dict[str, Any]] = {s.name: {"size": size, "kinds": [], "refused": None} for s in daemons}
        try:
            for s in daemons:
                warm(s, "timeout", self.limit)
                settle(s)
            time.sleep(1.0)
            for s in daemons:
                r = res[s.name]
                r["rss_before_mb"], r["processes_before"], r["threads_before"] = rss_mb(pid_of(s))
            for i in range(self.args.timeouts):
                for s in daemons:
                    if res[s.name]["refused"]:
                        continue
                    stem = f"t{i}{TIMEOUT_NAME}"
                    t0 = put(s, stage(s, stem, src))
                    t1, path = wait_one(s, "timeout", stem, self.limit, sleep=0.0005)
                    rec = sidecar(path)
                    err = rec.get("error") or {}
                    kind = err.get("kind") if isinstance(err, dict) else None
                    reason = str(err.get("reason", "")) if isinstance(err, dict) else str(err)
                    if path.name.endswith(DONE):
                        kind = "finished"  # ran to the end inside its limit: no timeout
                    res[s.name]["kinds"].append(kind)
                    res[s.name].setdefault("stop_ms", []).append((t1 - t0) * 1e3)
                    if kind == "jobname":
                        res[s.name]["refused"] = reason  # this tree takes no @timeout= in names
                        print(f"  {s.name} timeout: the name is refused: {reason}", flush=True)
                    settle(s)
                    clear(s)
            time.sleep(2.0)
            for s in daemons:
                r = res[s.name]
                r["rss_after_timeouts_mb"], r["processes_after_timeouts"], r["threads_after_timeouts"] = rss_mb(
                    pid_of(s)
                )
            for s in daemons:
                alive(s, "timeout")
                t0 = put(s, stage(s, "after-small", SMALL))
                t1, path = wait_one(s, "timeout", "after-small", self.limit)
                must_be_ok(s, "timeout", path)
                res[s.name]["small_after_ms"] = (t1 - t0) * 1e3
                t0 = put(s, stage(s, f"after-{size}", src))
                t1, path = wait_one(s, "timeout", f"after-{size}", self.limit, sleep=0.0002)
                must_be_ok(s, "timeout", path)
                res[s.name]["big_after_ms"] = (t1 - t0) * 1e3
                settle(s)
                clear(s)
            time.sleep(2.0)
            for s in daemons:
                r = res[s.name]
                r["rss_after_mb"], r["processes_after"], r["threads_after"] = rss_mb(pid_of(s))
                r["rss_ratio"] = r["rss_after_mb"] / r["rss_before_mb"] if r["rss_before_mb"] else float("nan")
                r["family_before"] = f"{r['processes_before']}/{r['threads_before']}"
                r["family_after"] = f"{r['processes_after']}/{r['threads_after']}"
                r["stop_median_ms"] = median(r.get("stop_ms", []))
                r["timeouts"] = sum(1 for k in r["kinds"] if k == "timeout")
                r["dropped"] = len(r["kinds"])
                r["alive"] = s.proc is not None and s.proc.poll() is None
                r["status"], r["serving"] = self.status(s)
                self.results[s.name]["timeout"] = r
                print(f"  {s.name} timeout: {json.dumps({k: v for k, v in r.items() if k != 'stop_ms'})}", flush=True)
        finally:
            for s in daemons:
                s.stop()

    def status(self, s: Served) -> tuple[str | None, bool | None]:
        """``mmd status --json`` in the spool (same env): the state's status, and whether it says serving."""
        try:
            _, done = s.tree.run("status", "--json", cwd=s.root, timeout=60)
            data = json.loads(done.stdout)
        except (subprocess.SubprocessError, ValueError) as exc:
            return f"no answer: {exc!r}"[:200], None
        state = data.get("state") or {}
        return data.get("status", state.get("status")), data.get("serving")


# -- the report -------------------------------------------------------------------------


def get(res: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(res, dict) or part not in res:
            return None
        res = res[part]
    return res


def rows(backend: str, baseline: str) -> list[tuple[str, str, str, str, Callable[[Any, Any], bool] | None]]:
    """(label, result path, format, target, check(value, baseline's value)) per row of the table."""
    burst_target = 2000.0 if backend == "cuda" else 1000.0
    return [
        ("burst jobs/s (median)", "burst.median", "{:.1f}", f">= {burst_target:.0f}", lambda v, b: v >= burst_target),
        ("burst jobs/s (min)", "burst.min", "{:.1f}", "", None),
        ("burst jobs/s (max)", "burst.max", "{:.1f}", "", None),
        ("burst error sidecars", "burst.errors", "{}", "0", lambda v, b: v == 0),
        ("burst CPU ms/job (median)", "burst.cpu_ms_per_job", "{:.3f}", "", None),
        ("burst user ms/job", "burst.user_ms_per_job", "{:.3f}", "", None),
        ("burst system ms/job", "burst.sys_ms_per_job", "{:.3f}", "", None),
        ("drops p50 ms", "drops.p50_ms", "{:.2f}", "<= 4", lambda v, b: v <= 4.0),
        ("flood: another's job ms", "flood.victim_ms", "{:.1f}", "<= 300", lambda v, b: v <= 300.0),
        ("flood: its jobs before it", "flood.flood_jobs_before", "{}", "", None),
        ("drops p95 ms", "drops.p95_ms", "{:.2f}", "<= 6", lambda v, b: v <= 6.0),
        ("drops CPU ms/job", "drops.cpu_ms_per_job", "{:.3f}", "", None),
        ("backlog first job s", "backlog.first_job_s", "{:.3f}", "<= 1", lambda v, b: v <= 1.0),
        ("backlog first tenth jobs/s", "backlog.first_tenth_jobs_per_s", "{:.1f}", "", None),
        ("backlog last tenth jobs/s", "backlog.last_tenth_jobs_per_s", "{:.1f}", "", None),
        ("backlog last/first", "backlog.last_over_first", "{:.2f}", ">= 0.8", lambda v, b: v >= 0.8),
        ("backlog total s", "backlog.total_s", "{:.2f}", "", None),
        ("backlog jobs/s overall", "backlog.jobs_per_s", "{:.1f}", "", None),
        ("backlog CPU ms/job", "backlog.cpu_ms_per_job", "{:.3f}", "", None),
        (
            "big drop->sidecar ms (med)",
            "big.median_ms",
            "{:.1f}",
            f"<= {baseline} +5%",
            lambda v, b: b is None or v <= 1.05 * b,
        ),
        ("big drop->sidecar ms (min)", "big.min_ms", "{:.1f}", "", None),
        ("big sidecar overall ms (med)", "big.overall_median_ms", "{:.1f}", "", None),
        ("timeout jobs that timed out", "timeout.timeouts", "{}", "all", None),  # checked in table()
        ("timeout jobs dropped", "timeout.dropped", "{}", "", None),
        ("timeout drop->error sidecar ms", "timeout.stop_median_ms", "{:.1f}", "", None),
        ("timeout RSS before MiB", "timeout.rss_before_mb", "{:.1f}", "", None),
        ("timeout RSS after stops MiB", "timeout.rss_after_timeouts_mb", "{:.1f}", "", None),
        ("timeout RSS after MiB", "timeout.rss_after_mb", "{:.1f}", "", None),
        ("timeout RSS after/before", "timeout.rss_ratio", "{:.2f}", "<= 1.2", lambda v, b: v <= 1.2),
        ("timeout processes/threads before", "timeout.family_before", "{}", "", None),
        ("timeout processes/threads after", "timeout.family_after", "{}", "", None),
        ("timeout daemon alive", "timeout.alive", "{}", "True", lambda v, b: v is True),
        ("timeout mmd status", "timeout.status", "{}", "serving", lambda v, b: v == "serving"),
        ("timeout small job after ms", "timeout.small_after_ms", "{:.2f}", "", None),
        ("timeout big job after ms", "timeout.big_after_ms", "{:.1f}", "", None),
    ]


def cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def table(results: dict[str, dict[str, Any]], backend: str) -> list[str]:
    trees = list(results)
    baseline = trees[0]
    width = max(14, *(len(t) + 2 for t in trees))
    lines = [f"{'':30}" + "".join(f"{t:>{width}}" for t in trees) + "   target"]
    for label, path, fmt, target, check in rows(backend, baseline):
        values = [get(results[t], path) for t in trees]
        if all(v is None for v in values):
            continue
        if path == "timeout.timeouts":  # k of the n dropped, or that the name was refused
            texts = []
            for v, t in zip(values, trees, strict=True):
                dropped = get(results[t], "timeout.dropped")
                if get(results[t], "timeout.refused"):
                    texts.append("refused MISS")
                elif v is not None:
                    texts.append(f"{v}/{dropped}" + (" ok" if dropped and v == dropped else " MISS"))
                else:
                    texts.append("-")
        else:
            texts = [cell(v, fmt) for v in values]
        if check is not None:
            base = values[0]
            for i, v in enumerate(values):
                if v is None or (isinstance(v, float) and v != v):
                    continue
                texts[i] += " ok" if check(v, None if i == 0 else base) else " MISS"
        lines.append(f"{label:30}" + "".join(f"{x:>{width}}" for x in texts) + f"   {target}")
    refused = {t: get(results[t], "timeout.refused") for t in trees}
    for t, why in refused.items():
        if why:
            lines.append(f"  {t}: refuses {TIMEOUT_NAME} in a name: {why}")
    return lines


#: Run with each tree's env: where its mmd and its C text path come from.
PROBE = (
    "import importlib.util as u, mmd; s = u.find_spec('mmd._fasttext'); "
    "print(mmd.__file__); print(s.origin if s and s.origin else '')"
)


def probe(tree: Tree, work: Path) -> dict[str, Any]:
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], cwd=work, env=tree.env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": repr(exc)}
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:]}
    mmd_file, _, fasttext = done.stdout.strip().partition("\n")
    return {"mmd": mmd_file, "fasttext": fasttext or None}


def commit_of(path: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        if head.returncode != 0:
            return "not a git tree"
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"


def machine(trees: list[Tree], work: Path) -> dict[str, Any]:
    mem = ""
    with contextlib.suppress(OSError):
        mem = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory": " ".join(mem.split()[1:]),
        "python": sys.version.split()[0] + f" ({sys.executable})",
        "platform": platform.platform(),
        "load_start": os.getloadavg(),
        "trees": {t.name: {"path": str(t.path), "commit": commit_of(t.path), **probe(t, work)} for t in trees},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_tree_options(ap, "another checkout to measure")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--burst", type=int, default=2000, help="32x32 files renamed in at once")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the burst")
    ap.add_argument("--drops", type=int, default=200, help="32x32 files dropped one at a time")
    ap.add_argument("--flood", type=int, default=2000, help="32x32 files of one submitter before another's one")
    ap.add_argument("--backlog", type=int, default=20000, help="32x32 files in the inbox before the daemon starts")
    ap.add_argument("--backlog-rounds", type=int, default=1)
    ap.add_argument("--big", type=int, default=4096, help="N of the big job")
    ap.add_argument("--repeat", type=int, default=5, help="drops of the big job")
    ap.add_argument("--timeouts", type=int, default=10, help=f"jobs named t{{i}}{TIMEOUT_NAME}.txt")
    ap.add_argument("--timeout-size", type=int, default=4096, help="N of those jobs and of the big job after them")
    harness.add_served_options(ap, wait=600.0, work="spools, inputs, caches")
    ap.add_argument("--no-isolate", action="store_true", help="let the venv's editable mmd fill a tree's gaps")
    ap.add_argument("--waiter", choices=("inotify", "poll"), default="inotify",
                    help="how a wait for one sidecar waits: inotify, or os.path.exists every 0.1 ms")  # fmt: skip
    ap.add_argument("--out", type=Path, default=OUT, help="where daemon.json goes")
    ap.add_argument("--set", action="append", default=[], metavar="TREE:KEY=VALUE",
                    help="a setting for one tree's daemon (MMD_KEY=VALUE), e.g. w4:WORKERS_PER_DEVICE=4; "
                    "the same checkout under two names with different settings compares settings")  # fmt: skip
    args = ap.parse_args()
    for opt in ("burst", "rounds", "drops", "flood", "backlog", "backlog_rounds", "big", "repeat", "timeout_size"):
        if getattr(args, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be at least 1")
    if args.backlog < 20 and "backlog" in args.cases:
        ap.error("--backlog must be at least 20 (a tenth of it is measured)")
    specs = harness.trees(ap, args.tree, now=not args.no_now)
    names = [n for n, _ in specs]
    global WAITER
    WAITER = args.waiter
    kernel = harness.served_kernel(args.backend, args.kernel)

    made_work = args.work is None or not args.work.exists()
    work = (args.work or Path(tempfile.mkdtemp(prefix="mmd-daemon-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    before = set(os.listdir(work))
    site = args.site
    if not args.no_isolate:
        site = os.pathsep.join(p for p in (str(harness.isolating_site(work / "isolate")), args.site) if p)
    extra: dict[str, dict[str, str]] = {}
    for spec in args.set:
        tree, colon, setting = spec.partition(":")
        key, eq, value = setting.partition("=")
        if not colon or not eq or tree not in names or not key:
            ap.error(f"--set {spec}: TREE:KEY=VALUE with TREE one of {names}")
        extra.setdefault(tree, {})[f"MMD_{key.upper()}"] = value
    trees = harness.served_trees(specs, work, args.backend, kernel, site, extra)

    facts = machine(trees, work)
    print(f"bench_daemon: {', '.join(args.cases)}; backend {args.backend}, kernel {kernel or '(unset)'}; "
          f"waiter {args.waiter}; work {work}")  # fmt: skip
    print(f"machine: nproc {facts['nproc']} (usable {facts['cpus_usable']}), memory {facts['memory']}, "
          f"python {facts['python']}, {facts['platform']}")  # fmt: skip
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*facts["load_start"]))
    for name, t in facts["trees"].items():
        print(f"tree {name}: {t['path']} at {t['commit']}")
        if "error" in t:
            print(f"  its mmd does not import: {t['error']}")
            continue
        if not t["mmd"].startswith(t["path"] + os.sep):
            print(f"  WARNING: its mmd is imported from {t['mmd']}")
        if not t["fasttext"]:
            print("  no compiled mmd._fasttext: the numpy text path (build it in the tree to compare like with like)")
        elif not t["fasttext"].startswith(t["path"] + os.sep):
            print(f"  WARNING: its mmd._fasttext comes from {t['fasttext']}")
    print(flush=True)

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(f"bench_daemon: signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    bench = Bench(args, trees, work)
    t_start = time.time()
    failed: str | None = None  # a wait that ran out or a daemon that died: what was measured is still reported
    try:
        # the cases on one set of warm daemons, in this order; then those that start daemons of their own
        on_warm = {"burst": bench.burst, "drops": bench.drops, "flood": bench.flood, "big": bench.big}
        shared = [c for c in on_warm if c in args.cases]
        if shared:
            with bench.warm_daemons("main", "/".join(shared)) as daemons:
                for case in shared:
                    print(case, flush=True)
                    on_warm[case](daemons)
        for case, run_case in (("backlog", bench.backlog), ("timeout", bench.timeout)):
            if case in args.cases:
                print(case, flush=True)
                run_case()
    except SystemExit as exc:
        failed = str(exc.code)
        print(failed, file=sys.stderr, flush=True)
    finally:
        for s in bench.daemons:
            with contextlib.suppress(Exception):
                s.stop()
        if not args.keep:
            if made_work:
                shutil.rmtree(work, ignore_errors=True)
            else:
                for name in set(os.listdir(work)) - before:
                    p = work / name
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        p.unlink(missing_ok=True)
    facts["load_end"] = os.getloadavg()
    facts["seconds"] = time.time() - t_start
    lines = table(bench.results, args.backend)
    print()
    print("\n".join(lines))
    print("\nload average at end: {:.2f} {:.2f} {:.2f}".format(*facts["load_end"]) + f"; {facts['seconds']:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "kernel": kernel,
        "machine": facts,
        "results": bench.results,
        "table": lines,
        "failed": failed,
    }
    (args.out / "daemon.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {args.out / 'daemon.json'}")
    if failed:
        print(f"INCOMPLETE: {failed.splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
