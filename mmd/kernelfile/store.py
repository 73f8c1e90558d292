"""A class's handed-in kernels: mmd's own copies, one namespace per student, every version a queued job may need.

The store is ``state_dir/kernels`` (mmd's private folder: no student can list or read it). Each student has a
folder of their own, ``kernels/<login>``, in which

* ``.v/<version>/NAME.cu`` (and ``NAME.kernel.yaml`` where one was handed in) is one version, kept under the
  sha256 of what was handed in (:func:`version_of`): a file mmd wrote itself, 0600;
* ``NAME.cu`` is the current version: a symbolic link to ``.v/<version>/NAME.cu``, replaced by a rename, so
  that a job that looks it up sees the old version or the new one, whole.

A job that names ``NAME`` is given the version's own path (:meth:`KernelStore.pick`): a later hand-in of the
same name changes the link, never that version, so the job runs what it was queued with. A student's jobs look
in their own folder only, and :func:`mmd.kernelchoice.in_folders` never looks there for one of mmd's own kernel
names: no one runs another's kernel, and no hand-in shadows a built-in.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..atomic import link_atomic, write_atomic
from ..kernelchoice import FOLDER_NAME, SUFFIX
from .reading import SIDECAR_SUFFIX

#: The store's folder in state_dir.
STORE_DIR = "kernels"
#: A student's folder of kept versions.
VERSIONS_DIR = ".v"


def version_of(source: bytes, declaration: bytes | None) -> str:
    """A hand-in's version: the sha256 of its ``.cu`` and of its ``.kernel.yaml`` (where there is one), each
    length-prefixed so that no two hand-ins share one."""
    h = hashlib.sha256()
    for part in (source, declaration):
        h.update(b"-" if part is None else f"{len(part)}:".encode() + part)
    return h.hexdigest()


#: The most hand-ins of one student a status lists (by name); the rest are counted.
SHOWN_HANDINS = 100


@dataclass(frozen=True)
class Current:
    """A student's current hand-in of one name, as their status shows it."""

    name: str
    version: str
    #: When it was handed in: its link's mtime (every hand-in of the name, even of the same version, renames
    #: a new link onto it).
    handed_in: float


@dataclass(frozen=True)
class Kept:
    """A hand-in as the store keeps it."""

    #: ``NAME`` (the file's stem): what jobs name.
    name: str
    version: str
    #: The version's ``NAME.cu``.
    path: Path
    #: Every file the store wrote for it (what counts toward the student's quota); empty where this version
    #: was kept already.
    written: tuple[Path, ...]


class KernelStore:
    """The handed-in kernels under ``root`` (``state_dir/kernels``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def of(cls, state_dir: Path) -> KernelStore:
        return cls(state_dir / STORE_DIR)

    def folder(self, login: str) -> Path:
        """``login``'s own folder: the one kernel folder their jobs look in."""
        return self.root / login

    def keep(self, login: str, name: str, source: bytes, declaration: bytes | None) -> Kept:
        """Keep a hand-in of ``NAME`` (``source``: its ``.cu``; ``declaration``: its ``.kernel.yaml``) as
        ``login``'s current version. Raises OutputError where it cannot be written."""
        if not FOLDER_NAME.fullmatch(name):
            raise ValueError(f"not a kernel's name: {name!r}")
        version = version_of(source, declaration)
        own = self.folder(login)
        where = own / VERSIONS_DIR / version
        for folder in (self.root, own, own / VERSIONS_DIR):
            folder.mkdir(mode=0o700, exist_ok=True)
        written: list[Path] = []
        path = where / (name + SUFFIX)
        if not path.is_file():
            where.mkdir(mode=0o700, exist_ok=True)
            parts = [(path, source)]
            if declaration is not None:
                parts.append((where / (name + SIDECAR_SUFFIX), declaration))
            for target, data in parts:
                write_atomic(target, [data], mode=0o600)
                written.append(target)
        link_atomic(own / (name + SUFFIX), os.path.join(VERSIONS_DIR, version, name + SUFFIX))
        return Kept(name, version, path, tuple(written))

    def sweep(self, max_age_s: float, now: float) -> list[tuple[str, Path, os.stat_result]]:
        """Remove the versions kept more than ``max_age_s`` before ``now`` (by when mmd wrote them: its own
        files' mtime) that are no name's current one (retention); returns what went: (login, file, its lstat).
        A job still queued with a version so removed runs its name's current one."""
        gone: list[tuple[str, Path, os.stat_result]] = []
        for own in _listed(self.root):
            current = set()
            for link in _listed(own):
                with contextlib.suppress(OSError):
                    current.add(os.path.normpath(own / os.readlink(link)).rsplit(os.sep, 2)[-2])
            for version in _listed(own / VERSIONS_DIR):
                if version.name in current:
                    continue
                try:
                    files = [(path, os.lstat(path)) for path in _listed(version)]
                except OSError:
                    continue
                if any(now - info.st_mtime < max_age_s for _, info in files):
                    continue
                for path, info in files:
                    with contextlib.suppress(OSError):
                        path.unlink()
                        gone.append((own.name, path, info))
                with contextlib.suppress(OSError):
                    version.rmdir()
        return gone

    def current(self, login: str, limit: int = SHOWN_HANDINS) -> tuple[list[Current], int]:
        """``login``'s current hand-ins, the first ``limit`` by name, and how many they have: one listing of
        their own folder (never another's) and a readlink and lstat of each one shown."""
        try:
            names = sorted(n for n in os.listdir(self.folder(login)) if n.endswith(SUFFIX) and not n.startswith("."))
        except OSError:
            return [], 0
        out: list[Current] = []
        for entry in names[:limit]:
            link = self.folder(login) / entry
            try:
                version, info = os.readlink(link).split(os.sep)[-2], os.lstat(link)
            except (OSError, IndexError):
                continue  # replaced or removed meanwhile
            out.append(Current(entry.removesuffix(SUFFIX), version, info.st_mtime))
        return out, len(names)

    def pick(self, login: str, name: str) -> Path | None:
        """The current version of ``login``'s ``NAME`` (its own ``NAME.cu`` in ``.v``); None where they have
        handed in none, or ``name`` is not a kernel folder's name."""
        if not FOLDER_NAME.fullmatch(name):
            return None
        own = self.folder(login)
        try:
            target = os.readlink(own / (name + SUFFIX))
        except OSError:
            return None
        path = (own / target).resolve()
        if path.parent.parent != (own / VERSIONS_DIR).resolve() or not path.is_file():
            return None  # mmd writes every link itself; anything else is not followed
        return path


def _listed(folder: Path) -> list[Path]:
    """The entries of ``folder`` but hidden ones (none where it is missing or not a folder)."""
    try:
        return [folder / name for name in sorted(os.listdir(folder)) if not name.startswith(".")]
    except OSError:
        return []
