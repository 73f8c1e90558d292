"""Shared fixtures: a clean environment for settings, and helpers to run the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_mmd_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see no MMD_* variables from the caller's shell."""
    for key in list(os.environ):
        if key.startswith("MMD_"):
            monkeypatch.delenv(key)


def run_mmd(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120):
    """Run ``python -m mmd ARGS`` as a real process and return the CompletedProcess."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MMD_")}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("MMD_LOG_FORMAT", "json")
    full_env.setdefault("MMD_BACKEND", "cpu")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "mmd", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
