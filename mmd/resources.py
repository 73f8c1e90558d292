"""Where mmd's data files are: the kernel sources, their tuning files and the default config.

They live at the top of the repository (``kernels/``, ``config/``) and ship
inside the package as ``mmd/data/kernels`` and ``mmd/data/config``: in a
checkout those are links to the top-level folders, in an installed mmd they
are the copies the wheel carries. Everything reads them through here, with
:mod:`importlib.resources`, so a non-editable install works from any folder.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

#: The default configuration's file name inside ``data/config``.
DEFAULT_CONFIG_NAME = "mmd.yaml"


@functools.cache
def data_dir() -> Path:
    """The package's data folder as a real path (nvcc needs one for ``-I``).

    mmd is never installed zipped (it carries a C extension), so the
    resource is a folder on disk.
    """
    return Path(str(resources.files("mmd") / "data")).resolve()


def kernels_dir() -> Path:
    """The folder of ``.cu`` sources, headers and ``*.tune.yaml`` files."""
    return data_dir() / "kernels"


def default_config_text() -> str:
    """The embedded default configuration (every key, documented)."""
    return (data_dir() / "config" / DEFAULT_CONFIG_NAME).read_text(encoding="utf-8")
