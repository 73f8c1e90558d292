"""Build of mmd's C accelerators (all metadata lives in pyproject.toml).

``mmd._fasttext`` is the text format's parse and emit, ``mmd._fastcheck`` the checks' passes over the
matrices. They are required wherever a C compiler exists (every GPU box has one: nvcc needs it), so a
build that fails there is an error, not a silent fall back to the slow paths. Only where no compiler
exists at all (the one the build would call is not on PATH) are they skipped, and mmd then runs its
own paths without them (numpy's, and the exact pure-Python ones they are tested against).
"""

import os
import shlex
import shutil
import sysconfig

from setuptools import Extension, setup


def _compiler_exists() -> bool:
    """Whether the C compiler this Python's extensions are built with (``CC``, as sysconfig or the
    environment names it) is on PATH."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(shlex.split(cc)[0]) is not None


OPTIONAL = not _compiler_exists()
# Linked stripped: the libraries carry no symbol table nor debug information (Python's own CFLAGS say -g),
# a third of the size; to step through them in a debugger, build them without this.
LINK = ["-s"]

setup(
    ext_modules=[
        Extension(
            "mmd._fasttext",
            ["mmd/_fasttext.c"],
            extra_compile_args=["-O3"],
            extra_link_args=LINK,
            optional=OPTIONAL,
        ),
        Extension(
            "mmd._fastcheck",
            ["mmd/_fastcheck.c"],
            # no fused multiply-add (arm64 and -march=native would contract a*b + c): the rules'
            # decisions must round as the numpy path's separate multiply and add do
            extra_compile_args=["-O3", "-ffp-contract=off"],
            extra_link_args=LINK,
            optional=OPTIONAL,
        ),
    ],
)
