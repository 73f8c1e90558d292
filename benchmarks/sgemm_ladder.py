#!/usr/bin/env python3
"""SGEMM ladder: compile, check and time mmd's kernels against cuBLAS with CuPy.

Standalone, for the GPU machine (needs CuPy, nvcc and, for the SASS counts,
cuobjdump); it does not use pycuda. In one go it

1. compiles every variant (kernel file + macro set) with
   ``nvcc -arch=sm_90 -cubin -Xptxas -v`` in parallel and reads the ptxas report
   (registers, shared memory, spill bytes) and the SASS instruction counts
   (LDG.E.128, LDS.128, STL/LDL, FFMA);
2. checks every variant on awkward shapes and three memory layouts (packed;
   pitched with ld a multiple of 4; ld odd with the base one float off 16-byte
   alignment) against a float64 reference: everything outside the matrices
   (pitch padding, slack) is NaN, inputs too, C is poisoned with NaN first, and
   the padding of C must still be NaN;
3. times every variant and cuBLAS SGEMM (cupy.matmul on float32, TF32 off) with
   CUDA events: warm-up, then the median of >= 10 timed launches, rotating input
   sets when a set fits in a few times the L2, the SM clock read through NVML
   (mmd.bench.clock) meanwhile;
4. autotunes `fast`: the best spill-free parameter set per shape, written to
   ``kernels/fast.tune.yaml`` (per GPU name, per shape class) and to $OUT.

Run from the repository root:  PYTHONUNBUFFERED=1 python3 benchmarks/sgemm_ladder.py
Options: --quick (fewer shapes and variants), --out DIR (default $OUT or ./bench).
The table printed last is the result; full logs and JSON go to the out folder.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import harness  # beside this script: its folder is first on sys.path
from harness import Column, Mat, Table

from mmd import kernels as registry

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS SGEMM in true fp32 (CuPy's default; made explicit)

BUILD_DIR = Path("/tmp/sgemm_ladder_build")

#: Shapes (M, K, N) that are timed. 4096x1024x2048 means M=4096, K=1024, N=2048.
TIMED_SHAPES = [(1000, 1000, 1000), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (4096, 1024, 2048)]
#: Awkward shapes (M, K, N) that are checked (every variant, every layout).
CHECK_SHAPES = [
    *harness.EDGE_SHAPES,
    (7, 33, 1000),
    (127, 33, 1000),
    (1000, 7, 33),
    (33, 1000, 127),
    (129, 257, 130),
    (300, 17, 515),
    # K a multiple of every BK, whole blocks beside edge ones: INTERIOR's unchecked loop and the checked one
    (384, 80, 520),
    (256, 32, 512),
]
#: Relative error bound: max|C - ref| / max|ref| < TOL_PER_SQRT_K * sqrt(K).
TOL_PER_SQRT_K = 1e-5
#: The course's kernels (at tiles 16 and 32): checked on the first shapes and layouts only, not timed at 8192
#: (seconds a launch, teaching nothing new), and shown in the last table at the square shapes up to 4096.
COURSE = ("tiled", "prefetch", "aplus")
COURSE_SHAPES = ("1000x1000x1000", "2048x2048x2048", "4096x4096x4096")
#: fast's sets always shown in the last table, beside the autotune's best.
SHOWN_SETS = ("128x128x8_async", "128x128x8_reg")


@dataclass
class Variant(harness.Build):
    """One build of the ladder; ``tunable``: a candidate for the fast autotune."""

    tunable: bool = False

    @property
    def name(self) -> str:
        return f"{self.kernel}:{self.label}"


#: The 128x256x16 set (8x16 per thread, A_PAD 0) that fast.cu's defaults were before issue 33: the
#: candidates below are changes to it (registry.variant spells out every other macro from fast.cu's defaults).
BASE_128X256 = {"BM": 128, "BN": 256, "BK": 16, "TM": 8, "TN": 16, "WTM": 4, "A_PAD": 0}
#: Parameter sets of fast tried by the autotune (besides the registered variants), as changes to BASE_128X256.
_CANDIDATE_CHANGES: dict[str, dict[str, int]] = {
    "128x256x16_reg_t8x16_pad0": {},
    "warptile_1buf": {"DOUBLE_BUFFER": 0, "BN": 128, "BK": 8, "TN": 8, "MIN_BLOCKS": 2, "A_PAD": 4},
    "128x128x8_async": {"ASYNC": 1, "BN": 128, "BK": 8, "TN": 8, "MIN_BLOCKS": 2, "A_PAD": 4},
    "128x128x8_async3": {"ASYNC": 1, "STAGES_ASYNC": 3, "BN": 128, "BK": 8, "TN": 8, "MIN_BLOCKS": 2, "A_PAD": 4},
    "128x128x16_async": {"ASYNC": 1, "BN": 128, "TN": 8, "MIN_BLOCKS": 2, "A_PAD": 4},
    "64x128x8_async": {"ASYNC": 1, "BM": 64, "BN": 128, "BK": 8, "TN": 8, "MIN_BLOCKS": 2, "A_PAD": 4},
    "64x64x8_t4x8_async": {"ASYNC": 1, "BM": 64, "BN": 64, "BK": 8, "TM": 4, "TN": 8, "MIN_BLOCKS": 2, "A_PAD": 4},
    "128x128x8_reg": {"BN": 128, "BK": 8, "TN": 8, "A_PAD": 4},
    "128x128x16_reg": {"BN": 128, "TN": 8, "A_PAD": 4},
    "128x128x16_reg_g1": {"BN": 128, "TN": 8, "GROUP_M": 1, "A_PAD": 4},
    "128x128x16_reg_w8": {"BN": 128, "TN": 8, "WTM": 8, "A_PAD": 4},
    "128x256x8_reg_t8x16": {"BK": 8, "A_PAD": 4},
    "256x128x8_reg_t16x8": {"BM": 256, "BN": 128, "BK": 8, "TM": 16, "TN": 8, "A_PAD": 4},
    "64x128x16_reg": {"BM": 64, "BN": 128, "TN": 8, "A_PAD": 4},
    "64x128x8_reg": {"BM": 64, "BN": 128, "BK": 8, "TN": 8, "A_PAD": 4},
    "64x64x16_reg": {"BM": 64, "BN": 64, "TN": 8, "A_PAD": 4},
    "128x128x8_reg_mb2": {"BN": 128, "BK": 8, "TN": 8, "MIN_BLOCKS": 2, "A_PAD": 4},
    "256x128x16_reg_t16x8_pad0": {"BM": 256, "BN": 128, "TM": 16, "TN": 8},
    "256x128x8_reg_t16x8_w8": {"BM": 256, "BN": 128, "BK": 8, "TM": 16, "TN": 8, "WTM": 8, "A_PAD": 4},
    # the large tile's warp shape (32x128 per warp at WTM 4) and cp.async instead of the register prefetch
    "128x256x16_reg_t8x16_w8_pad0": {"WTM": 8},
    "128x256x16_reg_t8x16_w2_pad0": {"WTM": 2},
    "128x256x16_async_t8x16_pad0": {"ASYNC": 1},
    # FRAG_PIPE: fragments double-buffered in registers across the slab boundary
    "128x256x16_reg_t8x16_pad0_fp": {"FRAG_PIPE": 1},
    "128x256x16_reg_t8x16_w8_pad0_fp": {"WTM": 8, "FRAG_PIPE": 1},
    "128x256x16_async_t8x16_pad0_fp": {"ASYNC": 1, "FRAG_PIPE": 1},
    "256x128x16_reg_t16x8_pad0_fp": {"BM": 256, "BN": 128, "TM": 16, "TN": 8, "FRAG_PIPE": 1},
    "128x128x8_reg_mb2_fp": {"BN": 128, "BK": 8, "TN": 8, "MIN_BLOCKS": 2, "A_PAD": 4, "FRAG_PIPE": 1},
    "128x128x8_async3_mb2_fp": {
        "ASYNC": 1,
        "STAGES_ASYNC": 3,
        "BN": 128,
        "BK": 8,
        "TN": 8,
        "MIN_BLOCKS": 2,
        "A_PAD": 4,
        "FRAG_PIPE": 1,
    },
    "128x128x16_async_mb2_fp": {"ASYNC": 1, "BN": 128, "TN": 8, "MIN_BLOCKS": 2, "A_PAD": 4, "FRAG_PIPE": 1},
    "64x64x16_t4x8_reg_fp": {"BM": 64, "BN": 64, "TM": 4, "TN": 8, "A_PAD": 4, "FRAG_PIPE": 1},
    # INTERIOR 0: every block's loads tested (the default before INTERIOR); A_SWIZZLE: conflict-free A stores
    "128x256x16_reg_t8x16_pad0_checked": {"INTERIOR": 0},
    "128x256x16_reg_t8x16_pad0_swz": {"A_SWIZZLE": 1},
    "128x256x16_async_t8x16_pad0_swz": {"ASYNC": 1, "A_SWIZZLE": 1},
    "256x128x8_reg_t16x8_swz": {"BM": 256, "BN": 128, "BK": 8, "TM": 16, "TN": 8, "A_SWIZZLE": 1},
    "128x128x8_reg_mb2_fp_swz": {"BN": 128, "BK": 8, "TN": 8, "MIN_BLOCKS": 2, "FRAG_PIPE": 1, "A_SWIZZLE": 1},
    "128x128x8_reg_mb2_fp_checked": {
        "BN": 128,
        "BK": 8,
        "TN": 8,
        "MIN_BLOCKS": 2,
        "A_PAD": 4,
        "FRAG_PIPE": 1,
        "INTERIOR": 0,
    },
}
FAST_CANDIDATES = {label: {**BASE_128X256, **changes} for label, changes in _CANDIDATE_CHANGES.items()}


def variants(quick: bool) -> list[Variant]:
    """The course kernels at tiles 16 and 32, the fixed-block ladder, and every fast parameter set."""
    out = [Variant(registry.get(k), f"T{t}", t) for k in COURSE for t in (16, 32)]
    out += [Variant(registry.get(k), "128x128x8") for k in ("blocktile2d", "vectorized")]
    fast = registry.get("fast")
    sets = {v.label: v for v in fast.variants}  # the registered variants first
    if not quick:
        sets |= {label: registry.variant("fast", label, **changes) for label, changes in FAST_CANDIDATES.items()}
    for label, variant in sets.items():
        out.append(Variant(fast.with_variant(variant), label, tunable=True))
    return out


# -- compile ------------------------------------------------------------------

#: SASS instructions counted in each build (harness.SASS_PATTERNS).
SASS_COUNTS = ("LDG.128", "LDGSTS.128", "LDS.128", "STG.128", "FFMA", "LDL/STL")
COMPILED = Table(
    (
        Column("variant", 34, "<"),
        Column("regs", 4),
        Column("smem", 6),
        Column("spill st/ld", 11, "<"),
        *(Column(title, width) for title, width in (("LDG128", 6), ("LDGSTS", 6), ("LDS128", 6), ("STG128", 6))),
        Column("FFMA", 5),
        Column("LDL/STL", 7),
    )
)


def compile_row(v: Variant) -> str:
    r = v.report
    s = r.get("sass", {})
    spill = f"{r['spill_stores']:>5}/{r['spill_loads']}"
    return COMPILED.row(v.name, r["registers"], r["static_smem"], spill, *(s.get(x) for x in SASS_COUNTS))


# -- check ----------------------------------------------------------------------


def check(v: Variant, cp: Any, shapes: list, layouts: list) -> tuple[bool, float, list[str]]:
    """Every shape in every layout against the float64 product: (all passed, worst error, the failures)."""
    worst, fails = 0.0, []
    for m, k, n in shapes:
        for layout in layouts:
            a = Mat.laid_out(cp, m, k, layout, "rand")
            b = Mat.laid_out(cp, k, n, layout, "rand")
            c = Mat.laid_out(cp, m, n, layout, "nan")
            harness.launch(v, a, b, c, m, k, n)
            cp.cuda.runtime.deviceSynchronize()
            err = harness.errors(cp, c.view.astype(cp.float64), a.view.astype(cp.float64) @ b.view.astype(cp.float64))
            pad_ok = c.padding_untouched(cp)
            worst = max(worst, err["max"])
            if not (err["max"] < TOL_PER_SQRT_K * math.sqrt(k)) or not pad_ok:
                fails.append(f"{m}x{k}x{n}/{layout[0]}: err={err['max']:.2e} pad_ok={pad_ok}")
    return not fails, worst, fails


def check_all(builds: list[Variant], cp: Any, say: Any) -> list[Variant]:
    """The builds that pass: the course's kernels on the edge shapes, packed and pitched; the rest everywhere."""
    cp.random.seed(12345)
    passed = []
    for v in builds:
        course = v.kernel in COURSE
        shapes = CHECK_SHAPES[:6] if course else CHECK_SHAPES
        layouts = harness.LAYOUTS[:2] if course else harness.LAYOUTS
        ok, worst, fails = check(v, cp, shapes, layouts)
        say(
            f"check {v.name:34} {'PASS' if ok else 'FAIL'} worst rel err {worst:.2e}"
            + ("" if ok else "  " + "; ".join(fails[:6]))
        )
        v.report["check_ok"], v.report["check_err"] = ok, worst
        if ok:
            passed.append(v)
    return passed


