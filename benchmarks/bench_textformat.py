"""Benchmark mmd.textformat against numpy.loadtxt / numpy.savetxt.

Usage: python benchmarks/bench_textformat.py [--sizes 1024 4096] [--repeat 3]

For each size N: an N×N input as ``mmd gen`` writes it (two decimals in
[-10, 10], '%.2f', like the course's input files) is parsed by numpy.loadtxt
and by mmd's parse; the product is written by numpy.savetxt(fmt='%6.2f', delimiter='')
and by mmd's emit. mmd is timed twice: on its exact Python path (``parse``/``emit``,
the switch mmd.accel.ON off, as with MMD_NO_C=1) and with the C
accelerator mmd._fasttext (``parse (C)``/``emit (C)``, when it is built).
Median of --repeat runs; peak RSS growth is measured in a fresh subprocess per
case with --rss (rough).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import harness  # beside this script: its folder is first on sys.path
import numpy as np
from harness import ROOT, Column, Table

from mmd import accel
from mmd import textformat as tf


def make_input(n: int, seed: int = 0) -> tuple[bytes, np.ndarray]:
    """An N×N input's bytes and its product."""
    a, b = harness.input_pair(n, n, n, seed)
    return harness.input_bytes(n, n, n, seed), a @ b


def timed(fn, repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    return harness.median(harness.seconds(fn, repeat))


CHILD = r"""
import io, resource, sys, numpy as np
sys.path.insert(0, {root!r})
from mmd import accel, textformat as tf
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
    print(TABLE.header())
    for r in rows:
        for case, size_key, base in CASES:
            if case not in r:
                continue
            t, size = r[case], r[size_key]
            up = f"{r[base] / t:.2f}x" if base else ""
            rss = r["rss"].get(case)
            print(TABLE.row(r["n"], case, size, t, size / t, up, None if rss is None else rss / 1e6))


#: (case, its size column, the case it is a speed-up over).
CASES = (
    ("loadtxt", "in_mb", None),
    ("parse", "in_mb", "loadtxt"),
    ("parse (C)", "in_mb", "loadtxt"),
    ("savetxt", "out_mb", None),
    ("emit", "out_mb", "savetxt"),
    ("emit (C)", "out_mb", "savetxt"),
)
TABLE = Table(
    (
        Column("N", 5),
        Column("case", 9, "<"),
        Column("MB", 7, spec=".1f"),
        Column("seconds", 8, spec=".3f"),
        Column("MB/s", 7, spec=".0f"),
        Column("speed-up", 8),
        Column("peak RSS +MB", 12, spec=".0f"),
    )
)


if __name__ == "__main__":
    main()
