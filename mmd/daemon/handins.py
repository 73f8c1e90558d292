"""The daemon's desk for kernels handed in (class mode): each taken from the inbox off the main loop.

A hand-in (``NAME.cu``: :func:`mmd.spool.handins.is_handin`) is never a job: the main loop hands it here once it
is complete, and one thread of its own takes it (:func:`mmd.spool.handins.receive`), one at a time, oldest
first. The thread does little but wait: NVRTC compiles in a child process of its own under limits
(:mod:`mmd.kernelfile.nvrtc`), so the main loop goes on serving jobs meanwhile; no worker's CUDA context is
touched. A hand-in the thread is still on is not handed to it again.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..config import Settings, graders_gids, kernel_cache_dir
from ..errors import MmdError
from ..kernelfile.store import KernelStore
from ..spool import Candidate, shown
from ..spool.handins import HandInSettings, receive
from ..spool.ledger import Ledger, usage_of
from ..spool.shared import Shared
from ..submitters import login_of


class HandInDesk:
    """Takes the kernels handed in to the spool whose private folder is ``private``."""

    def __init__(self, settings: Settings, private: Path, log: Any) -> None:
        self._shared = Shared(settings.inbox, settings.outbox, state_dir=settings.state_dir,
                              class_mode=settings.class_mode, graders=graders_gids(settings))  # fmt: skip
        self._ledger = Ledger(self._shared) if settings.class_mode and settings.state_dir is not None else None
        self._store = KernelStore.of(private)
        self._log = log
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmd-handin")
        self._pending: dict[str, Future[None]] = {}

    def take(self, cand: Candidate, settings: Settings) -> None:
        """Take hand-in ``cand`` (complete, in the inbox) under ``settings`` (the current ones: a reload that
        turns ``student_kernels`` off refuses the hand-ins that come after it)."""
        self._pending = {name: f for name, f in self._pending.items() if not f.done()}
        if cand.name in self._pending or cand.owner is None:
            return
        allowed = settings.student_kernels and settings.class_mode and settings.state_dir is not None
        judged = HandInSettings(allowed, kernel_cache_dir(settings), max_bytes=settings.max_submitter_bytes,
                                max_files=settings.max_submitter_files)  # fmt: skip
        self._pending[cand.name] = self._pool.submit(self._receive, cand, cand.owner, judged)

    def _receive(self, cand: Candidate, owner: int, settings: HandInSettings) -> None:
        try:
            if os.lstat(self._shared.inbox / cand.name).st_ino != cand.ino:
                return  # taken already, or another entry since: judged when it is seen
        except OSError:
            return
        try:
            folder = self._shared.make_output_folder(owner)
            answer = receive(
                self._shared.inbox,
                cand.name,
                owner,
                folder,
                self._store,
                settings,
                self._ledger,
                failed=self._shared.failed,
            )
        except MmdError as exc:
            self._log.error("cannot take a kernel handed in", file=shown(cand.name), submitter=login_of(owner),
                            reason=exc.reason)  # fmt: skip
            return
        except Exception as exc:  # the thread's boundary, as a worker's job's: it goes on to the next hand-in
            self._log.exception("internal error in a hand-in", file=shown(cand.name), error=repr(exc))
            return
        self._log.info("kernel handed in", file=shown(cand.name), submitter=login_of(owner), status=answer.status,
                       **({"reason": answer.reason} if answer.reason else {"version": answer.version}))  # fmt: skip

    def sweep(self, max_age_s: float) -> None:
        """Retention: remove the kept versions older than ``max_age_s`` that are no name's current one, on the
        desk's own thread (never beside a hand-in that may keep one of them again), each uncounted."""
        self._pool.submit(self._sweep, max_age_s)

    def _sweep(self, max_age_s: float) -> None:
        gone = self._store.sweep(max_age_s, time.time())
        if self._ledger is not None:
            for login, _path, info in gone:
                self._ledger.add(login, -usage_of(info))
        if gone:
            self._log.info("removed kept kernel versions older than retention_days", files=len(gone))

    def close(self) -> None:
        """Finish the hand-in in hand (a compile is bounded by its limits) and take no more."""
        self._pool.shutdown(wait=True, cancel_futures=True)
