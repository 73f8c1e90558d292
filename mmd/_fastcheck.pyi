# Types of the C passes of mmd.verify (mmd/_fastcheck.c), built at install where a compiler is found.
from typing import Any

MAX_VECTORS: int

def b_rows(
    b: Any, k: int, n: int, v: int, xt: Any, w: None, rows_t: Any, acc: Any, min_split: int = ..., /
) -> None: ...
def a_rows(a: Any, m: int, k: int, v: int, p: Any, y: Any, rows_t: Any, acc: Any, min_split: int = ..., /) -> None: ...
def b_cols(
    b: Any, k: int, n: int, v: int, p: None, w: Any, rows_t: None, acc: Any, min_split: int = ..., /
) -> None: ...
def c_pass(
    c: Any, m: int, n: int, v: int, xt: Any, y: Any, rows_t: Any, acc: Any, min_split: int = ..., /
) -> tuple[int, int]: ...
def sumsq(
    mat: Any, m: int, n: int, v: int, p: None, w: None, rows: Any, cols: Any, min_split: int = ..., /
) -> None: ...
def uniform(
    out: Any, ref: Any, m: int, n: int, allowed: float, min_split: int = ..., /
) -> tuple[int, float, float, float, int]: ...
def model(
    out: Any, ref: Any, m: int, n: int, scale: float, half: float, limit: int, min_split: int = ..., /
) -> tuple[float, float, float, int, int, int, int, bytes, bytes]: ...
