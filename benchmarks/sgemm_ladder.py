#!/usr/bin/env python3
"""SGEMM ladder: compile, check and time mmd's kernels against cuBLAS with CuPy.

Standalone, for the GPU machine (needs CuPy, nvcc and, for the SASS counts,
cuobjdump); it does not import mmd or pycuda. In one go it

1. compiles every variant (kernel file + macro set) with
   ``nvcc -arch=sm_90 -cubin -Xptxas -v`` in parallel and reads the ptxas report
   (registers, shared memory, spill bytes) and the SASS instruction counts
   (LDG.E.128, LDS.128, STL/LDL, FFMA);
2. checks every variant on awkward shapes and three memory layouts (packed;
   pitched with ld a multiple of 4; ld odd with the base one float off 16-byte
   alignment) against a float64 reference, with C poisoned with NaN first and
   the pitch padding checked untouched;
3. times every variant and cuBLAS SGEMM (cupy.matmul on float32, TF32 off) with
   CUDA events: warm-up, then the median of >= 10 timed launches, rotating input
   sets when a set fits in a few times the L2;
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
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import ladder_common as common  # beside this script: its folder is first on sys.path

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS SGEMM in true fp32 (CuPy's default; made explicit)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mmd import kernels as registry  # noqa: E402  (the kernels' geometry and variants live there)
from mmd.resources import kernels_dir  # noqa: E402

KERNELS = kernels_dir()
ARCH = "sm_90"

#: Shapes (M, K, N) that are timed. 4096x1024x2048 means M=4096, K=1024, N=2048.
TIMED_SHAPES = [(1000, 1000, 1000), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (4096, 1024, 2048)]
#: Awkward shapes (M, K, N) that are checked (every variant, every layout).
CHECK_SHAPES = [
    *common.EDGE_SHAPES,
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


@dataclass
class Variant:
    """One compiled kernel: a registry build (mmd/kernels.py: its macros and launch geometry) at one tile."""

    spec: registry.KernelSpec
    label: str
    tile: int = 0
    tunable: bool = False  # a candidate for the fast autotune
    # filled in by compile():
    cubin: Path | None = None
    report: dict = field(default_factory=dict)
    function: object = None

    @property
    def kernel(self) -> str:
        return self.spec.name

    @property
    def name(self) -> str:
        return f"{self.kernel}:{self.label}"

    @property
    def macros(self) -> dict:
        return self.spec.defines(self.tile)

    def block_and_tile(self) -> tuple[tuple[int, int, int], tuple[int, int]]:
        """(block dims, (rows, cols) of C per block), as the registry launches it."""
        return self.spec.block(self.tile), self.spec.block_shape(self.tile)

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return self.spec.grid(m, n, self.tile)


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
    out = [Variant(registry.get(k), f"T{t}", t) for k in ("tiled", "prefetch", "aplus") for t in (16, 32)]
    out += [Variant(registry.get(k), "128x128x8") for k in ("blocktile2d", "vectorized")]
    fast = registry.get("fast")
    sets = {v.label: v for v in fast.variants}  # the registered variants first
    if not quick:
        sets |= {label: registry.variant("fast", label, **changes) for label, changes in FAST_CANDIDATES.items()}
    for label, variant in sets.items():
        out.append(Variant(fast.with_variant(variant), label, tunable=True))
    return out


# -- compile ------------------------------------------------------------------

#: SASS instructions counted in each build (ladder_common.SASS_PATTERNS).
SASS_COUNTS = ("LDG.128", "LDGSTS.128", "LDS.128", "STG.128", "FFMA", "LDL/STL")


def compile_variant(v: Variant, build: Path) -> Variant:
    src = KERNELS / f"{v.kernel}.cu"
    v.cubin = build / f"{v.kernel}_{v.label}.cubin"
    cmd = [common.tool("nvcc") or "nvcc", f"-arch={ARCH}", "-cubin", "-Xptxas", "-v", "-o", str(v.cubin), str(src)]
    cmd[1:1] = [f"-D{k}={val}" for k, val in v.macros.items()]
    rep = common.compile_report(cmd, "smem")
    if rep["ok"]:
        counts = common.sass_counts(v.cubin, build / f"{v.kernel}_{v.label}.sass", SASS_COUNTS)
        if counts is not None:
            rep["sass"] = counts
    v.report = rep
    return v


# -- matrices -----------------------------------------------------------------


class Mat:
    """A rows x cols float32 matrix inside a flat buffer, at `offset` floats, row stride ld."""

    def __init__(self, cp, rows, cols, ld, offset, fill):
        self.rows, self.cols, self.ld, self.offset = rows, cols, ld, offset
        total = offset + rows * ld + 8
        if fill == "nan":
            self.buf = cp.full(total, cp.nan, dtype=cp.float32)
        else:
            self.buf = cp.random.uniform(-1.0, 1.0, total, dtype=cp.float64).astype(cp.float32)
        self.ptr_view = self.buf[offset:]  # the kernel's pointer
        self.view = self.buf[offset : offset + rows * ld].reshape(rows, ld)[:, :cols]

    def padding_untouched(self, cp) -> bool:
        inside = cp.zeros(self.buf.shape, dtype=bool)
        idx = self.offset + cp.arange(self.rows)[:, None] * self.ld + cp.arange(self.cols)[None, :]
        inside[idx.ravel()] = True
        return bool(cp.isnan(self.buf[~inside]).all())


def launch(v: Variant, a: Mat, b: Mat, c: Mat, m: int, k: int, n: int, np):
    block, _ = v.block_and_tile()
    v.function(v.grid(m, n), block, common.kernel_args(a, b, c, m, k, n, np))


def check(v: Variant, cp, np, shapes, layouts) -> tuple[bool, float, list[str]]:
    worst, fails = 0.0, []
    for m, k, n in shapes:
        for lname, how, off in layouts:
            a = Mat(cp, m, k, common.ld_for(k, how), off, "rand")
            b = Mat(cp, k, n, common.ld_for(n, how), off, "rand")
            c = Mat(cp, m, n, common.ld_for(n, how), off, "nan")
            launch(v, a, b, c, m, k, n, np)
            cp.cuda.runtime.deviceSynchronize()
            ref = a.view.astype(cp.float64) @ b.view.astype(cp.float64)
            got = c.view.astype(cp.float64)
            denom = float(cp.abs(ref).max()) or 1.0
            err = float(cp.abs(got - ref).max()) / denom if not bool(cp.isnan(got).any()) else math.inf
            pad_ok = c.padding_untouched(cp)
            worst = max(worst, err)
            if not (err < TOL_PER_SQRT_K * math.sqrt(k)) or not pad_ok:
                fails.append(f"{m}x{k}x{n}/{lname}: err={err:.2e} pad_ok={pad_ok}")
    return not fails, worst, fails


# -- timing -------------------------------------------------------------------


def time_fn(cp, fn, sets, reps, warmup=3) -> float:
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    cp.cuda.runtime.deviceSynchronize()
    starts = [cp.cuda.Event() for _ in range(reps)]
    ends = [cp.cuda.Event() for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(*sets[i % len(sets)])
        ends[i].record()
    ends[-1].synchronize()
    return statistics.median(cp.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends, strict=True))


def main() -> int:
    args = common.parser(__doc__).parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build = Path("/tmp/sgemm_ladder_build")
    build.mkdir(parents=True, exist_ok=True)
    say = common.logger(out / "ladder.log")

    # 1. compile
    vs = variants(args.quick)
    t0 = time.time()
    vs = common.in_parallel(lambda v: compile_variant(v, build), vs)
    say(f"# compiled {len(vs)} variants in {time.time() - t0:.1f} s")
    say(
        f"{'variant':34} {'regs':>4} {'smem':>6} {'spill st/ld':>11} {'LDG128':>6} {'LDGSTS':>6} {'LDS128':>6} "
        f"{'STG128':>6} {'FFMA':>5} {'LDL/STL':>7}"
    )
    if not args.compile_only:
        import cupy as cp
        import numpy as np
    good = []
    for v in vs:
        r = v.report
        if not r["ok"]:
            say(f"{v.name:34} COMPILE FAILED\n{r['log']}")
            continue
        s = r.get("sass", {})
        say(
            f"{v.name:34} {r['registers']:>4} {r['smem']:>6} {r['spill_stores']:>5}/{r['spill_loads']:<5} "
            f"{s.get('LDG.128', '-'):>6} {s.get('LDGSTS.128', '-'):>6} {s.get('LDS.128', '-'):>6} "
            f"{s.get('STG.128', '-'):>6} {s.get('FFMA', '-'):>5} {s.get('LDL/STL', '-'):>7}"
        )
        if not args.compile_only:
            v.function = cp.RawModule(path=str(v.cubin)).get_function(f"mmd_{v.kernel}")
        good.append(v)
    if args.compile_only:
        return 0
    import cupy as cp
    import numpy as np

    gpu, l2, sms, _ = common.gpu_facts(cp)
    say(f"# GPU {gpu}, {sms} SMs, L2 {l2 >> 20} MiB, CuPy {cp.__version__}, CUPY_TF32={os.environ['CUPY_TF32']}")

    # 2. check
    cp.random.seed(12345)
    checked = []
    for v in good:
        mine = v.kernel in ("blocktile2d", "vectorized", "fast")
        shapes = CHECK_SHAPES if mine else CHECK_SHAPES[:6]
        layouts = common.LAYOUTS if mine else common.LAYOUTS[:2]
        ok, worst, fails = check(v, cp, np, shapes, layouts)
        say(
            f"check {v.name:34} {'PASS' if ok else 'FAIL'} worst rel err {worst:.2e}"
            + ("" if ok else "  " + "; ".join(fails[:6]))
        )
        v.report["check_ok"], v.report["check_err"] = ok, worst
        if ok:
            checked.append(v)

    # 3. time
    rows = []
    for m, k, n in TIMED_SHAPES:
        flop = 2.0 * m * k * n
        set_bytes = 4 * (m * k + k * n + m * n)
        nsets = max(1, min(8, math.ceil(3 * l2 / set_bytes)))
        reps = 10 if flop > 1e12 else 30
        sets = []
        for _ in range(nsets):
            a = Mat(cp, m, k, k, 0, "rand")
            b = Mat(cp, k, n, n, 0, "rand")
            c = Mat(cp, m, n, n, 0, "nan")
            sets.append((a, b, c))
        ref = sets[0][0].view.astype(cp.float64) @ sets[0][1].view.astype(cp.float64)
        denom = float(cp.abs(ref).max())

        def err_of(c):
            g = c.view.astype(cp.float64)
            return math.inf if bool(cp.isnan(g).any()) else float(cp.abs(g - ref).max()) / denom

        shape = f"{m}x{k}x{n}"
        cub = lambda a, b, c: cp.matmul(a.view, b.view, out=c.view)  # noqa: E731
        ms_cublas = time_fn(cp, cub, sets, reps)
        cub(*sets[0])
        e = err_of(sets[0][2])
        cublas_row = dict(
            kernel="cublas", params="sgemm", shape=shape, ms=ms_cublas, tflops=flop / ms_cublas / 1e9, pct=100.0, err=e
        )
        rows.append(cublas_row)
        say(f"time {shape:16} cublas {ms_cublas:.3f} ms  err {e:.1e}  ({nsets} sets, {reps} reps)")
        for v in checked:
            if v.kernel in ("tiled", "prefetch", "aplus") and m * n * k > 4096**3:
                continue  # the course kernels at 8192 take seconds and teach nothing new
            for _, _, c in sets:
                c.buf.fill(cp.nan)
            fn = lambda a, b, c, v=v: launch(v, a, b, c, m, k, n, np)  # noqa: E731
            ms = time_fn(cp, fn, sets, reps)
            e = err_of(sets[0][2])
            row = dict(
                kernel=v.kernel,
                params=v.label,
                shape=shape,
                ms=ms,
                tflops=flop / ms / 1e9,
                pct=100.0 * ms_cublas / ms,
                err=e,
                tunable=v.tunable,
            )
            rows.append(row)
            say(
                f"time {shape:16} {v.name:34} {ms:8.3f} ms {row['tflops']:6.1f} TFLOP/s {row['pct']:6.1f}%  err {e:.1e}"
            )
        # cuBLAS again at the end of the shape: the spread between the two is the noise
        ms2 = time_fn(cp, cub, sets, reps)
        say(f"time {shape:16} cublas (again) {ms2:.3f} ms")
        cublas_row["ms_again"] = ms2
        del sets, ref
        cp.get_default_memory_pool().free_all_blocks()

    # 4. autotune record
    def shape_class(m, n):
        tiles = -(-m // 128) * -(-n // 128)
        return "small" if tiles < sms else ("medium" if tiles < 4 * sms else "large")

    # The tune file may only name registered variants (kernels/fast.cu's declaration); a better candidate is reported,
    # to be registered by hand.
    registered = {v.label for v in registry.get("fast").variants}
    spill_free = {
        v.label
        for v in vs
        if v.kernel == "fast"
        and v.tunable
        and v.report.get("ok")
        and v.report.get("spill_stores") == 0
        and v.report.get("spill_loads") == 0
    }
    by_class: dict[str, list[str]] = {}
    for m, k, n in TIMED_SHAPES:
        shape = f"{m}x{k}x{n}"
        by_class.setdefault(shape_class(m, n), []).append(shape)
        cands = [r for r in rows if r["shape"] == shape and r.get("tunable") and r["params"] in spill_free]
        if cands:
            max(cands, key=lambda r: r["tflops"])["best"] = True
    tune = {}
    for cls, shapes in by_class.items():
        # The set with the best geometric mean of %cuBLAS over the class's shapes.
        scores = {}
        for label in spill_free:
            pcts = [r["pct"] for r in rows if r["kernel"] == "fast" and r["params"] == label and r["shape"] in shapes]
            if len(pcts) == len(shapes):
                scores[label] = math.exp(sum(math.log(p) for p in pcts) / len(pcts))
        if not scores:
            continue
        best = max(scores, key=scores.get)
        usable = {k: v for k, v in scores.items() if k in registered}
        if not usable:
            continue
        label = max(usable, key=usable.get)
        if best != label:
            say(
                f"# {cls}: unregistered set {best} beats {label} ({scores[best]:.1f} vs {scores[label]:.1f} %cuBLAS):"
                " add it to the variants of kernels/fast.cu's declaration to use it"
            )
        tune[cls] = {
            "params": label,
            "measured_pct_cublas": {
                s_: round(
                    next(r["pct"] for r in rows if r["kernel"] == "fast" and r["params"] == label and r["shape"] == s_),
                    1,
                )
                for s_ in shapes
            },
        }
    (out / "results.json").write_text(
        json.dumps(
            {
                "gpu": gpu,
                "sms": sms,
                "l2": l2,
                "rows": rows,
                "compile": {v.name: {k: val for k, val in v.report.items() if k != "log"} for v in vs},
                "tune": tune,
            },
            indent=1,
            default=str,
        )
    )
    try:
        import yaml

        text = yaml.safe_dump(
            {gpu: {"shape_classes": "tiles=ceil(M/128)*ceil(N/128); small < SMs <= medium < 4*SMs <= large", **tune}},
            sort_keys=False,
        )
    except ImportError:
        text = json.dumps({gpu: tune}, indent=1)
    (out / "fast.tune.yaml").write_text(text)

    # table last
    say("")
    say(f"{'kernel':12} {'params':20} {'shape':16} {'ms':>9} {'TFLOP/s':>8} {'%cuBLAS':>8} {'max rel err':>11}")
    for r in rows:
        if r["kernel"] in ("tiled", "prefetch", "aplus") and r["shape"] not in (
            "4096x4096x4096",
            "2048x2048x2048",
            "1000x1000x1000",
        ):
            continue
        if (
            r["kernel"] == "fast"
            and r.get("tunable")
            and not r.get("best")
            and r["params"] not in ("128x128x8_async", "128x128x8_reg")
        ):
            continue
        mark = " *" if r.get("best") else ""
        say(
            f"{r['kernel']:12} {r['params'] + mark:20} {r['shape']:16} {r['ms']:9.3f} {r['tflops']:8.1f} "
            f"{r['pct']:7.1f}% {r['err']:11.1e}"
        )
    say("(* = autotune's best spill-free fast set for the shape; full rows in results.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
