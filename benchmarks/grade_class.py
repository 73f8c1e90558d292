#!/usr/bin/env python3
"""A class's kernels graded by ``mmd grade`` on one GPU: the issue's class of 20 students with three kernels each.

    python benchmarks/grade_class.py [--students 20] [--sizes 32,256,512,1024,2048,4096] [--profile] [--workdir DIR]

Each student hands in the course's naive, tiled and 4-outputs-per-thread kernels (docs/examples: naive.cu,
tiled.cu, granularity.cu); TESTS holds the course's sizes and four rectangular shapes (1×1×1, 37×53×29,
100×257×75, 513×31×1000). ``mmd grade`` runs with the course's plan and writes its JSON, JUnit and page, from
an empty kernel cache. Printed: its wall time beside the target (5 minutes for 20 students, by the same rate
for others), its two phases, and every kernel's right or wrong count. ``--profile``: the grading process under
cProfile, its 25 costliest functions (cumulative) printed.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from child_env import child_env

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mmd.generate import input_chunks, random_matrix  # noqa: E402

EXAMPLES = ROOT / "docs" / "examples"
COURSE = ("naive.cu", "tiled.cu", "granularity.cu")
RECTANGLES = ((1, 1, 1), (37, 53, 29), (100, 257, 75), (513, 31, 1000))
PYTHONPATH = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
#: The issue's target: 20 students' three kernels each in 5 minutes.
TARGET_S_PER_STUDENT = 300 / 20


def write_input(path: Path, m: int, k: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    with open(path, "wb") as out:
        for chunk in input_chunks(a, b, square=m == k == n):
            out.write(chunk)


def make_class(work: Path, students: int, sizes: list[int]) -> tuple[Path, Path]:
    tests, handin = work / "tests", work / "handin"
    tests.mkdir(parents=True)
    for i, n in enumerate(sizes):
        write_input(tests / f"square{n}.txt", n, n, n, i)
    for i, (m, k, n) in enumerate(RECTANGLES):
        write_input(tests / f"rect{m}x{k}x{n}.txt", m, k, n, 100 + i)
    for s in range(students):
        folder = handin / f"student{s:02d}"
        folder.mkdir(parents=True)
        for name in COURSE:
            (folder / name).write_bytes((EXAMPLES / name).read_bytes())
    return tests, handin


def phase_two_cases(grades: dict) -> str:
    """Where phase 2's time went: per timed case (size, tile), over every kernel, the seconds each took (median and
    sum), its launches (median) and the windows it ran in (the most)."""
    rows: dict[tuple[int, int], list[dict]] = {}
    for student in grades["grade"]["students"]:
        for kernel in student["kernels"]:
            for case in kernel["cases"]:
                if case["kind"] == "timed":
                    rows.setdefault((case["shape"][0], case["tile"]), []).append(case)
    lines = [f"{'timed case':<14}{'kernels':>8}{'median s':>10}{'sum s':>8}{'launches':>10}{'windows':>9}"]
    for (size, tile), cases in sorted(rows.items()):
        seconds = [c["seconds"] for c in cases]
        launches = [len(c.get("kernel_ms") or ()) for c in cases]
        windows = max(c.get("windows") or 0 for c in cases)
        lines.append(f"{f'{size} tile {tile}':<14}{len(cases):>8}{np.median(seconds):>10.3f}{sum(seconds):>8.1f}"
                     f"{np.median(launches):>10.0f}{windows:>9}")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=20)
    parser.add_argument("--sizes", default="32,256,512,1024,2048,4096", help="TESTS' square sizes")
    parser.add_argument("--profile", action="store_true", help="run the grading under cProfile")
    parser.add_argument("--workdir", type=Path, help="where TESTS, the hand-ins and the reports go")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mmd-grade-bench-") as tmp:
        work = args.workdir or Path(tmp)
        tests, handin = make_class(work, args.students, [int(s) for s in args.sizes.split(",")])
        env = child_env(MMD_KERNEL_CACHE=str(work / "kernel-cache"), PYTHONPATH=PYTHONPATH)
        profile = work / "grade.prof"
        run = [sys.executable, *(["-m", "cProfile", "-o", str(profile)] if args.profile else []), "-m", "mmd"]
        command = [*run, "grade", str(handin), "--tests", str(tests), "--json", str(work / "grades.json"),
                   "--junit", str(work / "grades.xml"), "--page", str(work / "page")]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        took = time.perf_counter() - start
        if done.returncode not in (0, 1) or not (work / "grades.json").exists():
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
            raise SystemExit(f"mmd grade failed with exit status {done.returncode}")
        phases = [line for line in done.stdout.splitlines() if line.startswith("phase 1")]
        grades = json.loads((work / "grades.json").read_text(encoding="utf-8"))
        if args.profile:
            pstats.Stats(str(profile)).sort_stats("cumulative").print_stats(25)
    counts: dict[str, list[int]] = {}
    for student in grades["grade"]["students"]:
        for kernel in student["kernels"]:
            right = sum(case["status"] == "ok" for case in kernel["cases"])
            tally = counts.setdefault(kernel["kernel"], [0, 0])
            tally[0] += right
            tally[1] += len(kernel["cases"]) - right
    print(f"\n{args.students} students x {len(COURSE)} kernels, TESTS {args.sizes} and {len(RECTANGLES)} rectangles")
    for kernel, (right, other) in sorted(counts.items()):
        print(f"  {kernel:<16} cases right {right}, not right {other}")
    print("\n".join(phases))
    print(phase_two_cases(grades))
    target = TARGET_S_PER_STUDENT * args.students
    print(f"mmd grade: {took:.1f} s ({'meets' if took <= target else 'MISSES'} {target:.0f} s, 5 min per 20 students)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