# -- time -------------------------------------------------------------------------


def time_shape(cp: Any, shape: tuple[int, int, int], builds: list[Variant], l2: int, say: Any) -> list[dict]:
    """cuBLAS, every build, and cuBLAS again (the spread between the two is the noise) at one shape: rows."""
    m, k, n = shape
    name = f"{m}x{k}x{n}"
    flop = 2.0 * m * k * n
    nsets = max(1, min(8, math.ceil(3 * l2 / (4 * (m * k + k * n + m * n)))))
    reps = 10 if flop > 1e12 else 30
    sets = [
        (Mat.packed(cp, m, k, "rand"), Mat.packed(cp, k, n, "rand"), Mat.packed(cp, m, n, "nan")) for _ in range(nsets)
    ]
    ref = sets[0][0].view.astype(cp.float64) @ sets[0][1].view.astype(cp.float64)

    def timed(fn: Any) -> dict:
        """fn(a, b, c) over the sets: its timing, the clock meanwhile, and the error of set 0's C after."""
        sampler = harness.clock(cp)
        with sampler:
            t = harness.time_events(cp, [partial(fn, *s) for s in sets], batch=reps, min_reps=reps, max_reps=reps)
        fn(*sets[0])
        cp.cuda.runtime.deviceSynchronize()
        err = harness.errors(cp, sets[0][2].view.astype(cp.float64), ref)["max"]
        return {"shape": name, **t.row(), "tflops": flop / t.ms / 1e9, "err": err, **sampler.summary()}

    def cublas(a: Mat, b: Mat, c: Mat) -> None:
        cp.matmul(a.view, b.view, out=c.view)

    base = {"kernel": "cublas", "params": "sgemm", **timed(cublas), "pct": 100.0}
    say(f"time {name:16} cublas {base['ms']:.3f} ms  err {base['err']:.1e}  ({nsets} sets, {reps} reps)")
    rows = [base]
    for v in builds:
        if v.kernel in COURSE and m * n * k > 4096**3:
            continue
        for _, _, c in sets:
            c.buf.fill(cp.nan)
        row = {"kernel": v.kernel, "params": v.label, **timed(partial(launch_at, v, m, k, n)), "tunable": v.tunable}
        row["pct"] = 100.0 * base["ms"] / row["ms"]
        rows.append(row)
        say(
            f"time {name:16} {v.name:34} {row['ms']:8.3f} ms {row['tflops']:6.1f} TFLOP/s {row['pct']:6.1f}%  "
            f"err {row['err']:.1e}  SM {row['sm_clock_mhz']} MHz" + ("  THROTTLED" if row["throttled"] else "")
        )
    base["ms_again"] = timed(cublas)["ms"]
    say(f"time {name:16} cublas (again) {base['ms_again']:.3f} ms")
    return rows


