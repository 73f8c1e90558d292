"""Build of mmd's optional C accelerators (all metadata lives in pyproject.toml).

``mmd._fasttext`` speeds up mmd.textformat's parse and emit, ``mmd._fastcheck``
mmd.verify's passes over the matrices. Both are optional: without a C compiler
the build skips them and mmd uses its numpy paths.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mmd._fasttext",
            ["mmd/_fasttext.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "mmd._fastcheck",
            ["mmd/_fastcheck.c"],
            # no fused multiply-add (arm64 and -march=native would contract a*b + c): the rules'
            # decisions must round as the numpy path's separate multiply and add do
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        ),
    ],
)
