"""Daemon benchmark: drop-to-output latency on a warm daemon, and throughput of many small files.

    python benchmarks/bench_daemon.py [--drops 50] [--files 1000] [--no-fsync] [--json]

A real ``mmd serve`` process (cpu backend, inotify) serves a fresh spool in a
temporary folder. A *drop* is a rename of a complete file into the inbox (the
way a careful client publishes a file); it is *done* when its
``.timing.yaml`` exists (the sidecar is committed last). Latency is measured
per drop on a warm daemon, one drop at a time; throughput is 1000 files
renamed in at once, timed from the first rename to the last sidecar.

``--no-fsync`` runs the daemon with ``durable=False`` (what a ``durable:
false`` setting would do) to show what the fsyncs of each commit cost;
``--libyaml`` dumps sidecars with libyaml's ``CSafeDumper`` (same bytes, about
five times faster than pure-Python PyYAML). Both are what-ifs, patched into
the daemon process only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mmd.generate import input_chunks, random_matrix  # noqa: E402

# Runs the daemon with what-if patches: durable=False (--no-fsync), libyaml sidecars (--libyaml).
WHAT_IF = """
import sys
import yaml
from mmd import daemon, sidecar
from mmd.cli import main
if "{no_fsync}" == "True":
    daemon.Daemon.durable = property(lambda self: False)
if "{libyaml}" == "True":
    def dumps(record):
        return yaml.dump(record, Dumper=yaml.CSafeDumper, sort_keys=False, default_flow_style=False,
                         allow_unicode=True).encode("utf-8")
    sidecar.dumps = dumps
sys.exit(main(sys.argv[1:]))
"""


def _input(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(input_chunks(random_matrix(rng, n, n), random_matrix(rng, n, n), square=True))


def _wait(path: Path, timeout: float = 30.0) -> float:
    end = time.perf_counter() + timeout
    while not os.path.exists(path):
        if time.perf_counter() > end:
            raise TimeoutError(f"no {path.name} after {timeout} s")
        time.sleep(0.0002)
    return time.perf_counter()


def _count(folder: Path, suffix: str) -> int:
    with os.scandir(folder) as it:
        return sum(1 for e in it if e.name.endswith(suffix))


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="mmd-bench-daemon-") as tmp:
        root = Path(tmp)
        stage, inbox, outbox = root / "stage", root / "inbox", root / "outbox"
        stage.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MMD_")}
        env.update(PYTHONPATH=str(ROOT), MMD_BACKEND="cpu", MMD_LOG_FORMAT="json", MMD_LOG_LEVEL="warning")
        cmd = [sys.executable, "-m", "mmd"]
        if args.no_fsync or args.libyaml:
            cmd = [sys.executable, "-c", WHAT_IF.format(no_fsync=args.no_fsync, libyaml=args.libyaml)]
        log = open(root / "daemon.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [*cmd, "serve", "--inbox", str(inbox), "--outbox", str(outbox)],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait(inbox / ".mmd-state.json")
            one = _input(args.size, 1)
            lat = []
            for i in range(args.warmup + args.drops):
                src = stage / f"l{i}.txt"
                src.write_bytes(one)
                t0 = time.perf_counter()
                os.rename(src, inbox / src.name)
                t1 = _wait(outbox / f"l{i}.timing.yaml")
                if i >= args.warmup:
                    lat.append((t1 - t0) * 1e3)

            small = _input(args.small, 2)
            for i in range(args.files):
                (stage / f"t{i:04d}.txt").write_bytes(small)
            before = _count(outbox, ".timing.yaml")
            t0 = time.perf_counter()
            for i in range(args.files):
                os.rename(stage / f"t{i:04d}.txt", inbox / f"t{i:04d}.txt")
            end = time.perf_counter() + 120
            while _count(outbox, ".timing.yaml") < before + args.files:
                if time.perf_counter() > end:
                    raise TimeoutError("throughput run did not finish in 120 s")
                time.sleep(0.02)
            elapsed = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
    lat.sort()
    return {
        "machine": f"{platform.node()} ({os.cpu_count()} cpus, {platform.processor() or platform.machine()}), "
        f"Python {platform.python_version()}",
        "fsync": not args.no_fsync,
        "libyaml_sidecars": args.libyaml,
        "latency_ms": {
            "size": args.size,
            "drops": len(lat),
            "p50": round(statistics.median(lat), 2),
            "p95": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 2),
            "min": round(lat[0], 2),
            "max": round(lat[-1], 2),
        },
        "throughput": {
            "files": args.files,
            "size": args.small,
            "seconds": round(elapsed, 3),
            "jobs_per_s": round(args.files / elapsed, 1),
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drops", type=int, default=50, help="latency drops (after --warmup)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--size", type=int, default=32, help="N of the latency job (N×N times N×N)")
    p.add_argument("--files", type=int, default=1000, help="files in the throughput run")
    p.add_argument("--small", type=int, default=16, help="N of the throughput jobs")
    p.add_argument("--no-fsync", action="store_true", help="what if: daemon with durable=False")
    p.add_argument("--libyaml", action="store_true", help="what if: sidecars dumped with yaml.CSafeDumper")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    res = run(args)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        lat, thr = res["latency_ms"], res["throughput"]
        print(
            f"{res['machine']}; fsync {'on' if res['fsync'] else 'off'}"
            f"{'; libyaml sidecars' if res['libyaml_sidecars'] else ''}"
        )
        print(
            f"latency {lat['size']}x{lat['size']} job, {lat['drops']} drops: p50 {lat['p50']} ms, "
            f"p95 {lat['p95']} ms (min {lat['min']}, max {lat['max']})"
        )
        print(
            f"throughput {thr['files']} files of {thr['size']}x{thr['size']}: {thr['seconds']} s, "
            f"{thr['jobs_per_s']} jobs/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
