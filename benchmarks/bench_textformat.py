"""Benchmark mmd.textformat against numpy.loadtxt / numpy.savetxt.

Usage: python benchmarks/bench_textformat.py [--sizes 1024 4096] [--repeat 3]

For each size N: an N×N pair of float32 inputs uniform in [-10, 10], written
with '%.2f' (like the course's input files), is parsed by numpy.loadtxt and by
mmd's parse; the product is written by numpy.savetxt(fmt='%6.2f', delimiter='')
and by mmd's emit. mmd is timed twice: on its numpy path (``parse``/``emit``,
the switch mmd.accel.ON off, as with MMD_NO_C=1) and with the C
accelerator mmd._fasttext (``parse (C)``/``emit (C)``, when it is built).
Median of --repeat runs; peak RSS growth is measured in a fresh subprocess per
case with --rss (rough).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mmd import accel  # noqa: E402
from mmd import textformat as tf  # noqa: E402


def make_input(n: int, seed: int = 0) -> tuple[bytes, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.uniform(-10, 10, (n, n)).astype(np.float32)
    b = rng.uniform(-10, 10, (n, n)).astype(np.float32)
    buf = io.BytesIO()
    buf.write(b"%d\n" % n)
    for mat in (a, b):
        # '%.2f' text, row by row (savetxt is fine for *generating* the input)
        np.savetxt(buf, mat, fmt="%.2f", delimiter=" ")
    return buf.getvalue(), a @ b


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


CHILD = r"""
import io, resource, sys, numpy as np
sys.path.insert(0, {root!r})
from mmd import textcore, textformat as tf
case, path = sys.argv[1], sys.argv[2]
accel.ON = case.endswith(' (C)')
case = case.replace(' (C)', '')
data = open(path, 'rb').read()
c = np.load(path + '.npy') if case in ('emit', 'savetxt') else None
import os
before = int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') // 1024
if case == 'parse':
    tf.parse(data)
elif case == 'loadtxt':
    body = io.BytesIO(data); body.readline(); np.loadtxt(body, dtype=np.float32)
elif case == 'emit':
    tf.emit(c)
else:
    np.savetxt(io.BytesIO(), c, fmt='%6.2f', delimiter='')
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024)
"""


def peak_delta(case: str, path: Path) -> int | None:
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD.format(root=str(ROOT)), case, str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout.strip())
    except Exception:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--rss",
        action="store_true",
        help="also run each case in a subprocess for peak RSS growth (rough: maxrss is a high-water mark)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            data, c = make_input(n)
            body = data.split(b"\n", 1)[1]
            out = tf.emit(c)
            assert tf.parse(data).a.shape == (n, n)
            in_mb, out_mb = len(data) / 1e6, len(out) / 1e6

            def loadtxt(body=body):
                return np.loadtxt(io.BytesIO(body), dtype=np.float32)

            t_load = timed(loadtxt, args.repeat)
            t_save = timed(lambda c=c: np.savetxt(io.BytesIO(), c, fmt="%6.2f", delimiter=""), args.repeat)
            fast = accel.fasttext is not None
            try:
                accel.ON = False
                t_parse = timed(lambda data=data: tf.parse(data), args.repeat)
                t_emit = timed(lambda c=c: tf.emit(c), args.repeat)
                if fast:
                    accel.ON = True
                    assert tf.emit(c) == out
                    t_parse_c = timed(lambda data=data: tf.parse(data), args.repeat)
                    t_emit_c = timed(lambda c=c: tf.emit(c), args.repeat)
            finally:
                accel.ON = fast
            rss = {}
            if args.rss:
                path = Path(tmp) / f"in{n}.txt"
                path.write_bytes(data)
                np.save(str(path) + ".npy", c)
                for case in ("loadtxt", "parse", "parse (C)", "savetxt", "emit", "emit (C)"):
                    if fast or "(C)" not in case:
                        rss[case] = peak_delta(case, path)
            row = dict(n=n, in_mb=in_mb, out_mb=out_mb, loadtxt=t_load, parse=t_parse, savetxt=t_save, emit=t_emit)
            if fast:
                row.update({"parse (C)": t_parse_c, "emit (C)": t_emit_c})
            rows.append(dict(row, rss=rss))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    mb = lambda v: "-" if v is None else f"{v / 1e6:.0f}"  # noqa: E731
    print(f"{'N':>5} {'case':<9} {'MB':>7} {'seconds':>8} {'MB/s':>7} {'speed-up':>8} {'peak RSS +MB':>12}")
    for r in rows:
        for case, size, base in (
            ("loadtxt", r["in_mb"], None),
            ("parse", r["in_mb"], "loadtxt"),
            ("parse (C)", r["in_mb"], "loadtxt"),
            ("savetxt", r["out_mb"], None),
            ("emit", r["out_mb"], "savetxt"),
            ("emit (C)", r["out_mb"], "savetxt"),
        ):
            if case not in r:
                continue
            t = r[case]
            up = f"{r[base] / t:.2f}x" if base else ""
            print(f"{r['n']:>5} {case:<9} {size:>7.1f} {t:>8.3f} {size / t:>7.0f} {up:>8} {mb(r['rss'].get(case)):>12}")


if __name__ == "__main__":
    main()
