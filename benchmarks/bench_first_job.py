#!/usr/bin/env python3
"""A fresh daemon's first job: how long after its start a 32×32 job's sidecar comes, by workers and kernel cache.

    python benchmarks/bench_first_job.py [--tree NAME=PATH ...] [--no-now] [--backend cuda] [--kernel NAME]
        [--workers 1 8] [--caches empty built] [--rounds 3] [--arch sm_90] [--wait 120] [--work DIR] [--keep]
        [--out DIR]

Issue 48's "first job after a restart". Each measurement starts ``mmd serve`` on a fresh spool (through its
command line, as systemd would: ``NOTIFY_SOCKET`` set, READY=1 awaited) with ``--workers`` workers on one GPU
(``MMD_DEVICES=0`` and ``MMD_WORKERS_PER_DEVICE``; on the cpu backend, that many CPU workers), and one of two
kernel caches:

* **empty**: a cache folder of its own, empty, as after an install that built nothing;
* **built**: a cache the tree's ``mmd kernels --build --configured`` filled (a tree without ``--configured``:
  ``--build``, every build), as the installer leaves the service's; built once per tree, before the rounds,
  with the settings the daemons run (``--kernel``), and shared by its rounds.

Two ways a first job comes, each on a daemon of its own:

* **waiting**: one 32×32 file already in the inbox at the start: the start (Popen) → its sidecar;
* **at READY**: the inbox empty at the start, one 32×32 file renamed in when READY=1 comes: the start →
  READY=1, READY=1 → the sidecar, and the start → the sidecar.

A sidecar's time is its mtime (the wall clock at its commit), against the wall clock at the start.
Every measurement goes round the trees, then the worker counts and caches, in turn, ``--rounds`` times
(median, min and max; compare trees in one run, never across runs). The table ends with the issue's target:
a fresh daemon's first job ≤ 1.5 s after the start with the default workers (8 per GPU) and the kernel
built. Everything measured goes to ``--out``/first_job.json (default: $OUT, else ``bench/``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # beside this script: its folder is first on sys.path
from harness import OUT, SMALL, Column, Served, Table, Tree, median

MODES = ("waiting", "ready")
CACHES = ("empty", "built")
#: The issue's target, in seconds after the start: 8 workers (the default), the kernel built.
TARGET_S = 1.5


def build_cache(tree: Tree, folder: Path, arch: str | None, limit: float) -> float:
    """Fill ``folder`` (a ``XDG_CACHE_HOME``) as the installer fills the service's: ``mmd kernels --build
    --configured`` with the tree's settings; seconds it took. A tree without ``--configured`` builds all."""
    env = {**tree.env, "XDG_CACHE_HOME": str(folder)}
    extra = ["--arch", arch] if arch else []
    t0 = time.perf_counter()
    for argv in (["kernels", "--build", "--configured", *extra], ["kernels", "--build", *extra]):
        done = subprocess.run(tree.argv(*argv), env=env, capture_output=True, text=True, timeout=limit)
        if done.returncode == 0:
            print(f"  {tree.name}: {' '.join(argv)}: {done.stdout.strip().splitlines()[-1]}", flush=True)
            return time.perf_counter() - t0
        if "--configured" not in done.stderr:  # refused for another reason than an option it lacks
            break
    raise SystemExit(f"bench_first_job: tree {tree.name}: mmd {' '.join(argv)} failed:\n{done.stdout}{done.stderr}")


def sidecar_at(path: Path, s: Served, limit: float) -> float:
    """Wait for ``path`` (a timing sidecar; an error sidecar ends the run) and return its mtime (wall clock)."""
    error = path.with_name(path.name.replace(".timing.yaml", ".error.yaml"))
    end = time.monotonic() + limit
    while True:
        with contextlib.suppress(FileNotFoundError):
            return path.stat().st_mtime_ns / 1e9
        if error.exists():
            raise SystemExit(f"bench_first_job: tree {s.name}: the job was refused:\n{error.read_text()}")
        if s.proc is not None and s.proc.poll() is not None:
            raise SystemExit(f"bench_first_job: tree {s.name}: the daemon exited ({s.proc.returncode}); "
                             f"its log: {s.root / 'daemon.log'}")  # fmt: skip
        if time.monotonic() > end:
            raise SystemExit(f"bench_first_job: tree {s.name}: no {path.name} {limit:.0f} s after the start")
        time.sleep(0.0005)


def one(tree: Tree, work: Path, root: Path, mode: str, workers: int, cache: Path, backend: str,
        limit: float) -> dict[str, float]:  # fmt: skip
    """One fresh daemon's first job (``mode``: waiting or ready): the seconds measured."""
    devices = ",".join(map(str, range(workers))) if backend == "cpu" else "0"
    env = {"XDG_CACHE_HOME": str(cache), "MMD_DEVICES": devices, "MMD_WORKERS_PER_DEVICE": str(workers)}
    s = Served(Tree(tree.name, tree.path, {**tree.env, **env}), work, root=root, start=False)
    staged = s.root / "src" / "first.txt"
    staged.write_bytes(SMALL)
    if mode == "waiting":
        os.rename(staged, s.root / "inbox" / "first.txt")
    sidecar = s.root / "outbox" / "first.timing.yaml"
    try:
        wall0, t0 = time.time(), time.perf_counter()
        if mode == "waiting":
            s.start()
            return {"first_job_s": sidecar_at(sidecar, s, limit) - wall0}
        ready = s.start_ready(limit)
        wall_ready = time.time()
        os.rename(staged, s.root / "inbox" / "first.txt")
        done = sidecar_at(sidecar, s, limit)
        return {"ready_s": ready - t0, "ready_to_sidecar_s": done - wall_ready, "first_job_s": done - wall0}
    finally:
        s.stop()


