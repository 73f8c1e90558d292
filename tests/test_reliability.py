"""A hostile inbox, faults and load: the daemon keeps serving, loses nothing, reaches nothing outside the spool.

Every test ends by accounting for every file it dropped: each input is in
``.done`` with a checked output, or in ``.failed`` (or back in the inbox) with
a reason; nothing is left in ``.work``, no temporary and no partial output is
visible. docs/reliability.md lists what each test injects. No sleep is used to
synchronise: waits poll a condition against a deadline (a random delay is
used only to choose *when* a kill -9 lands).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from mmd import config, daemon, record, spool
from mmd.daemon import observer

from . import workerhooks
from .conftest import LoggedProcess, alongside, mmd_env, run_mmd
from .test_daemon import ENV, Served, check_ok, error_of, make_input, names, served, wait_for, work_files

#: Real processes and daemons: left out of `make quick`, run by `make test`.
pytestmark = pytest.mark.integration

#: RELIABILITY_FULL=1 runs the full-size cases (a 4096 job, a 100 MB line) instead of the CI scale.
FULL = os.environ.get("RELIABILITY_FULL", "") not in ("", "0")

SPOOL_NAMES = {".work", ".done", ".failed", ".mmd.lock", ".mmd-state.json"}


__all__ = ["served"]  # the fixture, shared with test_daemon


def settings_for(root: Path, **kw) -> config.Settings:
    base = dict(inbox=root / "inbox", outbox=root / "outbox", backend="cpu", quiet_seconds=0.05, create_folders=True)
    base.update(kw)
    return config.Settings(**base)


def serve_with(settings: config.Settings, action, timeout: float = 120, worker_setup=None) -> daemon.Daemon:
    """Serve in this (the main) thread while ``action(daemon)`` runs in another; then stop.

    ``worker_setup``: a hook of tests/workerhooks.py each worker process calls first (its faults and fakes).
    """
    d = daemon.Daemon(settings, worker_setup=worker_setup)

    def drive() -> None:
        wait_for(lambda: d.state.snapshot()["status"] == "serving", 30, "the daemon to serve")
        action(d)

    assert alongside(d.serve, drive, lambda: d.request_stop("test"), timeout) == 0
    return d


def waiting(inbox: Path) -> set[str]:
    return {n for n in names(inbox) if spool.is_job_name(n)}


def assert_nothing_half_done(root: Path) -> None:
    outbox, inbox = root / "outbox", root / "inbox"
    assert not [p for p in outbox.iterdir() if p.name.endswith(".tmp")], "a temporary is visible"
    for out in outbox.glob("*.out"):
        assert record.timing_path(out).exists(), f"{out.name} has no sidecar: half done"
    assert work_files(inbox) == [], "a job was left in .work"


def small(path: Path, seed: int, m: int = 3, k: int = 4, n: int = 2):
    return make_input(path, m, k, n, seed)


# ---------------------------------------------------------------------------
# load


@pytest.mark.integration
def test_burst_of_2000_files_none_lost(tmp_path, served):
    """2,000 files in one burst (half renamed in, half written in place); events alone must take them all."""
    inbox, stage = tmp_path / "inbox", tmp_path / "stage"
    inbox.mkdir()
    stage.mkdir()
    d = served(MMD_RESCAN_SECONDS="600").wait_serving()  # no rescan in the test's time: events only
    inputs = {}
    for i in range(2000):
        stem = f"b{i:04d}"
        if i % 2:
            inputs[stem] = small(stage / f"{stem}.txt", i)
            os.rename(stage / f"{stem}.txt", inbox / f"{stem}.txt")
        else:
            inputs[stem] = small(inbox / f"{stem}.txt", i)
    wait_for(lambda: len(names(inbox / ".done")) >= 2000, 180, "2000 jobs")
    assert d.proc.poll() is None
    for stem, (a, b) in inputs.items():
        check_ok(d.outbox, stem, a, b)
    assert waiting(inbox) == set()
    assert d.stop() == 0
    assert_nothing_half_done(tmp_path)


def test_lost_events_are_found_by_the_periodic_rescan(tmp_path, monkeypatch):
    """Every event dropped (as on an inotify queue overflow the kernel could not even report): events are
    hints, so the periodic rescan finds every file, one rescan period late at most."""
    monkeypatch.setattr(observer, "hint_of", lambda mask, name: None)  # every event lost
    monkeypatch.setattr(daemon.Hints, "dispatch", lambda self, event: None)
    inputs = {}

    def act(d: daemon.Daemon) -> None:
        for i in range(50):
            inputs[f"o{i}"] = small(d.spool.shared.inbox / f"o{i}.txt", i)
        wait_for(lambda: len(names(d.spool.shared.inbox / ".done")) == 50, 60, "50 jobs found by rescans")

    s = settings_for(tmp_path, rescan_seconds=0.5, observer="inotify")
    s.inbox.mkdir()
    serve_with(s, act)
    for stem, (a, b) in inputs.items():
        check_ok(s.outbox, stem, a, b)


def test_an_inotify_queue_overflow_scans_the_inbox_at_once(tmp_path, monkeypatch):
    """Each event is lost to an overflow the kernel reports (IN_Q_OVERFLOW): the inbox is scanned at once,
    not an hour later at the periodic rescan."""
    monkeypatch.setattr(observer, "hint_of", lambda mask, name: daemon.messages.Overflowed())
    inputs = {}

    def act(d: daemon.Daemon) -> None:
        for i in range(5):
            inputs[f"v{i}"] = small(d.spool.shared.inbox / f"v{i}.txt", i)
            wait_for(lambda i=i: (d.spool.shared.inbox / ".done" / f"v{i}.txt").exists(), 30, f"v{i} found by a scan")

    s = settings_for(tmp_path, rescan_seconds=3600, observer="inotify")
    s.inbox.mkdir()
    serve_with(s, act)
    for stem, (a, b) in inputs.items():
        check_ok(s.outbox, stem, a, b)


@pytest.mark.integration
def test_big_job_interleaved_with_100_small(tmp_path, served):
    """A 1024 job (4096 with RELIABILITY_FULL=1) and 100 small ones dropped while it runs."""
    size = 4096 if FULL else 1024
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    big = make_input(tmp_path / "big.src", size, size, size, 1)
    d = served().wait_serving()
    os.rename(tmp_path / "big.src", inbox / "big.txt")
    inputs = {}
    for i in range(100):
        inputs[f"s{i:03d}"] = small(tmp_path / f"s{i:03d}.src", i, 5, 6, 7)
        os.rename(tmp_path / f"s{i:03d}.src", inbox / f"s{i:03d}.txt")
    wait_for(lambda: len(names(inbox / ".done")) == 101, 600 if FULL else 180, "101 jobs")
    check_ok(d.outbox, "big", *big)
    for stem, (a, b) in inputs.items():
        check_ok(d.outbox, stem, a, b)
    assert d.stop() == 0
    assert_nothing_half_done(tmp_path)


def test_max_queue_leaves_the_rest_in_the_inbox_for_a_rescan(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    inputs = {f"q{i:02d}": small(inbox / f"q{i:02d}.txt", i) for i in range(30)}
    assert daemon.Daemon(settings_for(tmp_path, max_queue=4)).serve(once=True) == 0
    for stem, (a, b) in inputs.items():
        check_ok(tmp_path / "outbox", stem, a, b)
    assert waiting(inbox) == set()


# ---------------------------------------------------------------------------
# faults


@pytest.mark.serial  # kill -9 rounds timed to land at chosen moments: alone on the machine
@pytest.mark.integration
def test_kill9_at_random_points_30_rounds(tmp_path):
    """30 daemons killed with SIGKILL at random moments (start-up, claim, reservation, commit, archive); then one
    drains. Every job exactly once under its plain name: no ``.1`` name (there is no collision), and no
    reservation left behind (issue 15: a kill between creating ``.x.claim`` and writing it left it empty,
    never swept, and ``x.txt`` came out as ``x.1.out``)."""
    rng = random.Random(30)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    inputs = {}
    for round_ in range(30):
        for j in range(4):
            stem = f"r{round_:02d}_{j}"
            inputs[stem] = make_input(tmp_path / f"{stem}.src", 90, 90, 90, round_ * 10 + j)
            os.rename(tmp_path / f"{stem}.src", inbox / f"{stem}.txt")
        d = Served(tmp_path)
        time.sleep(rng.uniform(0.3, 1.5))  # not a synchronisation: the random point of the kill
        d.proc.kill()
        d.proc.wait(timeout=10)
        d.log.close()
    r = run_mmd("serve", "--once", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr
    outbox = tmp_path / "outbox"
    for stem, (a, b) in inputs.items():
        check_ok(outbox, stem, a, b, input_name=f"{stem}.txt")
    assert not list(outbox.glob("*.1.*")), "a job was done twice, or its plain name was blocked"
    assert not [p.name for p in outbox.iterdir() if p.name.endswith(spool.CLAIM_SUFFIX)], "a stale reservation"
    assert names(inbox / ".done") == {f"{s}.txt" for s in inputs}
    assert_nothing_half_done(tmp_path)


def hits_of(path: Path) -> int:
    """How many writes a :func:`workerhooks.enospc_on` hook refused (one line each)."""
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("which", ["out", "yaml"])
def test_disk_full_keeps_the_input_and_shows_nothing_half_written(tmp_path, which):
    """ENOSPC on the output (or on the sidecars after the output): held in .work, retried, then done.

    The disk is full inside the worker processes (tests/workerhooks.py's ``enospc_on``), for as long as the
    file ``full`` exists."""
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    a, b = small(inbox / "m.txt", 1)
    full, hits = tmp_path / "full", tmp_path / "hits"
    full.touch()
    setup = workerhooks.partial(workerhooks.enospc_on, str(outbox), rf"\.{which}\.", str(hits), str(full))
    s = settings_for(tmp_path)
    assert daemon.Daemon(s, worker_setup=setup).serve(once=True) == 1  # --once stops: the outbox refused a result
    assert hits_of(hits) >= 1
    assert held(inbox, "m.txt") and waiting(inbox) == set(), "the input must be kept, held in .work"
    assert names(outbox) == {".m.claim"}, f"something half written is visible: {names(outbox)}"
    full.unlink()  # space again
    assert daemon.Daemon(s, worker_setup=setup).serve(once=True) == 0
    check_ok(outbox, "m", a, b)
    assert names(outbox) == {"m.out", "m.timing.yaml"}


def test_output_that_never_fits_is_failed_after_three_attempts_and_others_run(tmp_path):
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    outbox.mkdir()
    hits = tmp_path / "hits"
    # only big.out's temporary hits a full disk, in the workers
    setup = workerhooks.partial(workerhooks.enospc_on, str(outbox), r"^\.big\.out\.", str(hits))
    inputs = {}

    def act(d: daemon.Daemon) -> None:
        small(d.spool.shared.inbox / "big.txt", 9)
        for i in range(3):
            inputs[f"f{i}"] = small(d.spool.shared.inbox / f"f{i}.txt", i)
        # big's archive ends it: its error sidecar is also committed (and removed again) at each hold before
        wait_for(lambda: "big.txt" in names(inbox / ".failed") and len(names(inbox / ".done")) == 3, 60, "all jobs")

    serve_with(settings_for(tmp_path, rescan_seconds=0.05), act, worker_setup=setup)
    rec = error_of(outbox, "big")
    assert rec["error"]["kind"] == "output" and "No space left" in rec["error"]["reason"]
    assert hits_of(hits) == daemon.MAX_OUTPUT_ATTEMPTS, "the output was tried MAX_OUTPUT_ATTEMPTS times"
    assert names(inbox / ".failed") == {"big.txt"}
    for stem, (a, b) in inputs.items():
        check_ok(outbox, stem, a, b)
    assert_nothing_half_done(tmp_path)


def _try_mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    options = f"size={size},mode=0755"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    return r.returncode == 0


def _remount(where: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(where)], check=True, capture_output=True)


def _fill(folder: Path) -> Path:
    """A file that takes every byte left in ``folder``'s filesystem (then smaller and smaller writes)."""
    filler = folder / ".filler"
    with open(filler, "wb", buffering=0) as fh:
        for block in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * block)
    return filler


