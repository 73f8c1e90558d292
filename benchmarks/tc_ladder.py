#!/usr/bin/env python3
"""Tensor-core ladder: compile, check and time tc1 (TF32) and tc3 (3xTF32) against cuBLAS with CuPy.

Standalone, for the GPU machine (needs CuPy, nvcc and, for the SASS counts,
cuobjdump); it does not use pycuda. In one go it

1. compiles kernels/tc1.cu and kernels/tc3.cu for sm_90a (the wgmma path) and
   for sm_90 (the mma.sync path), a few macro variants, and kernels/fast.cu
   (its defaults) with ``nvcc -cubin -O3 -Xptxas -v``, and reads the ptxas
   report (registers, spills, stack) and the SASS counts (HGMMA, HMMA, LDL/STL);
2. checks every build (each in its own process, so that a faulting kernel
   cannot end the run) on awkward shapes in three memory layouts (packed;
   pitched with ld a multiple of 4; ld odd with the base one float off 16-byte
   alignment) against a float64 reference: everything outside the matrices
   (pitch padding, slack) is NaN, inputs too, and C is poisoned with NaN
   before each launch; every element must be finite and within the kernel's
   error bound (so a read past an edge shows as NaN), and the padding of C
   must still be NaN;
3. times every build at 4096^3 and 8192^3 with CUDA events around each launch
   alone: the L2 is flushed before every timed launch (a buffer of several
   times the L2 is written), warm-up first, then batches of launches until the
   interquartile spread is under 2 % of the median (capped), median reported;
   the SM clock is read through NVML (mmd.bench.clock) during each timing and
   a throttle flag set when it drops under 90 % of its maximum or a power or
   thermal reason is active; reference rows are cuBLAS SGEMM (cupy.matmul, TF32
   off) and cuBLAS TF32 (the same in a second process with CUPY_TF32=1);
4. measures the accuracy of tc1, tc3 (and its variants), fast, cuBLAS SGEMM
   and cuBLAS TF32 vs float64 for M = N = 1024 and K = 32, 64, ..., 8192.

After a full run (the cubins are in /tmp/tc_ladder_build), ``--profile fast,tc1``
launches those builds once each at 4096^3, for a profiler:
  ncu --clock-control none -k regex:'mmd_(fast|tc1)' -c 2 python3 benchmarks/tc_ladder.py --profile fast,tc1

Errors: "max rel" = max|C - ref| / max|ref|, "rms rel" = ||C - ref||_F / ||ref||_F
(ref = the float64 product of the same float32 inputs), inputs uniform in [-1, 1].

Run from the repository root:  PYTHONUNBUFFERED=1 python3 benchmarks/tc_ladder.py
Options: --quick (fewer shapes, no 8192), --compile-only (no GPU), --out DIR
(default $OUT or ./bench). The table printed last is the result; results.json
in the out folder has every number.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness  # beside this script: its folder is first on sys.path
from harness import SM90, SM90A, Column, Mat, Table

from mmd import kernels as registry
from mmd.cuda import libcuda  # tensor maps and cluster launches: the TMA builds

#: Shapes (M, K, N) that are checked. 4096x1024x2048 means M=4096, K=1024, N=2048.
CHECK_SHAPES = [
    *harness.EDGE_SHAPES,
    (129, 257, 130),
    (300, 17, 515),
    (257, 40, 129),
    (64, 96, 256),
    (128, 64, 256),
    (128, 32, 256),
    (4096, 1024, 2048),
    (31, 31, 31),
    (4095, 31, 1000),
    (4095, 4095, 4095),
]
TIMED_SIZES = [4096, 8192]
#: Columns of the accuracy table (builds that exist and whose check did not die).
ACC_COLUMNS = [
    "cublas_sgemm",
    "cublas_tf32",
    "fast",
    "tc1",
    "tc1_round",
    "tc1_tma",
    "tc1_tma_tf",
    "tc3",
    "tc3_p2",
    "tc3_tma",
]
ACCURACY_KS = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
ACCURACY_MN = 1024

#: Failures on these shapes (one or two tiles) save A, B, C to diag_<build>.npz.
DIAG_SHAPES = [(128, 64, 256), (64, 96, 256), (129, 257, 130)]
BUILD_DIR = Path("/tmp/tc_ladder_build")


@dataclass
class TcBuild(harness.Build):
    """One build of the ladder: whether and at which sizes it is timed, and its error bound's scale."""

    timed: bool = True  # time it (else check only)
    sizes: tuple = tuple(TIMED_SIZES)  # sizes to time
    rep_scale: float = 1.0  # x the kernel's representation-error bound (see bound_scale)
    maps: dict = field(default_factory=dict)  # TMA builds: encoded tensor maps by (address, rows, cols, ld)

    @property
    def tma(self) -> bool:
        return bool(self.macros.get("TMA"))

    @property
    def bound_scale(self) -> float:
        """rep_scale, times 1.5 for tc1 with A truncated (ROUND_A 0): 2^-10 + 2^-11 per product, not 2 x 2^-11."""
        macros = self.macros
        if self.kernel == "tc1" and not macros.get("ROUND_A", 1) and not macros.get("TMA_TF32", 0):
            return 1.5 * self.rep_scale
        return self.rep_scale


