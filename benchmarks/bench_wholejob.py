#!/usr/bin/env python3
"""The whole job against the machine's floor: every phase of a job, and what the hardware needs for it.

    python benchmarks/bench_wholejob.py [--tree NAME=PATH ...] [--sizes 1024 2048 4096] [--repeat 5]
        [--small 1000 3000] [--backend cuda] [--kernel fast] [--out DIR]

It drives mmd only through its command line and its sidecars (``mmd run``,
``mmd serve``), so it measures any checkout the same way: ``--tree
before=PATH`` puts an older tree in the same run, side by side (these
machines are noisy: compare versions in one run). For each tree:

* **one-shot**: ``mmd run`` of an N×N file as a process, ``--repeat`` times
  after a warm-up (kernel cache filled), the trees taking turns: the process's wall time and the
  sidecar's phases (medians);
* **daemon**: one ``mmd serve`` (durable commits, as shipped); each file is
  renamed into the inbox (a complete drop) and is done when its
  ``.timing.yaml`` appears: drop→sidecar latency and the sidecar's phases;
* **first job**: a fresh ``mmd serve`` per tree and round (``--first``
  rounds); 2 s after it says READY=1 (sd_notify, to a socket of this
  script's), the largest size is renamed in: drop→sidecar, as a student's
  first job after a restart sees it;
* **small jobs**: 32×32 drops one at a time (p50, p95 of drop→sidecar), then
  bursts of ``--small`` files (default 1000 and 3000) renamed in at once,
  ``--bursts`` times each (jobs per second, first rename to last sidecar;
  median): a scan of the inbox costs more the more files wait in it.

Every measurement goes round the trees in turn, and the daemons of all the
trees stay up side by side (an idle one costs nothing).

And once, the **floors** on this machine: a bare Python and one that
imports numpy, pycuda's driver init and context; reading the input from the
page cache into page-locked memory; a host memcpy; sha256 alone and two at
once; writing the output with and without fsync; a small file's
commit (write, fsync, rename) and a folder's fsync; loading a cached cubin;
H2D and D2H of the input and the output through page-locked memory. The
table printed last puts each phase beside its floor.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import harness  # beside this script: its folder is first on sys.path
import numpy as np
from harness import OUT, ROOT, SMALL, Served, Tree, median, pct, square_input, tree_env

PHASES = ("read", "parse", "compile", "malloc", "h2d", "kernel", "d2h", "free", "cuda", "emit", "write", "overall")


# -- one tree, through its command line ----------------------------------------


def sidecar_timings(path: Path) -> dict[str, float]:
    import yaml

    rec = yaml.safe_load(path.read_text())
    if rec.get("status") != "ok":
        raise SystemExit(f"{path}: {rec.get('error')}")
    return {k: float(v) for k, v in rec["timings_ms"].items() if v is not None}


def one_shot(tree: Tree, work: Path, src: Path) -> tuple[float, dict[str, float]]:
    """`mmd run` of ``src`` as a process: its wall time (ms) and its sidecar's phases."""
    out = work / f"oneshot-{tree.name}.out"
    out.unlink(missing_ok=True)  # mmd run replaces no output (--force, which an older tree does not know)
    wall, done = tree.run("run", str(src), "-o", str(out), cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"{tree.name}: mmd run failed: {done.stderr.strip()[-500:]}")
    return wall * 1e3, sidecar_timings(out.with_name(out.stem + ".timing.yaml"))


