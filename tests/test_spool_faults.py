"""Faults injected into every spool step: each operation of each step fails with each errno.

A job's fate must always be one of three: its output and sidecar (archived
to ``.done``); its error sidecar (archived to ``.failed``); or kept, in the
inbox or claimed in ``.work`` (held, or left after a failed archive) and
done once the fault is gone, without a restart (the daemon takes it back
after its pause) and after one. A valid job is never failed because the
outbox refused it, and later jobs still run.

The faults go through :class:`mmd.fileops.FileOps`, the seam the spool and
the commits do their file operations through (as watchdog's polling
snapshot takes ``stat`` and ``listdir``). The matrix drives a real
:class:`~mmd.daemon.Runner`, a worker's job loop (real files, the cpu backend), in
this process, and the daemon's own scheduling (the pause, the
take-back, ``--once``'s exit status) is checked with whole daemons below.
Real filesystems (a full tmpfs, a read-only remount, a daemon of another
user) are in tests/test_reliability.py.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmd import config, daemon, spool
from mmd.daemon import Control, Runner
from mmd.daemon.messages import Kept, Resume, RunOrder
from mmd.fileops import OPERATIONS, FileOps
from mmd.job import new_id

#: The errnos a lab box's disk gives: read-only remount, full, wrong owner or mode, not permitted, failing.
ERRNOS = {name: getattr(errno, name) for name in ("EROFS", "ENOSPC", "EACCES", "EPERM", "EIO")}

GOOD = "2\n1 2\n3 4\n5 6\n7 8\n"
GOOD_OUT = b"2\n 19.00 22.00\n 43.00 50.00\n"
BAD = "2\n1 2\n3 x\n5 6\n7 8\n"  # refused: line 3


# ---------------------------------------------------------------------------
# the injector


@dataclass
class Fault:
    step: str
    op: str
    err: int
    hits: int = 0


@dataclass
class FaultyOps(FileOps):
    """:class:`FileOps` that fails the armed (step, operation) pairs with their errno, until cleared.

    Each call is classified into the spool step it belongs to from the
    operation and its paths (:meth:`step_of`); ``seen`` records every
    (step, operation) pair met, armed or not.
    """

    inbox: Path
    outbox: Path
    #: Where the armed faults are kept for other processes too (a whole daemon's workers get a copy of
    #: this object when they start; arming and clearing later reach them through this file).
    shared: Path | None = None
    faults: list[Fault] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    _fds: dict[int, Path] = field(default_factory=dict)

    def arm(self, step: str, op: str, err: int) -> Fault:
        fault = Fault(step, op, err)
        self.faults.append(fault)
        self._share()
        return fault

    def clear(self) -> None:
        self.faults.clear()
        self._share()

    def _share(self) -> None:
        if self.shared is not None:
            tmp = self.shared.with_suffix(".tmp")
            tmp.write_text(json.dumps([[f.step, f.op, f.err] for f in self.faults]))
            os.replace(tmp, self.shared)

    def _armed(self) -> list[Fault]:
        if self.shared is None:
            return self.faults
        try:
            return [Fault(*f) for f in json.loads(self.shared.read_text())]
        except FileNotFoundError:
            return []

    def step_of(self, op: str, *paths: Path) -> str | None:
        if op == "syncfs":
            return "group"  # a group commit's one sync of the outbox's filesystem
        work, done, failed = self.inbox / ".work", self.inbox / ".done", self.inbox / ".failed"
        for path in paths:
            if path.parent == self.outbox:
                name = path.name
                tmp = re.fullmatch(r"\.(.+)\.[0-9]+\.tmp", name)  # write_atomic's .<name>.<pid>.tmp
                base = tmp[1] if tmp else name
                for suffix, step in (
                    (spool.CLAIM_SUFFIX, "reservation"),
                    (".timing.yaml", "sidecar"),
                    (".error.yaml", "error-sidecar"),
                    (".out", "output"),
                ):
                    if base.endswith(suffix):
                        return step
        first = paths[0]
        if first.parent == work and re.fullmatch(rf"\..+{re.escape(spool.CLAIM_SUFFIX)}\.[0-9]+\.tmp", first.name):
            return "reservation"  # a released one, kept in .work as a spare to be written anew
        if first in (done, failed) or first.parent in (done, failed):
            return "archive"
        if first.parent == self.inbox:
            return "claim"  # the rename out of the inbox
        if first == work or (first.parent == work and op == "mkdir"):
            return "claim"  # .work, or a job folder
        if first.parent == work:  # a job folder: the spare renamed to it, or it renamed on
            if first.name.startswith(spool.SPARE_DIR):  # one of the process's spare folders
                return "claim"
            return "release" if op == "rmdir" or paths[-1].name.startswith(spool.SPARE_DIR) else "claim"
        if first.parent.parent == work:  # in a job folder
            if first.name.startswith(spool.ATTEMPTS_NAME):
                return "release" if op == "unlink" and first.name == spool.ATTEMPTS_NAME else "hold"
            return "claim" if op == "lstat" else "archive"
        return None

    def _check(self, op: str, *paths: Path | None) -> None:
        real = [Path(p) for p in paths if p is not None]
        if not real:
            return
        step = self.step_of(op, *real)
        if step is None:
            return
        self.seen.add((step, op))
        for fault in self._armed():
            if (fault.step, fault.op) == (step, op):
                fault.hits += 1
                raise OSError(fault.err, os.strerror(fault.err), str(real[0]))

    def open_exclusive(self, path: Path, mode: int = 0o644) -> int:
        self._check("open_exclusive", path)
        fd = super().open_exclusive(path, mode)
        self._fds[fd] = Path(path)
        return fd

    def open_rewrite(self, path: Path) -> int:
        self._check("open_rewrite", path)
        fd = super().open_rewrite(path)
        self._fds[fd] = Path(path)
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._check("write", self._fds.get(fd))
        return super().write(fd, data)

    def truncate(self, fd: int, length: int) -> None:
        self._check("truncate", self._fds.get(fd))
        super().truncate(fd, length)

    def fsync(self, fd: int) -> None:
        self._check("fsync", self._fds.get(fd))
        super().fsync(fd)

    def close(self, fd: int) -> None:
        path = self._fds.pop(fd, None)
        try:
            self._check("close", path)
        finally:
            super().close(fd)  # a failed close still releases the descriptor, as close(2) does

    def rename(self, src: Path, dst: Path) -> None:
        self._check("rename", src, dst)
        super().rename(src, dst)

    def replace(self, src: Path, dst: Path) -> None:
        self._check("replace", src, dst)
        super().replace(src, dst)

    def link(self, src: Path, dst: Path) -> None:
        self._check("link", dst, src)
        super().link(src, dst)

    def unlink(self, path: Path) -> None:
        self._check("unlink", path)
        super().unlink(path)

    def mkdir(self, path: Path) -> None:
        self._check("mkdir", path)
        super().mkdir(path)

    def rmdir(self, path: Path) -> None:
        self._check("rmdir", path)
        super().rmdir(path)

    def lstat(self, path: Path) -> os.stat_result:
        self._check("lstat", path)
        return super().lstat(path)

    def syncfs(self, folder: Path) -> None:
        self._check("syncfs", folder)
        super().syncfs(folder)


# ---------------------------------------------------------------------------
# a worker's runner in this process (the daemon's scheduling is tested with whole daemons below)


class Rig:
    """An inbox, an outbox, a FaultyOps, and a worker that runs jobs the way a daemon's worker does."""

    def __init__(self, root: Path) -> None:
        self.inbox, self.outbox = root / "inbox", root / "outbox"
        self.ops = FaultyOps(self.inbox, self.outbox)
        self.settings = config.Settings(inbox=self.inbox, outbox=self.outbox, backend="cpu", rescan_seconds=0.01)
        self.start()

    def start(self) -> None:
        """A daemon starting: a fresh spool and worker; what an earlier one left in .work is resumed."""
        self.spool = spool.Spool(spool.Shared(self.inbox, self.outbox, ops=self.ops))
        self.spool.shared.prepare()
        self.events: list[Any] = []
        self.runner = Runner(self.settings, self.spool, self.events.append, Control.new(multiprocessing))
        self.seq = 0
        resumed = self.spool.claims.resumable()
        self.spool.reservations.sweep(resumed)
        for claim in resumed:
            self.resume(claim)

    def resume(self, claim: spool.Claim) -> None:
        self.seq += 1
        self.runner.process(Resume(self.seq, claim))

    @property
    def pauses(self) -> list[Kept]:
        """What the daemon would pause for: the jobs the runner kept in .work."""
        return [e for e in self.events if isinstance(e, Kept)]

    def drop(self, name: str, text: str) -> None:
        (self.inbox / name).write_text(text)

    def run(self, name: str) -> None:
        self.seq += 1
        self.runner.process(RunOrder(self.seq, name, new_id()))

    def drain(self) -> None:
        """What the daemon does after its pause: take back what it left in .work, sweep, claim what waits."""
        for _ in range(10):
            back = self.spool.claims.take_back()
            for claim in back:
                self.resume(claim)
            self.spool.reservations.sweep(self.spool.claims.in_work())
            waiting = [c.name for c in self.spool.scanner.scan()]
            for name in waiting:
                self.run(name)
            if not back and not waiting and not self.spool.in_hand.left:
                return
        raise AssertionError("jobs still pending after 10 rounds")

    def close(self) -> None:
        self.runner.close()

    # -- what became of a job --
    def fate(self, name: str) -> str:
        """``done``, ``failed``, ``inbox``, ``held`` (in .work, nothing of it visible in the outbox) or ``left``
        (in .work with its whole result committed: only its archive is left to do)."""
        stem = name.rsplit(".", 1)[0]
        claimed = [p for p in (self.inbox / ".work").glob(f"*/{name}")]
        places = {
            "done": self.inbox / ".done" / name,
            "failed": self.inbox / ".failed" / name,
            "inbox": self.inbox / name,
        }
        where = [k for k, p in places.items() if p.exists()] + (["work"] if claimed else [])
        if len(where) == 2 and "work" in where:  # an archive whose unlinks both failed: one file, two names
            other = places[where[0]]
            assert os.path.samestat(os.lstat(other), os.lstat(claimed[0])), f"{name} is doubled: {where}"
            where = ["work"]
        assert len(where) == 1, f"{name} is in {where or 'no place'}: lost or doubled"
        visible = sorted(p.name for p in self.outbox.iterdir() if p.name.startswith(stem + ".") and "1." not in p.name)
        committed = {
            "done": [f"{stem}.out", f"{stem}.timing.yaml"],
            "failed": [f"{stem}.error.yaml"],
        }
        fate = where[0]
        if fate in committed:
            assert visible == committed[fate], f"{name} is {fate} but {visible} are visible"
        elif fate == "inbox" or not visible:
            fate = "held" if fate == "work" else fate
            assert visible == [], f"{name} is kept ({fate}) but {visible} are visible: half done"
        else:
            assert visible in committed.values(), f"{name} is in .work with {visible}: half done"
            fate = "left"
        if visible == committed["done"]:
            assert yaml.safe_load((self.outbox / f"{stem}.timing.yaml").read_text())["status"] == "ok"
        return fate

    def assert_clean(self, names: list[str]) -> None:
        """Every job ended, each once, under its plain name; nothing stale or half done is left."""
        for name in names:
            assert self.fate(name) in ("done", "failed"), name
        work = self.inbox / ".work"
        spare = re.compile(rf"\.\.spare[0-9]+{re.escape(spool.CLAIM_SUFFIX)}\.{os.getpid()}\.tmp")  # this process's
        leftovers = [p for p in work.rglob("*") if p.is_file() and not (p.parent == work and spare.fullmatch(p.name))]
        assert leftovers == [], leftovers
        assert not [n for n in os.listdir(self.inbox) if spool.is_job_name(n)]
        assert not list(self.outbox.glob("*.1.*")), "a versioned name: the plain one was blocked"
        assert not [p.name for p in self.outbox.iterdir() if p.name.endswith(spool.CLAIM_SUFFIX)], "stale reservation"
        for folder in (self.inbox / ".done", self.inbox / ".failed"):
            archived = sorted(os.listdir(folder)) if folder.exists() else []
            assert len(archived) == len(set(n.split(".")[0] for n in archived)), f"archived twice: {archived}"


