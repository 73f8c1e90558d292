"""How many cores this process may use: the one number mmd's thread pools are sized from."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU set where the system has one (a Slurm task's,
    a systemd unit's ``AllowedCPUs``, ``taskset``), else every core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no CPU sets here (macOS)
        return max(1, os.cpu_count() or 1)
