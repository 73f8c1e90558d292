"""Steady-state throughput of `mmd serve --once` with one worker per device: devices [0] against [0, 1].

    python benchmarks/bench_devices.py --n 4096 --jobs 32 --devices 0 0,1 [--backend cuda] [--kernel tiled]
        [--gil-probe 4]

One input is generated (seeded) and copied ``--jobs`` times into a fresh
inbox for each device list (copies, not hard links: the spool refuses a file
with two links); each run is one `python -m mmd serve --once` process, and
its folder is removed before the next (a 4096 input is 185 MB, its output
about 117 MB). A first run of one small job fills the kernel cache, so no
measured run compiles.

Throughput comes from the sidecars, not from the process's wall time (which
includes Python start, imports and CUDA set-up): each job's claim time is its
``finished_at`` less its ``overall`` (claim to committed output).

* ``batch jobs/s``: jobs / (last finish - first claim);
* ``steady jobs/s``: the first job of each device is left out (it loads the
  text kernels into its context): jobs finished after the last of those
  first finishes / (last finish - that finish).

A second table gives the per-phase medians (ms) from the sidecars: read,
parse (upload + GPU parse), kernel, emit (GPU format + download), write
(output commit with sha256), overall, and ``other`` = overall less those
(claim, the input's sha256 wait, the sidecar).

``--gil-probe K`` runs K jobs in this process on device 0 with a second
thread that sleeps 0.2 ms at a time and notes how late it wakes: a late wake
is time the job thread held the GIL. It prints, per job, overall ms, the
summed lateness and the longest single one.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness  # beside this script: its folder is first on sys.path
import yaml
from child_env import child_env
from harness import Column, Table, median

PHASES = ("read", "parse", "kernel", "emit", "write", "overall")


THROUGHPUT = Table(
    (
        Column("devices", 8, "<"),
        Column("ok", 3),
        Column("err", 3),
        Column("wall s", 7, spec=".2f"),
        Column("batch j/s", 9, spec=".2f"),
        Column("steady j/s", 10, spec=".2f"),
        Column("(jobs)", 6),
        Column("speed-up", 8),
        Column(" jobs per device", 0, "<"),
    )
)
PHASE_TABLE = Table((Column("devices", 8, "<"), *(Column(k, 8, spec=".1f") for k in (*PHASES, "other"))))


def serve_once(root: Path, devices: str, args: argparse.Namespace, cache: Path) -> float:
    env = child_env(
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


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def throughput(recs: list[dict]) -> tuple[float, float, int]:
    """(batch jobs/s, steady jobs/s, jobs in the steady window) from the sidecars."""
    fin = [_ts(r["finished_at"]) for r in recs]
    claim = [f - r["timings_ms"]["overall"] / 1e3 for f, r in zip(fin, recs, strict=True)]
    batch = len(recs) / (max(fin) - min(claim))
    first: dict = {}
    for f, r in sorted(zip(fin, recs, strict=True), key=lambda x: x[0]):
        first.setdefault(r.get("device_index"), f)
    start = max(first.values())
    later = [f for f in fin if f > start]
    steady = len(later) / (max(fin) - start) if later else float("nan")
    return batch, steady, len(later)


def phases(recs: list[dict]) -> dict[str, float]:
    out = {key: median(r["timings_ms"][key] for r in recs if r["timings_ms"].get(key) is not None) for key in PHASES}
    out["other"] = median(
        r["timings_ms"]["overall"] - sum(r["timings_ms"].get(k) or 0.0 for k in PHASES[:-1]) for r in recs
    )
    return out


def gil_probe(source: Path, args: argparse.Namespace, cache: Path, count: int, base: Path) -> list[str]:
    """Run ``count`` jobs here on device 0 while a sleeper thread measures how long the GIL is held."""
    from mmd.backends import open_backend
    from mmd.config import Settings
    from mmd.job import describe
    from mmd.pipeline import run_job

    backend, _ = open_backend(args.backend, 0, kernel_cache=cache)
    settings = Settings(kernel=args.kernel, durable=False)
    lines = []
    try:
        for i in range(count + 1):  # the first one loads the kernels: not shown
            late: list[float] = []
            stop = threading.Event()

            def sleeper(late: list[float] = late, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    time.sleep(0.0002)
                    late.append(time.perf_counter() - t0 - 0.0002)

            t = threading.Thread(target=sleeper)
            t.start()
            time.sleep(0.01)
            res = run_job(describe(source, base / "probe.out", settings), lambda _s: backend)
            stop.set()
            t.join()
            if res.error is not None:
                sys.exit(f"probe job failed: {res.error.reason}")
            if i == 0:
                continue
            held = sum(x for x in late if x > 0.0005)
            lines.append(
                f"probe job {i}: overall {res.record.timings_ms.overall or 0:7.1f} ms, GIL held ~{held * 1e3:6.1f} ms "
                f"(longest {max(late, default=0) * 1e3:5.1f} ms)"
            )
            for p in base.glob("probe.*"):
                p.unlink()
    finally:
        backend.close()
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--jobs", type=int, default=32)
    p.add_argument("--devices", nargs="+", default=["0", "0,1"])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--kernel", default="tiled")
    p.add_argument("--gil-probe", type=int, default=0, metavar="K")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mmd-devices-"))
    cache = base / "kernels"
    t0 = time.perf_counter()
    source = base / "m.txt"
    harness.write_input(source, args.n, args.n, args.n, 1)
    print(f"generated {args.n}x{args.n} pair: {source.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
    warm = base / "warm"
    (warm / "inbox").mkdir(parents=True)
    (warm / "outbox").mkdir()  # mmd serve makes no folder it is not told to (--create)
    (warm / "inbox" / "w.txt").write_bytes(harness.input_bytes(64, 64, 64, 2))
    serve_once(warm, args.devices[-1], args, cache)
    shutil.rmtree(warm)
    probe = gil_probe(source, args, cache, args.gil_probe, base) if args.gil_probe else []
    rows = []
    for devices in args.devices:
        root = base / f"run-{devices.replace(',', '_')}"
        (root / "inbox").mkdir(parents=True)
        (root / "outbox").mkdir()
        stage = root / "stage"
        stage.mkdir()
        for i in range(args.jobs):
            shutil.copyfile(source, stage / f"m{i:03d}.txt")
            os.rename(stage / f"m{i:03d}.txt", root / "inbox" / f"m{i:03d}.txt")
        took = serve_once(root, devices, args, cache)
        recs = [yaml.safe_load(s.read_text()) for s in (root / "outbox").glob("*.timing.yaml")]
        bad = list((root / "outbox").glob("*.error.yaml"))
        per = collections.Counter(r.get("device_index") for r in recs)
        batch, steady, counted = throughput(recs) if recs else (float("nan"),) * 2 + (0,)
        rows.append(
            dict(devices=devices, ok=len(recs), bad=len(bad), wall=took, per=per, batch=batch, steady=steady,
                 counted=counted, ph=phases(recs) if recs else {}, device=recs[0]["device"] if recs else "?")
        )  # fmt: skip
        shutil.rmtree(root)
    shutil.rmtree(base)
    for line in probe:
        print(line)
    what = f"{args.jobs} jobs of {args.n}^3, backend {args.backend}, kernel {args.kernel}"
    print(f"\n{what}; device: {rows[0]['device']}")
    print(THROUGHPUT.header())
    for r in rows:
        per = dict(sorted(r["per"].items()))
        print(THROUGHPUT.row(f"[{r['devices']}]", r["ok"], r["bad"], r["wall"], r["batch"], r["steady"], r["counted"],
                             f"{r['steady'] / rows[0]['steady']:7.2f}x", per))  # fmt: skip
    print("\nper-job medians, ms (other = overall - read - parse - kernel - emit - write)")
    print(PHASE_TABLE.header())
    for r in rows:
        print(PHASE_TABLE.row(f"[{r['devices']}]", *(r["ph"].get(k, float("nan")) for k in (*PHASES, "other"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
