"""The tolerance model of mmd's checks, numpy-free (:mod:`mmd.verify`'s full check, :mod:`mmd.freivalds`).

Printed values carry ``%6.2f`` rounding (half a hundredth) on top of fp32
arithmetic error, which grows about as sqrt(K)·eps·(|A|·|B|) for a dot product
of length K.
"""

from __future__ import annotations

import math

#: Half a unit in the last printed place of ``%6.2f``, plus a hair for binary rounding.
PRINT_HALF_UNIT = 0.005 * (1 + 1e-9)
#: float32's machine epsilon.
EPS32 = 2.0**-23
#: float64's unit roundoff.
U64 = 2.0**-53
#: The default fp32 model, in words (the factor is :func:`fp32_factor`'s).
FP32_MODEL = "4·sqrt(K)·eps·|A||B|"


def fp32_factor(k: int, factor: float = 4.0) -> float:
    """c in the fp32 allowance c·(|A|·|B|) for inner dimension ``k``: factor·sqrt(K)·eps."""
    return factor * math.sqrt(max(k, 1)) * EPS32


def described(tol: float | None) -> str:
    """The allowance a check holds each value to, in words: print rounding plus the fp32 model, or plus ``tol``."""
    return f"0.005 + {FP32_MODEL}" if tol is None else f"0.005 + {tol:g}"
