"""On a box with the class service installed: its /etc/mmd/mmd.yaml is the service's and its commands', and
the suite's daemon-starting cases run beside it as anywhere else.

Each test writes a class's config to the real /etc/mmd/mmd.yaml for its length, and only where there is none
(an admin's is never touched): it needs root, as CI runs. The processes run as a user's shell would, with no
MMD_CONFIG, so they find their files by mmd's own rule.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from mmd import config

from .conftest import mmd_env
from .test_benchmarks import runs_in_its_tiny_mode

pytestmark = [pytest.mark.integration, pytest.mark.serial]

#: The real file, taken before the suite's fixture points config.SYSTEM_CONFIG elsewhere for each test.
SYSTEM_CONFIG = config.SYSTEM_CONFIG
#: The uid the service's state folder belongs to (the service's user: not whoever runs a command).
SERVICE_UID = 65534
INPUT = "2\n1 2\n3 4\n1 0\n0 1\n"
PRODUCT = "2\n  1.00  2.00\n  3.00  4.00\n"


@dataclass
class ClassBox:
    """The service's config in /etc/mmd/mmd.yaml and what it names."""

    inbox: Path
    socket: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A user's environment on the box: no MMD_CONFIG, the CPU backend."""
        env = mmd_env(MMD_BACKEND="cpu", **extra)
        del env["MMD_CONFIG"]
        return env


@pytest.fixture
def class_box(tmp_path: Path) -> Iterator[ClassBox]:
    """A class's /etc/mmd/mmd.yaml as systemd/install.sh writes one (its state folder the service user's
    alone, 0700), removed after the test with /etc/mmd where the test made it."""
    if os.geteuid() != 0:
        pytest.skip("writes /etc/mmd/mmd.yaml: needs root (CI runs as root)")
    if SYSTEM_CONFIG.exists():
        pytest.skip(f"{SYSTEM_CONFIG} exists: this box's own config is never touched")
    srv = tmp_path / "srv"
    inbox, outbox, state = srv / "inbox", srv / "outbox", srv / "state"
    for folder in (inbox, outbox, state):
        folder.mkdir(parents=True)
    os.chown(state, SERVICE_UID, SERVICE_UID)
    state.chmod(0o700)
    socket = tmp_path / "mmd.sock"
    settings = {
        "inbox": str(inbox),
        "outbox": str(outbox),
        "state_dir": str(state),
        "class_mode": True,
        "control_socket": str(socket),
        "retention_days": 120,
        "min_free_bytes": 1 << 30,
        "tile": 16,
    }
    made = not SYSTEM_CONFIG.parent.exists()
    SYSTEM_CONFIG.parent.mkdir(mode=0o750, exist_ok=True)
    try:
        with SYSTEM_CONFIG.open("x") as fh:  # never over a file that appeared meanwhile
            yaml.safe_dump(settings, fh)
        yield ClassBox(inbox, socket)
    finally:
        SYSTEM_CONFIG.unlink(missing_ok=True)
        if made:
            SYSTEM_CONFIG.parent.rmdir()


def mmd(box: ClassBox, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmd", *args], cwd=cwd, env=box.env(), capture_output=True, text=True, timeout=120
    )


def test_a_users_own_daemon_and_jobs_run_beside_the_service_s_config(class_box, tmp_path):
    """A TA's `mmd serve --inbox ~/in --outbox ~/out` took the service's state_dir and class_mode and refused
    ("... belongs to uid 65534, not to mmd")."""
    mine = tmp_path / "mine"
    (mine / "in").mkdir(parents=True)
    (mine / "out").mkdir()
    (mine / "in" / "m.txt").write_text(INPUT)
    served = mmd(class_box, "serve", "--once", "--inbox", "in", "--outbox", "out", cwd=mine)
    assert served.returncode == 0, served.stderr[-3000:]
    assert (mine / "out" / "m.out").read_text() == PRODUCT

    (mine / "r.txt").write_text(INPUT)
    ran = mmd(class_box, "run", "r.txt", cwd=mine)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (mine / "r.out").read_text() == PRODUCT
    requested = yaml.safe_load((mine / "r.timing.yaml").read_text())["requested"]
    assert requested["tile"] == config.Settings().tile, "the service's tile is the service's"


def test_a_benchmark_runs_beside_the_service_s_config(class_box, tmp_path):
    """crash.py's daemons read the service's config and refused; it ended in a traceback."""
    runs_in_its_tiny_mode("crash.py", tmp_path, class_box.env())


def test_the_service_s_commands_still_read_its_config(class_box, tmp_path):
    cancelled = mmd(class_box, "cancel", "m.txt", cwd=tmp_path)
    assert cancelled.returncode == 3 and f"no daemon answers on {class_box.socket}" in cancelled.stderr
    theirs = json.loads(mmd(class_box, "config", "--service", "--json", cwd=tmp_path).stdout)
    assert theirs["settings"]["class_mode"] == {"value": True, "from": str(SYSTEM_CONFIG)}
    assert theirs["settings"]["inbox"]["value"] == str(class_box.inbox)
    mine = json.loads(mmd(class_box, "config", "--json", cwd=tmp_path).stdout)
    assert mine["settings"]["class_mode"] == {"value": False, "from": "default"}
    assert mine["files"][0]["path"] == str(SYSTEM_CONFIG) and mine["files"][0]["state"].startswith("not read")
