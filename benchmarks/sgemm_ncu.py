#!/usr/bin/env python3
"""One ``fast`` parameter set and cuBLAS SGEMM at one shape, launched for Nsight Compute to profile side by side.

For the GPU machine (CuPy, nvcc); run it under ``ncu`` from the repository root:

    ncu --clock-control none --set full -k regex:'mmd_fast|gemm' -o $OUT/sgemm \
        python3 benchmarks/sgemm_ncu.py [LABEL] [--size 4096] --launches 2

LABEL is a registered ``fast`` variant (kernels/fast.cu's declaration) or one of sgemm_ladder.py's candidates; default:
the best set at the shape in a ladder run's ``results.json`` (``--results``), else fast.cu's defaults.
Each kernel is launched --launches times, fast first (under ncu: 2, a warm-up and the one worth reading;
the filter leaves out CuPy's kernels that make the inputs); it prints both kernels' times (CUDA events,
median after two warm-up launches, one where --launches is 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import harness  # beside this script: its folder is first on sys.path
import sgemm_ladder as ladder
from harness import Mat


def best_label(results: Path, shape: str) -> str | None:
    """The fastest spill-free tunable fast set at ``shape`` in a ladder run's results.json."""
    if not results.is_file():
        return None
    rows = json.loads(results.read_text())["rows"]
    best = [r for r in rows if r["shape"] == shape and r.get("best")]
    return best[0]["params"] if best else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("label", nargs="?")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--results", type=Path, default=Path("results.json"))
    ap.add_argument("--launches", type=int, default=12, help="per kernel; the first two are warm-up")
    args = ap.parse_args()
    n = args.size
    label = args.label or best_label(args.results, f"{n}x{n}x{n}") or "256x128x8_reg_t16x8_w8"
    fast = ladder.registry.get("fast")
    sets = {v.label: v for v in fast.variants}
    if label not in sets:
        sets[label] = ladder.registry.variant("fast", label, **ladder.FAST_CANDIDATES[label])
    v = ladder.Variant(fast.with_variant(sets[label]), label, tunable=True)
    build = Path("/tmp/sgemm_ncu_build")
    build.mkdir(parents=True, exist_ok=True)
    harness.compile_build(v, build, ())
    if not v.report["ok"]:
        print(v.report["log"], file=sys.stderr)
        return 1
    import cupy as cp

    v.function = harness.load(cp, v)
    cp.random.seed(1)
    a, b = (Mat.packed(cp, n, n, "rand") for _ in range(2))
    c = Mat.packed(cp, n, n, "nan")
    runs = {
        f"fast {label}": lambda: harness.launch(v, a, b, c, n, n, n),
        "cublas sgemm": lambda: cp.matmul(a.view, b.view, out=c.view),
    }
    warmup = min(2, args.launches - 1)  # every launch is one ncu profiles: --launches in all
    for name, fn in runs.items():
        reps = args.launches - warmup
        t = harness.time_events(cp, [fn], warmup=warmup, batch=reps, min_reps=reps, max_reps=reps)
        print(f"{name}: {t.ms:.3f} ms at {n}^3 ({args.launches} launches)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
