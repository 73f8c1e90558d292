#!/usr/bin/env python3
"""Tensor-core ladder: compile, check and time tc1 (TF32) and tc3 (3xTF32) against cuBLAS with CuPy.

Standalone, for the GPU machine (needs CuPy, nvcc and, for the SASS counts,
cuobjdump); it does not import mmd or pycuda. In one go it

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
   the SM clock is sampled with nvidia-smi during each timing and a throttle
   flag set when it drops under 90 % of the maximum or a throttle reason other
   than idle is active; reference rows are cuBLAS SGEMM (cupy.matmul, TF32
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
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import ladder_common as common  # beside this script: its folder is first on sys.path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mmd import kernels as registry  # noqa: E402  (the kernels' launch geometry lives there)
from mmd.cuda import libcuda  # noqa: E402  (tensor maps and cluster launches: the TMA builds)

KERNELS = registry.kernels_dir()

#: Shapes (M, K, N) that are checked. 4096x1024x2048 means M=4096, K=1024, N=2048.
CHECK_SHAPES = [
    *common.EDGE_SHAPES,
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
ACC_COLUMNS = ["cublas_sgemm", "cublas_tf32", "fast", "tc1", "tc1_round", "tc1_tma", "tc1_tma_tf", "tc3", "tc3_p2"]
ACCURACY_KS = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
ACCURACY_MN = 1024

#: Failures on these shapes (one or two tiles) save A, B, C to diag_<build>.npz.
DIAG_SHAPES = [(128, 64, 256), (64, 96, 256), (129, 257, 130)]
BUILD_DIR = Path("/tmp/tc_ladder_build")

SM90A = "-gencode=arch=compute_90a,code=sm_90a"
SM90 = "-arch=sm_90"


@dataclass
class Build:
    """One compiled kernel: a .cu file, a macro set and a target."""

    kernel: str  # file stem: kernels/<kernel>.cu, entry mmd_<kernel>
    label: str  # short name of the build
    arch: str = SM90A  # nvcc target option
    macros: dict = field(default_factory=dict)
    timed: bool = True  # time it (else check only)
    sizes: tuple = tuple(TIMED_SIZES)  # sizes to time
    rep_scale: float = 1.0  # x the kernel's representation-error bound (see bound_scale)
    cubin: Path | None = None
    report: dict = field(default_factory=dict)
    function: object = None
    maps: dict = field(default_factory=dict)  # TMA builds: encoded tensor maps by (address, rows, cols, ld)

    @property
    def tma(self) -> bool:
        return bool(self.macros.get("TMA"))

    @property
    def name(self) -> str:
        return self.label

    @property
    def bound_scale(self) -> float:
        """rep_scale, times 1.5 for tc1 with A truncated (ROUND_A 0): 2^-10 + 2^-11 per product, not 2 x 2^-11."""
        macros = dict(self.spec.macros)
        if self.kernel == "tc1" and not macros.get("ROUND_A", 1) and not macros.get("TMA_TF32", 0):
            return 1.5 * self.rep_scale
        return self.rep_scale

    @property
    def spec(self) -> registry.KernelSpec:
        """The registry's build for these macros: its launch geometry is the kernel's declaration's (mmd/kernels.py
        reads it from the file's header)."""
        base = registry.get(self.kernel)
        if base.uses_tile:
            return base
        return base.with_variant(registry.variant(self.kernel, self.label, **self.macros))

    def block(self) -> tuple[int, int, int]:
        return self.spec.block(0)

    def tile(self) -> tuple[int, int]:
        return self.spec.block_shape(0)

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return self.spec.grid(m, n, 0)

    def dynamic_shared(self) -> int:
        return self.spec.dynamic_shared_bytes