def tc(kernel: str, label: str, arch: str, macros: dict[str, int] | None = None, **options: Any) -> TcBuild:
    """``kernel`` with ``macros`` changed from its file's defaults, for ``arch``: the registry's build, whose
    launch geometry is the kernel's declaration's (mmd/kernels.py reads it from the file's header)."""
    spec = registry.get(kernel).with_variant(registry.variant(kernel, label, **(macros or {})))
    return TcBuild(spec, label, arch=arch, **options)


def builds(quick: bool, only: tuple[str, ...] = ()) -> list[TcBuild]:
    out = [
        tc("tc1", "tc1", SM90A),
        tc("tc3", "tc3", SM90A),
        tc("tc1", "tc1_mma", SM90),
        tc("tc3", "tc3_mma", SM90),
        tc("fast", "fast", SM90),
        # variants
        tc("tc1", "tc1_round", SM90A, {"ROUND_A": 1}),  # A rounded in shared memory: what it costs
        tc("tc1", "tc1_pf", SM90A, {"PREFETCH_A": 1}),  # L2 prefetch-size hint on A's copies
        tc("tc1", "tc1_g4", SM90A, {"GROUP_M": 4}, sizes=(4096,)),
        tc("tc1", "tc1_g16", SM90A, {"GROUP_M": 16}, sizes=(4096,)),
        tc("tc3", "tc3_p2", SM90A, {"PROMOTE": 2}),
        tc("tc1", "tc1_mma_a", SM90A, {"USE_WGMMA": 0}, timed=False),
        tc("tc3", "tc3_mma_a", SM90A, {"USE_WGMMA": 0}, timed=False),
        tc("tc3", "tc3_mma_p2", SM90, {"PROMOTE": 2}, timed=False),
        # the copy engine (TMA) and clusters: launched through mmd.cuda.libcuda
        tc("tc1", "tc1_tma", SM90A, {"TMA": 1}),
        tc("tc1", "tc1_tma2", SM90A, {"TMA": 1, "CLUSTER_N": 2}),
        tc("tc1", "tc1_tma_tf", SM90A, {"TMA": 1, "TMA_TF32": 1}),
        tc("tc1", "tc1_tma2_tf", SM90A, {"TMA": 1, "TMA_TF32": 1, "CLUSTER_N": 2}),
        tc("tc1", "tc1_tma2_s3", SM90A, {"TMA": 1, "CLUSTER_N": 2, "STAGES": 3}, sizes=(4096,)),
        tc("tc3", "tc3_tma", SM90A, {"TMA": 1}),  # a producer warpgroup copies and makes A's small part once
    ]
    if only:
        out = [b for b in out if b.label in only]
    elif quick:
        out = [b for b in out if b.label in ("tc1", "tc3", "tc1_mma", "tc3_mma", "fast")]
    return out


def built(label: str) -> TcBuild:
    """A build compiled already (by a full run), by its label."""
    b = next(x for x in builds(False, (label,)))
    b.cubin = BUILD_DIR / f"{b.stem}.cubin"
    return b


# -- compile ------------------------------------------------------------------

