"""The package installs as a plain wheel and works from anywhere: kernels, config and the C accelerator ship in it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.process]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mmd built as a wheel from a copy of the tree and installed (not editable) into a folder of its own."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "*.so", ".*cache"),
        symlinks=True,
    )
    wheels = tmp / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("mmd-*.whl")
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    return site


def run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMD_")}
    env["PYTHONPATH"] = str(site)  # ahead of the editable install of the tree under test
    env["XDG_CACHE_HOME"] = str(cwd / "cache")
    return subprocess.run(
        [sys.executable, "-m", "mmd", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_wheel_carries_kernels_config_and_runs_a_job_from_elsewhere(installed: Path, tmp_path: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import mmd, mmd.resources as r; print(mmd.__file__); print(r.kernels_dir())"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        check=True,
    )
    module, kernels = probe.stdout.split()
    assert Path(module).is_relative_to(installed), "the installed package answers, not the tree"
    assert Path(kernels).is_relative_to(installed) and (Path(kernels) / "tiled.cu").is_file()
    listing = run(installed, tmp_path, "kernels")
    assert listing.returncode == 0, listing.stderr
    assert "tiled" in listing.stdout and "fast" in listing.stdout
    (tmp_path / "inbox").mkdir()
    made = run(installed, tmp_path, "gen", "24", "--seed", "1", "-o", "m.txt")
    assert made.returncode == 0, made.stderr
    done = run(installed, tmp_path, "run", "m.txt", "--backend", "cpu")
    assert done.returncode == 0, done.stderr
    checked = run(installed, tmp_path, "check", "m.out", "--input", "m.txt")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_wheel_carries_the_c_accelerators_and_their_stubs(installed: Path, tmp_path: Path) -> None:
    from mmd import textcore

    for name, built in (("_fasttext", textcore.fasttext), ("_fastcheck", textcore.fastcheck)):
        assert (installed / "mmd" / f"{name}.pyi").is_file()
        if built is None:  # no compiler here: the wheel has none either
            continue
        probe = subprocess.run(
            [sys.executable, "-c", f"import mmd.{name} as m; print(m.__file__)"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(installed)},
            capture_output=True,
            text=True,
            check=True,
        )
        assert Path(probe.stdout.strip()).is_relative_to(installed)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_installed_kernels_compile(installed: Path, tmp_path: Path) -> None:
    built = run(installed, tmp_path, "kernels", "--build", "--arch", "sm_90", "--cache", str(tmp_path / "k"))
    assert built.returncode == 0, built.stdout + built.stderr
    assert " 0 failed" in built.stdout
