"""A job's phases, as a supervisor is told them.

:func:`mmd.pipeline.run_job` calls its ``on_phase`` hook with each phase it
enters; a daemon's worker puts the phase in its control block, so that a job
stopped at its time limit is refused naming the phase it was in. Stopping a
job is its worker's end (docs/daemon.md), so a job needs no way to be
stopped from inside.
"""

from __future__ import annotations

from collections.abc import Callable

#: The phases a job goes through, in order ("claimed": not yet reading).
PHASES = ("claimed", "read", "parse", "multiply", "emit")

#: Told each phase a job enters.
PhaseHook = Callable[[str], None]


def ignore_phase(_phase: str) -> None:
    """The hook of a job nobody supervises (``mmd run``, the benchmark)."""
