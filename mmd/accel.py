"""mmd's C accelerators, and the one switch that says whether they are in use.

setup.py builds ``mmd._fasttext`` (the text format's parsers and emitters) and ``mmd._fastcheck``
(the checks' O(n²) passes) wherever a compiler is found, as on every GPU box. Every other module
asks :func:`text` and :func:`passes` here, at each use, so that one assignment to :data:`ON`
(tests) or ``MMD_NO_C=1`` (in the environment, before the import) switches every path at once.
Off, the text format takes its exact pure-Python path (:mod:`mmd.textformat`) and the checks
their plain numpy passes (:mod:`mmd.check.full`, :mod:`mmd.check.modelcheck`,
:mod:`mmd.check.quickarrays`): the fallback, and the oracle the tests compare the C paths against.
"""

from __future__ import annotations

import os
from types import ModuleType

fasttext: ModuleType | None
fastcheck: ModuleType | None
try:
    from . import _fasttext as fasttext
except ImportError:  # pragma: no cover - depends on the build
    fasttext = None
try:
    from . import _fastcheck as fastcheck
except ImportError:  # pragma: no cover - depends on the build
    fastcheck = None

#: Whether the C accelerators are in use: both built, and ``MMD_NO_C`` unset (or 0).
ON = fasttext is not None and fastcheck is not None and os.environ.get("MMD_NO_C", "") in ("", "0")

#: Elements from which mmd._fastcheck's passes split their rows over two threads.
C_SPLIT_ELEMS = 1 << 16


def text() -> ModuleType | None:
    """mmd._fasttext where the accelerators are on, else None (the exact pure-Python text path)."""
    return fasttext if ON else None


def passes() -> ModuleType | None:
    """mmd._fastcheck where the accelerators are on, else None (the checks' plain numpy passes)."""
    return fastcheck if ON else None