#: SASS instructions counted in each build (harness.SASS_PATTERNS).
SASS_COUNTS = ("HGMMA", "HMMA", "LDG.128", "STS.128", "LDL/STL")
COMPILED = Table(
    (
        Column("build", 12, "<"),
        Column("target", 8, "<"),
        Column("regs", 4),
        Column("stack", 5),
        Column("spill st/ld", 11, "<"),
        Column("smem dyn", 8),
        Column("HGMMA", 5),
        Column("HMMA", 5),
        Column("LDL/STL", 7),
    )
)


def compile_row(b: TcBuild) -> str:
    r = b.report
    s = r.get("sass", {})
    target = "sm_90a" if "90a" in b.arch else b.arch.split("=")[-1]
    spill = f"{r['spill_stores']:>5}/{r['spill_loads']}"
    cells = [b.label, target, r["registers"], r["stack"], spill, b.dynamic_shared(), s.get("HGMMA"), s.get("HMMA")]
    line = COMPILED.row(*cells, s.get("LDL/STL"))
    return line + (f"  warnings: {r['warnings']}" if r["warnings"] else "")


def build_facts(b: TcBuild) -> dict:
    """A build's entry in results.json: what it is and what nvcc said (its log aside)."""
    return {
        "kernel": b.kernel,
        "arch": b.arch,
        "macros": b.macros,
        "block": b.block(),
        "tile": b.block_shape(),
        "dynamic_shared": b.dynamic_shared(),
        **{k: v for k, v in b.report.items() if k != "log"},
    }


# -- launches -----------------------------------------------------------------


def launch(b: TcBuild, a: Mat, bm: Mat, c: Mat, m: int, k: int, n: int) -> None:
    if b.tma:
        launch_tma(b, a, bm, c, m, k, n)
    else:
        harness.launch(b, a, bm, c, m, k, n)


def tma_ok(*mats: Mat) -> bool:
    """Whether the copy engine can read these matrices (16-byte aligned base and row stride)."""
    return all(libcuda.tma_ok(x.ptr_view.data.ptr, x.ld) for x in mats)


def launch_tma(b: TcBuild, a: Mat, bm: Mat, c: Mat, m: int, k: int, n: int) -> None:
    """A TMA build through the driver API, with the operand maps its registry entry names (spec.tensor_maps)."""
    import cupy as cp

    driver, function = b.function
    spec = b.spec
    maps = spec.tensor_maps
    assert maps is not None

    def tensor_map(x: Mat, box: tuple[int, int]) -> libcuda.TensorMap:
        key = (x.ptr_view.data.ptr, x.rows, x.cols, x.ld, box)
        if key not in b.maps:
            tile = libcuda.matrix_map(x.rows, x.cols, x.ld, *box, maps.swizzle, tf32=maps.tf32)
            b.maps[key] = driver.encode(x.ptr_view.data.ptr, tile)
        return b.maps[key]

    args = [
        tensor_map(a, maps.a_box),
        tensor_map(bm, maps.b_box),
        libcuda.Pointer(c.ptr_view.data.ptr),
        *(libcuda.Int(v) for v in (m, k, n, c.ld)),
    ]
    driver.launch(
        function, b.grid(m, n), b.block(), args, shared=b.dynamic_shared(),
        stream=cp.cuda.get_current_stream().ptr, cluster=(spec.cluster_x, 1, 1),
    )  # fmt: skip


def load_function(cp: Any, b: TcBuild) -> Any:
    if b.tma:  # pycuda and CuPy give no CUfunction to launch with a cluster: the driver API, in CuPy's context
        assert b.cubin is not None
        cp.cuda.Device().use()
        cp.empty(1)  # the primary context made current in this thread
        driver = libcuda.Driver()
        module = driver.load_module(b.cubin.read_bytes())
        return driver, driver.function(module, b.spec.entry, b.dynamic_shared())
    return harness.load(cp, b)


