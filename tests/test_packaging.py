"""What an install of mmd is made of: the lock every install here takes its versions from."""

from __future__ import annotations

import re
import subprocess
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from mmd import resources

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"


def locked() -> dict[str, list[Requirement]]:
    """The lock's pins by package name (a package may have one pin per Python version)."""
    pins: dict[str, list[Requirement]] = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            pin = Requirement(line)
            pins.setdefault(canonicalize_name(pin.name), []).append(pin)
    return pins


def test_the_lock_pins_every_requirement_of_mmd_and_its_extras_within_pyprojects_bounds() -> None:
    """pyproject.toml says what mmd needs, the lock which versions: a requirement added or moved without
    `make lock` shows here (the installed metadata is pyproject.toml's: `make` reinstalls when it changes)."""
    pins = locked()
    for line in metadata.requires(resources.DISTRIBUTION) or []:
        wanted = Requirement(line)
        if canonicalize_name(wanted.name) == canonicalize_name(resources.DISTRIBUTION):
            continue  # an extra that takes in another
        assert canonicalize_name(wanted.name) in pins, f"{wanted.name} is not locked: make lock"
        for pin in pins[canonicalize_name(wanted.name)]:
            (version,) = (spec.version for spec in pin.specifier if spec.operator == "==")
            assert wanted.specifier.contains(version, prereleases=True), f"{pin} is outside {wanted}: make lock"
    for needed in ("nvidia-ml-py", "nvidia-cuda-nvrtc", "playwright", "pycuda", "matplotlib", "pytest"):
        assert needed in pins, needed
    assert all(pin.specifier for group in pins.values() for pin in group), "every line a version"


def test_every_install_the_makefile_makes_takes_the_lock(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    targets = [f"{venv}/.installed-runtime", f"{venv}/.installed", "gpu-test"]
    planned = subprocess.run(
        ["make", "-n", "-B", f"VENV={venv}", *targets], cwd=ROOT, capture_output=True, text=True, check=True
    )
    installs = [line for line in planned.stdout.splitlines() if re.search(r"/pip install (?!.*--upgrade pip)", line)]
    assert len(installs) == 3, planned.stdout
    for line in installs:
        assert " -c constraints.txt " in line, line
