#!/usr/bin/env python3
"""One GPU call: versions, the GPU tests, then kernel timings at 4096, table last.

    PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py [--size 4096] [--repeats 5] [--out DIR] [--no-tests]

1. prints the device, driver, toolkit and library versions;
2. runs ``pytest -m gpu tests/gpu`` (correctness: every kernel × tile × size
   against float64, poisoned outputs, memory modes, tile 64, leaks);
3. times every kernel at tiles 4/8/16/32 and cuBLAS at size³ with CUDA events
   (one warm-up launch, median of ``--repeats``) on buffers allocated once,
   checks each result against cuBLAS, and times one whole backend job per
   memory mode to show the five phases;
4. prints a compact table last (and writes it with the raw numbers to --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mmd import kernels as registry  # noqa: E402
from mmd.backends.base import CUDA_PHASES, MultiplyRequest  # noqa: E402
from mmd.backends.cuda import CudaBackend  # noqa: E402
from mmd.config import MEMORY_MODES  # noqa: E402


def sh(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"({cmd[0]}: {exc})"


def print_versions(backend: CudaBackend) -> None:
    session = backend.session
    print(f"device: {backend.device_name()}")
    limits = backend.limits
    print(
        f"limits: {limits.max_threads_per_block} threads, {limits.max_shared_per_block} B shared, "
        f"{limits.max_registers_per_block} registers per block; {limits.total_memory / 2**30:.1f} GiB"
    )
    print(f"versions: {session.device.versions()} python {platform.python_version()} numpy {np.__version__}")
    nvcc = shutil.which("nvcc")
    print(f"nvcc: {nvcc} {sh(nvcc, '--version').splitlines()[-1] if nvcc else ''}")
    query = "--query-gpu=name,driver_version,clocks.sm,clocks.mem"
    print(f"nvidia-smi: {sh('nvidia-smi', query, '--format=csv,noheader')}")


def run_tests(out: Path | None) -> int:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", str(ROOT / "tests" / "gpu")]
    if out is not None:
        cmd += [f"--junitxml={out / 'gpu-tests.xml'}"]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out is not None:
        (out / "gpu-tests.log").write_text(proc.stdout + proc.stderr)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    for line in failed[:30]:
        print(line)
    print(f"gpu tests: {lines[-1] if lines else '(no output)'} (exit {proc.returncode})", flush=True)
    return proc.returncode


def time_kernels(backend: CudaBackend, size: int, repeats: int) -> list[dict]:
    session = backend.session
    rng = np.random.default_rng(2026)
    a = rng.uniform(-1, 1, (size, size)).astype(np.float32)
    b = rng.uniform(-1, 1, (size, size)).astype(np.float32)
    da, db, dc = (session.memory.alloc("device", size, size) for _ in range(3))
    rows: list[dict] = []
    try:
        session.memory.upload(da, a, "a")
        session.memory.upload(db, b, "b")
        session.stream.synchronize()
        reference = np.empty(0)
        cases = [("cublas", None)]
        for k in registry.SOURCE_KERNELS:
            cases += [(k, t) for t in registry.TILES] if registry.get(k).uses_tile else [(k, None)]
        for kernel, tile in cases:
            spec = registry.get(kernel)
            if not spec.compiled:

                def step(tf32: bool = spec.precision == "tf32") -> None:
                    session.stream.multiply(None, da, db, dc, tf32=tf32)

                regs = None
            else:
                compiled, _ = session.modules.compile(spec, tile or 0)
                regs = compiled.registers

                def step(compiled=compiled) -> None:
                    session.stream.multiply(compiled, da, db, dc)

            session.memory.fill(dc, float("nan"))
            step()  # warm-up
            times = []
            for _ in range(repeats):
                timer = session.stream.phase_timer()
                with timer.phase("kernel"):
                    step()
                times.append(timer.elapsed_ms()["kernel"])
            c = session.memory.download(dc, "c")
            if kernel == "cublas":
                reference = c.astype(np.float64)
                # cuBLAS itself against float64 on a band of rows (the whole
                # product in float64 would cost the host seconds).
                band = slice(0, min(size, 256))
                exact = a[band].astype(np.float64) @ b.astype(np.float64)
                err = float(np.linalg.norm(reference[band] - exact) / np.linalg.norm(exact))
            else:
                err = float(np.linalg.norm(c - reference) / np.linalg.norm(reference))
            ms = statistics.median(times)
            row = {
                "kernel": kernel, "tile": tile, "ms": ms, "min_ms": min(times), "max_ms": max(times),
                "tflops": 2 * size**3 / ms / 1e9, "rel_err_vs_cublas": err, "registers": regs,
            }  # fmt: skip
            rows.append(row)
            print(
                f"  {kernel:8s} tile {tile or '-':>2}: {ms:9.3f} ms  {row['tflops']:6.2f} TFLOP/s  err {err:.1e}",
                flush=True,
            )
    finally:
        for matrix in (da, db, dc):
            session.memory.free(matrix)
    return rows


def time_phases(backend: CudaBackend, size: int) -> list[dict]:
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (size, size)).astype(np.float32)
    b = rng.uniform(-1, 1, (size, size)).astype(np.float32)
    rows = []
    for memory in MEMORY_MODES:
        request = MultiplyRequest(kernel="tiled", tile=32, memory=memory)
        backend.multiply(a, b, request)  # warm-up
        product = backend.multiply(a, b, request)
        rows.append({"memory": memory, **product.timings_ms})
    return rows


def table(rows: list[dict], phases: list[dict], size: int, device: str) -> str:
    out = [f"kernel ms at {size}x{size}x{size} (median of repeats, CUDA events) on {device}"]
    tiles = registry.TILES
    out.append(f"{'kernel':11s}" + "".join(f"{'tile ' + str(t):>11s}" for t in tiles) + f"{'best TFLOP/s':>14s}")
    by = {(r["kernel"], r["tile"]): r for r in rows}
    for kernel in registry.SOURCE_KERNELS:
        if not registry.get(kernel).uses_tile:
            c = by.get((kernel, None))
            if c:
                out.append(f"{kernel:11s}{c['ms']:11.2f}{'(fixed block)':>33s}{c['tflops']:14.2f}")
            continue
        cells = [by.get((kernel, t)) for t in tiles]
        best = max((c["tflops"] for c in cells if c), default=float("nan"))
        ms_cells = "".join(f"{c['ms']:11.2f}" if c else f"{'-':>11s}" for c in cells)
        out.append(f"{kernel:11s}{ms_cells}{best:14.2f}")
    cub = by.get(("cublas", None))
    if cub:
        out.append(f"{'cublas':11s}{cub['ms']:11.2f}{'(library)':>33s}{cub['tflops']:14.2f}")
    worst = max((r["rel_err_vs_cublas"] for r in rows if r["kernel"] != "cublas"), default=float("nan"))
    cub_err = cub["rel_err_vs_cublas"] if cub else float("nan")
    out.append(
        f"largest relative difference of a kernel from cuBLAS: {worst:.1e}; "
        f"cuBLAS vs float64 (first 256 rows): {cub_err:.1e}"
    )
    if phases:
        out.append(f"whole job, tiled tile 32, {size}^3, ms: " + " ".join(f"{p:>7s}" for p in (*CUDA_PHASES, "cuda")))
        for p in phases:
            values = " ".join(f"{p.get(k, float('nan')):7.2f}" for k in (*CUDA_PHASES, "cuda"))
            out.append(f"  {p['memory']:8s}" + " " * 29 + values)
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    parser.add_argument("--no-tests", action="store_true")
    args = parser.parse_args()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)

    tests_rc = 0
    if not args.no_tests:
        tests_rc = run_tests(args.out)

    backend = CudaBackend(device=0)
    try:
        print_versions(backend)
        print(f"timing at {args.size}:", flush=True)
        rows = time_kernels(backend, args.size, args.repeats)
        phases = time_phases(backend, args.size)
        text = table(rows, phases, args.size, backend.device_name())
    finally:
        backend.close()
    if args.out is not None:
        (args.out / "timings.json").write_text(json.dumps({"kernels": rows, "phases": phases}, indent=1))
        (args.out / "timings.txt").write_text(text + "\n")
    print()
    print(text)
    return 1 if tests_rc else 0


if __name__ == "__main__":
    sys.exit(main())