def summary(key: str, samples: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Medians of (latency, phases) samples: ``key`` for the latency, then each phase."""
    return {
        key: median(s[0] for s in samples),
        **{k: median(s[1][k] for s in samples if k in s[1]) for k in PHASES},
    }


def daemon_job(served: Served, data: bytes, stem: str) -> tuple[float, dict[str, float]]:
    """Drop→sidecar (ms) of one file on a warm daemon, and the sidecar's phases."""
    t0, sidecar = served.drop(data, stem)
    done = served.wait(sidecar)
    timings = sidecar_timings(sidecar)
    for p in served.root.glob("outbox/*.out"):
        p.unlink()
    return (done - t0) * 1e3, timings


def small_drop(served: Served) -> tuple[float, dict[str, float]]:
    """One 32×32 job dropped on an idle daemon: drop→sidecar (ms) and its sidecar's phases."""
    t0, sc = served.drop(SMALL)
    return (served.wait(sc) - t0) * 1e3, sidecar_timings(sc)


def small_burst(served: Served, burst: int, round_: int) -> float:
    """``burst`` 32×32 files renamed in at once: jobs per second, first rename to last sidecar."""
    names = []
    for i in range(burst):
        src = served.root / "src" / f"b{round_}-{i:06d}.txt"
        src.write_bytes(SMALL)
        names.append(src)
    t0 = time.perf_counter()
    for src in names:
        os.rename(src, served.root / "inbox" / src.name)
    for src in names:
        served.wait(served.root / "outbox" / f"{src.stem}.timing.yaml", 600)
    return burst / (time.perf_counter() - t0)


# -- the floors ------------------------------------------------------------------------


def timed(fn: Any, repeat: int = 5) -> float:
    """Median milliseconds of ``fn()`` (one call first, untimed)."""
    return median(harness.seconds(fn, repeat, warmup=1)) * 1e3


def floors(src: Path, out_bytes: int, work: Path, kernel_cu: Path | None) -> dict[str, float]:
    f: dict[str, float] = {}
    py = sys.executable
    f["python_start"] = timed(lambda: subprocess.run([py, "-c", "pass"], check=True))
    f["python_numpy"] = timed(lambda: subprocess.run([py, "-c", "import numpy"], check=True))
    size = src.stat().st_size
    data = src.read_bytes()
    out_data = np.frombuffer(os.urandom(out_bytes), np.uint8)
    f["read_bytes"] = timed(src.read_bytes)
    f["memcpy_in"] = timed(lambda: np.frombuffer(data, np.uint8).copy())
    f["memcpy_out"] = timed(lambda: out_data.copy())
    f["sha256_in"] = timed(lambda: hashlib.sha256(data).digest())
    f["sha256_out"] = timed(lambda: hashlib.sha256(out_data).digest())

    def two_hashes() -> None:
        t = threading.Thread(target=lambda: hashlib.sha256(data).digest())
        t.start()
        hashlib.sha256(out_data).digest()
        t.join()

    f["sha256_both_parallel"] = timed(two_hashes)
    target = work / "floor.out"

    def write(sync: bool) -> None:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, out_data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    f["write_out_fsync"] = timed(lambda: write(True))
    f["write_out"] = timed(lambda: write(False))
    target.unlink()
    # A small job's fixed costs: each commit (output, sidecar) writes a few KB and
    # fsyncs it, and one fsync of the outbox makes both renames durable.
    small = work / "floor.small"
    small_data = b"x" * (32 * 7 * 32)

    def commit_small() -> None:
        fd = os.open(small, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, small_data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(small, work / "floor.small.done")

    def fsync_folder() -> None:
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    f["small_commit_fsync"] = timed(commit_small, 20)
    f["folder_fsync"] = timed(fsync_folder, 20)
    try:
        import pycuda.driver as cuda
    except ImportError:
        return f
    init = "import pycuda.driver as c; c.init(); x = c.Device(0).retain_primary_context(); x.push(); x.pop()"
    f["pycuda_init_context"] = timed(lambda: subprocess.run([py, "-c", init], check=True), 3)
    cuda.init()
    ctx = cuda.Device(0).retain_primary_context()
    ctx.push()
    try:
        pinned = cuda.pagelocked_empty(size, np.uint8)

        def read_pinned() -> None:
            with open(src, "rb", buffering=0) as fh:
                fh.readinto(memoryview(pinned))

        f["read_to_pinned"] = timed(read_pinned)
        dev_in = cuda.mem_alloc(size)
        dev_out = cuda.mem_alloc(out_bytes)
        host_out = cuda.pagelocked_empty(out_bytes, np.uint8)
        stream = cuda.Stream()

        def copy(fn: Any) -> float:
            times = []
            for _ in range(6):
                a, b = cuda.Event(), cuda.Event()
                a.record(stream)
                fn()
                b.record(stream)
                b.synchronize()
                times.append(a.time_till(b))
            return median(times[1:])

        f["h2d_in"] = copy(lambda: cuda.memcpy_htod_async(dev_in, pinned, stream))
        f["d2h_out"] = copy(lambda: cuda.memcpy_dtoh_async(host_out, dev_out, stream))
        nvcc = harness.tool("nvcc")
        if kernel_cu is not None and nvcc:
            major, minor = cuda.Device(0).compute_capability()
            cubin = work / "floor.cubin"
            subprocess.run([nvcc, "--cubin", f"-arch=sm_{major}{minor}", "-O3", "-o", str(cubin), str(kernel_cu)],
                           check=True)  # fmt: skip
            blob = cubin.read_bytes()
            f["module_load"] = timed(lambda: cuda.module_from_buffer(blob), 10)
        dev_in.free()
        dev_out.free()
    finally:
        ctx.pop()
    return f


# -- the report ------------------------------------------------------------------------

#: Each phase's floor: what the machine needs at least for it (None: no floor of its own).
PHASE_FLOORS = {
    "read": ("read_to_pinned", "read_bytes"),
    "compile": ("module_load",),
    "h2d": ("h2d_in",),
    "d2h": ("d2h_out",),
    "write": ("write_out_fsync",),
}


def floor_of(phase: str, fl: dict[str, float]) -> float | None:
    for key in PHASE_FLOORS.get(phase, ()):
        if key in fl:
            return fl[key]
    return None


def table(results: dict[str, Any], floors_by_size: dict[int, dict[str, float]], sizes: list[int]) -> list[str]:
    trees = list(results)
    lines = []
    for n in sizes:
        fl = floors_by_size[n]
        lines.append(f"\n{n}x{n}  (ms, medians)")
        head = f"{'':24}" + "".join(f"{t:>14}" for t in trees) + f"{'floor':>10}{'ratio':>8}"
        lines.append(head)
        for part in ("oneshot", "first", "daemon"):
            keys = ["process_ms"] if part == "oneshot" else ["drop_to_sidecar_ms"]
            for key in keys + list(PHASES):
                vals = [results[t][part].get(n, {}).get(key) for t in trees]
                if all(v is None or (isinstance(v, float) and np.isnan(v)) for v in vals):
                    continue
                floor = floor_of(key, fl)
                last = vals[-1]
                ratio = f"{last / floor:8.2f}" if floor and last is not None else f"{'':8}"
                fl_text = f"{floor:10.2f}" if floor else f"{'':10}"
                row = f"{part + ' ' + key:24}" + "".join(
                    f"{v:14.2f}" if v is not None and not np.isnan(v) else f"{'-':>14}" for v in vals
                )
                lines.append(row + fl_text + ratio)
    lines.append("\nsmall 32x32 jobs, daemon")
    lines.append(f"{'':24}" + "".join(f"{t:>14}" for t in trees))
    for key in results[trees[-1]]["small"]:
        lines.append(f"{key:24}" + "".join(f"{results[t]['small'].get(key, float('nan')):14.2f}" for t in trees))
    for n in sizes:
        lines.append(f"\nfloors at {n} (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in floors_by_size[n].items()))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_tree_options(ap, "another checkout to measure", no_now=False)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--small", type=int, nargs="*", default=[1000, 3000], help="32x32 files renamed in at once")
    ap.add_argument("--first", type=int, default=3, help="rounds of a fresh daemon's first job (largest size)")
    ap.add_argument("--bursts", type=int, default=2, help="rounds of each --small burst (median)")
    ap.add_argument("--drops", type=int, default=200, help="32x32 drops one at a time")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--kernel", default="fast")
    ap.add_argument("--site", default="", help="extra PYTHONPATH entry (the device machine's wheels)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="mmd-wholejob-"))
    work.mkdir(parents=True, exist_ok=True)
    trees = harness.trees(ap, args.tree)
    inputs = {n: square_input(work / f"in-{n}.txt", n, n) for n in args.sizes}
    # Every measurement goes round the trees in turn, so that a slow spell of
    # the machine (writeback, a neighbour) falls on all of them alike.
    built = [Tree(name, path, tree_env(path, work, name, args.backend, args.kernel, args.site)) for name, path in trees]
    results: dict[str, Any] = {t.name: {"oneshot": {}, "first": {}, "daemon": {}, "small": {}} for t in built}
    for n, src in inputs.items():
        samples: dict[str, list[tuple[float, dict[str, float]]]] = {t.name: [] for t in built}
        for i in range(args.repeat + 1):
            for t in built:
                sample = one_shot(t, work, src)
                if i:  # the first round fills each tree's kernel cache
                    samples[t.name].append(sample)
        for t in built:
            results[t.name]["oneshot"][n] = summary("process_ms", samples[t.name])
            print(f"{t.name} one-shot {n}: {json.dumps(results[t.name]['oneshot'][n])}", flush=True)
    biggest = max(inputs)
    firsts: dict[str, list[tuple[float, dict[str, float]]]] = {t.name: [] for t in built}
    for r in range(args.first):
        for t in built:
            fresh = Served(t, work, root=work / f"spool-{t.name}-first", start=False)
            try:
                fresh.start_ready()
                time.sleep(2.0)
                firsts[t.name].append(daemon_job(fresh, inputs[biggest].read_bytes(), f"first-{r}"))
            finally:
                fresh.stop()
    for t in built:
        if firsts[t.name]:
            results[t.name]["first"] = {biggest: summary("drop_to_sidecar_ms", firsts[t.name])}
            print(f"{t.name} first job {biggest}: {json.dumps(results[t.name]['first'][biggest])}", flush=True)
    served = [Served(t, work) for t in built]
    try:
        for s in served:
            s.wait(s.drop(inputs[min(inputs)].read_bytes(), "warm")[1])  # kernels built, buffers made
        for n, src in inputs.items():
            data = src.read_bytes()
            samples = {s.name: [] for s in served}
            for i in range(args.repeat):
                for s in served:
                    samples[s.name].append(daemon_job(s, data, f"{src.stem}-{i}"))
            for s in served:
                results[s.name]["daemon"][n] = summary("drop_to_sidecar_ms", samples[s.name])
                print(f"{s.name} daemon {n}: {json.dumps(results[s.name]['daemon'][n])}", flush=True)
        drops: dict[str, list[tuple[float, dict[str, float]]]] = {s.name: [] for s in served}
        for _ in range(0, args.drops, 10):
            for s in served:
                drops[s.name] += [small_drop(s) for _ in range(10)]
        rates: dict[str, dict[int, list[float]]] = {s.name: {b: [] for b in args.small} for s in served}
        for r in range(args.bursts):
            for burst in args.small:
                for s in served:
                    rates[s.name][burst].append(small_burst(s, burst, r))
        for s in served if args.drops else ():
            lat = [d[0] for d in drops[s.name]]
            # where a small job's time goes: the sidecar's phases (medians), beside drop→sidecar
            phases = {f"{k}_ms": v for k, v in summary("", drops[s.name]).items() if k and not math.isnan(v)}
            results[s.name]["small"] = {
                "p50_ms": pct(lat, 50),
                "p95_ms": pct(lat, 95),
                **{f"jobs_per_s_{b}": median(rates[s.name][b]) for b in args.small},
                **phases,
            }
            print(f"{s.name} small: {json.dumps(results[s.name]['small'])}", flush=True)
    finally:
        for s in served:
            s.stop()
    kernel_cu = ROOT / "kernels" / "fast.cu"
    fl = {
        n: floors(src, n * (6 * n + 1) + len(f"{n}\n"), work, kernel_cu if kernel_cu.exists() else None)
        for n, src in inputs.items()
    }
    lines = table(results, fl, args.sizes)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "wholejob.json").write_text(json.dumps({"results": results, "floors": fl}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