# ---------------------------------------------------------------------------
# the matrix

#: Every (step, operation) a job's path through the spool does, and what becomes of a job when that
#: operation fails: "done" (the step has another way, or the operation is not on the job's path),
#: "held" (kept claimed in .work, nothing visible: the outbox refused what it had to write), "inbox"
#: (not claimed), "left" (claimed and kept in .work without a hold: its archive failed after its result
#: was committed, or it could not be looked at after the claim). The "error-sidecar" step runs a
#: refused input (its "done" is "failed"); "hold" also fails the output, so that the job is held.
MATRIX: dict[tuple[str, str], str] = {
    ("claim", "mkdir"): "inbox",  # .work, or the job's folder
    ("claim", "rename"): "inbox",  # the spare folder to the job's, the file out of the inbox
    ("claim", "lstat"): "held",  # claimed, not examinable: left for the take-back, nothing written
    ("reservation", "open_exclusive"): "held",
    ("reservation", "write"): "held",  # the disk full to the last byte (issue 15)
    ("reservation", "close"): "held",
    ("reservation", "link"): "held",  # EPERM: no hard links here; made in place instead: done
    ("reservation", "unlink"): "done",  # its temporary, and its release after the sidecar
    ("reservation", "open_rewrite"): "done",  # a spare (a released one) written anew; else a new one made
    ("reservation", "truncate"): "done",  # a spare cut to its new text; else a new one made
    ("reservation", "rename"): "done",  # its release kept as a spare; else removed
    ("output", "open_exclusive"): "held",
    ("output", "write"): "held",
    ("output", "fsync"): "held",
    ("output", "close"): "held",
    ("output", "replace"): "held",  # a read-only outbox (issue 15)
    ("output", "unlink"): "done",  # only on failure paths (a temporary; a held job's own output)
    ("sidecar", "open_exclusive"): "held",
    ("sidecar", "write"): "held",
    ("sidecar", "fsync"): "held",
    ("sidecar", "close"): "held",
    ("sidecar", "replace"): "held",
    ("sidecar", "unlink"): "done",  # only on failure paths (its temporary, when the output before it failed)
    ("error-sidecar", "open_exclusive"): "held",
    ("error-sidecar", "write"): "held",
    ("error-sidecar", "fsync"): "held",
    ("error-sidecar", "close"): "held",
    ("error-sidecar", "replace"): "held",
    ("error-sidecar", "unlink"): "done",  # only on failure paths (a held job's own error sidecar): refused
    ("archive", "mkdir"): "left",
    ("archive", "link"): "done",  # another user's file under fs.protected_hardlinks (EPERM): renamed
    ("archive", "rename"): "done",  # only when link is refused
    ("archive", "unlink"): "left",
    ("release", "rename"): "done",  # the emptied folder kept as a spare; else removed
    ("release", "rmdir"): "done",
    ("release", "unlink"): "done",  # the attempts record of a job that was held
    ("hold", "open_exclusive"): "held",  # the hold stands; only its count is lost
    ("hold", "write"): "held",
    ("hold", "fsync"): "held",
    ("hold", "close"): "held",
    ("hold", "replace"): "held",
}