def bound(kernel: str, k: int, rep_scale: float = 1.0) -> float:
    """Elementwise bound on |C - ref| / (|A| |B|): operand representation + fp32 accumulation.

    tc1 rounds both operands to TF32 (relative error <= 2^-11 each); tc3's
    big + small keeps x to 2^-22 and drops small*small (~2^-22); fp32
    accumulation of K terms adds at most about K * 2^-23 (generous: the tensor
    cores' internal accumulation is not IEEE round-to-nearest)."""
    rep = {"tc1": 2.0**-10, "tc3": 2.0**-20, "fast": 2.0**-22, "cublas": 2.0**-22}[kernel]
    return 1.05 * rep * rep_scale + k * 2.0**-23


# -- the workers: a check per build, and cuBLAS TF32 (CuPy reads CUPY_TF32 at import) -------------


def worker(tag: str, argv: list[str], timeout: float, env: dict[str, str] | None = None) -> dict:
    """This script run again with ``argv``: the JSON it printed after ``tag``, or {"error": why}."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out ({timeout:.0f} s)"}
    for line in proc.stdout.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
    return {"error": f"process died (rc {proc.returncode}): " + " | ".join(tail)}


def check_worker(label: str, quick: bool, out: Path) -> int:
    """Check one build (compiled already) on every shape and layout; print CHECKJSON."""
    import cupy as cp
    import numpy as np

    b = built(label)
    b.function = load_function(cp, b)
    skipped = 0
    shapes = CHECK_SHAPES if not quick else CHECK_SHAPES[:8]
    st: dict = {"ok": True, "worst_elem": 0.0, "worst_max": 0.0, "fails": [], "rows": [], "checks": 0}
    cp.random.seed(12345)  # every worker draws the same inputs
    saved = False
    for m, k, n in shapes:
        for layout in harness.LAYOUTS:
            lname = layout[0]
            a = Mat.laid_out(cp, m, k, layout, "rand")
            bmat = Mat.laid_out(cp, k, n, layout, "rand")
            a64, b64 = a.view.astype(cp.float64), bmat.view.astype(cp.float64)
            ref = a64 @ b64
            absprod = cp.abs(a64) @ cp.abs(b64)
            sg = harness.errors(cp, cp.matmul(a.view, bmat.view).astype(cp.float64), ref)  # cuBLAS SGEMM, same data
            c = Mat.laid_out(cp, m, n, layout, "nan")
            if b.tma and not tma_ok(a, bmat):
                skipped += 1  # mmd launches the cp.async build there: the copy engine needs 16-byte rows
                continue
            launch(b, a, bmat, c, m, k, n)
            cp.cuda.runtime.deviceSynchronize()
            got = c.view.astype(cp.float64)
            e = harness.errors(cp, got, ref)
            elem = float((cp.abs(got - ref) / cp.maximum(absprod, 1e-30)).max()) if e["finite"] else math.inf
            pad_ok = c.padding_untouched(cp)
            lim = bound(b.kernel, k, b.bound_scale)
            # fp32 class: within 8x cuBLAS SGEMM's rms error on the same data, or within
            # 2 sqrt(K) 2^-24 (a few outputs can make SGEMM's own error a lucky small number);
            # TF32 class: under 2e-3
            fp32_class = b.kernel in ("tc3", "fast")
            rms_lim = max(8 * sg["rms"], 2 * math.sqrt(k) * 2.0**-24) if fp32_class else 2e-3
            rms_ok = e["rms"] <= rms_lim
            ok = e["finite"] and pad_ok and elem <= lim and rms_ok
            st["checks"] += 1
            st["worst_elem"] = max(st["worst_elem"], elem)
            st["worst_max"] = max(st["worst_max"], e["max"])
            st["rows"].append(
                {
                    "build": b.label,
                    "shape": [m, k, n],
                    "layout": lname,
                    "ok": ok,
                    "elem": elem,
                    "bound": lim,
                    "max": e["max"],
                    "rms": e["rms"],
                    "sgemm_rms": sg["rms"],
                    "pad_ok": pad_ok,
                    "finite": e["finite"],
                }
            )
            if not ok:
                st["ok"] = False
                nan_count = int(cp.isnan(got).sum())
                st["fails"].append(
                    f"{m}x{k}x{n}/{lname}: elem={elem:.2e} (bound {lim:.1e}) max={e['max']:.2e} "
                    f"rms={e['rms']:.2e} (sgemm {sg['rms']:.1e}) nan={nan_count} pad_ok={pad_ok}"
                )
                if not saved and (m, k, n) in DIAG_SHAPES and b.label in ("tc1", "tc3", "tc1_mma", "tc3_mma"):
                    saved = True
                    np.savez_compressed(
                        out / f"diag_{b.label}.npz",
                        A=cp.asnumpy(a.view),
                        B=cp.asnumpy(bmat.view),
                        C=cp.asnumpy(c.view),
                        shape=np.array([m, k, n]),
                        layout=lname,
                    )
            del a, bmat, a64, b64, ref, absprod, c
        cp.get_default_memory_pool().free_all_blocks()
    st["skipped"] = skipped
    print("CHECKJSON " + json.dumps(st), flush=True)
    return 0


def run_check_worker(label: str, quick: bool, out: Path) -> dict:
    st = worker("CHECKJSON", ["--check-worker", label, "--out", str(out), *(["--quick"] if quick else [])], 45)
    if "error" in st:
        return {"ok": False, "died": True, "worst_elem": math.inf, "worst_max": math.inf, "fails": [st["error"]]}
    return st


def timed(cp: Any, fn: Callable[[], object], flush: Callable[[], None], own_processes: int = 1) -> dict:
    """fn's launches timed (each alone, the L2 flushed first) with the SM clock meanwhile; ``own_processes``: this
    run's processes on the GPU (the TF32 worker's parent is the second)."""
    sampler = harness.clock(cp, own_processes)
    with sampler:
        t = harness.time_events(cp, [fn], flush)
    return {**t.row(), **sampler.summary()}


def timed_row(cp, flush, case, label, kernel, fn, say) -> dict:
    """Time fn (which writes case["c"]), then run it once more on a poisoned C for its error."""
    c, size = case["c"], case["size"]
    c.buf.fill(cp.nan)
    t = timed(cp, fn, flush)
    c.buf.fill(cp.nan)
    fn()
    cp.cuda.runtime.deviceSynchronize()
    t["err"] = harness.errors(cp, c.view.astype(cp.float64), case["ref"])
    row = {"kernel": label, "file": kernel, "size": size, "tflops": case["flop"] / t["ms"] / 1e9, **t}
    say(
        f"time {size:5d}^3 {label:12} {t['ms']:8.3f} ms {row['tflops']:6.1f} TFLOP/s  "
        f"iqr {t['iqr_rel'] * 100:4.1f}% reps {t['reps']:3d}  SM {t['sm_clock_mhz']} MHz "
        f"throttled={t['throttled']} {t['throttle_reasons']}  max rel {t['err']['max']:.1e}"
    )
    return row


def tf32_worker(sizes: list[int], ks: list[int]) -> int:
    import cupy as cp

    res: dict = {"cupy_tf32": os.environ.get("CUPY_TF32"), "timing": {}, "accuracy": {}}
    flush = harness.l2_flush(cp, cp.cuda.Device().attributes["L2CacheSize"])
    cp.random.seed(777)
    for n in sizes:
        a, b = random_pair(cp, n, n, n)
        c = cp.empty((n, n), dtype=cp.float32)
        t = timed(cp, functools.partial(cp.matmul, a, b, out=c), flush, own_processes=2)
        ref = a.astype(cp.float64) @ b.astype(cp.float64)
        cp.matmul(a, b, out=c)
        t["err"] = harness.errors(cp, c.astype(cp.float64), ref)
        res["timing"][str(n)] = t
        del a, b, c, ref
        cp.get_default_memory_pool().free_all_blocks()
    cp.random.seed(4242)
    for k in ks:
        a, b = random_pair(cp, ACCURACY_MN, k, ACCURACY_MN)
        ref = a.astype(cp.float64) @ b.astype(cp.float64)
        res["accuracy"][str(k)] = harness.errors(cp, cp.matmul(a, b).astype(cp.float64), ref)
    print("TF32JSON " + json.dumps(res), flush=True)
    return 0


def run_tf32_worker(sizes: list[int], ks: list[int]) -> dict:
    argv = ["--tf32-worker", "--sizes", ",".join(map(str, sizes)), "--ks", ",".join(map(str, ks))]
    return worker("TF32JSON", argv, 240, env=dict(os.environ, CUPY_TF32="1"))


def random_pair(cp, m, k, n):
    """A (m x k) and B (k x n), uniform in [-1, 1], drawn the same way in both processes."""
    a = cp.random.uniform(-1.0, 1.0, (m, k), dtype=cp.float64).astype(cp.float32)
    b = cp.random.uniform(-1.0, 1.0, (k, n), dtype=cp.float64).astype(cp.float32)
    return a, b


def packed_pair(cp, m, k, n) -> tuple[Mat, Mat]:
    """:func:`random_pair` as two packed matrices."""
    a, b = random_pair(cp, m, k, n)
    pair = Mat.packed(cp, m, k, "nan"), Mat.packed(cp, k, n, "nan")
    pair[0].view[...], pair[1].view[...] = a, b
    return pair


def profile_launches(labels: list[str]) -> int:
    """One 4096^3 launch of each build in labels (compiled already), for a profiler such as ncu."""
    import cupy as cp

    cp.random.seed(5)
    n = 4096
    a, bmat = packed_pair(cp, n, n, n)
    c = Mat.packed(cp, n, n, "nan")
    for label in labels:
        b = built(label)
        b.function = load_function(cp, b)
        launch(b, a, bmat, c, n, n, n)
        cp.cuda.runtime.deviceSynchronize()
    return 0


# -- the run's steps -----------------------------------------------------------------


def check_step(good: list[TcBuild], quick: bool, out: Path, say) -> dict[str, dict]:
    """Each build checked in its own process: a kernel that faults (a sticky CUDA error) cannot take the rest
    of the run down with it."""
    t0 = time.time()
    shapes = CHECK_SHAPES if not quick else CHECK_SHAPES[:8]
    status = {b.label: run_check_worker(b.label, quick, out) for b in good}
    say(f"# checks: {len(shapes)} shapes x {len(harness.LAYOUTS)} layouts per build, {time.time() - t0:.1f} s")
    for b in good:
        st = status[b.label]
        say(
            f"check {b.label:12} {'PASS' if st['ok'] else 'FAIL'}  worst elementwise |C-ref|/(|A||B|) "
            f"{st['worst_elem']:.2e}  worst max rel {st['worst_max']:.2e}  ({st.get('checks', 0)} checks"
            + (f", {st['skipped']} unaligned layouts left to the cp.async build)" if st.get("skipped") else ")")
            + ("" if st["ok"] else "\n    " + "\n    ".join(st["fails"][:8]))
        )
    return status


def time_step(cp, good: list[TcBuild], status: dict, sizes: list[int], l2: int, say) -> list[dict]:
    """At each size: cuBLAS SGEMM, every timed build whose check did not die (one that gave wrong numbers is
    still timed, flagged), and cuBLAS SGEMM again (the drift)."""
    flush = harness.l2_flush(cp, l2)
    rows = []
    cp.random.seed(777)  # the TF32 worker draws the same inputs
    for size in sizes:
        m = k = n = size
        a, bmat = packed_pair(cp, m, k, n)
        c = Mat.packed(cp, m, n, "nan")
        ref = a.view.astype(cp.float64) @ bmat.view.astype(cp.float64)
        case = {"size": size, "flop": 2.0 * m * k * n, "c": c, "ref": ref}
        sgemm = functools.partial(cp.matmul, a.view, bmat.view, out=c.view)
        rows.append(timed_row(cp, flush, case, "cublas_sgemm", "cublas", sgemm, say))
        for b in good:
            if not b.timed or size not in b.sizes or status[b.label].get("died"):
                continue
            fn = functools.partial(launch, b, a, bmat, c, m, k, n)
            rows.append({**timed_row(cp, flush, case, b.label, b.kernel, fn, say), "check_ok": status[b.label]["ok"]})
        rows.append(timed_row(cp, flush, case, "cublas_sgemm", "cublas", sgemm, say))
        del a, bmat, c, ref
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def accuracy_step(cp, good: list[TcBuild], status: dict) -> dict[int, dict]:
    """Errors against float64 at M = N = ACCURACY_MN for every K: cuBLAS SGEMM and the accuracy table's builds."""
    cp.random.seed(4242)  # the TF32 worker draws the same inputs
    acc_builds = [b for b in good if b.label in ACC_COLUMNS and not status[b.label].get("died")]
    acc: dict[int, dict] = {}
    for kk in ACCURACY_KS:
        a, bmat = packed_pair(cp, ACCURACY_MN, kk, ACCURACY_MN)
        ref = a.view.astype(cp.float64) @ bmat.view.astype(cp.float64)
        acc[kk] = {"cublas_sgemm": harness.errors(cp, cp.matmul(a.view, bmat.view).astype(cp.float64), ref)}
        for b in acc_builds:
            c = Mat.packed(cp, ACCURACY_MN, ACCURACY_MN, "nan")
            launch(b, a, bmat, c, ACCURACY_MN, kk, ACCURACY_MN)
            cp.cuda.runtime.deviceSynchronize()
            acc[kk][b.label] = harness.errors(cp, c.view.astype(cp.float64), ref)
    return acc