def held(inbox: Path, name: str) -> bool:
    """Whether ``name`` is kept claimed in ``.work`` (held: the outbox refused its result)."""
    return any(p.name == name for p in work_files(inbox))


def reservations(outbox: Path) -> list[str]:
    return [p.name for p in outbox.iterdir() if p.name.endswith(spool.CLAIM_SUFFIX)]


@pytest.mark.integration
def test_real_full_tmpfs_outbox(tmp_path, served):
    """A 1 MiB tmpfs outbox: a result too big for it is failed with the reason and the small ones are served.
    Then the disk is filled to the last byte before a job is claimed (issue 15: "cannot claim", the input left
    in .work with an empty reservation, not served when space came back, ``x.1.out`` after a restart): the job
    is held, the daemon pauses, and the job is served under its plain name once space is freed, no restart."""
    outbox = tmp_path / "outbox"
    if not _try_mount_tmpfs(outbox, "1m"):
        pytest.skip("cannot mount a tmpfs here (needs root and mount rights); tests/test_spool_faults.py covers it")
    try:
        inbox = tmp_path / "inbox"
        inbox.mkdir()
        d = served(MMD_RESCAN_SECONDS="0.2").wait_serving()
        make_input(tmp_path / "big.src", 450, 10, 450, 1)  # ~1.2 MB of output
        os.rename(tmp_path / "big.src", inbox / "big.txt")
        inputs = {f"t{i}": small(tmp_path / f"t{i}.src", i) for i in range(3)}
        for stem in inputs:
            os.rename(tmp_path / f"{stem}.src", inbox / f"{stem}.txt")
        # big's archive ends it: its error sidecar is also committed (and removed again) at each hold before
        wait_for(lambda: "big.txt" in names(inbox / ".failed") and len(names(inbox / ".done")) == 3, 60, "jobs")
        assert "No space left" in error_of(outbox, "big")["error"]["reason"]
        for stem, (a, b) in inputs.items():
            check_ok(outbox, stem, a, b)
        filler = _fill(outbox)
        late = small(tmp_path / "late.src", 7)
        os.rename(tmp_path / "late.src", inbox / "late.txt")
        wait_for(lambda: held(inbox, "late.txt") and (d.state().get("paused") or {}).get("reason"), 30, "the hold")
        # The held job may keep its reservation (a spare of a worker's, written anew in the space it had): it
        # is whole, and the job's in .work. (Not held_jobs(): the daemon takes the job back every 0.2 s to try
        # again, and between two looks it may be in hand, not held.)
        left = [spool.read_reservation(outbox / n) for n in reservations(outbox)]
        in_work = {parsed[0] for p in (inbox / ".work").iterdir() if (parsed := spool.parse_work_folder(p.name))}
        assert all(r is not None and r[0] in in_work for r in left), f"a reservation was left half written: {left}"
        filler.unlink()
        wait_for(lambda: (outbox / "late.timing.yaml").exists(), 60, "the late job after space came back")
        check_ok(outbox, "late", *late)
        wait_for(lambda: "late.txt" in names(inbox / ".done"), 10, "the archive")
        assert d.stop() == 0
        assert not list(outbox.glob("late.1.*")) and reservations(outbox) == []
        assert_nothing_half_done(tmp_path)
    finally:
        subprocess.run(["umount", "-l", str(outbox)], capture_output=True)


