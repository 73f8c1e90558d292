"""Where a benchmark's numbers come from: device, driver, CUDA, versions, host and date (results.yaml's
``environment``)."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import __version__
from ..backends.base import Backend


def command_output(argv: Sequence[str], timeout: float = 10.0) -> str | None:
    """``argv``'s standard output, None where the command is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(backend: Backend) -> dict[str, Any]:
    """Where the numbers come from: device, driver, CUDA, versions, host and date."""
    env: dict[str, Any] = {
        "device": backend.device_name(),
        "backend": backend.name,
        "driver_version": None,
        "cuda_version": None,
        "cuda_toolkit": None,
        "pycuda_version": _package_version("pycuda"),
        "mmd_version": __version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        found = backend.versions()
    except Exception:  # versions are facts for the record, never a reason to stop
        found = {}
    env["driver_version"] = found.get("driver")
    env["cuda_version"] = found.get("pycuda_built_for")
    env["pycuda_version"] = env["pycuda_version"] or found.get("pycuda")
    smi = command_output(["nvidia-smi"])
    if smi:
        if env["driver_version"] is None:
            match = re.search(r"Driver Version:\s*([\d.]+)", smi)
            env["driver_version"] = match.group(1) if match else None
        match = re.search(r"CUDA Version:\s*([\d.]+)", smi)
        env["cuda_driver_api"] = match.group(1) if match else None
    nvcc = command_output(["nvcc", "--version"])
    if nvcc:
        match = re.search(r"release ([\d.]+)", nvcc)
        env["cuda_toolkit"] = match.group(1) if match else None
    if env["cuda_version"] is None and backend.name == "cuda":
        # The installed toolkit stands in only where CUDA ran the numbers: beside the cpu backend it ran nothing.
        env["cuda_version"] = env.get("cuda_toolkit")
    return env