def tf32_step(sizes: list[int], rows: list[dict], acc: dict[int, dict], say) -> dict:
    """cuBLAS TF32, in its own process: its rows and accuracy added to ``rows`` and ``acc``."""
    tf = run_tf32_worker(sizes, ACCURACY_KS)
    if "timing" not in tf:
        say(f"# cuBLAS TF32 worker failed: {tf.get('error')}")
        return tf
    for s, t in tf["timing"].items():
        size = int(s)
        rows.append(
            {"kernel": "cublas_tf32", "file": "cublas", "size": size, "tflops": 2.0 * size**3 / t["ms"] / 1e9, **t}
        )
        say(
            f"time {size:5d}^3 {'cublas_tf32':12} {t['ms']:8.3f} ms  "
            f"iqr {t['iqr_rel'] * 100:4.1f}% reps {t['reps']} "
            f"SM {t['sm_clock_mhz']} MHz throttled={t['throttled']}  max rel {t['err']['max']:.1e}"
        )
    for s, e in tf.get("accuracy", {}).items():
        acc.setdefault(int(s), {})["cublas_tf32"] = e
    return tf


TIMED = Table(
    (
        Column("kernel", 13, "<"),
        Column("size", 6),
        Column("ms", 8, spec=".3f"),
        Column("TFLOP/s", 8, spec=".1f"),
        Column("x SGEMM", 8, spec=".2f"),
        Column("max rel", 8, spec=".1e"),
        Column("rms rel", 8, spec=".1e"),
        Column("SM MHz", 7),
        Column("thr", 3, "<"),
    )
)