@pytest.mark.integration
def test_read_only_outbox_holds_the_job_until_it_is_writable_again(tmp_path, served):
    """Issue 15: with the outbox remounted read-only a valid job's input went to .failed with no error sidecar,
    and it was never served once the outbox was writable again. Now it is held in .work (``mmd status`` says
    why) and served when the outbox is writable, without a restart."""
    outbox = tmp_path / "outbox"
    if not _try_mount_tmpfs(outbox, "4m"):
        pytest.skip("cannot mount a tmpfs here (needs root and mount rights); tests/test_spool_faults.py covers it")
    try:
        inbox = tmp_path / "inbox"
        inbox.mkdir()
        d = served(MMD_RESCAN_SECONDS="0.2").wait_serving()
        _remount(outbox, "ro")
        a, b = small(tmp_path / "r.src", 1)
        os.rename(tmp_path / "r.src", inbox / "r.txt")
        wait_for(lambda: held(inbox, "r.txt") and (d.state().get("paused") or {}).get("reason"), 30, "the hold")
        assert "Read-only file system" in d.state()["paused"]["reason"]
        status = run_mmd("status", "--json", cwd=tmp_path, env=ENV)
        [job] = json.loads(status.stdout)["held"]
        assert job["file"] == "r.txt" and "Read-only file system" in job["reason"]
        assert "held" in run_mmd("status", cwd=tmp_path, env=ENV).stdout
        assert names(inbox / ".failed") == set()
        _remount(outbox, "rw")
        wait_for(lambda: (outbox / "r.timing.yaml").exists(), 60, "the job once the outbox is writable")
        check_ok(outbox, "r", a, b)
        wait_for(lambda: names(inbox / ".done") == {"r.txt"}, 10, "the archive")
        assert d.stop() == 0
        assert names(outbox) == {"r.out", "r.timing.yaml"}, "a stale reservation or a versioned name is left"
        assert_nothing_half_done(tmp_path)
    finally:
        subprocess.run(["umount", "-l", str(outbox)], capture_output=True)