def expected(step: str, op: str, err: int) -> str:
    if (step, op) == ("reservation", "link") and err == errno.EPERM:
        return "done"  # link's EPERM says "no hard links on this filesystem": created in place
    fate = MATRIX[(step, op)]
    return "failed" if step == "error-sidecar" and fate == "done" else fate  # its job is a refused input


@pytest.mark.parametrize("err", list(ERRNOS), ids=list(ERRNOS))
@pytest.mark.parametrize(("step", "op"), list(MATRIX), ids=[f"{s}-{o}" for s, o in MATRIX])
@pytest.mark.parametrize(
    "recovery",
    ["take-back", pytest.param("restart", marks=pytest.mark.integration)],  # the same faults; `make test` runs both
)
def test_each_operation_of_each_step_fails_with_each_errno(tmp_path, step, op, err, recovery):
    rig = Rig(tmp_path)
    try:
        name, text = ("bad.txt", BAD) if step == "error-sidecar" else ("a.txt", GOOD)
        if step in ("release", "archive") or (step, op) == ("claim", "mkdir"):
            rig.spool.shared.forget_folders()  # .done, .failed and .work are made (and so failed) on first use
        if step == "release" and op == "unlink":  # the attempts record of a job held once before
            rig.ops.arm("output", "replace", errno.ENOSPC)
            rig.drop(name, text)
            rig.run(name)
            rig.ops.clear()
            fault = rig.ops.arm(step, op, ERRNOS[err])
            [claim] = rig.spool.claims.take_back()
            rig.resume(claim)
        else:
            if step == "hold":
                rig.ops.arm("output", "write", errno.ENOSPC)  # held, and its hold cannot be recorded
            if step == "reservation" and op in ("open_rewrite", "truncate"):  # a spare: a released reservation
                rig.drop("first.txt", GOOD)
                rig.run("first.txt")
            fault = rig.ops.arm(step, op, ERRNOS[err])
            rig.drop(name, text)
            rig.run(name)
        fate = rig.fate(name)
        want = expected(step, op, ERRNOS[err])
        assert fate == want, f"{name}: {fate}, expected {want}"
        if (want != "done" and want != "failed") or step == "reservation":
            assert fault.hits, "the fault was never met"
        if want == "held" and step != "claim":
            assert rig.pauses, "a held job pauses the daemon"
            held = spool.held_jobs(rig.inbox)
            if step != "hold":  # (there the record itself is what failed: the hold stands unrecorded)
                [job] = held
                assert job.file == name and os.strerror(ERRNOS[err]) in job.reason, job
        rig.ops.clear()
        if recovery == "restart":
            rig.close()
            rig.start()
        rig.drop("b.txt", GOOD)  # a later job
        rig.drain()
        rig.assert_clean([name, "b.txt"])
        assert rig.fate(name) == ("failed" if name == "bad.txt" else "done")
        assert (rig.outbox / "b.out").read_bytes() == GOOD_OUT
        if name == "a.txt":
            assert (rig.outbox / "a.out").read_bytes() == GOOD_OUT
    finally:
        rig.close()


