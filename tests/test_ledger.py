"""The ledger of what the service keeps for each submitter (mmd/spool/ledger.py), alone."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from mmd.spool.common import Shared
from mmd.spool.ledger import Ledger, Usage


def _add_many(private: str, times: int) -> None:
    folder = Path(private)
    ledger = Ledger(Shared(folder, folder, state_dir=folder, class_mode=True))
    for _ in range(times):
        ledger.add("alice", Usage(4096, 1))


def test_counts_changed_by_several_processes_at_once_lose_nothing(tmp_path):
    """Workers archive at the same time: each change is read and rewritten under the file's lock."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add_many, args=(str(tmp_path), 300)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    ledger = Ledger(Shared(tmp_path, tmp_path, state_dir=tmp_path, class_mode=True))
    assert ledger.usage("alice") == Usage(4 * 300 * 4096, 1200)
    assert ledger.usage("bob") == Usage()
    ledger.add("alice", -Usage(4 * 300 * 4096 + 1, 5000))  # never below zero
    assert ledger.usage("alice") == Usage()
