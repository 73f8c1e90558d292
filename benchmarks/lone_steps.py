#!/usr/bin/env python3
"""Where a lone small job's drop→sidecar time goes, step by step, tree beside tree.

    python benchmarks/lone_steps.py [--tree NAME=PATH ...] [--no-now] [--rounds 3] [--drops 100]
        [--backend cpu] [--kernel NAME] [--site DIR] [--work DIR] [--keep] [--out DIR]

Each round starts a fresh `mmd serve` of each tree in turn (as ``bench_daemon.py`` does: through its
command line, durable commits as shipped), drops ``--drops`` 32×32 files into its inbox one at a
time, 10 ms apart, and waits for each sidecar on an inotify watch of the outbox. A sitecustomize
written into ``--work`` and put on the daemon's PYTHONPATH stamps every call of ``os.read``,
``os.write``, ``os.rename``, ``os.replace``, ``os.fsync``, ``os.open``, ``os.pread`` and ``os.link``
in the daemon and its workers (CLOCK_MONOTONIC, before and after, into a file of the process's
own mapped in memory: no system call per stamp). Each drop's stamps then give its milestones
(:data:`STEPS`), medians over every drop of a tree printed side by side. Probes of this kind
(py-spy, perf trace) cost the daemon more; this one costs about 0.1–0.2 ms a job, so compare trees
with each other here, never with ``bench_daemon.py``'s drops.

The milestones are found by what the calls look like, so a change to how mmd reads its events,
sends its orders or commits may need them taught again: a step none of a tree's drops shows is
printed as "-".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # beside this script: its folder is first on sys.path
from bench_daemon import DONE, wait_one
from harness import OUT, SMALL, Served, Tree

#: Appended to the isolating sitecustomize: the stamps, when MMD_BENCH_STAMPS names a folder.
STAMPER = """
import mmap as _mmap
import os as _os
import struct as _struct
import time as _time

_STAMPS = _os.environ.get("MMD_BENCH_STAMPS")
if _STAMPS:
    _SIZE = 1 << 24
    _pack = _struct.Struct("qiiq").pack_into
    _now = _time.monotonic_ns
    _at = [None, 0]

    def _map():
        fd = _os.open(f"{_STAMPS}/{_os.getpid()}", _os.O_RDWR | _os.O_CREAT, 0o644)
        _os.ftruncate(fd, _SIZE)
        _at[0], _at[1] = _mmap.mmap(fd, _SIZE), 0
        _os.close(fd)

    def _stamp(code, fd, result):
        at = _at[1]
        if at <= _SIZE - 24:
            _pack(_at[0], at, _now(), code, fd, result)
            _at[1] = at + 24

    def _wrap(code, name):
        real = getattr(_os, name)

        def stamped(*args, **kwargs):
            _stamp(code, -1, -1)
            result = real(*args, **kwargs)
            fd = args[0] if args and isinstance(args[0], int) else -1
            size = len(result) if isinstance(result, bytes) else result if isinstance(result, int) else -1
            _stamp(code + 100, fd, size)
            return result

        setattr(_os, name, stamped)

    _map()
    _os.register_at_fork(after_in_child=_map)  # a forked worker maps a file of its own
    for _code, _name in enumerate(("read", "write", "rename", "replace", "fsync", "open", "pread", "link"), 1):
        _wrap(_code, _name)
"""
READ, WRITE, RENAME, REPLACE, FSYNC, OPEN, PREAD = range(1, 8)
END = 100  # added to a call's code in its stamp after it returned

#: The milestones of one drop, in order: (name, what it means).
STEPS = [
    ("event", "the main process reads the inotify event"),
    ("order", "a worker reads its order, or its own inbox event (a worker on a watch)"),
    ("claim", "the worker's first rename: the claim starts"),
    ("read", "the input read (the claim done)"),
    ("output", "the output's temporary opened (parse, multiply, emit done)"),
    ("syncs", "the first fsync starts"),
    ("synced", "the second fsync ends"),
    ("renamed", "the sidecar renamed in"),
    ("seen", "the waiter sees it"),
]


def load(folder: Path) -> list[tuple[float, int, int, int, int]]:
    """Every stamp in ``folder``: (seconds, pid, code, fd, result), in time order."""
    stamps = []
    for f in folder.iterdir():
        data = f.read_bytes()
        for at in range(0, len(data) - 23, 24):
            ns, code, fd, result = struct.unpack_from("qiiq", data, at)
            if ns == 0:
                break
            stamps.append((ns / 1e9, int(f.name), code, fd, result))
    stamps.sort()
    return stamps


def milestones(stamps: list[tuple[float, int, int, int, int]], main: int, t0: float, t1: float) -> dict[str, float]:
    """One drop's milestones (ms after its rename at ``t0``; its sidecar seen at ``t1``)."""
    out: dict[str, float] = {}
    window = [s for s in stamps if t0 <= s[0] <= t1]

    def first(name: str, match: Any) -> tuple[float, int, int, int, int] | None:
        for s in window:
            if match(s):
                out[name] = (s[0] - t0) * 1e3
                return s
        return None

    # An inotify event of a short name is 32 to 64 bytes; a pickled order is longer (read after its 4-byte length).
    first("event", lambda s: s[1] == main and s[2] == END + READ and 16 < s[4] <= 64)
    got = first("order", lambda s: s[1] != main and s[2] == END + READ and s[4] > 16)
    if got is not None:
        worker = got[1]
        first("claim", lambda s: s[1] == worker and s[2] == RENAME)
        claimed = t0 + out["claim"] / 1e3 if "claim" in out else t1
        read = first("read", lambda s: s[1] == worker and s[2] in (END + PREAD, END + READ) and s[0] > claimed)
        if read is not None:
            first("output", lambda s: s[1] == worker and s[2] == END + OPEN and s[0] > read[0])
        syncs = [s for s in window if s[1] == worker and s[2] in (FSYNC, END + FSYNC)]
        if len(syncs) >= 4:
            out["syncs"], out["synced"] = (syncs[0][0] - t0) * 1e3, (syncs[3][0] - t0) * 1e3
        replaced = [s for s in window if s[1] == worker and s[2] == END + REPLACE]
        if len(replaced) >= 2:
            out["renamed"] = (replaced[1][0] - t0) * 1e3
    out["seen"] = (t1 - t0) * 1e3
    return out