def test_the_matrix_covers_every_operation_of_every_step(tmp_path):
    """A good job, a refused one and a held one, with nothing failing: every (step, operation) they do is in
    the matrix, so a new file operation in a step cannot go untested."""
    rig = Rig(tmp_path)
    try:
        rig.spool.shared.forget_folders()
        rig.drop("a.txt", GOOD)
        rig.drop("bad.txt", BAD)
        rig.run("a.txt")
        rig.run("bad.txt")
        rig.ops.arm("output", "replace", errno.ENOSPC)
        rig.drop("h.txt", GOOD)
        rig.run("h.txt")
        rig.ops.clear()
        rig.drain()
        rig.assert_clean(["a.txt", "bad.txt", "h.txt"])
        assert rig.ops.seen - set(MATRIX) == set(), "operations no fault is injected into"
        assert {op for _, op in rig.ops.seen} <= set(OPERATIONS)
    finally:
        rig.close()


def test_a_fault_that_passes_by_itself_needs_nothing_but_the_take_back(tmp_path):
    """ENOSPC for the first output only (another job's temporary filled the disk a moment): held, then done."""
    rig = Rig(tmp_path)
    try:
        rig.drop("a.txt", GOOD)
        fault = rig.ops.arm("output", "write", errno.ENOSPC)
        rig.run("a.txt")
        assert rig.fate("a.txt") == "held" and fault.hits == 1
        rig.ops.clear()
        rig.drain()
        rig.assert_clean(["a.txt"])
        attempts_gone = not list((rig.inbox / ".work").rglob(spool.ATTEMPTS_NAME))
        assert attempts_gone
    finally:
        rig.close()


