"""The tolerance model of mmd's checks, numpy-free (:mod:`mmd.check.full`, :mod:`mmd.check.quick`).

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
#: The fp32 model's factor: an fp32 product's value is allowed FACTOR·sqrt(K)·eps·(|A|·|B|) of error.
FACTOR = 4.0
#: The default fp32 model, in words.
FP32_MODEL = f"{FACTOR:g}·sqrt(K)·eps·|A||B|"


def fp32_factor(k: int, factor: float = FACTOR) -> float:
    """c in the fp32 allowance c·(|A|·|B|) for inner dimension ``k``: factor·sqrt(K)·eps."""
    return factor * math.sqrt(max(k, 1)) * EPS32


def described(tol: float | None) -> str:
    """The allowance a check holds each value to, in words: print rounding plus the fp32 model, or plus ``tol``."""
    return f"0.005 + {FP32_MODEL}" if tol is None else f"0.005 + {tol:g}"


#: What TF32 operands add to a product's error, relative to |A|·|B|: each operand is off by less
#: than one TF32 unit, 2^-10 of it (truncation, the worst a TF32 path does; rounding halves it),
#: so each term a·b by less than 2·2^-10 + 2^-20 of |a·b|. A worst case, not a statistical one:
#: TF32's error is the operands' rounding, which no fp32 model of the sums covers (a product of
#: TF32-rounded operands exceeds the fp32 tolerance, by more at small N: docs/bench.md has the figures).
TF32_OPERAND_ERROR = 2.0**-9 + 2.0**-20

#: The tolerance each precision (:data:`mmd.kernels.PRECISIONS`) is checked against, in words.
TOLERANCES: dict[str, str] = {"fp32": FP32_MODEL, "tf32": "(2^-9 + 4·sqrt(K)·eps)·|A||B|"}


def model_factor(k: int, precision: str = "fp32") -> float:
    """c in the allowance c·(|A|·|B|) of a ``precision`` product (:data:`mmd.kernels.PRECISIONS`) for
    inner dimension ``k``: the fp32 model, widened by :data:`TF32_OPERAND_ERROR` for TF32. The full
    check and the quick check both hold a product to this."""
    return fp32_factor(k) + (TF32_OPERAND_ERROR if precision == "tf32" else 0.0)


def tolerance_of(tol: float | None, precision: str = "fp32") -> str:
    """The allowance each value is held to, in words: print rounding plus ``tol``, else plus ``precision``'s model."""
    return described(tol) if tol is not None else f"0.005 + {TOLERANCES[precision]}"
