"""What each parameter of a kernel may be: the roles a declaration's ``arguments`` name and the type each takes.

A module of its own so that reading a declaration (:mod:`.declaration`, which the registry does for each
of mmd's own kernels on every start) needs no lexer: :mod:`.signature` matches parameters to these.
"""

from __future__ import annotations

#: Parameter types.
FLOAT_PTR, INTEGER, FLOAT = "float*", "int", "float"

#: What each role is: the operands and the product, the sizes (``width``: the one size of a square
#: kernel), the row strides in elements, and BLAS's scalars (alpha 1, beta 0).
ROLES: dict[str, str] = {
    "A": FLOAT_PTR, "B": FLOAT_PTR, "C": FLOAT_PTR,
    "M": INTEGER, "K": INTEGER, "N": INTEGER, "width": INTEGER,
    "lda": INTEGER, "ldb": INTEGER, "ldc": INTEGER,
    "alpha": FLOAT, "beta": FLOAT,
}  # fmt: skip