def builds(quick: bool, only: tuple[str, ...] = ()) -> list[Build]:
    out = [
        Build("tc1", "tc1", SM90A),
        Build("tc3", "tc3", SM90A),
        Build("tc1", "tc1_mma", SM90),
        Build("tc3", "tc3_mma", SM90),
        Build("fast", "fast", SM90),
        # variants
        Build("tc1", "tc1_round", SM90A, {"ROUND_A": 1}),  # A rounded in shared memory: what it costs
        Build("tc1", "tc1_pf", SM90A, {"PREFETCH_A": 1}),  # L2 prefetch-size hint on A's copies
        Build("tc1", "tc1_g4", SM90A, {"GROUP_M": 4}, sizes=(4096,)),
        Build("tc1", "tc1_g16", SM90A, {"GROUP_M": 16}, sizes=(4096,)),
        Build("tc3", "tc3_p2", SM90A, {"PROMOTE": 2}),
        Build("tc1", "tc1_mma_a", SM90A, {"USE_WGMMA": 0}, timed=False),
        Build("tc3", "tc3_mma_a", SM90A, {"USE_WGMMA": 0}, timed=False),
        Build("tc3", "tc3_mma_p2", SM90, {"PROMOTE": 2}, timed=False),
        # the copy engine (TMA) and clusters: launched through mmd.cuda.libcuda
        Build("tc1", "tc1_tma", SM90A, {"TMA": 1}),
        Build("tc1", "tc1_tma2", SM90A, {"TMA": 1, "CLUSTER_N": 2}),
        Build("tc1", "tc1_tma_tf", SM90A, {"TMA": 1, "TMA_TF32": 1}),
        Build("tc1", "tc1_tma2_tf", SM90A, {"TMA": 1, "TMA_TF32": 1, "CLUSTER_N": 2}),
        Build("tc1", "tc1_tma2_s3", SM90A, {"TMA": 1, "CLUSTER_N": 2, "STAGES": 3}, sizes=(4096,)),
    ]
    if only:
        out = [b for b in out if b.label in only]
    elif quick:
        out = [b for b in out if b.label in ("tc1", "tc3", "tc1_mma", "tc3_mma", "fast")]
    return out


# -- compile ------------------------------------------------------------------

#: SASS instructions counted in each build (ladder_common.SASS_PATTERNS).
SASS_COUNTS = ("HGMMA", "HMMA", "LDG.128", "STS.128", "LDL/STL")


def compile_build(b: Build, build_dir: Path) -> Build:
    src = KERNELS / f"{b.kernel}.cu"
    b.cubin = build_dir / f"{b.label}.cubin"
    cmd = [
        common.tool("nvcc") or "nvcc",
        "-cubin",
        "-O3",
        "-Xptxas",
        "-v",
        *b.arch.split(),
        *[f"-D{k}={v}" for k, v in b.macros.items()],
        "-o",
        str(b.cubin),
        str(src),
    ]
    rep = common.compile_report(cmd, "static_smem")
    if rep["ok"]:
        rep["warnings"] = [ln for ln in rep["log"].splitlines() if "warning" in ln.lower()]
        counts = common.sass_counts(b.cubin, build_dir / f"{b.label}.sass", SASS_COUNTS)
        if counts is not None:
            rep["sass"] = counts
    b.report = rep
    return b


# -- matrices -----------------------------------------------------------------


class Mat:
    """A rows x cols float32 matrix inside a flat buffer, at `offset` floats, row stride ld."""

    def __init__(self, cp, rows, cols, ld, offset, fill):
        self.rows, self.cols, self.ld, self.offset = rows, cols, ld, offset
        total = offset + rows * ld + 8
        # Everything outside the matrix is NaN, inputs too: a kernel that reads
        # past an edge (and lets it into a product) gives NaN, and one that
        # writes past an edge of C overwrites NaN that must stay.
        self.buf = cp.full(total, cp.nan, dtype=cp.float32)
        self.ptr_view = self.buf[offset:]  # the kernel's pointer
        self.view = self.buf[offset : offset + rows * ld].reshape(rows, ld)[:, :cols]
        if fill != "nan":
            self.view[...] = cp.random.uniform(-1.0, 1.0, (rows, cols), dtype=cp.float64).astype(cp.float32)

    @classmethod
    def wrap(cls, arr):
        """A packed Mat around an existing contiguous 2-D array."""
        self = cls.__new__(cls)
        self.rows, self.cols = arr.shape
        self.ld, self.offset = self.cols, 0
        self.buf = arr.reshape(-1)
        self.ptr_view = self.buf
        self.view = arr
        return self

    def padding_untouched(self, cp) -> bool:
        mask = cp.ones(self.buf.shape, dtype=bool)
        inner = mask[self.offset : self.offset + self.rows * self.ld].reshape(self.rows, self.ld)
        inner[:, : self.cols] = False
        return bool(cp.isnan(self.buf[mask]).all())