def test_an_output_that_never_fits_is_failed_after_three_attempts_while_the_outbox_takes_its_error_sidecar(tmp_path):
    rig = Rig(tmp_path)
    try:
        rig.drop("big.txt", GOOD)
        rig.ops.arm("output", "write", errno.ENOSPC)
        rig.run("big.txt")
        for _ in ("the second attempt", "the third"):
            assert rig.fate("big.txt") == "held"
            [claim] = rig.spool.claims.take_back()
            rig.resume(claim)
        assert rig.fate("big.txt") == "failed"
        rec = yaml.safe_load((rig.outbox / "big.error.yaml").read_text())
        assert rec["error"]["kind"] == "output" and "No space left on device" in rec["error"]["reason"]
        rig.ops.clear()
        rig.drop("b.txt", GOOD)
        rig.drain()
        assert rig.fate("b.txt") == "done"
    finally:
        rig.close()


def test_a_job_whose_error_sidecar_cannot_be_written_is_never_failed_without_one(tmp_path):
    """A read-only outbox: the output and the error sidecar both refused, however often; held, never failed."""
    rig = Rig(tmp_path)
    try:
        rig.drop("a.txt", GOOD)
        for step in ("output", "error-sidecar"):
            rig.ops.arm(step, "open_exclusive", errno.EROFS)
        rig.run("a.txt")
        for _ in range(5):
            [claim] = rig.spool.claims.take_back()
            rig.resume(claim)
            assert rig.fate("a.txt") == "held"
        [job] = spool.held_jobs(rig.inbox)
        assert job.holds == 6 and "Read-only file system" in job.reason
        rig.ops.clear()
        rig.drain()
        rig.assert_clean(["a.txt"])
    finally:
        rig.close()


