"""The distribution's name and the install hints every message gives: a command that works where the user is."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from mmd import resources

ROOT = Path(__file__).resolve().parent.parent


def test_the_distribution_is_named_in_one_place_and_is_not_pypis_mmd() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.findall(r'^name = "(.*)"$', pyproject, re.M) == [resources.DISTRIBUTION] != ["mmd"]
    self_references = re.findall(r'^ *"(mmd[^"]*)",$', pyproject, re.M)  # an extra that takes in another
    assert self_references and all(r.startswith(f"{resources.DISTRIBUTION}[") for r in self_references)


@pytest.fixture
def venv_pip_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``pip`` a user would type is this interpreter's (an activated venv)."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.usefixtures("venv_pip_on_path")
def test_from_the_clone_the_hint_reinstalls_the_clone_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the test suite runs from its clone's editable install
    assert resources.install_hint("report") == "pip install -e '.[report]'"


@pytest.mark.usefixtures("venv_pip_on_path")
def test_from_elsewhere_the_hint_names_the_clone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert resources.install_hint("report") == f"pip install -e {shlex.quote(f'{ROOT}[report]')}"


def test_where_pip_is_another_pythons_the_hint_runs_this_ones(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    other = tmp_path / "bin"
    other.mkdir()
    (other / "pip").write_text("#!/bin/sh\n")
    (other / "pip").chmod(0o755)
    monkeypatch.setenv("PATH", str(other))  # a venv's mmd run by its path, the venv not activated
    monkeypatch.chdir(ROOT)
    assert resources.install_hint("report") == f"{shlex.quote(sys.executable)} -m pip install -e '.[report]'"
