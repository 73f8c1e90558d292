"""The inbox's filesystem: the folders on it where one user may move another's file into the inbox (mmd.inboxfs).

Real folders on a small filesystem of the test's own (a tmpfs, mounted as root); owners are bare uids and
gids, no accounts. The class's real accounts, the daemon and the attack itself: tests/test_class.py."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mmd import inboxfs

from .classbox import filesystem_of_its_own

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a filesystem of its own: needs root (CI is)")

SERVICE, ALICE, CLASS = 40000, 40001, 40010


def folder(path: Path, mode: int, uid: int = 0, gid: int = 0) -> Path:
    path.mkdir(parents=True)
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


def spool(root: Path) -> Path:
    """The installer's spool in ``root``: inbox 3730 (the service's, the class's group), outbox, state; returns
    the inbox."""
    folder(root / "outbox", 0o2750, SERVICE, CLASS)
    folder(root / "state", 0o700, SERVICE, CLASS)
    return folder(root / "inbox", 0o3730, SERVICE, CLASS)


@pytest.fixture
def fs() -> Iterator[Path]:
    with filesystem_of_its_own() as where:
        yield where


@pytest.fixture
def mounts() -> Iterator[list[Path]]:
    """Mount points to unmount after the test, innermost last."""
    made: list[Path] = []
    yield made
    for point in reversed(made):
        subprocess.run(["umount", str(point)], check=True, capture_output=True)


def bind(source: Path, target: Path, made: list[Path]) -> None:
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True, capture_output=True)
    made.append(target)


def test_a_filesystem_of_the_spool_alone_is_safe(fs: Path) -> None:
    found = inboxfs.check(spool(fs))
    assert found.safe, found.describe()
    assert (found.top, found.found, found.covered, found.partial) == (fs, 0, (), False)
    assert found.describe().startswith(f"the inbox's filesystem (from {fs}) holds no folder where one user")


def test_the_folders_where_one_user_may_move_anothers_file_are_found_and_named(fs: Path) -> None:
    inbox = spool(fs)
    team = folder(fs / "course" / "team", 0o2770, 0, CLASS)  # group work: any member moves any member's file
    shared = folder(fs / "course" / "shared", 0o1777, ALICE)  # sticky, but its owner removes anyone's file
    folder(fs / "course" / "public", 0o1777)  # sticky and root's, as /tmp: each moves only their own
    folder(fs / "course" / "alice", 0o755, ALICE)  # only its owner writes in it
    folder(fs / "course" / "nosearch", 0o2760, 0, CLASS)  # write without search: nothing can be moved out
    folder(fs / "course" / "public" / "open", 0o777, ALICE)  # found below a folder that is not
    found = inboxfs.check(inbox)
    assert not found.safe
    assert found.found == 3
    assert sorted(str(f) for f in found.shown) == sorted([
        f"{shared} (1777 {ALICE}:root)",
        f"{team} (2770 root:{CLASS})",
        f"{fs}/course/public/open (0777 {ALICE}:root)",
    ])  # fmt: skip
    line = found.describe()
    assert "holds 3 folders where one user may move another's file into the inbox" in line
    assert str(team) in line and line.endswith(inboxfs.FIX)


def test_the_first_few_are_named_and_the_rest_counted(fs: Path) -> None:
    inbox = spool(fs)
    for i in range(inboxfs.SHOWN + 3):
        folder(fs / f"team{i}", 0o2770, 0, CLASS)
    found = inboxfs.check(inbox)
    assert (found.found, len(found.shown)) == (inboxfs.SHOWN + 3, inboxfs.SHOWN)
    assert " and 3 more: " in found.describe()


def test_a_filesystem_mounted_below_is_not_walked_and_hides_nothing(fs: Path) -> None:
    inbox = spool(fs)
    with filesystem_of_its_own() as other:
        folder(other / "team", 0o2770, 0, CLASS)
        (fs / "home").mkdir()
        subprocess.run(["mount", "--move", str(other), str(fs / "home")], check=True, capture_output=True)
        try:
            found = inboxfs.check(inbox)
        finally:
            subprocess.run(["mount", "--move", str(fs / "home"), str(other)], check=True, capture_output=True)
    assert found.safe, found.describe()


def test_a_bind_mount_that_hides_a_folder_is_named_and_one_onto_itself_is_not(fs: Path, mounts: list[Path]) -> None:
    """As the unit's sandbox does: ProtectHome= puts another folder over /home, PrivateTmp= over /tmp (what
    the students see there the service does not), ReadWritePaths= binds the spool onto itself."""
    inbox = spool(fs)
    folder(fs / "home" / "team", 0o2770, 0, CLASS)
    folder(fs / "empty", 0o755)
    bind(fs / "empty", fs / "home", mounts)
    bind(fs / "outbox", fs / "outbox", mounts)
    found = inboxfs.check(inbox)
    assert (found.found, found.covered) == (0, (fs / "home",))
    assert f"has folders a mount hides here, not looked under: {fs / 'home'}" in found.describe()


def test_a_rename_or_a_link_never_crosses_a_mount_even_of_the_same_filesystem(fs: Path, mounts: list[Path]) -> None:
    """What a spool on a mount of its own rests on (a bind mount too: EXDEV is by mount, not by filesystem)."""
    team = folder(fs / "team", 0o2770, 0, CLASS)
    (team / "work.txt").write_text("1 1 1\n2\n3\n")
    box = folder(fs / "box", 0o755)
    bind(box, box, mounts)
    assert os.stat(team).st_dev == os.stat(box).st_dev
    for move in (os.rename, os.link):
        with pytest.raises(OSError) as refused:
            move(team / "work.txt", box / "hw1.txt")
        assert refused.value.errno == errno.EXDEV


def test_the_walk_stops_at_its_bound_of_entries_and_says_it_looked_in_part(fs: Path) -> None:
    inbox = spool(fs)
    for i in range(40):
        many = folder(fs / f"d{i:02d}", 0o755)
        for j in range(250):
            (many / f"f{j}").touch()
    folder(fs / "deep" / "er" / "team", 0o2770, 0, CLASS)  # listed after the 10,000 files (breadth first)
    found = inboxfs.check(inbox, max_entries=2_000, max_seconds=60)
    assert (found.partial, found.entries, found.found) == (True, 2_000, 0)
    assert not found.safe
    assert "was looked at in part (2,000 entries looked at in " in found.describe()
    whole = inboxfs.check(inbox, max_entries=100_000, max_seconds=60)
    assert (whole.partial, whole.found) == (False, 1)


def test_the_walk_stops_at_its_bound_of_time(fs: Path) -> None:
    inbox = spool(fs)
    for i in range(20_000):
        (fs / "outbox" / f"f{i}").touch()
    began = time.monotonic()
    found = inboxfs.check(inbox, max_entries=10**9, max_seconds=0.01)
    took = time.monotonic() - began
    assert found.partial and found.entries < 20_000, found
    assert took < 1.0, f"a walk bound to 0.01 s took {took:.2f} s"


def test_the_command_says_what_it_found_in_one_line_and_exits_0(fs: Path) -> None:
    inbox = spool(fs)

    def command() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mmd.inboxfs", str(inbox)], capture_output=True, text=True)

    done = command()
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"ok: {inbox}: the inbox's filesystem (from {fs}) holds no folder")
    folder(fs / "team", 0o2770, 0, CLASS)
    done = command()
    assert (done.returncode, done.stderr, done.stdout.count("\n")) == (0, "", 1)
    assert done.stdout.startswith(f"warning: {inbox}: ") and f"{fs / 'team'} (2770 root:{CLASS})" in done.stdout
