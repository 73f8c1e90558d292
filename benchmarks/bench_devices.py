"""Throughput of `mmd serve --once` with one worker per device: devices [0] against [0, 1] (and more).

    python benchmarks/bench_devices.py --n 4096 --jobs 8 --devices 0 0,1 [--backend cuda] [--kernel tiled]

One input is generated (seeded) and copied ``--jobs`` times into a fresh
inbox for each device list; each run is one `python -m mmd serve --once`
process, timed from start to exit. A first run of one small job fills the
kernel cache, so no measured run compiles. Prints one row per device list:
wall seconds, jobs/s, speed-up over the first row, and the jobs each device
took (from the sidecars' ``device_index``).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from mmd.generate import input_chunks, random_matrix


def serve_once(root: Path, devices: str, args: argparse.Namespace, cache: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMD_")}
    env.update(
        MMD_DEVICES=devices,
        MMD_KERNEL_CACHE=str(cache),
        MMD_LOG_FORMAT="json",
        MMD_DURABLE="false",
        MMD_QUIET_SECONDS="0.05",
    )
    argv = [sys.executable, "-m", "mmd", "serve", "--once", "--backend", args.backend, "--kernel", args.kernel]
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"serve failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--devices", nargs="+", default=["0", "0,1"])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--kernel", default="tiled")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mmd-devices-"))
    cache = base / "kernels"
    t0 = time.perf_counter()
    rng = np.random.default_rng(1)
    source = base / "m.txt"
    with open(source, "wb") as fh:
        for chunk in input_chunks(random_matrix(rng, args.n, args.n), random_matrix(rng, args.n, args.n), square=True):
            fh.write(chunk)
    print(f"generated {args.n}x{args.n} pair: {source.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
    warm = base / "warm"
    (warm / "inbox").mkdir(parents=True)
    small = random_matrix(rng, 64, 64)
    (warm / "inbox" / "w.txt").write_bytes(b"".join(input_chunks(small, small, square=True)))
    serve_once(warm, args.devices[-1], args, cache)
    rows = []
    for devices in args.devices:
        root = base / f"run-{devices.replace(',', '_')}"
        (root / "inbox").mkdir(parents=True)
        stage = root / "stage"
        stage.mkdir()
        for i in range(args.jobs):
            shutil.copyfile(source, stage / f"m{i:02d}.txt")
            os.rename(stage / f"m{i:02d}.txt", root / "inbox" / f"m{i:02d}.txt")
        took = serve_once(root, devices, args, cache)
        recs = [yaml.safe_load(s.read_text()) for s in (root / "outbox").glob("*.timing.yaml")]
        bad = list((root / "outbox").glob("*.error.yaml"))
        per = collections.Counter(r.get("device_index") for r in recs)
        kernel = np.median([r["timings_ms"]["kernel"] for r in recs]) if recs else float("nan")
        overall = np.median([r["timings_ms"]["overall"] for r in recs]) if recs else float("nan")
        rows.append((devices, len(recs), len(bad), took, per, kernel, overall, recs[0]["device"] if recs else "?"))
        shutil.rmtree(root)
    print(f"\n{args.jobs} jobs of {args.n}^3, backend {args.backend}, kernel {args.kernel}; device: {rows[0][7]}")
    print(
        f"{'devices':8} {'ok':>3} {'err':>3} {'wall s':>7} {'jobs/s':>7} {'speed-up':>8} {'kernel ms':>9} "
        f"{'job ms':>8}  jobs per device"
    )
    for devices, ok, bad, took, per, kernel, overall, _ in rows:
        print(
            f"[{devices}]".ljust(8),
            f"{ok:>3} {bad:>3} {took:7.2f} {ok / took:7.2f} {rows[0][3] / took:8.2f}x "
            f"{kernel:9.1f} {overall:8.1f}  {dict(sorted(per.items()))}",
        )
    shutil.rmtree(base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
