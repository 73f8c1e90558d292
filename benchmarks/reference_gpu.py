#!/usr/bin/env python3
"""When ``mmd check --reference gpu`` pays: it beside ``--reference cpu`` at several sizes, and where its time goes.

Usage: python benchmarks/reference_gpu.py [--sizes 1024 2048 4096] [--repeat 5] [--workdir DIR]

For each size: an input pair from ``mmd gen`` and its output from ``mmd run --backend cpu``; then
``python -m mmd check OUT --input IN --reference cpu`` and ``... gpu`` as processes, interleaved
(every other round in reverse order), medians and the spread of --repeat runs. Then, in this process,
the parts: opening the GPU reference (pycuda's import, the CUDA context, a thread;
``mmd.backends.cuda.DeviceReference``), its first and a later float64 product (cuBLAS DGEMM with the
transfers), and numpy's float64 product, at each size. Run on purpose, never as a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from child_env import child_env
from harness import ROOT, median  # beside this script: its folder is first on sys.path


def mmd(*args: str) -> float:
    """Seconds ``python -m mmd ARGS`` took as a process (SystemExit where it failed)."""
    env = child_env()
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "mmd", *args], env=env, capture_output=True, text=True, cwd=ROOT)
    took = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"mmd {' '.join(args)} exited {r.returncode}: {r.stdout[-300:]} {r.stderr[-300:]}")
    return took


def spread(xs: list[float]) -> str:
    return f"{median(xs):6.3f} s (min {min(xs):.3f}, max {max(xs):.3f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="mmd-refgpu-"))
    work.mkdir(parents=True, exist_ok=True)

    files = {}
    for n in args.sizes:
        src, out = work / f"m{n}.txt", work / f"m{n}.out"
        if not out.exists():
            mmd("gen", str(n), "--seed", "7", "-o", str(src))
            mmd("run", str(src), "--backend", "cpu", "-o", str(out), "--force")
        files[n] = (src, out)

    print(f"# mmd check OUT --input IN, as a process; median of {args.repeat} (interleaved)", flush=True)
    for n, (src, out) in files.items():
        times: dict[str, list[float]] = {"cpu": [], "gpu": []}
        for r in range(args.repeat):
            for where in ("cpu", "gpu") if r % 2 == 0 else ("gpu", "cpu"):
                times[where].append(mmd("check", str(out), "--input", str(src), "--reference", where))
        cpu, gpu = (median(times[w]) for w in ("cpu", "gpu"))
        print(
            f"{n:6}  --reference cpu {spread(times['cpu'])}   --reference gpu {spread(times['gpu'])}"
            f"   gpu/cpu {gpu / cpu:.2f}",
            flush=True,
        )

    print("# the parts, in this process", flush=True)
    from mmd.backends.cuda import DeviceReference

    t = time.perf_counter()
    ref = DeviceReference()
    print(f"open DeviceReference (pycuda import, context, thread): {time.perf_counter() - t:.3f} s", flush=True)
    rng = np.random.default_rng(7)
    with ref:
        for n in args.sizes:
            a, b = (rng.uniform(-10, 10, (n, n)) for _ in range(2))
            parts = []
            for _ in range(3):
                t = time.perf_counter()
                ref(a, b)
                parts.append(time.perf_counter() - t)
            t = time.perf_counter()
            np.matmul(a, b)
            cpu = time.perf_counter() - t
            print(
                f"{n:6}  GPU float64 product with transfers: first {parts[0]:.3f} s, then {min(parts[1:]):.3f} s;"
                f"  numpy float64 product: {cpu:.3f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