# ---------------------------------------------------------------------------
# group commits: small jobs with more waiting behind them are published together


def run_group(rig: Rig, names: list[str]) -> None:
    """Run ``names`` as a worker does when more orders wait behind each (the last flushes the group)."""
    for name in names:
        rig.seq += 1
        rig.runner.process(RunOrder(rig.seq, name, new_id()), more_waiting=True)
    rig.runner.flush()


def test_a_group_is_published_with_one_sync(tmp_path):
    rig = Rig(tmp_path)
    try:
        names = [f"g{c}.txt" for c in "abcde"] + ["bad.txt"]
        for name in names:
            rig.drop(name, BAD if name == "bad.txt" else GOOD)
        run_group(rig, names)
        synced = {(step, op) for step, op in rig.ops.seen if op in ("fsync", "syncfs")}
        assert synced == {("group", "syncfs")}, "five outputs, six sidecars: one sync, no file's own"
        rig.assert_clean(names)
        assert all((rig.outbox / f"g{c}.out").read_bytes() == GOOD_OUT for c in "abcde")
        assert [type(e).__name__ for e in rig.events] == ["Ended"] * 6
    finally:
        rig.close()


@pytest.mark.parametrize(("step", "op"), [("group", "syncfs"), ("output", "replace"), ("sidecar", "replace")])
def test_a_group_the_outbox_refuses_is_held_whole_and_done_later(tmp_path, step, op):
    """The sync fails (EIO), or every rename: each job of the group is held, nothing half done is visible,
    and all are done once the fault is gone."""
    rig = Rig(tmp_path)
    try:
        names = [f"g{c}.txt" for c in "abcd"]
        for name in names:
            rig.drop(name, GOOD)
        rig.ops.arm(step, op, errno.EIO)
        run_group(rig, names)
        assert [rig.fate(n) for n in names] == ["held"] * 4
        assert len(rig.pauses) == 4
        rig.ops.clear()
        rig.drain()
        rig.assert_clean(names)
    finally:
        rig.close()