def spread(values: list[float]) -> str:
    """``median [min–max]`` of seconds, or ``-``."""
    if not values:
        return "-"
    return f"{median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


TABLE = Table((
    Column("tree", 8, "<"),
    Column("workers", 7),
    Column("cache", 6),
    Column("waiting: start→sidecar s", 27),
    Column("start→READY s", 22),
    Column("READY→sidecar s", 22),
    Column("at READY: start→sidecar s", 27),
))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_tree_options(ap, "another checkout to measure")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 8], help="worker counts (on one GPU)")
    ap.add_argument("--caches", nargs="+", choices=CACHES, default=list(CACHES))
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", help="--arch for the built cache's `mmd kernels --build` (default: the GPU's)")
    harness.add_served_options(ap, wait=120.0, work="spools and kernel caches")
    ap.add_argument("--out", type=Path, default=OUT, help="where first_job.json goes")
    args = ap.parse_args()
    if args.rounds < 1 or min(args.workers) < 1:
        ap.error("--rounds and --workers must be at least 1")
    specs = harness.trees(ap, args.tree, now=not args.no_now)
    kernel = harness.served_kernel(args.backend, args.kernel)
    work = (args.work or Path(tempfile.mkdtemp(prefix="mmd-first-job-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    site = os.pathsep.join(p for p in (str(harness.isolating_site(work / "isolate")), args.site) if p)
    trees = harness.served_trees(specs, work, args.backend, kernel, site)
    print(f"bench_first_job: backend {args.backend}, kernel {kernel or '(unset)'}, workers {args.workers}, "
          f"caches {args.caches}, modes {args.modes}, {args.rounds} rounds; work {work}", flush=True)  # fmt: skip

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(f"bench_first_job: signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    results: dict[str, Any] = {"backend": args.backend, "kernel": kernel, "rounds": args.rounds, "trees": {}}
    runs: dict[tuple[str, int, str, str], list[dict[str, float]]] = {}
    failed: str | None = None
    count = 0
    try:
        built: dict[str, Path] = {}
        if "built" in args.caches:
            print("building the kernel caches (as the installer does)", flush=True)
            for t in trees:
                built[t.name] = work / f"built-{t.name}"
                shutil.rmtree(built[t.name], ignore_errors=True)
                results["trees"].setdefault(t.name, {})["build_s"] = build_cache(t, built[t.name], args.arch,
                                                                                  args.wait * 10)  # fmt: skip
        for r in range(args.rounds):
            for workers in args.workers:
                for cache in args.caches:
                    for mode in args.modes:
                        for t in trees:
                            count += 1
                            folder = built[t.name] if cache == "built" else work / f"empty-{count}"
                            got = one(t, work, work / f"spool-{count}", mode, workers, folder, args.backend,
                                      args.wait)  # fmt: skip
                            runs.setdefault((t.name, workers, cache, mode), []).append(got)
                            print(f"  round {r}: {t.name}, {workers} workers, {cache} cache, {mode}: "
                                  f"{json.dumps({k: round(v, 4) for k, v in got.items()})}", flush=True)  # fmt: skip
                            if not args.keep:
                                shutil.rmtree(work / f"spool-{count}", ignore_errors=True)
                                if cache == "empty":
                                    shutil.rmtree(folder, ignore_errors=True)
    except SystemExit as exc:
        failed = str(exc.code)
        print(failed, file=sys.stderr, flush=True)

    def values(name: str, workers: int, cache: str, mode: str, key: str) -> list[float]:
        return [got[key] for got in runs.get((name, workers, cache, mode), [])]

    print()
    print(TABLE.header())
    for t in trees:
        rows = results["trees"].setdefault(t.name, {}).setdefault("rows", [])
        for workers in args.workers:
            for cache in args.caches:
                row = {
                    "workers": workers,
                    "cache": cache,
                    "waiting_first_job_s": values(t.name, workers, cache, "waiting", "first_job_s"),
                    "ready_s": values(t.name, workers, cache, "ready", "ready_s"),
                    "ready_to_sidecar_s": values(t.name, workers, cache, "ready", "ready_to_sidecar_s"),
                    "ready_first_job_s": values(t.name, workers, cache, "ready", "first_job_s"),
                }
                rows.append(row)
                print(TABLE.row(t.name, workers, cache, *(spread(row[k]) for k in list(row)[2:])))
    print(
        f"\ntarget (issue 48): a fresh daemon's first 32x32 job <= {TARGET_S} s after the start, 8 workers per GPU, "
        "the kernel built (the `waiting` and `at READY` start→sidecar columns, 8 workers, built)"
    )
    for t in trees:
        for mode, key in (("waiting", "first_job_s"), ("ready", "first_job_s")):
            got = values(t.name, 8, "built", mode, key)
            if got:
                verdict = "met" if median(got) <= TARGET_S else "MISSED"
                print(f"  {t.name} {mode}: median {median(got):.3f} s: {verdict}")
    results["failed"] = failed
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first_job.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out / 'first_job.json'}")
    if not args.keep and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
