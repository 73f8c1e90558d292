"""How many cores this process may use: the one number mmd's thread pools, and the blocks its checks
take at a time, are sized from."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU set where the system has one (a Slurm task's,
    a systemd unit's ``AllowedCPUs``, ``taskset``), else every core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no CPU sets here (macOS)
        return max(1, os.cpu_count() or 1)


#: Elements the checks take at a time, 2^20 per usable core: a block of rows of the float64 product
#: (mmd.verify.Product.blocks) and of the outputs mmd.grading reads beside it; 512 rows of a 4096
#: matrix on 2 cores, all of it on 16. On the GPU machine's 16 cores, blocks of 512 rows made
#: ``mmd check OUT --input IN`` at 4096 take 0.95 s against 0.83 s whole (benchmarks/bench_check.py,
#: side by side; likely the BLAS packing B again for every block, a cost that more cores do not
#: shrink as they shrink the multiply-adds). Here, with no numpy, so that mmd.readahead can read it.
BLOCK_ELEMS = (1 << 20) * usable_cores()


def block_rows(n: int) -> int:
    """Rows of an n-column matrix that the checks take at a time (:data:`BLOCK_ELEMS` elements)."""
    return max(1, BLOCK_ELEMS // max(n, 1))