# ---------------------------------------------------------------------------
# whole daemons: the pause, the take-back, --once


def _settings(root: Path, **kw: Any) -> config.Settings:
    base: dict[str, Any] = dict(
        inbox=root / "inbox", outbox=root / "outbox", backend="cpu", quiet_seconds=0.05, rescan_seconds=0.05
    )
    base.update(kw)
    return config.Settings(**base)


def test_once_stops_with_status_1_and_the_next_run_serves_the_held_job(tmp_path):
    s = _settings(tmp_path)
    ops = FaultyOps(s.inbox, s.outbox, shared=tmp_path / "faults.json")
    spool.Shared(s.inbox, s.outbox).prepare()
    (s.inbox / "m.txt").write_text(GOOD)
    ops.arm("output", "replace", errno.EROFS)
    assert daemon.Daemon(s, ops=ops).serve(once=True) == 1
    assert [p.name for p in (s.inbox / ".work").glob("*/m.txt")] == ["m.txt"]
    assert [p.name for p in s.outbox.iterdir()] == [".m.claim"], "held: only its reservation, nothing visible"
    ops.clear()
    assert daemon.Daemon(s, ops=ops).serve(once=True) == 0
    assert (s.outbox / "m.out").read_bytes() == GOOD_OUT
    assert sorted(p.name for p in s.outbox.iterdir()) == ["m.out", "m.timing.yaml"]


def test_a_serving_daemon_takes_a_held_job_back_once_the_outbox_is_writable(tmp_path):
    """Issue 15's read-only outbox, in process: held (not failed), served after the pause, no restart."""
    from .conftest import alongside, wait_for

    s = _settings(tmp_path)
    ops = FaultyOps(s.inbox, s.outbox, shared=tmp_path / "faults.json")
    spool.Shared(s.inbox, s.outbox).prepare()
    for step, op in (("reservation", "open_exclusive"), ("output", "open_exclusive")):
        ops.arm(step, op, errno.EROFS)
    d = daemon.Daemon(s, ops=ops)

    def drive() -> None:
        wait_for(lambda: d.state.snapshot()["status"] == "serving", 30, "the daemon")
        (s.inbox / "m.txt").write_text(GOOD)
        wait_for(lambda: spool.held_jobs(s.inbox), 30, "the hold")
        assert not (s.inbox / ".failed").exists()
        wait_for(lambda: [h.holds for h in spool.held_jobs(s.inbox)] >= [2], 30, "a retry after the pause")
        ops.clear()
        wait_for(lambda: (s.inbox / ".done" / "m.txt").exists(), 30, "the job once the outbox is writable")
        (s.inbox / "n.txt").write_text(GOOD)
        wait_for(lambda: (s.inbox / ".done" / "n.txt").exists(), 30, "a later job")

    assert alongside(d.serve, drive, lambda: d.request_stop("test")) == 0
    assert sorted(p.name for p in s.outbox.iterdir()) == ["m.out", "m.timing.yaml", "n.out", "n.timing.yaml"]


def test_a_restart_resumes_a_held_job_under_its_plain_name(tmp_path):
    s = _settings(tmp_path)
    ops = FaultyOps(s.inbox, s.outbox, shared=tmp_path / "faults.json")
    spool.Shared(s.inbox, s.outbox).prepare()
    (s.inbox / "m.txt").write_text(GOOD)
    ops.arm("reservation", "write", errno.ENOSPC)  # the outbox full to the last byte at the claim
    assert daemon.Daemon(s, ops=ops).serve(once=True) == 1
    assert [p.name for p in s.outbox.iterdir()] == [], "no reservation half written"
    ops.clear()
    assert daemon.Daemon(s, ops=ops).serve(once=True) == 0
    assert sorted(p.name for p in s.outbox.iterdir()) == ["m.out", "m.timing.yaml"]
    assert yaml.safe_load((s.outbox / "m.timing.yaml").read_text())["resumed"] is True
