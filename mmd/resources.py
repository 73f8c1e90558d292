"""Where mmd's data files are (the kernel sources, their tuning files and the default config), and how this
install of mmd adds an optional part (:func:`install_hint`).

They live at the top of the repository (``kernels/``, ``config/``) and ship
inside the package as ``mmd/data/kernels`` and ``mmd/data/config``: in a
checkout those are links to the top-level folders, in an installed mmd they
are the copies the wheel carries. Everything reads them through here, with
:mod:`importlib.resources`, so a non-editable install works from any folder.
"""

from __future__ import annotations

import functools
import shlex
import shutil
import sys
from importlib import resources
from pathlib import Path

#: The default configuration's file name inside ``data/config``.
DEFAULT_CONFIG_NAME = "mmd.yaml"

#: The distribution's name (pyproject.toml's); the package and the command are ``mmd``. PyPI's ``mmd`` is
#: another project, so no hint names a distribution: mmd is installed from its clone (:func:`install_hint`).
DISTRIBUTION = "mmd-lab"


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


def install_hint(extra: str) -> str:
    """The command that adds the optional part ``extra`` (an extra of pyproject.toml) to this mmd, as its user
    would type it where they are: run from a clone (an editable install, or the clone's folder on the path),
    the clone again with the extra; from an installed wheel, the extra's own requirements, into the
    environment mmd runs in."""
    found = shutil.which("pip")
    pip = (
        "pip"
        if found and Path(found).parent == Path(sys.executable).parent
        else f"{shlex.quote(sys.executable)} -m pip"
    )
    clone = Path(__file__).resolve().parent.parent
    if (clone / "pyproject.toml").is_file():  # a wheel puts the package beside others, no pyproject.toml there
        where = "." if clone == Path.cwd().resolve() else str(clone)
        return f"{pip} install -e {shlex.quote(f'{where}[{extra}]')}"
    # only for this message: importlib.metadata alone would add a tenth of the registry's import to every command
    from importlib import metadata

    from packaging.requirements import Requirement

    wanted = []
    for line in metadata.requires(DISTRIBUTION) or []:
        requirement = Requirement(line)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
            requirement.marker = None
            wanted.append(shlex.quote(str(requirement)))
    return f"{pip} install {' '.join(wanted)}"
