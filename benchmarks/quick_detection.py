"""What ``mmd check --quick`` catches and what it never refuses: the figures of docs/quick-detection.md
(run on purpose, never as a test; a few minutes on 2 cores).

Usage: python benchmarks/quick_detection.py [--big 4096] [--seeds 40]

1. The law (mmd.check.quick, no data): for v vectors, the bound z (in a row's σ)
   and how far past σ a row's error norm must reach to be refused with
   chance 1 - 1e-6 and 1/2.
2. The figures for ``mmd gen``'s default values at 256, 1024 and --big:
   what --quick catches (rms per value), beside the full check's per-value
   allowance 0.005 + 4·sqrt(K)·eps·(|A|·|B|) (median), and the largest ratio
   to its bound an honest output reached over the seeds.
3. Honest fp32 products, numpy's and a sequential FMA sum (a naive or tiled
   kernel's order), several value ranges and constant matrices: ρ, the largest
   root-mean-square of a row's (column's) fp32 error in units of
   sqrt(K)·eps·|A||B| (a row of values each at the full check's fp32
   allowance has ρ = 4), and --quick's largest ratio and refusals.
4. One dot product of constant values summed in order, K = 256 .. 4096: the
   largest error in units of sqrt(K)·eps·|A||B| over 43 value pairs, and how
   many exceed the full check's 4.
5. The issue's case: one row of a right 1024 output shifted by δ: refused in
   how many of --seeds seeds, beside the law's chance for the largest bound
   (a lower bound on the row's own chance).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmd import textformat as tf
from mmd import textoutput
from mmd.check import quick, quickarrays, tolerance
from mmd.generate import random_matrix


def printed(c: np.ndarray) -> np.ndarray:
    """The values an mmd output of ``c`` holds: ``%6.2f``, read back."""
    return textoutput.parse_output(tf.emit(c))


def exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def sequential(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """k in order, one fused multiply-add each (a float32 product is exact in float64)."""
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for r in range(a.shape[1]):
        acc = (acc + np.outer(a64[:, r], b64[r])).astype(np.float32)
    return acc


def law() -> None:
    print("1. the law at m = n = 1024, false alarm 1e-9: a row is refused when its norm reaches z·σ")
    print("| vectors | z | caught surely (1 - 1e-6) from | caught half the time from |")
    print("| --- | --- | --- | --- |")
    for v in (4, 8, 12, 16):
        z = quick.threshold(1e-9 / 2048, v)
        print(f"| {v} | {z:.2f} | {z * quick.reach(v):.1f} σ | {z * quick.reach(v, 0.5):.2f} σ |")


def figures(big: int, seeds: int) -> None:
    print(f"\n2. mmd gen's default values ([-10, 10]), numpy's float32 product, {seeds} seeds")
    print("| n | per-value allowance (median) | catches (rms) | honest: largest ratio |")
    print("| --- | --- | --- | --- |")
    for n in (256, 1024, big):
        rng = np.random.default_rng(n)
        a, b = random_matrix(rng, n, n), random_matrix(rng, n, n)
        out = printed(a @ b)
        s = np.abs(a) @ np.abs(b)
        allowance = tolerance.PRINT_HALF_UNIT + tolerance.fp32_factor(n) * float(np.median(s))
        reports = [quickarrays.quick_of(out, a, b, seed=seed) for seed in range(seeds if n < big else min(seeds, 10))]
        assert all(r.ok for r in reports)
        print(f"| {n} | {allowance:.3g} | {reports[0].catches:.3g} | {max(r.worst_ratio for r in reports):.2g} |")


FAMILIES = {"default": (-10.0, 10.0), "positive": (0.01, 10.0), "small": (0.01, 0.1), "large": (-999.99, 999.99)}


def honest(seeds: int) -> None:
    print(
        f"\n3. honest fp32 products: ρ (4 = every value at the full check's fp32 allowance); --quick over {seeds} seeds"
    )
    print("| n | values | order | ρ | --quick: largest ratio | refused |")
    print("| --- | --- | --- | --- | --- | --- |")
    eps = tolerance.EPS32
    for n in (64, 256, 1024):
        for family in [*FAMILIES, "constant 3.33 × 7.77", "constant 2.49 × 3.12"]:
            rng = np.random.default_rng(n + len(family))
            if family.startswith("constant"):
                av, bv = (float(x) for x in family.split()[1::2])
                a, b = np.full((n, n), av, np.float32), np.full((n, n), bv, np.float32)
            else:
                a, b = random_matrix(rng, n, n, *FAMILIES[family]), random_matrix(rng, n, n, *FAMILIES[family])
            ref, s = exact(a, b), np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
            for order in ("numpy", "sequential"):
                if order == "sequential" and n > 256 and not family.startswith("constant"):
                    continue  # minutes of numpy at 1024; the constant case is the one that matters
                c = a @ b if order == "numpy" else sequential(a, b)
                f = c.astype(np.float64) - ref
                unit = math.sqrt(n) * eps
                rho = max(
                    float(np.max(np.linalg.norm(f, axis=1) / (unit * np.linalg.norm(s, axis=1)))),
                    float(np.max(np.linalg.norm(f, axis=0) / (unit * np.linalg.norm(s, axis=0)))),
                )
                out = printed(c)
                reports = [quickarrays.quick_of(out, a, b, seed=seed) for seed in range(seeds)]
                worst = max(r.worst_ratio for r in reports)
                refused = sum(not r.ok for r in reports)
                print(f"| {n} | {family} | {order} | {rho:.3f} | {worst:.2g} | {refused} |")


def constant_sums() -> None:
    print("\n4. one dot product of constant values a, b summed in order in float32 (43 pairs)")
    print("| K | largest error / (sqrt(K)·eps·K·a·b) | median | pairs beyond 4 |")
    print("| --- | --- | --- | --- |")
    rng = np.random.default_rng(1)
    pairs = [(3.33, 7.77), (9.99, 9.99), (1.01, 9.99)] + [tuple(rng.integers(1, 1000, 2) / 100) for _ in range(40)]
    for k in (256, 1024, 2048, 4096):
        units = []
        for av, bv in pairs:
            a, b = float(np.float32(av)), float(np.float32(bv))
            acc = np.float32(0)
            for _ in range(k):
                acc = np.float32(float(acc) + a * b)
            units.append(abs(float(acc) - k * a * b) / (math.sqrt(k) * tolerance.EPS32 * k * a * b))
        print(f"| {k} | {max(units):.2f} | {float(np.median(units)):.2f} | {sum(u > 4 for u in units)} |")


def issue_case(seeds: int) -> None:
    print(f"\n5. one row of a right 1024 output (default values) shifted by δ, {seeds} seeds")
    print("| δ | refused | the law's chance at the largest bound |")
    print("| --- | --- | --- |")
    rng = np.random.default_rng(30)
    a, b = random_matrix(rng, 1024, 1024), random_matrix(rng, 1024, 1024)
    out = printed(a @ b)
    bound = quickarrays.quick_of(out, a, b, seed=0).bound
    for delta in (0.5, 1.0, 1.5, 2.0, 3.0, 4.5):
        bad = out.copy()
        bad[417] += delta
        refused = sum(not quickarrays.quick_of(bad, a, b, seed=seed).ok for seed in range(seeds))
        print(f"| {delta:g} | {refused} of {seeds} | {quick.caught(delta * 32 / bound, 16):.3g} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big", type=int, default=4096)
    parser.add_argument("--seeds", type=int, default=40)
    args = parser.parse_args()
    law()
    figures(args.big, args.seeds)
    honest(10)
    constant_sums()
    issue_case(args.seeds)


if __name__ == "__main__":
    main()
