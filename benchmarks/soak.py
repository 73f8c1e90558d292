"""Soak and full-size load for `mmd serve` (run on purpose, never in CI).

    python benchmarks/soak.py                      # 10 minutes of continuous drops
    python benchmarks/soak.py --minutes 1 --full   # plus a 4096 job among 100 small ones and a 100 MB line

A real `mmd serve` (cpu backend unless --backend, inotify) on a temporary
spool. Drops are a mix: small good jobs (renamed in, or written in place),
bad ones (a bad value, an empty file, a symlink, a hard link, a hostile name)
at a steady rate. Every `--every` seconds it samples the daemon's resident
memory (VmRSS) and open file descriptors from /proc, then prints the samples
and the accounting: every file dropped must end in .done (with an output and
sidecar) or .failed (with an error sidecar); lost must be 0. Memory and file
counts must stay flat: it fails when the last quarter's median RSS is more
than 20 % (and 20 MB) above the second quarter's, or the fd count grows by
more than 8.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from child_env import child_env
from harness import ROOT, write_input  # beside this script: its folder is first on sys.path


def proc_sample(pid: int) -> tuple[int, int]:
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def wait_for(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise SystemExit(f"soak: timed out waiting for {what}")
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=50.0, help="drops per second")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--full", action="store_true", help="also the full-size cases: a 4096 job, a 100 MB line")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="mmd-soak-"))
    inbox, outbox, stage = root / "inbox", root / "outbox", root / "stage"
    for d in (inbox, outbox, stage):
        d.mkdir()
    env = child_env(MMD_BACKEND=args.backend, MMD_LOG_FORMAT="json", PYTHONPATH=str(ROOT))
    log = open(root / "daemon.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "mmd", "serve"], cwd=root, env=env, stdout=log, stderr=log)
    wait_for(lambda: (inbox / ".mmd-state.json").exists(), 60, "the daemon")
    rng = random.Random(1)
    secret = root / "secret.txt"
    secret.write_text("1\n5\n7\n")
    dropped = 0
    expected_bad = 0
    samples: list[tuple[float, int, int]] = []
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    next_sample = t0
    if args.full:
        write_input(stage / "big4096.txt", 4096, 4096, 4096, 7)
        os.rename(stage / "big4096.txt", inbox / "big4096.txt")
        (inbox / "line100mb.txt").write_bytes(b"2\n" + b"7" * (100 << 20))
        dropped += 2
        expected_bad += 1
        for i in range(100):
            write_input(stage / f"full{i}.txt", 8, 8, 8, i)
            os.rename(stage / f"full{i}.txt", inbox / f"full{i}.txt")
            dropped += 1
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_sample:
            rss, fds = proc_sample(proc.pid)
            samples.append((now - t0, rss, fds))
            next_sample += args.every
        i = dropped
        kind = rng.random()
        name = f"s{i:07d}.txt"
        if kind < 0.80:
            write_input(stage / name, rng.randint(2, 24), rng.randint(2, 24), rng.randint(2, 24), i)
            os.rename(stage / name, inbox / name)
        elif kind < 0.90:
            write_input(inbox / name, 6, 6, 6, i)
        else:
            expected_bad += 1
            bad = rng.choice(["value", "empty", "symlink", "hardlink", "name"])
            if bad == "value":
                (inbox / name).write_text("2\n1 2 x 4\n5 6 7 8\n")
            elif bad == "empty":
                (inbox / name).write_bytes(b"")
            elif bad == "symlink":
                os.symlink(secret, inbox / name)
            elif bad == "hardlink":
                os.link(secret, inbox / name)
            else:
                (inbox / f"s{i:07d}@kernel=..\n{'x' * 200}.txt").write_text("1\n1\n1\n")
        dropped += 1
        time.sleep(max(0.0, t0 + dropped / args.rate - time.monotonic()))  # pacing, not synchronisation

    def finished() -> int:
        return len(os.listdir(inbox / ".done")) + len(os.listdir(inbox / ".failed"))

    wait_for(lambda: finished() >= dropped, 1800, "the last jobs")
    rss, fds = proc_sample(proc.pid)
    samples.append((time.monotonic() - t0, rss, fds))
    proc.terminate()
    proc.wait(timeout=60)
    log.close()

    done, failed = len(os.listdir(inbox / ".done")), len(os.listdir(inbox / ".failed"))
    timing = len(list(outbox.glob("*.timing.yaml")))
    errors = len(list(outbox.glob("*.error.yaml")))
    waiting = [n for n in os.listdir(inbox) if not n.startswith(".")]
    lost = dropped - done - failed - len(waiting)
    print(f"spool: {root}")
    print("   t_s     rss_MB  fds")
    for t, r, f in samples:
        print(f"{t:7.1f}  {r / 2**20:8.1f}  {f:4d}")
    q = max(1, len(samples) // 4)
    early = statistics.median(r for _, r, _ in samples[q : 2 * q] or samples)
    late = statistics.median(r for _, r, _ in samples[-q:])
    fd_growth = samples[-1][2] - min(f for _, _, f in samples)
    result = {
        "minutes": args.minutes,
        "dropped": dropped,
        "done": done,
        "failed": failed,
        "expected_failed": expected_bad,
        "timing_sidecars": timing,
        "error_sidecars": errors,
        "left_in_inbox": len(waiting),
        "lost": lost,
        "rss_mb_q2_median": round(early / 2**20, 1),
        "rss_mb_q4_median": round(late / 2**20, 1),
        "fd_growth": fd_growth,
        "secret_intact": secret.read_text() == "1\n5\n7\n",
    }
    print(json.dumps(result, indent=1))
    flat = late <= early * 1.2 or late - early < 20 * 2**20
    ok = lost == 0 and not waiting and failed == expected_bad and flat and fd_growth <= 8 and result["secret_intact"]
    print("soak:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
