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


#: Elements the checks take at a time on one thread, 2^20 per usable core: a block of rows of a
#: product made elsewhere (a GPU's, as mmd.check.product.Float64Product.pairs hands it out), and of the outputs
#: mmd.check.jobs reads a block at a time (two outputs compared, --quick's sums); 512 rows of a 4096
#: matrix on 2 cores, all of it on 16. Here, with no numpy, so that --quick by the C passes can read it.
BLOCK_ELEMS = (1 << 20) * usable_cores()

#: Elements of a block of rows that one of mmd.check.product's workers takes at a time (its float64 product
#: block and the output's rows beside it: 8 MiB each, a buffer per worker used again block to block).
WORKER_BLOCK_ELEMS = 1 << 20


def block_rows(n: int) -> int:
    """Rows of an n-column matrix that the checks take at a time (:data:`BLOCK_ELEMS` elements)."""
    return max(1, BLOCK_ELEMS // max(n, 1))


def worker_rows(m: int, n: int) -> int:
    """Rows of an m×n product that one of mmd.check.product's workers takes at a time: at most
    :data:`WORKER_BLOCK_ELEMS` elements, and few enough that every usable core has a block."""
    per_core = -(-m // usable_cores())
    return max(1, min(WORKER_BLOCK_ELEMS // max(n, 1), per_core))