def _free_uid() -> int:
    import pwd

    for uid in range(4242, 4342):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    pytest.skip("no free uid")


#: Checks, as the other user, that this Python can start another Python (the daemon's fork server is one) with mmd.
_RUNS_ITSELF = (
    "import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', 'import mmd.daemon']).returncode)"
)


def _python_for(uid: int, root: Path) -> tuple[str, dict[str, str]]:
    """A Python that user ``uid`` can run, and run again from inside itself (the daemon starts its worker
    processes' fork server with ``sys.executable``), with the environment it needs to import mmd, checked in
    ``root`` (where the daemon runs).

    This interpreter first; else a system one of the same version given this one's site-packages (a test
    machine's interpreter may live under a home folder no other user may enter); else, where the clone itself
    is in such a folder (``mktemp -d``), that system Python given copies of mmd and of the site-packages in
    ``root`` (hard links: no bytes copied). Skips, saying what each try met, when none works.
    """
    import site
    import sysconfig

    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    paths = [p for p in (sysconfig.get_paths()["purelib"], *site.getsitepackages()) if os.path.isdir(p)]
    paths = list(dict.fromkeys(paths))
    repo = Path(__file__).resolve().parent.parent
    systems = [
        os.path.join(folder, f"python{version}")
        for folder in ("/usr/bin", "/usr/local/bin", "/bin")
        if os.access(os.path.join(folder, f"python{version}"), os.X_OK)
    ]
    candidates: list[tuple[str, dict[str, str]]] = [(sys.executable, {})]
    candidates += [(exe, {"PYTHONPATH": os.pathsep.join([str(repo), *paths])}) for exe in systems]
    met = []
    for i, (exe, extra) in enumerate([*candidates, *((exe, {}) for exe in systems[:1])]):
        if i == len(candidates):  # the last resort: copies of mmd and the site-packages the user can read
            try:
                extra = {"PYTHONPATH": _staged(root / "staged", [repo / "mmd", *map(Path, paths)])}
            except (OSError, shutil.Error) as exc:  # another filesystem: a real copy would be hundreds of MB
                met.append(f"cannot link copies of mmd and its site-packages into {root}: {exc}")
                break
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", exe, "-c", _RUNS_ITSELF]
        done = subprocess.run(argv, cwd=root, env=mmd_env(extra), capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return exe, extra
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        met.append(f"{exe}{' with copies' if i == len(candidates) else ''}: {last}")
    pytest.skip(f"no Python {version} here that uid {uid} can run with mmd ({'; '.join(met)})")


def _staged(staged: Path, sources: list[Path]) -> str:
    """Hard-linked copies of the package ``sources[0]`` and the site-packages folders after it in ``staged``
    (no bytes copied); their PYTHONPATH."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(sources[0], staged / "src" / sources[0].name, copy_function=os.link, ignore=ignore)
    entries = [staged / "src"]
    for i, folder in enumerate(sources[1:]):
        entries.append(staged / f"site{i}")
        shutil.copytree(folder, entries[-1], copy_function=os.link, ignore=ignore, symlinks=True)
    return os.pathsep.join(map(str, entries))


@pytest.mark.integration
def test_unwritable_outbox_for_a_daemon_of_another_user(tmp_path):
    """The systemd set-up's usual case: the daemon runs as its own user and a dropped file belongs to whoever
    dropped it. Issue 15: with the outbox not writable, putting the file back into the inbox failed with EPERM
    (``os.link`` under ``fs.protected_hardlinks=1``) and the job stayed in .work until a restart."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root (to run the daemon as another user) and setpriv")
    uid = _free_uid()
    root = Path(tempfile.mkdtemp(prefix="mmd-user-", dir="/tmp"))  # tmp_path's parents are root's alone
    proc = None
    try:
        os.chmod(root, 0o755)
        inbox, outbox, stage = root / "inbox", root / "outbox", root / "stage"
        for folder in (inbox, outbox):
            folder.mkdir()
            os.chown(folder, uid, uid)
        stage.mkdir()
        os.chmod(outbox, 0o555)  # the daemon's own outbox, not writable (an admin's chmod, a wrong owner ...)
        python, extra = _python_for(uid, root)
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-m", "mmd", "serve"]
        env = mmd_env(ENV, HOME=str(root), MMD_RESCAN_SECONDS="0.2")
        env.update(extra)
        proc = LoggedProcess(argv, root, root / "daemon.log", env)
        wait_for(lambda: (daemon.read_state(inbox) or {}).get("status") == "serving" or proc.proc.poll() is not None)
        assert proc.proc.poll() is None, proc.logs()
        a, b = small(stage / "u.txt", 3)  # written by root: another user's file
        os.rename(stage / "u.txt", inbox / "u.txt")
        wait_for(lambda: held(inbox, "u.txt") and (daemon.read_state(inbox) or {}).get("paused"), 30, "the hold")
        assert "Permission denied" in daemon.read_state(inbox)["paused"]["reason"]
        os.chmod(outbox, 0o755)
        wait_for(lambda: (outbox / "u.timing.yaml").exists(), 60, "the job once the outbox is writable")
        check_ok(outbox, "u", a, b)
        wait_for(lambda: names(inbox / ".done") == {"u.txt"}, 10, "the archive")
        assert proc.stop() == 0
        assert names(outbox) == {"u.out", "u.timing.yaml"}
        assert work_files(inbox) == []
    finally:
        if proc is not None:
            proc.stop(signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def test_stale_reservations_are_swept_at_start_and_while_serving(tmp_path, monkeypatch):
    """Issue 15: a stale ``.x.claim`` was never swept, so ``x.txt`` came out as ``x.1.out`` with no collision
    note and the plain name stayed blocked for good. Now one left by a dead daemon is swept at start and at
    the rescans while serving, and the job gets its plain name."""
    monkeypatch.setattr(daemon.tunables, "RESERVATION_SWEEP_SECONDS", 0.0)  # the full sweep at every rescan
    s = settings_for(tmp_path, rescan_seconds=0.1)
    spool.Shared(s.inbox, s.outbox).prepare()
    at_start = s.outbox / ".a.claim"
    at_start.write_text("")  # a kill between create and write, long ago; no job of ours maps to it
    os.utime(at_start, (time.time() - 3600, time.time() - 3600))
    inputs = {}

    def act(d: daemon.Daemon) -> None:
        assert not at_start.exists(), "not swept at start"
        later = s.outbox / ".x.claim"
        later.write_text(f"0123456789ab - {2**22 + 12345}\n")  # its daemon is dead, its job gone
        wait_for(lambda: not later.exists(), 30, "the sweep while serving")
        for stem in ("a", "x"):
            inputs[stem] = small(s.inbox / f"{stem}.txt", 1)
        wait_for(lambda: len(names(s.inbox / ".done")) == 2, 30, "both jobs")

    serve_with(s, act)
    for stem, (a, b) in inputs.items():
        check_ok(s.outbox, stem, a, b)
    assert names(s.outbox) == {"a.out", "a.timing.yaml", "x.out", "x.timing.yaml"}


def test_inbox_deleted_and_recreated(tmp_path, served):
    inbox = tmp_path / "inbox"
    d = served().wait_serving()
    first = small(tmp_path / "a.src", 1)
    os.rename(tmp_path / "a.src", inbox / "a.txt")
    wait_for(lambda: (inbox / ".done" / "a.txt").exists(), 30, "job a")

    def removed() -> bool:  # the daemon may write its state file into the folder while it is removed
        shutil.rmtree(inbox, ignore_errors=True)
        return not inbox.exists()

    wait_for(removed, 10, "the inbox to be removed")
    wait_for(lambda: any(e.get("event", "").startswith("the inbox is gone") for e in d.events()), 30, "the log")
    inbox.mkdir()
    second = small(tmp_path / "b.src", 2)
    os.rename(tmp_path / "b.src", inbox / "b.txt")
    wait_for(lambda: (d.outbox / "b.timing.yaml").exists(), 30, "job b in the new inbox")
    check_ok(d.outbox, "a", *first)
    check_ok(d.outbox, "b", *second)
    assert daemon.lock_holder(inbox) == d.proc.pid, "the new inbox is locked by the daemon"
    third = small(tmp_path / "c.src", 3)
    os.rename(tmp_path / "c.src", inbox / "c.txt")  # events work again (a new watch)
    wait_for(lambda: (d.outbox / "c.timing.yaml").exists(), 30, "job c")
    check_ok(d.outbox, "c", *third)
    assert d.stop() == 0


def test_outbox_deleted_is_made_again(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    a, b = small(inbox / "m.txt", 1)
    s = settings_for(tmp_path)
    spool.Shared(s.inbox, s.outbox).prepare()
    shutil.rmtree(s.outbox)
    assert daemon.Daemon(s).serve(once=True) == 0
    check_ok(s.outbox, "m", a, b)


def test_clock_jumps_do_not_break_timings(tmp_path, monkeypatch):
    """The wall clock jumps an hour back and forth on every read, in the daemon and in its workers (where the
    job is timed); durations use the monotonic clock."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    a, b = small(inbox / "m.txt", 1, 40, 40, 40)
    real = time.time
    flips = iter(range(10**9))
    monkeypatch.setattr(time, "time", lambda: real() + (3600 if next(flips) % 2 else -3600))
    setup = workerhooks.jumpy_wall_clock
    assert daemon.Daemon(settings_for(tmp_path), worker_setup=setup).serve(once=True) == 0
    rec = check_ok(tmp_path / "outbox", "m", a, b)
    timings = {k: v for k, v in rec["timings_ms"].items() if v is not None}
    assert all(0 <= v < 60_000 for v in timings.values()), timings


def test_readiness_survives_wall_clock_jumps():
    mono, wall = [100.0], [1_000_000.0]
    r = spool.Readiness(0.5, clock=lambda: mono[0], wall=lambda: wall[0])
    fresh = int(wall[0] * 1e9)
    wall[0] -= 3600  # jumps back: the mtime is in the future, the monotonic quiet time still decides
    assert not r.observe("m", 10, fresh)
    mono[0] += 0.6
    assert r.observe("m", 10, fresh)
    wall[0] += 7200  # jumps forward: a growing file is still watched until its size settles
    assert not r.observe("n", 10, int(wall[0] * 1e9))


# ---------------------------------------------------------------------------
# bad input, through the daemon


@pytest.mark.serial  # a wall-clock bound: alone on the machine
def test_bad_inputs_are_refused_with_reasons_and_nothing_is_lost(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    line_mb = 100 if FULL else 8
    bad = {
        "empty": b"",
        "spaces": b" \n\t\r\n" * 1000,
        "huge_header": b"1000000 1000000 1000000\n1 2 3\n",
        "square_huge": b"1000000\n1\n",
        "long_line": b"2\n" + b"7" * (line_mb << 20),
        "long_header": b"1" * (line_mb << 20),
        "nul": b"2\n1 2\x00 3 4\n1 0 0 1\n",
        "binary": bytes(range(256)) * 64,
        "nan": b"1\nnan\n1\n",
        "negative": b"-2\n1 2\n",
        "float_header": b"2.0\n1 2 3 4 5 6 7 8\n",
        "too_many": b"1\n1 2 3\n",
    }
    for stem, data in bad.items():
        (inbox / f"{stem}.txt").write_bytes(data)
    # Whitespace "bombs": 16 MB of blanks between 8 values is more than 8 values can take (64 bytes each
    # and 1 MiB: max_bytes_per_value), refused unread; just under a MiB of blanks is valid and served.
    values = b"1 2 3 4 5 6 7 8".split()
    (inbox / "sparse.txt").write_bytes(b"2\n" + (b" " * (2 << 20)).join(values) + b"\n")
    (inbox / "padded.txt").write_bytes(b"2\n" + (b" \t\r\n" * (32 << 10)).join(values) + b"\n")
    t0 = time.monotonic()
    assert daemon.Daemon(settings_for(tmp_path)).serve(once=True) == 0
    assert time.monotonic() - t0 < 120
    for stem in bad:
        rec = error_of(tmp_path / "outbox", stem)
        assert rec["error"]["kind"] in ("input", "limit") and rec["error"]["reason"], stem
    rec = error_of(tmp_path / "outbox", "sparse")
    assert rec["error"]["kind"] == "limit" and "max_bytes_per_value" in rec["error"]["reason"]
    assert names(inbox / ".failed") == {f"{s}.txt" for s in bad} | {"sparse.txt"}
    assert names(inbox / ".done") == {"padded.txt"}
    assert (tmp_path / "outbox" / "padded.out").read_text() == "2\n 19.00 22.00\n 43.00 50.00\n"


def test_limits_refuse_with_clear_reasons(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    make_input(inbox / "bigfile.txt", 40, 40, 40, 1)
    (inbox / "bigshape.txt").write_bytes(b"30 30 30\n" + b"1 " * 1800)
    ok = small(inbox / "fine.txt", 3)
    s = settings_for(tmp_path, max_file_bytes=6000, max_memory_bytes=4 * 1024)
    assert daemon.Daemon(s).serve(once=True) == 0
    rec = error_of(tmp_path / "outbox", "bigfile")
    assert rec["error"]["kind"] == "limit" and "6000" in rec["error"]["reason"]
    rec = error_of(tmp_path / "outbox", "bigshape")
    assert rec["error"]["kind"] == "limit" and "30x30x30" in rec["error"]["reason"]
    check_ok(tmp_path / "outbox", "fine", *ok)


@pytest.mark.integration
def test_file_growing_while_it_is_read(tmp_path, served):
    """A writer keeps appending after its first close (the close is what inotify reports)."""
    inbox = tmp_path / "inbox"
    d = served().wait_serving()
    path = inbox / "grow.txt"
    make_input(tmp_path / "g.src", 60, 60, 60, 1)
    body = (tmp_path / "g.src").read_bytes()
    keep = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)  # stays open
    try:
        with open(path, "ab") as first:  # its close is the CLOSE_WRITE event
            first.write(body)
        for _ in range(2000):  # about 4 MB more, racing the claim and the read
            os.write(keep, b"1.00 " * 400 + b"\n")
    finally:
        os.close(keep)
    wait_for(lambda: list(d.outbox.glob("grow*.yaml")), 30, "the job to end")
    assert d.proc.poll() is None
    wait_for(lambda: names(inbox / ".done") | names(inbox / ".failed"), 10, "the archive")
    assert names(inbox / ".done") | names(inbox / ".failed") == {"grow.txt"}
    for rec_path in d.outbox.glob("grow*.error.yaml"):
        assert yaml.safe_load(rec_path.read_text())["error"]["reason"]
    assert d.stop() == 0


# ---------------------------------------------------------------------------
# hostile names and links


def test_links_are_never_followed_out_of_the_spool(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"1\n5\n7\n")  # a valid job: reading it would be the leak
    secret_dir = tmp_path / "secretdir"
    secret_dir.mkdir()
    (secret_dir / "x").write_text("x")
    before = secret.stat()
    os.symlink(secret, inbox / "sym.txt")
    os.symlink(secret_dir, inbox / "symdir.txt")
    os.symlink(tmp_path / "nowhere", inbox / "dangling.txt")
    os.symlink("../secret.txt", inbox / "relative.txt")
    os.link(secret, inbox / "hard.txt")
    os.mkfifo(inbox / "fifo.txt")  # opening it would block the worker forever
    linked = set(waiting(inbox))
    ok = small(inbox / "plain.txt", 1)
    assert daemon.Daemon(settings_for(tmp_path)).serve(once=True) == 0

    outbox = tmp_path / "outbox"
    for name in linked:
        rec = error_of(outbox, name[:-4])
        assert rec["error"]["kind"] == "spool", name
    assert "hard link" in error_of(outbox, "hard")["error"]["reason"]
    assert "symbolic link" in error_of(outbox, "sym")["error"]["reason"]
    assert names(inbox / ".failed") == linked
    assert os.path.islink(inbox / ".failed" / "sym.txt"), "the link itself is moved, never its target"
    after = secret.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert secret.read_bytes() == b"1\n5\n7\n" and (secret_dir / "x").read_text() == "x"
    for path in outbox.iterdir():
        assert b"35.00" not in path.read_bytes(), f"{path.name} holds the secret's product"
    check_ok(outbox, "plain", *ok)


HOSTILE = [
    "with space.txt",
    "new\nline.txt",
    "tab\there.txt",
    "esc\x1b[31mred.txt",
    "données-ünïcode-行列.txt",
    "emoji-🧮.txt",
    "evil\u202etxt.exe",
    "-rf.txt",
    "--help.txt",
    "a..b.txt",
    "x..y..txt",
    "x" * 251 + ".txt",
    "é" * 125 + ".txt",
    "m@kernel=....etc..passwd.txt",
    "m@kernel=..,backend=cpu.txt",
    "m@kernel=__import__('os').txt",
    "m@backend=cuda;rm -rf.txt",
    "m@tile=1e9.txt",
    "m@tile=-1.txt",
    "m@memory=dev-nvidia0.txt",
    "m@kernel=naive\n.txt",
    "m@kernel=naive,kernel=tiled.txt",
]
INJECTIONS = [n for n in HOSTILE if n.startswith("m@")]


def test_hostile_names_stay_inside_the_outbox(tmp_path):
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    inputs = {}
    for i, name in enumerate(HOSTILE):
        inputs[name] = small(inbox / name, i)
    raw = os.fsencode(inbox) + b"/bad\xff\xfe.txt"  # not UTF-8
    with open(raw, "wb") as fh:
        fh.write(b"1\n2\n3\n")
    outside_before = sorted(p for p in tmp_path.rglob("*") if not p.is_relative_to(inbox))

    r = run_mmd("serve", "--once", cwd=tmp_path, env=ENV, timeout=60)  # a few seconds when it works
    assert r.returncode == 0, r.stderr
    for line in r.stderr.splitlines():
        event = json.loads(line)  # every log line is one JSON object: no raw newline from a name
        assert "\x1b" not in json.dumps(event, ensure_ascii=False)

    produced = list(outbox.iterdir())
    assert all(p.parent == outbox for p in produced)
    for p in produced:
        assert len(os.fsencode(p.name)) <= 255
        assert p.name.isprintable() and "\u202e" not in p.name, repr(p.name)
    outside_after = sorted(p for p in tmp_path.rglob("*") if not p.is_relative_to(inbox) and p.parent != outbox)
    assert outside_after == [p for p in outside_before if p.parent != outbox and p != outbox] + [outbox]

    ok = [n for n in HOSTILE if n not in INJECTIONS]
    records = [yaml.safe_load(p.read_text()) for p in outbox.glob("*.timing.yaml")]
    assert len(records) == len(ok) + 1  # and the non-UTF-8 name
    errors = [yaml.safe_load(p.read_text()) for p in outbox.glob("*.error.yaml")]
    assert len(errors) == len(INJECTIONS) and all(e["error"]["kind"] == "jobname" for e in errors)
    for rec in records:
        assert rec["status"] == "ok"
    assert len(names(inbox / ".done")) == len(ok) + 1
    assert len(names(inbox / ".failed")) == len(INJECTIONS)
    assert waiting(inbox) == set() and work_files(inbox) == []
    renamed = [rec for rec in records if "original_name" in rec]
    assert {rec["original_name"] for rec in renamed} >= {"new\\nline.txt", "bad\\udcff\\udcfe.txt"}
    assert (outbox / "with space.out").exists() and (outbox / "-rf.out").exists()
    assert (outbox / "données-ünïcode-行列.out").exists()


# ---------------------------------------------------------------------------
# permissions and planted spool files


def test_files_are_created_without_group_or_world_write(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    small(inbox / "m.txt", 1)
    (inbox / "bad.txt").write_text("x")
    old = os.umask(0)
    try:
        assert daemon.Daemon(settings_for(tmp_path)).serve(once=True) == 0
        assert os.umask(0) == 0, "the daemon restores the caller's umask"
    finally:
        os.umask(old)
    made = [tmp_path / "outbox", inbox / ".done", inbox / ".failed", inbox / ".work"]
    made += list((tmp_path / "outbox").iterdir())
    for path in made:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert not mode & 0o022, f"{path.name} is {mode:o}"


def test_mmd_serve_under_umask_000_creates_nothing_group_or_world_writable(tmp_path):
    """The CLI, as systemd runs it: the workers start from a fork server the command starts first thing, and
    they make the outputs, so they must tighten the umask as the daemon does."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (tmp_path / "outbox").mkdir()
    small(inbox / "m.txt", 1)
    (inbox / "bad.txt").write_text("x")
    old = os.umask(0)
    try:
        r = run_mmd("serve", "--once", cwd=tmp_path, env=ENV)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    made = [inbox / ".done", inbox / ".failed", inbox / ".work", *(tmp_path / "outbox").iterdir()]
    assert {p.name for p in made} >= {"m.out", "m.timing.yaml", "bad.error.yaml"}
    for path in made:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert not mode & 0o022, f"{path.name} is {mode:o}"


def test_world_writable_outbox_is_refused(tmp_path):
    (tmp_path / "outbox").mkdir()
    os.chmod(tmp_path / "outbox", 0o777)
    r = run_mmd("serve", "--once", cwd=tmp_path, env=ENV)
    assert r.returncode != 0 and "world-writable" in r.stderr


@pytest.mark.parametrize("planted", [".work", ".done", ".failed"])
def test_planted_spool_folder_link_is_refused(tmp_path, planted):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, inbox / planted)
    small(inbox / "m.txt", 1)
    r = run_mmd("serve", "--once", cwd=tmp_path, env=ENV)
    assert r.returncode != 0 and "not a folder" in r.stderr
    assert list(elsewhere.iterdir()) == [] and waiting(inbox) == {"m.txt"}


def test_state_file_is_never_written_through_a_planted_link(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    victim = tmp_path / "victim.out"
    victim.write_text("another user's result\n")
    os.symlink(victim, inbox / f".{spool.STATE_NAME}.{os.getpid()}.tmp")
    small(inbox / "m.txt", 1)
    assert daemon.Daemon(settings_for(tmp_path)).serve(once=True) == 0
    assert victim.read_text() == "another user's result\n"
    assert json.loads((inbox / spool.STATE_NAME).read_text())["status"] == "stopped"


# ---------------------------------------------------------------------------
# the GPU (tests/gpu holds the rest; these skip without pycuda and a GPU)


def _has_gpu() -> bool:
    try:
        import pycuda.driver as drv

        drv.init()
        return drv.Device.count() > 0
    except Exception:
        return False


HOG = """
import sys, pycuda.autoinit, pycuda.driver as drv
free, total = drv.mem_get_info()
hog = drv.mem_alloc(max(free - (64 << 20), 1))
print("held", flush=True)
sys.stdin.readline()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs pycuda and a CUDA GPU")
def test_gpu_out_of_memory_mid_job_then_the_next_job_runs(tmp_path, served):
    inbox = tmp_path / "inbox"
    d = served(MMD_BACKEND="cuda").wait_serving()
    hog = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "held"
        make_input(tmp_path / "oom.src", 4096, 4096, 4096, 1)  # 200 MB of device memory: more than is left
        os.rename(tmp_path / "oom.src", inbox / "oom.txt")
        wait_for(lambda: (d.outbox / "oom.error.yaml").exists(), 120, "the out-of-memory refusal")
        assert error_of(d.outbox, "oom")["error"]["kind"] in ("cuda", "limit")
    finally:
        hog.stdin.close()
        hog.wait(timeout=30)
        hog.stdout.close()
    nxt = make_input(tmp_path / "next.src", 512, 512, 512, 2)
    os.rename(tmp_path / "next.src", inbox / "next.txt")
    wait_for(lambda: (d.outbox / "next.timing.yaml").exists(), 120, "the next job")
    check_ok(d.outbox, "next", *nxt)
    assert d.stop() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs pycuda and a CUDA GPU")
def test_gpu_launch_refusal_then_the_next_job_runs(tmp_path, served):
    inbox = tmp_path / "inbox"
    d = served(MMD_BACKEND="cuda").wait_serving()
    make_input(tmp_path / "t.src", 64, 64, 64, 1)
    os.rename(tmp_path / "t.src", inbox / "t@tile=1024.txt")  # 1024x1024 threads: no GPU launches it
    wait_for(lambda: (d.outbox / "t@tile=1024.error.yaml").exists(), 60, "the refusal")
    nxt = make_input(tmp_path / "n.src", 256, 256, 256, 2)
    os.rename(tmp_path / "n.src", inbox / "n.txt")
    wait_for(lambda: (d.outbox / "n.timing.yaml").exists(), 60, "the next job")
    check_ok(d.outbox, "n", *nxt)
    assert d.stop() == 0