def launch_at(v: Variant, m: int, k: int, n: int, a: Mat, b: Mat, c: Mat) -> None:
    harness.launch(v, a, b, c, m, k, n)


# -- autotune -----------------------------------------------------------------------


def shape_class(m: int, n: int, sms: int) -> str:
    tiles = -(-m // 128) * -(-n // 128)
    return "small" if tiles < sms else ("medium" if tiles < 4 * sms else "large")


def autotune(rows: list[dict], builds: list[Variant], sms: int, say: Any) -> dict:
    """Per shape class, the registered spill-free fast set with the best geometric mean of %cuBLAS over the
    class's shapes; the rows of each shape's best spill-free set are marked ``best``.

    The tune file may only name registered variants (kernels/fast.cu's declaration); a better candidate is
    reported, to be registered by hand."""
    registered = {v.label for v in registry.get("fast").variants}
    spill_free = {
        v.label
        for v in builds
        if v.kernel == "fast"
        and v.tunable
        and v.report.get("ok")
        and v.report.get("spill_stores") == 0
        and v.report.get("spill_loads") == 0
    }
    by_class: dict[str, list[str]] = {}
    for m, k, n in TIMED_SHAPES:
        shape = f"{m}x{k}x{n}"
        by_class.setdefault(shape_class(m, n, sms), []).append(shape)
        cands = [r for r in rows if r["shape"] == shape and r.get("tunable") and r["params"] in spill_free]
        if cands:
            max(cands, key=lambda r: r["tflops"])["best"] = True

    def pct(label: str, shape: str) -> float | None:
        return next(
            (r["pct"] for r in rows if r["kernel"] == "fast" and r["params"] == label and r["shape"] == shape), None
        )

    tune = {}
    for cls, shapes in by_class.items():
        scores = {}
        for label in spill_free:
            pcts = [p for p in (pct(label, s) for s in shapes) if p is not None]
            if len(pcts) == len(shapes):
                scores[label] = math.exp(sum(math.log(p) for p in pcts) / len(pcts))
        usable = {k: v for k, v in scores.items() if k in registered}
        if not usable:
            continue
        best, label = max(scores, key=scores.__getitem__), max(usable, key=usable.__getitem__)
        if best != label:
            say(
                f"# {cls}: unregistered set {best} beats {label} ({scores[best]:.1f} vs {scores[label]:.1f} %cuBLAS):"
                " add it to the variants of kernels/fast.cu's declaration to use it"
            )
        tune[cls] = {"params": label, "measured_pct_cublas": {s: round(pct(label, s) or 0.0, 1) for s in shapes}}
    return tune


def write_tune(out: Path, gpu: str, tune: dict) -> None:
    import yaml

    classes = "tiles=ceil(M/128)*ceil(N/128); small < SMs <= medium < 4*SMs <= large"
    (out / "fast.tune.yaml").write_text(yaml.safe_dump({gpu: {"shape_classes": classes, **tune}}, sort_keys=False))


# -- the table ---------------------------------------------------------------------------

RESULT = Table(
    (
        Column("kernel", 12, "<"),
        Column("params", 20, "<"),
        Column("shape", 16, "<"),
        Column("ms", 9, spec=".3f"),
        Column("TFLOP/s", 8, spec=".1f"),
        Column("%cuBLAS", 8),
        Column("max rel err", 11, spec=".1e"),
    )
)


def shown(r: dict) -> bool:
    """A row of the last table: not the course's kernels beyond their shapes, nor fast's other candidates."""
    if r["kernel"] in COURSE and r["shape"] not in COURSE_SHAPES:
        return False
    return not (r["kernel"] == "fast" and r.get("tunable") and not r.get("best") and r["params"] not in SHOWN_SETS)


def main() -> int:
    args = harness.ladder_parser(__doc__).parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say = harness.logger(out / "ladder.log")

    t0 = time.time()
    builds = harness.compile_all(variants(args.quick), BUILD_DIR, SASS_COUNTS)
    say(f"# compiled {len(builds)} variants in {time.time() - t0:.1f} s")
    say(COMPILED.header())
    for v in builds:
        say(compile_row(v) if v.report["ok"] else f"{v.name:34} COMPILE FAILED\n{v.report['log']}")
    good = [v for v in builds if v.report["ok"]]
    if args.compile_only:
        return 0

    import cupy as cp

    gpu, l2, sms, _ = harness.gpu_facts(cp)
    say(f"# GPU {gpu}, {sms} SMs, L2 {l2 >> 20} MiB, CuPy {cp.__version__}, CUPY_TF32={os.environ['CUPY_TF32']}")
    for v in good:
        v.function = harness.load(cp, v)
    checked = check_all(good, cp, say)
    rows = []
    for shape in TIMED_SHAPES:
        rows += time_shape(cp, shape, checked, l2, say)
        cp.get_default_memory_pool().free_all_blocks()  # the shape's matrices, gone with its call
    tune = autotune(rows, builds, sms, say)
    compiled = {v.name: {k: val for k, val in v.report.items() if k != "log"} for v in builds}
    results = {"gpu": gpu, "sms": sms, "l2": l2, "rows": rows, "compile": compiled, "tune": tune}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    write_tune(out, gpu, tune)

    say("")
    say(RESULT.header())
    for r in filter(shown, rows):
        params = r["params"] + (" *" if r.get("best") else "")
        say(RESULT.row(r["kernel"], params, r["shape"], r["ms"], r["tflops"], f"{r['pct']:7.1f}%", r["err"]))
    say("(* = autotune's best spill-free fast set for the shape; full rows in results.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
