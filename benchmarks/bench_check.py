"""Benchmark ``mmd check`` against the targets of issue 14 (run on purpose, never as a test).

Usage: python benchmarks/bench_check.py [--size 4096] [--folder 50 512] [--repeat 5] [--workdir DIR]
                                        [--tree NAME=PATH ...]

In one run, with every case repeated and the repetitions interleaved (so a
busy neighbour slows every case alike; every other round in reverse order),
medians of --repeat runs:

* the float64 numpy product at --size (``a64 @ b64`` alone, in this process);
* ``python -m mmd check OUT --input IN`` at --size, as a process;
* the same with ``--quick``;
* ``python -m mmd check OUT OUT2``: two outputs of --size, the same bytes
  (OUT2 a copy: mmd check then parses one), and ``OUT OUT3``, OUT3 with its
  last value 0.01 off (both parsed);
* ``python -m mmd check OUTBOX --inputs DIR``: a folder of 50 outputs of 512;

(each of these also for every ``--tree NAME=PATH``, another checkout of mmd
with its accelerator built, e.g. ``git worktree add /tmp/check-before main``:
its rows, marked ``[NAME]``, run in the same rounds, so old and new are
compared side by side) and, to show where the time goes, ``python -m mmd check --help`` (the start-up
every command pays) and the library calls behind each case in this process. Each tree's
modules are compiled to bytecode first, as an installed mmd's are.
The inputs come from ``mmd gen``'s generator, the 4096 output from
``mmd run --backend cpu``, the folder's outputs from numpy's float32 product
and ``textformat.emit`` (the bytes the cpu backend writes).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import harness  # beside this script: its folder is first on sys.path
import numpy as np
from child_env import child_env
from harness import ROOT, median

from mmd import accel, textcore, textformat, textoutput
from mmd.atomic import write_atomic
from mmd.check import full, jobs, results

#: Seconds a case is allowed, from the medians of the others.
Limit = Callable[[dict[str, float]], float]


@dataclass
class Case:
    name: str
    run: Callable[[], object]
    target: str = ""
    limit: Limit | None = None
    times: list[float] | None = None


def mmd_process(*args: str, tree: Path = ROOT) -> Callable[[], float | None]:
    """``python -m mmd ARGS`` as a process, with the mmd of ``tree`` first on its path."""
    env = child_env(PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def run() -> float | None:
        r = subprocess.run([sys.executable, "-m", "mmd", *args], env=env, capture_output=True, text=True, cwd=tree)
        if r.returncode == 2 and "--reference gpu:" in r.stderr:
            return float("nan")  # no GPU here: the case is not measured
        if r.returncode != 0:
            raise SystemExit(f"mmd {' '.join(args)} exited {r.returncode}: {r.stdout[-300:]} {r.stderr[-300:]}")
        return None

    return run


#: The first float64 product in a fresh process, as mmd check meets it (OpenBLAS's threads and
#: buffers and the result's pages are new there): its own time, printed by the child.
COLD_PRODUCT = (
    "import sys, time, numpy as np\n"
    "a, b = (np.load(p).astype(np.float64) for p in sys.argv[1:3])\n"
    "t = time.perf_counter(); a @ b; print(time.perf_counter() - t)\n"
)


def cold_product(a_path: Path, b_path: Path) -> Callable[[], float]:
    def run() -> float:
        r = subprocess.run(
            [sys.executable, "-c", COLD_PRODUCT, str(a_path), str(b_path)], capture_output=True, text=True, check=True
        )
        return float(r.stdout)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--folder", type=int, nargs=2, default=(50, 512), metavar=("COUNT", "N"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", type=Path, help="keep the files here (default: a temporary folder)")
    harness.add_tree_options(
        ap,
        "also run the process cases with the mmd of this checkout (its accelerator built), in the same rounds",
        no_now=False,
    )
    args = ap.parse_args()
    args.tree = harness.trees(ap, args.tree)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_check."))
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(args, work)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    n = args.size
    count, small = args.folder
    print(f"setting up in {work} ...", flush=True)
    src = work / "m.txt"
    a, b = harness.write_input(src, n, n, n, 1)
    out = work / "m.out"
    if not out.exists():
        mmd_process("run", str(src), "-o", str(out), "--backend", "cpu")()
    out2, out3 = work / "m2.out", work / "m3.out"
    shutil.copy(out, out2)
    text = out.read_bytes()
    last = int(text[-2:-1])
    out3.write_bytes(text[:-2] + b"%d\n" % (last + 1 if last < 9 else last - 1))
    tests, outbox = work / "tests", work / "outbox"
    for d in (tests, outbox):
        d.mkdir(exist_ok=True)
    for i in range(count):
        sa, sb = harness.write_input(tests / f"t{i:02d}.txt", small, small, small, 100 + i)
        write_atomic(outbox / f"t{i:02d}.out", [textformat.emit(sa @ sb)], durable=False)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.save(work / "a.npy", a)
    np.save(work / "b.npy", b)
    values = textoutput.parse_output(out.read_bytes())
    opts = results.Options()
    trees: list[tuple[str, Path]] = args.tree
    for _, tree in trees:  # bytecode, as pip leaves an installed mmd: no process compiles its modules
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "mmd")], check=True)

    def processes(name: str, argv: tuple[str, ...], target: str = "", limit: Limit | None = None) -> list[Case]:
        """One case per tree, the same command."""
        return [
            Case(name if tree_name == "now" else f"{name} [{tree_name}]", mmd_process(*argv, tree=tree), target, limit)
            for tree_name, tree in trees
        ]

    product_limit: Limit = lambda med: med[f"float64 numpy product, {n}"] + 0.5  # noqa: E731
    cases = [
        Case(f"float64 numpy product, {n}", lambda: a64 @ b64),
        Case(f"  the same, first in a fresh process, {n}", cold_product(work / "a.npy", work / "b.npy")),
        *processes("start-up: mmd check --help", ("check", "--help")),
        *processes(
            f"mmd check OUT --input IN, {n}",
            ("check", str(out), "--input", str(src)),
            "<= product + 0.5 s",
            product_limit,
        ),
        Case(
            f"  the same, against the fresh product, {n}",
            lambda: None,
            "<= fresh product + 0.5",
            lambda med: med[f"  the same, first in a fresh process, {n}"] + 0.5,
        ),
        *processes(
            f"mmd check --quick, {n}", ("check", str(out), "--input", str(src), "--quick"), "< 0.5 s", lambda med: 0.5
        ),
        *processes(
            f"mmd check OUT --input IN --reference gpu, {n}",
            ("check", str(out), "--input", str(src), "--reference", "gpu"),
            "< 1 s (GPU machine)",
            lambda med: 1.0,
        ),
        *processes(f"mmd check OUT OUT2, {n}", ("check", str(out), str(out2)), "< 0.5 s", lambda med: 0.5),
        *processes(f"mmd check OUT OUT3, {n}", ("check", str(out), str(out3)), "< 0.5 s", lambda med: 0.5),
        *processes(
            f"mmd check folder, {count} x {small}",
            ("check", str(outbox), "--inputs", str(tests)),
            "< 3 s",
            lambda med: 3.0,
        ),
        Case(f"  in-process: check vs input, {n}", lambda: jobs.check_file(out, src, opts)),
        Case(
            f"  in-process: --quick, {n}",
            lambda: jobs.check_file(out, src, results.Options(quick=True)),
        ),
        Case(
            f"  in-process: two outputs, {n}",
            lambda: jobs.check_file(out, out2, results.Options(against="expected")),
        ),
        Case(f"  in-process: folder, {count} x {small}", lambda: jobs.check_folder(outbox, tests, opts)),
        Case(f"  in-process: parse_output, {n}", lambda: textoutput.parse_output(memoryview(textcore.read_bytes(out)))),
        Case(f"  in-process: parse input, {n}", lambda: textformat.parse(memoryview(textcore.read_bytes(src)))),
        Case(f"  in-process: rule beyond the product, {n}", lambda: full.against_inputs(values, a, b)),
    ]
    load0 = os.getloadavg()
    for i in range(args.repeat):
        print(f"round {i + 1} of {args.repeat} ...", flush=True)
        # every other round backwards: a case and its other trees' twin take turns at going first, and
        # no case always follows the same one (what a process finds depends on what ran before it: on
        # the 2-core VM, memory left free for a few seconds goes back to the host, free page reporting,
        # and the next process to touch it pays for page faults in system time)
        for c in cases if i % 2 == 0 else cases[::-1]:
            t = time.perf_counter()
            own = c.run()
            took = time.perf_counter() - t
            c.times = [*(c.times or []), own if isinstance(own, float) else took]
    load1 = os.getloadavg()
    med = {c.name: median(c.times or [0.0]) for c in cases}
    check = f"mmd check OUT --input IN, {n}"
    against_fresh = f"  the same, against the fresh product, {n}"
    med[against_fresh] = med[check]
    # the full rule in-process includes its own product: show what lies beyond it
    rule = f"  in-process: rule beyond the product, {n}"
    med[rule] -= med[f"float64 numpy product, {n}"]
    mins = {c.name: min(c.times or [0.0]) for c in cases}
    mins[rule] = float("nan")
    mins[against_fresh] = float("nan")
    print()
    print(f"python benchmarks/bench_check.py --size {n} --folder {count} {small} --repeat {args.repeat}")
    cpu = platform.processor() or platform.machine()
    print(
        f"machine: {os.cpu_count()} cores (nproc {len(os.sched_getaffinity(0))}), {cpu}, "
        f"Python {platform.python_version()}, numpy {np.__version__}, "
        f"C accelerator {'on' if accel.ON else 'off'}"
    )
    print(f"load average at start {load0[0]:.2f}, at end {load1[0]:.2f}")
    width = max(len(c.name) for c in cases)
    print(f"{'case':<{width}}  {'median s':>9}  {'min s':>7}  {'target':<20} result")
    for c in cases:
        verdict = ""
        if c.limit is not None:
            verdict = "PASS" if med[c.name] <= c.limit(med) else f"FAIL (limit {c.limit(med):.2f} s)"
        low = "" if mins[c.name] != mins[c.name] else f"{mins[c.name]:7.3f}"
        print(f"{c.name:<{width}}  {med[c.name]:9.3f}  {low:>7}  {c.target:<20} {verdict}".rstrip())


if __name__ == "__main__":
    main()
