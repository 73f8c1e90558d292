"""Build of mmd's optional C accelerator (all metadata lives in pyproject.toml).

``mmd._fasttext`` speeds up mmd.textformat's parse and emit. It is optional:
without a C compiler the build skips it and mmd uses its numpy path.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mmd._fasttext",
            ["mmd/_fasttext.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ],
)
