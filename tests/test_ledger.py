"""The ledger of what the service keeps for each submitter (mmd/spool/ledger.py), alone."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from mmd.spool.ledger import Ledger, Usage
from mmd.spool.shared import Shared


def _ledger(folder: Path) -> Ledger:
    return Ledger(Shared(folder, folder, state_dir=folder, class_mode=True))


def _add_many(private: str, times: int) -> None:
    ledger = _ledger(Path(private))
    for _ in range(times):
        ledger.add("alice", Usage(4096, 1))


def _in_processes(target, private: Path, times: int, count: int) -> None:
    """``target(private, times)`` in ``count`` processes at once, each ending well."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=(str(private), times)) for _ in range(count)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0


def test_counts_changed_by_several_processes_at_once_lose_nothing(tmp_path):
    """Workers archive at the same time: each change is read and rewritten under the file's lock."""
    _in_processes(_add_many, tmp_path, 300, 4)
    ledger = _ledger(tmp_path)
    assert ledger.usage("alice") == Usage(4 * 300 * 4096, 1200)
    assert ledger.usage("bob") == Usage()
    ledger.add("alice", -Usage(4 * 300 * 4096 + 1, 5000))  # never below zero
    assert ledger.usage("alice") == Usage()


def _charge_many(private: str, times: int) -> None:
    ledger = _ledger(Path(private))
    for _ in range(times):
        ledger.charge_gpu("alice", 0.25)


def test_gpu_seconds_charged_by_several_processes_add_up_and_outlive_a_recount(tmp_path):
    """The GPU time a student's kernels used (student_kernel_gpu_s): charged by each worker after a job, under the
    file's lock; history, not what lies on disk, so a daemon's start (the recount) keeps it."""
    _in_processes(_charge_many, tmp_path, 100, 3)
    ledger = _ledger(tmp_path)
    assert ledger.gpu_seconds("alice") == 75.0 and ledger.gpu_seconds("bob") == 0.0
    ledger.recount()
    assert ledger.gpu_seconds("alice") == 75.0
    ledger.charge_gpu("bob", 0.0)  # nothing used: nothing written
    assert not (ledger.root / "gpu" / "bob").exists()