def launch(b: Build, a: Mat, bm: Mat, c: Mat, m: int, k: int, n: int, np, stream=None):
    if b.tma:
        launch_tma(b, a, bm, c, m, k, n)
        return
    b.function(b.grid(m, n), b.block(), common.kernel_args(a, bm, c, m, k, n, np), shared_mem=b.dynamic_shared())


def tma_ok(*mats: Mat) -> bool:
    """Whether the copy engine can read these matrices (16-byte aligned base and row stride)."""
    return all(libcuda.tma_ok(x.ptr_view.data.ptr, x.ld) for x in mats)


def launch_tma(b: Build, a: Mat, bm: Mat, c: Mat, m: int, k: int, n: int) -> None:
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


def errors(cp, got, ref) -> dict:
    """max rel, rms rel of got vs ref (float64 arrays); inf where got has a non-finite element."""
    if not bool(cp.isfinite(got).all()):
        return {"max": math.inf, "rms": math.inf, "finite": False}
    diff = got - ref
    return {
        "max": float(cp.abs(diff).max() / max(float(cp.abs(ref).max()), 1e-300)),
        "rms": float(cp.linalg.norm(diff) / max(float(cp.linalg.norm(ref)), 1e-300)),
        "finite": True,
    }


def bound(kernel: str, k: int, rep_scale: float = 1.0) -> float:
    """Elementwise bound on |C - ref| / (|A| |B|): operand representation + fp32 accumulation.

    tc1 rounds both operands to TF32 (relative error <= 2^-11 each); tc3's
    big + small keeps x to 2^-22 and drops small*small (~2^-22); fp32
    accumulation of K terms adds at most about K * 2^-23 (generous: the tensor
    cores' internal accumulation is not IEEE round-to-nearest)."""
    rep = {"tc1": 2.0**-10, "tc3": 2.0**-20, "fast": 2.0**-22, "cublas": 2.0**-22}[kernel]
    return 1.05 * rep * rep_scale + k * 2.0**-23


# -- timing -------------------------------------------------------------------