def one_round(tree: Tree, work: Path, round_: int, drops: int, limit: float) -> list[dict[str, float]]:
    """A fresh daemon of ``tree``: its drops' milestones. Its spool is new (the outbox's inotify watch,
    kept per folder by ``wait_one``, would not see a folder made again under the same name)."""
    stamps = work / f"stamps-{tree.name}-{round_}"
    stamps.mkdir(parents=True)
    served = Served(tree, work, root=work / f"spool-{tree.name}-{round_}", start=False)
    served.start({"MMD_BENCH_STAMPS": str(stamps)})
    marks = []
    try:
        for i in range(3):  # untimed: the daemon and its worker warm
            _, sidecar = served.drop(SMALL, f"warm{i}")
            wait_one(served, "steps", sidecar.name[: -len(DONE)], limit)
        time.sleep(1.0)
        for _ in range(drops):
            time.sleep(0.01)  # idle: the last job archived
            t0, sidecar = served.drop(SMALL)
            t1, _ = wait_one(served, "steps", sidecar.name[: -len(DONE)], limit)
            marks.append((t0, t1))
        assert served.proc is not None
        main = served.proc.pid
    finally:
        served.stop()
    all_stamps = load(stamps)
    return [milestones(all_stamps, main, t0, t1) for t0, t1 in marks]


def table(rows: dict[str, list[dict[str, float]]]) -> list[str]:
    names = list(rows)
    lines = [f"{'step (median ms from the drop)':32s}" + "".join(f"{n:>12s}" for n in names)]
    for step, _ in STEPS:
        cells = []
        for n in names:
            v = [r[step] for r in rows[n] if step in r]
            cells.append(f"{harness.median(v):12.3f}" if v else f"{'-':>12s}")
        lines.append(f"{step:32s}" + "".join(cells))
    lines.append(f"{'drops':32s}" + "".join(f"{len(rows[n]):12d}" for n in names))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_tree_options(ap, "another checkout to measure")
    ap.add_argument("--rounds", type=int, default=3, help="fresh daemons per tree, in turn")
    ap.add_argument("--drops", type=int, default=100, help="32x32 files dropped one at a time in each round")
    harness.add_served_options(ap, wait=120.0, work="spools and stamps")
    ap.add_argument("--out", type=Path, default=OUT, help="where steps.json goes")
    args = ap.parse_args()
    if args.rounds < 1 or args.drops < 1:
        ap.error("--rounds and --drops must be at least 1")
    specs = harness.trees(ap, args.tree, now=not args.no_now)
    kernel = harness.served_kernel(args.backend, args.kernel)
    work = (args.work or Path(tempfile.mkdtemp(prefix="mmd-steps-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    site = harness.isolating_site(work / "site", STAMPER)
    trees = harness.served_trees(
        specs, work, args.backend, kernel, os.pathsep.join(p for p in (str(site), args.site) if p)
    )
    print(f"lone_steps: backend {args.backend}, {args.rounds} rounds x {args.drops} drops; work {work}")
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    rows: dict[str, list[dict[str, float]]] = {t.name: [] for t in trees}
    try:
        for r in range(args.rounds):
            for t in trees:
                got = one_round(t, work, r, args.drops, args.wait)
                rows[t.name] += got
                seen = harness.median(g["seen"] for g in got)
                print(f"  round {r} {t.name}: drop->sidecar seen p50 {seen:.3f} ms", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    for line in table(rows):
        print(line)
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    args.out.mkdir(parents=True, exist_ok=True)
    drops = {n: [{k: round(v, 3) for k, v in r.items()} for r in got] for n, got in rows.items()}
    text = json.dumps({"steps": dict(STEPS), "drops": drops}, separators=(",", ":"))
    (args.out / "steps.json").write_text(text + "\n")
    print(f"wrote {args.out / 'steps.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
