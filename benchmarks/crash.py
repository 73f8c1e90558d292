"""Crash test for `mmd serve`: kill -9 at random moments, then one drain; every job exactly once.

    python benchmarks/crash.py                        # 30 rounds of 8 jobs (240 jobs)
    python benchmarks/crash.py --rounds 60 --jobs 4 --seed 7

Each round renames ``--jobs`` inputs into the inbox (as a client does),
starts a real `mmd serve` (cpu backend unless --backend) and kills it with
SIGKILL after a random delay between --min and --max seconds, so the kills
land at start-up, claims, reservations, commits and archives alike. After
each kill it notes what the dead daemon left: jobs in ``.work``,
reservations, and empty reservations (what a kill between creating and
writing one used to leave). Then `mmd serve --once` drains the inbox and the
script accounts for every input: archived in ``.done`` exactly once, its
output correct (checked against a float64 product) under its plain name
with a sidecar; nothing left in ``.work``; no temporary, no reservation and
no ``.1`` name in the outbox (there is no collision). Exits 1 on any miss.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness  # beside this script: its folder is first on sys.path
from child_env import child_env
from harness import ROOT

from mmd import textoutput
from mmd.check import full


def env(backend: str) -> dict[str, str]:
    return child_env(
        PYTHONPATH=str(ROOT),
        MMD_BACKEND=backend,
        MMD_LOG_FORMAT="json",
        MMD_QUIET_SECONDS="0.3",
        MMD_RESCAN_SECONDS="1",
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=8, help="inputs dropped per round")
    ap.add_argument("--size", type=int, default=90, help="N of each N×N×N job")
    ap.add_argument("--min", type=float, default=0.3, help="shortest delay before the kill (s)")
    ap.add_argument("--max", type=float, default=1.5, help="longest delay before the kill (s)")
    ap.add_argument("--seed", type=int, default=30)
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="mmd-crash-"))
    inbox, outbox, stage = root / "inbox", root / "outbox", root / "stage"
    for folder in (inbox, outbox, stage):  # mmd serve makes no folder it is not told to (--create)
        folder.mkdir()
    inputs = {}
    left_in_work = reservations = empty = 0
    t0 = time.monotonic()
    for round_ in range(args.rounds):
        for j in range(args.jobs):
            stem = f"r{round_:03d}_{j}"
            n = args.size
            a, b = harness.write_input(stage / f"{stem}.txt", n, n, n, round_ * 1000 + j)
            os.rename(stage / f"{stem}.txt", inbox / f"{stem}.txt")
            inputs[stem] = (a, b)
        with open(root / f"daemon-{round_:03d}.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mmd", "serve"], cwd=root, env=env(args.backend), stdout=log, stderr=log
            )
            time.sleep(rng.uniform(args.min, args.max))  # not a synchronisation: the random point of the kill
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        work = [p for p in (inbox / ".work").rglob("*.txt")] if (inbox / ".work").exists() else []
        claims = [p for p in outbox.iterdir() if p.name.endswith(".claim")] if outbox.exists() else []
        hollow = [p for p in claims if p.stat().st_size == 0]
        left_in_work += len(work)
        reservations += len(claims)
        empty += len(hollow)
        done = len(os.listdir(inbox / ".done")) if (inbox / ".done").exists() else 0
        print(
            f"round {round_ + 1:3d}: killed; {done:4d} done so far, left in .work {len(work)}, "
            f"reservations {len(claims)} ({len(hollow)} empty)",
            flush=True,
        )
    r = subprocess.run(
        [sys.executable, "-m", "mmd", "serve", "--once"], cwd=root, env=env(args.backend), capture_output=True
    )
    problems = []
    if r.returncode != 0:
        problems.append(f"the drain exited {r.returncode}: {r.stderr.decode()[-400:]}")
    done = sorted(os.listdir(inbox / ".done"))
    if done != sorted(f"{s}.txt" for s in inputs):
        problems.append(f"archived: {len(done)} names for {len(inputs)} inputs")
    for stem, (a, b) in inputs.items():
        out = outbox / f"{stem}.out"
        if not out.exists() or not (outbox / f"{stem}.timing.yaml").exists():
            problems.append(f"{stem}: no output or sidecar under its plain name")
            continue
        report = full.against_inputs(textoutput.parse_output(out.read_bytes()), a, b)
        if not report.ok:
            problems.append(f"{stem}: {report.summary()}")
    names = os.listdir(outbox)
    versioned = [n for n in names if ".1." in n]
    stale = [n for n in names if n.endswith(".claim")]
    temporaries = [n for n in names if n.endswith(".tmp")]
    in_work = [str(p.relative_to(inbox)) for p in (inbox / ".work").rglob("*") if p.is_file()]
    for what, found in (("versioned names", versioned), ("stale reservations", stale), ("temporaries", temporaries)):
        if found:
            problems.append(f"{what} in the outbox: {found[:5]}")
    if in_work:
        problems.append(f"left in .work: {in_work[:5]}")
    print(
        f"{args.rounds} rounds, {len(inputs)} jobs, {time.monotonic() - t0:.0f} s; after the kills: "
        f"{left_in_work} jobs found in .work, {reservations} reservations ({empty} empty); after the drain: "
        f"{len(done)} archived, {len(versioned)} .1 names, {len(stale)} reservations, {len(temporaries)} "
        f"temporaries, {len(in_work)} files in .work"
    )
    for line in problems:
        print("FAIL:", line)
    print("ok" if not problems else f"{len(problems)} problems; the spool is kept in {root}")
    if not problems:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