class ClockSampler:
    """Samples the SM clock and throttle reasons with nvidia-smi in a thread while active."""

    FIELDS_TRY = (
        "clocks.sm,clocks.max.sm,clocks_event_reasons.active",
        "clocks.sm,clocks.max.sm,clocks_throttle_reasons.active",
        "clocks.sm,clocks.max.sm",
    )

    def __init__(self):
        self.smi = shutil.which("nvidia-smi")
        self.fields = None
        if self.smi:
            for f in self.FIELDS_TRY:
                r = subprocess.run(
                    [self.smi, f"--query-gpu={f}", "--format=csv,noheader,nounits", "-i", "0"],
                    capture_output=True,
                    text=True,
                )
                if r.returncode == 0 and "not supported" not in r.stdout.lower() and "invalid" not in r.stdout.lower():
                    self.fields = f
                    break
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = None

    def read(self):
        if not self.fields:
            return None
        r = subprocess.run(
            [self.smi, f"--query-gpu={self.fields}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
        )
        parts = [p.strip() for p in r.stdout.strip().split(",")]
        try:
            sm, mx = float(parts[0]), float(parts[1])
            reasons = int(parts[2], 16) if len(parts) > 2 and parts[2].startswith("0x") else 0
            return sm, mx, reasons
        except (ValueError, IndexError):
            return None

    def __enter__(self):
        self.samples = []
        self._stop.clear()

        def loop():
            while not self._stop.is_set():
                s = self.read()
                if s:
                    self.samples.append(s)
                self._stop.wait(0.1)

        if self.fields:
            self._thread = threading.Thread(target=loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join()

    def summary(self) -> dict:
        if not self.samples:
            return {"sm_mhz": None, "sm_max_mhz": None, "throttled": None, "reasons": None}
        clocks = [s[0] for s in self.samples]
        mx = self.samples[0][1]
        # 0x1 = GPU idle; anything else (power cap, thermal, ...) counts as throttling
        reasons = 0
        for s in self.samples:
            reasons |= s[2]
        active = reasons & ~0x1
        return {
            "sm_mhz": statistics.median(clocks),
            "sm_min_mhz": min(clocks),
            "sm_max_mhz": mx,
            "throttled": bool(active) or min(clocks) < 0.9 * mx,
            "reasons": hex(reasons),
            "samples": len(clocks),
        }


def time_launches(cp, fn, flush, warmup=3, batch=10, max_reps=60, min_reps=10, spread=0.02):
    """Median ms of fn, each launch timed alone after an L2 flush; batches until IQR/median < spread."""
    for _ in range(warmup):
        flush()
        fn()
    cp.cuda.runtime.deviceSynchronize()
    times = []
    while True:
        ev = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(batch)]
        for s, e in ev:
            flush()
            s.record()
            fn()
            e.record()
        ev[-1][1].synchronize()
        times += [cp.cuda.get_elapsed_time(s, e) for s, e in ev]
        if len(times) >= min_reps:
            q = statistics.quantiles(times, n=4)
            med = statistics.median(times)
            if (q[2] - q[0]) / med < spread or len(times) >= max_reps:
                break
    q = statistics.quantiles(times, n=4)
    med = statistics.median(times)
    return {"ms": med, "min": min(times), "iqr_rel": (q[2] - q[0]) / med, "reps": len(times)}


def load_function(cp, b: Build):
    if b.tma:  # pycuda and CuPy give no CUfunction to launch with a cluster: the driver API, in CuPy's context
        cp.cuda.Device().use()
        cp.empty(1)  # the primary context made current in this thread
        driver = libcuda.Driver()
        module = driver.load_module(b.cubin.read_bytes())
        return driver, driver.function(module, f"mmd_{b.kernel}", b.dynamic_shared())
    fn = cp.RawModule(path=str(b.cubin)).get_function(f"mmd_{b.kernel}")
    dyn = b.dynamic_shared()
    if dyn > 48 * 1024:
        try:
            fn.max_dynamic_shared_size_bytes = dyn
        except Exception:  # older CuPy: no setter on Function
            cp.cuda.driver.funcSetAttribute(cp.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn.ptr, dyn)
    return fn


def check_worker(label: str, quick: bool, out: Path) -> int:
    """Check one build (compiled already) on every shape and layout; print CHECKJSON."""
    import cupy as cp
    import numpy as np

    b = next(x for x in builds(False, (label,)))
    b.cubin = BUILD_DIR / f"{b.label}.cubin"
    b.function = load_function(cp, b)
    skipped = 0
    shapes = CHECK_SHAPES if not quick else CHECK_SHAPES[:8]
    st = {"ok": True, "worst_elem": 0.0, "worst_max": 0.0, "fails": [], "rows": [], "checks": 0}
    cp.random.seed(12345)  # every worker draws the same inputs
    saved = False
    for m, k, n in shapes:
        for lname, how, off in common.LAYOUTS:
            a = Mat(cp, m, k, common.ld_for(k, how), off, "rand")
            bmat = Mat(cp, k, n, common.ld_for(n, how), off, "rand")
            a64, b64 = a.view.astype(cp.float64), bmat.view.astype(cp.float64)
            ref = a64 @ b64
            absprod = cp.abs(a64) @ cp.abs(b64)
            sg = errors(cp, cp.matmul(a.view, bmat.view).astype(cp.float64), ref)  # cuBLAS SGEMM, same data
            c = Mat(cp, m, n, common.ld_for(n, how), off, "nan")
            if b.tma and not tma_ok(a, bmat):
                skipped += 1  # mmd launches the cp.async build there: the copy engine needs 16-byte rows
                continue
            launch(b, a, bmat, c, m, k, n, np)
            cp.cuda.runtime.deviceSynchronize()
            got = c.view.astype(cp.float64)
            e = errors(cp, got, ref)
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
    cmd = [sys.executable, str(Path(__file__).resolve()), "--check-worker", label, "--out", str(out)]
    if quick:
        cmd.append("--quick")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=45)
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "died": True,
            "worst_elem": math.inf,
            "worst_max": math.inf,
            "fails": ["check timed out (45 s)"],
        }
    for line in proc.stdout.splitlines():
        if line.startswith("CHECKJSON "):
            return json.loads(line[len("CHECKJSON ") :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
    return {
        "ok": False,
        "died": True,
        "worst_elem": math.inf,
        "worst_max": math.inf,
        "fails": [f"check process died (rc {proc.returncode}): " + " | ".join(tail)],
    }


def timed_row(cp, sampler, flush, case, label, kernel, fn, say) -> dict:
    """Time fn (which writes case["c"]), then run it once more on a poisoned C for its error."""
    c, size = case["c"], case["size"]
    c.buf.fill(cp.nan)
    with sampler:
        t = time_launches(cp, fn, flush)
    t.update(sampler.summary())
    c.buf.fill(cp.nan)
    fn()
    cp.cuda.runtime.deviceSynchronize()
    t["err"] = errors(cp, c.view.astype(cp.float64), case["ref"])
    row = {"kernel": label, "file": kernel, "size": size, "tflops": case["flop"] / t["ms"] / 1e9, **t}
    say(
        f"time {size:5d}^3 {label:12} {t['ms']:8.3f} ms {row['tflops']:6.1f} TFLOP/s  "
        f"iqr {t['iqr_rel'] * 100:4.1f}% reps {t['reps']:3d}  SM {t.get('sm_mhz')} MHz (min {t.get('sm_min_mhz')}) "
        f"throttled={t.get('throttled')} {t.get('reasons')}  max rel {t['err']['max']:.1e}"
    )
    return row


# -- the TF32 worker (a second process: CuPy reads CUPY_TF32 at import) ---------


def tf32_worker(args) -> int:
    import cupy as cp
    import numpy as np  # noqa: F401

    res = {"cupy_tf32": os.environ.get("CUPY_TF32"), "timing": {}, "accuracy": {}}
    l2 = cp.cuda.Device().attributes["L2CacheSize"]
    flush_buf = cp.empty(max(8 * l2, 256 << 20) // 4, dtype=cp.float32)
    flush = lambda: flush_buf.fill(1.0)  # noqa: E731
    sampler = ClockSampler()
    cp.random.seed(777)
    for n in args.sizes:
        a, b = random_pair(cp, n, n, n)
        c = cp.empty((n, n), dtype=cp.float32)
        with sampler:
            t = time_launches(cp, functools.partial(cp.matmul, a, b, out=c), flush)
        t.update(sampler.summary())
        ref = a.astype(cp.float64) @ b.astype(cp.float64)
        cp.matmul(a, b, out=c)
        t["err"] = errors(cp, c.astype(cp.float64), ref)
        res["timing"][str(n)] = t
        del a, b, c, ref
        cp.get_default_memory_pool().free_all_blocks()
    cp.random.seed(4242)
    for k in args.ks:
        a, b = random_pair(cp, ACCURACY_MN, k, ACCURACY_MN)
        ref = a.astype(cp.float64) @ b.astype(cp.float64)
        res["accuracy"][str(k)] = errors(cp, cp.matmul(a, b).astype(cp.float64), ref)
    print("TF32JSON " + json.dumps(res), flush=True)
    return 0


def random_pair(cp, m, k, n):
    """A (m x k) and B (k x n), uniform in [-1, 1], drawn the same way in both processes."""
    a = cp.random.uniform(-1.0, 1.0, (m, k), dtype=cp.float64).astype(cp.float32)
    b = cp.random.uniform(-1.0, 1.0, (k, n), dtype=cp.float64).astype(cp.float32)
    return a, b


def profile_launches(labels: list[str]) -> int:
    """One 4096^3 launch of each build in labels (compiled already), for a profiler such as ncu."""
    import cupy as cp
    import numpy as np

    cp.random.seed(5)
    n = 4096
    a, bmat = (Mat.wrap(x) for x in random_pair(cp, n, n, n))
    c = Mat(cp, n, n, n, 0, "nan")
    for label in labels:
        b = next(x for x in builds(False) if x.label == label)
        b.cubin = BUILD_DIR / f"{b.label}.cubin"
        b.function = load_function(cp, b)
        launch(b, a, bmat, c, n, n, n, np)
        cp.cuda.runtime.deviceSynchronize()
    return 0


def run_tf32_worker(sizes, ks) -> dict:
    env = dict(os.environ, CUPY_TF32="1")
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--tf32-worker",
        "--sizes",
        ",".join(map(str, sizes)),
        "--ks",
        ",".join(map(str, ks)),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    for line in proc.stdout.splitlines():
        if line.startswith("TF32JSON "):
            return json.loads(line[len("TF32JSON ") :])
    return {"error": (proc.stderr or proc.stdout)[-2000:]}


# -- main -----------------------------------------------------------------------


def main() -> int:
    ap = common.parser(__doc__)
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
        args.sizes = [int(x) for x in args.sizes.split(",") if x]
        args.ks = [int(x) for x in args.ks.split(",") if x]
        return tf32_worker(args)

    os.environ["CUPY_TF32"] = "0"  # cuBLAS SGEMM in true fp32 in this process
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build_dir = BUILD_DIR
    build_dir.mkdir(parents=True, exist_ok=True)
    say = common.logger(out / "tc_ladder.log")
    results: dict = {"builds": {}, "checks": [], "timing": [], "accuracy": {}, "env": {}}

    def dump():
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))

    t_start = time.time()
    # 1. compile
    only = tuple(x for x in args.only.split(",") if x)
    bs = builds(args.quick, only)
    bs = common.in_parallel(lambda b: compile_build(b, build_dir), bs)
    nvcc_v = subprocess.run([common.tool("nvcc") or "nvcc", "--version"], capture_output=True, text=True).stdout
    results["env"]["nvcc"] = nvcc_v.strip().splitlines()[-1] if nvcc_v.strip() else "?"
    say(f"# compiled {len(bs)} builds in {time.time() - t_start:.1f} s ({results['env']['nvcc']})")
    say(
        f"{'build':12} {'target':8} {'regs':>4} {'stack':>5} {'spill st/ld':>11} {'smem dyn':>8} "
        f"{'HGMMA':>5} {'HMMA':>5} {'LDL/STL':>7}"
    )
    good = []
    for b in bs:
        r = b.report
        results["builds"][b.label] = {
            "kernel": b.kernel,
            "arch": b.arch,
            "macros": b.macros,
            "block": b.block(),
            "tile": b.tile(),
            "dynamic_shared": b.dynamic_shared(),
            **{k: v for k, v in r.items() if k != "log"},
        }
        if not r["ok"]:
            say(f"{b.label:12} COMPILE FAILED\n{r['log']}")
            continue
        s = r.get("sass", {})
        tgt = "sm_90a" if "90a" in b.arch else b.arch.split("=")[-1]
        say(
            f"{b.label:12} {tgt:8} {r['registers']:>4} {r['stack']:>5} {r['spill_stores']:>5}/{r['spill_loads']:<5} "
            f"{b.dynamic_shared():>8} {s.get('HGMMA', '-'):>5} {s.get('HMMA', '-'):>5} {s.get('LDL/STL', '-'):>7}"
            + (f"  warnings: {r['warnings']}" if r.get("warnings") else "")
        )
        good.append(b)
    dump()
    if args.compile_only:
        return 0

    import cupy as cp
    import numpy as np

    gpu, l2, sms, props = common.gpu_facts(cp)
    cc = f"{props['major']}.{props['minor']}"
    results["env"].update(gpu=gpu, sms=sms, l2=l2, cc=cc, cupy=cp.__version__)
    sampler = ClockSampler()
    idle = sampler.read()
    say(
        f"# GPU {gpu} (cc {cc}), {sms} SMs, L2 {l2 >> 20} MiB, CuPy {cp.__version__}, "
        f"SM clock idle {idle[0] if idle else '?'} / max {idle[1] if idle else '?'} MHz, "
        f"nvidia-smi fields {sampler.fields}"
    )

    for b in good:
        b.function = load_function(cp, b)

    # 2. check, each build in its own process: a kernel that faults (a sticky
    # CUDA error) cannot take the rest of the run down with it
    t0 = time.time()
    shapes = CHECK_SHAPES if not args.quick else CHECK_SHAPES[:8]
    status = {}
    for b in good:
        status[b.label] = run_check_worker(b.label, args.quick, out)
    say(f"# checks: {len(shapes)} shapes x {len(common.LAYOUTS)} layouts per build, {time.time() - t0:.1f} s")
    for b in good:
        st = status[b.label]
        say(
            f"check {b.label:12} {'PASS' if st['ok'] else 'FAIL'}  worst elementwise |C-ref|/(|A||B|) "
            f"{st['worst_elem']:.2e}  worst max rel {st['worst_max']:.2e}  ({st.get('checks', 0)} checks"
            + (f", {st['skipped']} unaligned layouts left to the cp.async build)" if st.get("skipped") else ")")
            + ("" if st["ok"] else "\n    " + "\n    ".join(st["fails"][:8]))
        )
        results["checks"] += st.pop("rows", [])
    results["check_summary"] = status
    dump()

    # 3. time
    flush_buf = cp.empty(max(8 * l2, 256 << 20) // 4, dtype=cp.float32)
    flush = lambda: flush_buf.fill(1.0)  # noqa: E731
    sizes = TIMED_SIZES if not args.quick else TIMED_SIZES[:1]
    rows = []
    cp.random.seed(777)  # the TF32 worker draws the same inputs
    for size in sizes:
        m = k = n = size
        flop = 2.0 * m * k * n
        a, bmat = (Mat.wrap(x) for x in random_pair(cp, m, k, n))
        c = Mat(cp, m, n, n, 0, "nan")
        ref = a.view.astype(cp.float64) @ bmat.view.astype(cp.float64)

        case = {"size": size, "flop": flop, "c": c, "ref": ref}
        sgemm = functools.partial(cp.matmul, a.view, bmat.view, out=c.view)
        rows.append(timed_row(cp, sampler, flush, case, "cublas_sgemm", "cublas", sgemm, say))
        for b in good:
            # a build that gave wrong numbers is still timed (flagged); one whose check died is not
            if not b.timed or size not in b.sizes or status[b.label].get("died"):
                continue
            fn = functools.partial(launch, b, a, bmat, c, m, k, n, np)
            row = timed_row(cp, sampler, flush, case, b.label, b.kernel, fn, say)
            row["check_ok"] = status[b.label]["ok"]
            rows.append(row)
        rows.append(timed_row(cp, sampler, flush, case, "cublas_sgemm", "cublas", sgemm, say))  # again: the drift
        del a, bmat, c, ref
        cp.get_default_memory_pool().free_all_blocks()
    results["timing"] = rows
    dump()

    # 4. accuracy vs K
    cp.random.seed(4242)  # the TF32 worker draws the same inputs
    acc_builds = [b for b in good if b.label in ACC_COLUMNS and not status[b.label].get("died")]
    acc = {}
    for kk in ACCURACY_KS:
        a, bmat = (Mat.wrap(x) for x in random_pair(cp, ACCURACY_MN, kk, ACCURACY_MN))
        ref = a.view.astype(cp.float64) @ bmat.view.astype(cp.float64)
        acc[kk] = {"cublas_sgemm": errors(cp, cp.matmul(a.view, bmat.view).astype(cp.float64), ref)}
        for b in acc_builds:
            c = Mat(cp, ACCURACY_MN, ACCURACY_MN, ACCURACY_MN, 0, "nan")
            launch(b, a, bmat, c, ACCURACY_MN, kk, ACCURACY_MN, np)
            cp.cuda.runtime.deviceSynchronize()
            acc[kk][b.label] = errors(cp, c.view.astype(cp.float64), ref)
    results["accuracy"] = {str(k): v for k, v in acc.items()}
    dump()

    # cuBLAS TF32, in its own process
    tf = run_tf32_worker(sizes, ACCURACY_KS)
    results["tf32_worker"] = tf
    if "timing" in tf:
        for s, t in tf["timing"].items():
            size = int(s)
            rows.append(
                {"kernel": "cublas_tf32", "file": "cublas", "size": size, "tflops": 2.0 * size**3 / t["ms"] / 1e9, **t}
            )
            say(
                f"time {size:5d}^3 {'cublas_tf32':12} {t['ms']:8.3f} ms  "
                f"iqr {t['iqr_rel'] * 100:4.1f}% reps {t['reps']} "
                f"SM {t.get('sm_mhz')} MHz throttled={t.get('throttled')}  max rel {t['err']['max']:.1e}"
            )
        for s, e in tf.get("accuracy", {}).items():
            acc.setdefault(int(s), {})["cublas_tf32"] = e
    else:
        say(f"# cuBLAS TF32 worker failed: {tf.get('error')}")
    results["accuracy"] = {str(k): v for k, v in acc.items()}
    results["wall_s"] = time.time() - t_start
    dump()

    # tables last
    cols = [c_ for c_ in ACC_COLUMNS if any(c_ in acc[kk] for kk in acc)]
    for what in ("max", "rms"):
        say("")
        say(f"accuracy vs float64, M = N = {ACCURACY_MN}, inputs uniform [-1, 1]: {what} rel")
        say(f"{'K':>5} " + " ".join(f"{c_:>12}" for c_ in cols))
        for kk in sorted(acc):
            cells = [f"{acc[kk][c_][what]:.1e}" if c_ in acc[kk] else "-" for c_ in cols]
            say(f"{kk:>5} " + " ".join(f"{x:>12}" for x in cells))
    say("")
    say(
        f"correctness ({len(shapes)} shapes x {len(common.LAYOUTS)} layouts, C poisoned with NaN, "
        "every element checked): " + ", ".join(f"{b.label} {'PASS' if status[b.label]['ok'] else 'FAIL'}" for b in good)
    )
    say("")
    say(f"GPU {gpu}; CUDA events, L2 flushed before each launch, median of reps (IQR < 2% or capped)")
    say(
        f"{'kernel':13} {'size':>6} {'ms':>8} {'TFLOP/s':>8} {'x SGEMM':>8} {'max rel':>8} {'rms rel':>8} "
        f"{'SM MHz':>7} thr"
    )
    for size in sizes:
        sg = [r for r in rows if r["kernel"] == "cublas_sgemm" and r["size"] == size]
        base = statistics.mean(r["ms"] for r in sg) if sg else None  # before and after the kernels
        seen = set()
        for r in rows:
            if r["size"] != size or (r["kernel"] == "cublas_sgemm" and r["kernel"] in seen):
                continue
            seen.add(r["kernel"])
            ratio = base / r["ms"] if base else float("nan")
            name = r["kernel"] + ("!" if r.get("check_ok") is False else "")
            say(
                f"{name:13} {size:>6} {r['ms']:8.3f} {r['tflops']:8.1f} {ratio:8.2f} {r['err']['max']:8.1e} "
                f"{r['err']['rms']:8.1e} {r.get('sm_mhz')!s:>7} {'Y' if r.get('throttled') else 'n'}"
            )
        if len(sg) > 1:
            say(f"{'(sgemm again)':13} {size:>6} {sg[-1]['ms']:8.3f}   (x SGEMM uses the mean of both SGEMM runs)")
    say("(! = failed its correctness check; thr = throttled: SM clock under 90 % of max or a throttle reason set)")
    say(f"# wall {time.time() - t_start:.0f} s")
    return 0 if all(status[b.label]["ok"] for b in good) else 1


if __name__ == "__main__":
    sys.exit(main())
