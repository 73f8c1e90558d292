"""A timeline of one ``mmd run`` and the processes it starts, for benchmarks/kernelfile_vs_builtin.py.

Put this folder first on PYTHONPATH with MMDBENCH_TRACE_FILE set: every Python process that starts then
appends ``pid seconds event`` lines (wall clock) to that file as it passes the points named in
:data:`POINTS` (and in MMDBENCH_TRACE_POINTS), without a line of mmd changed: each function is wrapped as its
module is first imported.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import socket
import sys
import time
from typing import Any

FILE = os.environ.get("MMDBENCH_TRACE_FILE")
#: module: (qualified names of the functions traced, entry and return); the launch process's messages are
#: traced as they are sent
POINTS = {
    "mmd.kernelfile.launch": (
        "LaunchProcess.__init__",
        "LaunchProcess.ready",
        "LaunchProcess.run_text",
        "LaunchProcess.close",
    ),
    "mmd.cuda.session": ("GpuSession.__init__",),
    "mmd.cuda.libcuda": ("ContextWarmer.__init__", "ContextWarmer._warm"),
    "mmd.pipeline.driver": ("run_job",),
    "mmd.backends.kernelfile": ("KernelFileBackend._prepare", "KernelFileBackend.multiply_text"),
    "mmd.cli": ("main",),
}
# more points from the environment: MMDBENCH_TRACE_POINTS="module:Qual.name,other;module2:name"
for _entry in filter(None, os.environ.get("MMDBENCH_TRACE_POINTS", "").split(";")):
    _module, _, _names = _entry.partition(":")
    POINTS[_module] = (*POINTS.get(_module, ()), *filter(None, _names.split(",")))


def mark(event: str) -> None:
    if FILE:
        with open(FILE, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()} {time.time():.6f} {event}\n")


def _traced(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(f"{name} >")
        try:
            return fn(*args, **kwargs)
        finally:
            mark(f"{name} <")

    return wrapper


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, names: tuple[str, ...]) -> None:
        self.inner, self.names = inner, names

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        mark(f"import {module.__name__}")
        for qual in self.names:
            owner, _, attr = qual.rpartition(".")
            holder = getattr(module, owner) if owner else module
            setattr(holder, attr, _traced(f"{module.__name__.rsplit('.', 1)[-1]}.{qual}", getattr(holder, attr)))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in POINTS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, POINTS[name])
        return spec


if FILE:
    mark("start " + " ".join(sys.argv[:3]))
    sys.meta_path.insert(0, _Finder())
    _exit = os._exit

    def _traced_exit(status: int) -> None:
        mark("os._exit")
        _exit(status)

    os._exit = _traced_exit
    _send_fds = socket.send_fds

    def _traced_send(sock: Any, buffers: Any, fds: Any, *args: Any) -> int:
        # the launch process's messages (ready, launching, ran, done) and the parent's jobs
        first = bytes(buffers[0][:40]).decode("utf-8", "replace").split('"')
        mark(f"send {first[1] if len(first) > 1 else '?'}")
        return _send_fds(sock, buffers, fds, *args)

    socket.send_fds = _traced_send
