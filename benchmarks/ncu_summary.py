#!/usr/bin/env python3
"""The figures docs/fast.md reads from a Nsight Compute raw page, each kernel beside the others.

Usage: python benchmarks/ncu_summary.py RAW.csv  (RAW.csv from ``ncu --import X.ncu-rep --page raw --csv``,
as benchmarks/fast_round.sh writes it): one line per metric, one column per profiled kernel launch.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys

METRICS = (
    "gpu__time_duration.sum",
    "sm__cycles_active.avg",
    "launch__registers_per_thread",
    "smsp__inst_executed.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed_op_branch.sum",
    "smsp__sass_inst_executed_op_shared_ld.sum",
    "smsp__sass_inst_executed_op_shared_st.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "lts__t_sector_hit_rate.pct",
    "dram__bytes_read.sum",
)
STALL = re.compile(r"smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", help="the raw page as CSV: ncu --import X.ncu-rep --page raw --csv")
    args = ap.parse_args()
    with open(args.raw, newline="") as f:
        rows = list(csv.reader(f))
    header, units, data = rows[0], rows[1], rows[2:]
    names = [d[header.index("Kernel Name")][:24] for d in data]
    print(f"{'metric':62} {'unit':8} " + " ".join(f"{n:>24}" for n in names))
    for m in METRICS:
        if m in header:
            i = header.index(m)
            print(f"{m:62} {units[i][:8]:8} " + " ".join(f"{d[i]:>24}" for d in data))
    print("stall reasons, warps per issued instruction (smsp__average_warps_issue_stalled_*_per_issue_active)")
    for i, h in enumerate(header):
        match = STALL.match(h)
        if match and any(float(d[i] or 0) >= 0.005 for d in data):
            print(f"  {match.group(1):60} {'':8} " + " ".join(f"{float(d[i]):>24.3f}" for d in data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