def tables(acc: dict[int, dict], rows: list[dict], sizes: list[int], good, status, quick: bool, gpu: str, say) -> None:
    """The accuracy tables, the checks' verdicts and the timing table: the run's result."""
    cols = [c_ for c_ in ACC_COLUMNS if any(c_ in acc[kk] for kk in acc)]
    accuracy = Table((Column("K", 5), *(Column(c_, 12) for c_ in cols)))
    for what in ("max", "rms"):
        say("")
        say(f"accuracy vs float64, M = N = {ACCURACY_MN}, inputs uniform [-1, 1]: {what} rel")
        say(accuracy.header())
        for kk in sorted(acc):
            say(accuracy.row(kk, *(f"{acc[kk][c_][what]:.1e}" if c_ in acc[kk] else "-" for c_ in cols)))
    say("")
    shapes = CHECK_SHAPES if not quick else CHECK_SHAPES[:8]
    say(
        f"correctness ({len(shapes)} shapes x {len(harness.LAYOUTS)} layouts, C poisoned with NaN, "
        "every element checked): " + ", ".join(f"{b.label} {'PASS' if status[b.label]['ok'] else 'FAIL'}" for b in good)
    )
    say("")
    say(f"GPU {gpu}; CUDA events, L2 flushed before each launch, median of reps (IQR < 2% or capped)")
    say(TIMED.header())
    for size in sizes:
        sg = [r for r in rows if r["kernel"] == "cublas_sgemm" and r["size"] == size]
        base = harness.median(r["ms"] for r in sg) if sg else None  # before and after the kernels: their mean
        seen = set()
        for r in rows:
            if r["size"] != size or (r["kernel"] == "cublas_sgemm" and r["kernel"] in seen):
                continue
            seen.add(r["kernel"])
            ratio = base / r["ms"] if base else float("nan")
            name = r["kernel"] + ("!" if r.get("check_ok") is False else "")
            thr = "Y" if r.get("throttled") else "n"
            say(
                TIMED.row(
                    name, size, r["ms"], r["tflops"], ratio, r["err"]["max"], r["err"]["rms"], r["sm_clock_mhz"], thr
                )
            )
        if len(sg) > 1:
            say(f"{'(sgemm again)':13} {size:>6} {sg[-1]['ms']:8.3f}   (x SGEMM uses the mean of both SGEMM runs)")
    say("(! = failed its correctness check; thr = throttled: SM clock under 90 % of max, or a power or thermal reason)")


