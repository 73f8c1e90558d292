"""What a command runs: one of mmd's own kernels, by its registry name, or a kernel file (docs/kernels.md).

:class:`KernelChoice` is the one kind of kernel the benchmark's plan, its runner, its rows and the command
lines that take ``--kernel-file`` beside mmd's own kernels hand around. Its :attr:`~KernelChoice.name` is what
rows, graphs, tables and messages call it: the registry's name, or the file's own name (``p1.cu``), which no
registry name ends with, so the two never meet.

:func:`in_folders` finds the kernel file a job's name picks (``NAME@kernel=p1.txt``) in the kernel folders a
service allows (the ``kernel_folders`` setting): ``p1.cu`` in the first folder that holds one. Names are
looked up there only where they are not one of mmd's own: a kernel folder cannot shadow a built-in kernel.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import kernels as registry

if TYPE_CHECKING:
    from .kernelfile.reading import KernelFile

#: The suffix of a kernel file.
SUFFIX = ".cu"

#: What a job's name may call a kernel folder's file: ``NAME`` for ``NAME.cu``. Letters, digits, ``_`` and ``-``,
#: not first: no path, no dot, so a name never leaves the folder it is looked up in.
FOLDER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")


@dataclass(frozen=True)
class KernelChoice:
    """One kernel to run: ``spec`` (one of mmd's own) or ``file`` (a kernel file read from ``path``).

    Two choices are the same kernel when their names and paths are: the facts behind them come from those.
    """

    #: What it is called: the registry's name, or the kernel file's name (``p1.cu``).
    name: str
    #: The kernel file's path as given (None: one of mmd's own).
    path: Path | None = None
    spec: registry.KernelSpec | None = field(default=None, compare=False, repr=False)
    file: KernelFile | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.spec is None) == (self.file is None):
            raise ValueError(f"{self.name}: a kernel choice is one of mmd's own or a kernel file, not both or neither")

    @classmethod
    def builtin(cls, name: str) -> KernelChoice:
        """mmd's own kernel ``name``; KernelError naming the choices for a name the registry lacks."""
        spec = registry.get(name)
        return cls(spec.name, spec=spec)

    @classmethod
    def of_file(cls, path: Path) -> KernelChoice:
        """The kernel file at ``path``, read and guarded (KernelFileError with a one-line reason: refused)."""
        from .kernelfile.reading import read_kernel_file  # the lexer and the sandbox: only where a file is given

        kernel = read_kernel_file(path)
        return cls(kernel.name, path=path, file=kernel)

    @property
    def is_file(self) -> bool:
        return self.file is not None

    @property
    def uses_tile(self) -> bool:
        """Whether the tile changes its build or launch (a kernel file's declaration says)."""
        if self.file is not None:
            return self.file.declaration.uses_tile
        return self._spec.uses_tile

    @property
    def on_gpu(self) -> bool:
        """Whether it runs on a GPU: every kernel file does (in a process of its own), and mmd's CUDA kernels."""
        return self.file is not None or self._spec.on_gpu

    @property
    def on_host(self) -> bool:
        """Whether it is the host's kernel (numpy, the cpu backend's)."""
        return self.spec is not None and self.spec.kind == registry.HOST

    @property
    def precision(self) -> str:
        """The arithmetic of its products (:data:`mmd.kernels.PRECISIONS`), which sets the check's tolerance."""
        if self.file is not None:
            return self.file.declaration.precision
        return self._spec.precision

    @property
    def sha256(self) -> str | None:
        """The sha256 of a kernel file's bytes (None: one of mmd's own)."""
        return self.file.sha256 if self.file is not None else None

    @property
    def description(self) -> str:
        """One line on what it is, for a report's table of kernels."""
        if self.file is not None:
            return f"kernel file {self.path}: {self.file.kernel.name}, {self.file.signature}"
        return self._spec.description

    @property
    def _spec(self) -> registry.KernelSpec:
        assert self.spec is not None  # __post_init__: a choice that is no file has a spec
        return self.spec


def in_folders(name: str, folders: Sequence[Path]) -> Path | None:
    """The kernel file ``name`` picks in ``folders`` (``NAME.cu`` in the first that holds it as a file); None where
    ``name`` is one of mmd's own, is not a :data:`FOLDER_NAME`, or no folder holds it."""
    if name in registry.NAMES or not FOLDER_NAME.fullmatch(name):
        return None
    for folder in folders:
        path = folder / (name + SUFFIX)
        if path.is_file():
            return path
    return None
