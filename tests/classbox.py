"""A class on one lab box, for the tests: real Unix users in one group, and a spool laid out as the docs say.

The users are made as root (``useradd``) for the session and removed after;
what they run is the system's own tools (``sh``, ``flock``, ``cat``) through
``setpriv``, never this clone's venv, so the tests pass in a clone that other
users cannot enter. The spool lives in a fresh folder under /tmp that they
can: pytest's own ``tmp_path`` is private to root.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

GROUP = "mmdtestcls"
STUDENTS = ("mmdtstu1", "mmdtstu2")
#: A grader: not in the class's group, in the graders' group (``graders_group``).
GRADERS, GRADER = "mmdtgraders", "mmdtgrad"


@dataclass(frozen=True)
class Student:
    login: str
    uid: int
    gid: int

    def argv(self, *command: str) -> list[str]:
        """The argv that runs ``command`` as this student: their uid, their groups, an empty environment."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--reset-env", *command]

    def run(self, script: str, *args: str, umask: str = "022", check: bool = True) -> subprocess.CompletedProcess:
        """``sh -c script`` as this student (their uid, their groups), in /tmp, with ``umask``."""
        argv = self.argv("sh", "-c", f"umask {umask}; {script}", "sh", *args)
        return subprocess.run(argv, cwd="/tmp", capture_output=True, text=True, timeout=60, check=check)

    def drop(self, inbox: Path, name: str, text: str, umask: str = "022") -> None:
        """Write ``text`` to ``inbox/name`` as this student: under ``name.part``, then a rename (the docs' recipe)."""
        self.run('printf %s "$3" > "$1/$2.part" && mv "$1/$2.part" "$1/$2"', str(inbox), name, text, umask=umask)

    def upload(self, inbox: Path, name: str, text: str, check: bool = True) -> subprocess.CompletedProcess:
        """Upload ``text`` as ``inbox/name`` by docs/operations.md's recipe, run as written, as this student would
        from their machine: ``ssh lab CMD`` and ``scp FILE lab:PATH`` stand for a shell and a copy on this box."""
        recipe = upload_recipe().replace("/srv/mmd/inbox", str(inbox)).replace("hw1.txt", name)
        shims = 'ssh() { shift; sh -c "$1"; }; scp() { cp "$1" "${2#lab:}"; }'
        here = f'd=$(mktemp -d) && cd "$d" && printf %s "$1" > {name}'
        return self.run(f"{shims}\n{here} || exit 1\n{recipe}", text, check=check)

    def rename_in(self, inbox: Path, name: str, data: bytes) -> None:
        """Put ``data`` at ``inbox/name`` as a file of this student's, renamed in (over whatever of theirs is there):
        written under a dot name first, as root (a big input does not fit a command line), and given to them."""
        staged = inbox / f".{self.login}.{name}.part"
        staged.write_bytes(data)
        os.chown(staged, self.uid, self.gid)
        staged.chmod(0o644)
        self.run('mv "$1" "$2"', str(staged), str(inbox / name))


def upload_recipe() -> str:
    """docs/operations.md's upload recipe for students: the sh block after "Students upload", as the docs give it."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    return text.split("Students upload", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]


def hold_owners_until(path: str, uids: tuple[int, ...]) -> None:
    """A worker hook (tests/workerhooks.py): the jobs whose input ``uids`` own wait until ``path`` exists."""
    from mmd.daemon import worker

    real = worker.run_job

    def held(job: Any, *args: Any, **kw: Any) -> Any:
        if os.lstat(job.input).st_uid in uids:
            while not os.path.exists(path):
                time.sleep(0.01)
        return real(job, *args, **kw)

    worker.run_job = held


def _ensure_group(name: str) -> int:
    with contextlib.suppress(KeyError):
        return grp.getgrnam(name).gr_gid
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    return grp.getgrnam(name).gr_gid


def _ensure_user(login: str, group: str) -> Student:
    try:
        entry = pwd.getpwnam(login)
    except KeyError:
        subprocess.run(["useradd", "-M", "-N", "-g", group, "-s", "/usr/sbin/nologin", login],
                       check=True, capture_output=True)  # fmt: skip
        entry = pwd.getpwnam(login)
    return Student(login, entry.pw_uid, entry.pw_gid)


@pytest.fixture(scope="session")
def users() -> Iterator[tuple[Student, Student, Student]]:
    """Two students of one class group and a grader (made for the session; root only, which CI is)."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv to make the class's users (CI runs as root)")
    _ensure_group(GROUP)
    _ensure_group(GRADERS)
    one, two = (_ensure_user(login, GROUP) for login in STUDENTS)
    yield one, two, _ensure_user(GRADER, GRADERS)
    for login in (*STUDENTS, GRADER):
        subprocess.run(["userdel", login], capture_output=True)
    for group in (GROUP, GRADERS):
        subprocess.run(["groupdel", group], capture_output=True)


@pytest.fixture
def students(users) -> tuple[Student, Student]:
    return users[0], users[1]


@pytest.fixture
def grader(users) -> Student:
    return users[2]


@dataclass(frozen=True)
class Box:
    """The folders of a class box: inbox 3730 root:<class> (a drop box), outbox 0755, state 0700."""

    root: Path
    inbox: Path
    outbox: Path
    state: Path


def lay_out(root: Path) -> Box:
    """The class box's folders in ``root`` (an existing folder, made 0755)."""
    root.chmod(0o755)
    inbox, outbox, state = root / "inbox", root / "outbox", root / "state"
    inbox.mkdir()
    os.chown(inbox, 0, grp.getgrnam(GROUP).gr_gid)
    inbox.chmod(0o3730)
    outbox.mkdir(mode=0o755)
    state.mkdir(mode=0o700)
    return Box(root, inbox, outbox, state)


@pytest.fixture
def box(students) -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="mmd-class-"))
    yield lay_out(root)
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def filesystem_of_its_own(size: str = "32m") -> Iterator[Path]:
    """A small filesystem of its own (a tmpfs: it keeps POSIX ACLs) mounted on a fresh folder under /tmp,
    unmounted and removed after."""
    where = Path(tempfile.mkdtemp(prefix="mmd-fs-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "mmd-test", str(where)],
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True, capture_output=True)
        where.rmdir()


def team_folder(path: Path) -> Path:
    """A folder for the class's group work as courses make them: the group's, group-writable and setgid,
    without the sticky bit (each member may move, rename or remove any member's file in it)."""
    path.mkdir()
    os.chown(path, 0, grp.getgrnam(GROUP).gr_gid)
    path.chmod(0o2770)
    return path


def swap_at_claim(name: str, staged: str) -> None:
    """A worker hook: the first claim of inbox ``name`` finds ``staged`` renamed over it just before (a student's
    rename between the offer of a small drop and its claim, made certain)."""
    from mmd.spool import Claims

    real = Claims.claim

    def claim(self: Any, inbox_name: str, job_id: str | None = None) -> Any:
        if inbox_name == name and os.path.exists(staged):
            os.rename(staged, self.shared.inbox / name)
        return real(self, inbox_name, job_id)

    Claims.claim = claim