# -- main -----------------------------------------------------------------------


def main() -> int:
    ap = harness.ladder_parser(__doc__)
    ap.add_argument("--tf32-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--check-worker", default="", help=argparse.SUPPRESS)
    ap.add_argument(
        "--profile", default="", help="after a full run: launch these builds (comma-separated) once at 4096^3, for ncu"
    )
    ap.add_argument("--only", default="", help="only these builds (comma-separated labels)")
    ap.add_argument("--sizes", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ks", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.profile:
        return profile_launches(args.profile.split(","))
    if args.check_worker:
        return check_worker(args.check_worker, args.quick, Path(args.out))
    if args.tf32_worker:
        return tf32_worker([int(x) for x in args.sizes.split(",") if x], [int(x) for x in args.ks.split(",") if x])

    os.environ["CUPY_TF32"] = "0"  # cuBLAS SGEMM in true fp32 in this process
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say = harness.logger(out / "tc_ladder.log")
    results: dict = {"builds": {}, "checks": [], "timing": [], "accuracy": {}, "env": {}}

    def dump():
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))

    t_start = time.time()
    bs = harness.compile_all(builds(args.quick, tuple(x for x in args.only.split(",") if x)), BUILD_DIR, SASS_COUNTS)
    results["env"]["nvcc"] = harness.nvcc_version()
    say(f"# compiled {len(bs)} builds in {time.time() - t_start:.1f} s ({results['env']['nvcc']})")
    say(COMPILED.header())
    for b in bs:
        results["builds"][b.label] = build_facts(b)
        say(compile_row(b) if b.report["ok"] else f"{b.label:12} COMPILE FAILED\n{b.report['log']}")
    good = [b for b in bs if b.report["ok"]]
    dump()
    if args.compile_only:
        return 0

    import cupy as cp

    gpu, l2, sms, props = harness.gpu_facts(cp)
    cc = f"{props['major']}.{props['minor']}"
    results["env"].update(gpu=gpu, sms=sms, l2=l2, cc=cc, cupy=cp.__version__)
    now, top = harness.clock_now(cp)
    say(
        f"# GPU {gpu} (cc {cc}), {sms} SMs, L2 {l2 >> 20} MiB, CuPy {cp.__version__}, "
        f"SM clock now {now if now else '?'} / max {top if top else '?'} MHz (NVML)"
    )
    for b in good:
        b.function = load_function(cp, b)

    status = check_step(good, args.quick, out, say)
    for b in good:
        results["checks"] += status[b.label].pop("rows", [])
    results["check_summary"] = status
    dump()

    sizes = TIMED_SIZES if not args.quick else TIMED_SIZES[:1]
    rows = time_step(cp, good, status, sizes, l2, say)
    results["timing"] = rows
    dump()

    acc = accuracy_step(cp, good, status)
    results["accuracy"] = {str(k): v for k, v in acc.items()}
    dump()

    results["tf32_worker"] = tf32_step(sizes, rows, acc, say)
    results["accuracy"] = {str(k): v for k, v in acc.items()}
    results["wall_s"] = time.time() - t_start
    dump()

    tables(acc, rows, sizes, good, status, args.quick, gpu, say)
    say(f"# wall {time.time() - t_start:.0f} s")
    return 0 if all(status[b.label]["ok"] for b in good) else 1


if __name__ == "__main__":
    sys.exit(main())
