"""Padding operands up to what a kernel needs, and cropping its product, without changing a bit of the result.

A course kernel assumes square matrices whose size is a multiple of its tile. mmd pads A (m×k) and
B (k×n) to (mp×kp) and (kp×np) and crops the mp×np product back to m×n. Each output C[i, j] with
i < m, j < n then sums the same k products as before, in the same order, and kp − k more, each
A[i, p]·B[p, j] with p ≥ k: A's padded columns hold +0.0 and B's padded rows −0.0, so each such product
is −0.0, and x + (−0.0) is x for every float x, −0.0 and NaN included (+0.0 would turn a −0.0 sum into
+0.0). An FMA adds the same −0.0 exactly. Padded rows of A and columns of B only reach cropped outputs.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import LimitError
from ..kernels import FLOAT_BYTES
from .declaration import Requirement


def _up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def padded_shape(m: int, k: int, n: int, need: Requirement) -> tuple[int, int, int]:
    """(mp, kp, np): the sizes an m×k · k×n product is run at to meet ``need``."""
    if need.square:
        edge = _up(max(m, k, n), math.lcm(need.rows, need.columns, need.depth))
        return edge, edge, edge
    return _up(m, need.rows), _up(k, need.depth), _up(n, need.columns)


def padded_bytes(padded: tuple[int, int, int]) -> int:
    """Bytes of the padded A, B and C (float32)."""
    mp, kp, np_ = padded
    return FLOAT_BYTES * (mp * kp + kp * np_ + mp * np_)


def check_padded(m: int, k: int, n: int, need: Requirement, max_dim: int | None, max_memory: int | None) -> None:
    """Refuse, before anything is allocated, a product whose padded sizes pass ``max_dim`` or whose padded
    operands and product alone pass the memory limit (the job's own buffers come on top of them)."""
    padded = padded_shape(m, k, n, need)
    if padded == (m, k, n):
        return
    shown = "x".join(map(str, padded))
    if max_dim is not None and max(padded) > max_dim:
        raise LimitError(
            f"a {m}x{k}x{n} product is padded to {shown} for this kernel, past the largest size allowed, {max_dim}",
            {"padded": list(padded), "max_dim": max_dim},
        )
    need_bytes = padded_bytes(padded)
    if max_memory is not None and need_bytes > max_memory:
        raise LimitError(
            f"a {m}x{k}x{n} product is padded to {shown} for this kernel: {need_bytes} bytes of memory; "
            f"the limit is {max_memory}",
            {"padded": list(padded), "need_bytes": need_bytes, "max_memory_bytes": max_memory},
        )


def pad_operands(a: np.ndarray, b: np.ndarray, need: Requirement) -> tuple[np.ndarray, np.ndarray]:
    """A and B padded to :func:`padded_shape` (the same arrays where nothing needs padding)."""
    (m, k), (_, n) = a.shape, b.shape
    mp, kp, np_ = padded_shape(m, k, n, need)
    if (mp, kp, np_) == (m, k, n):
        return a, b
    pa = np.zeros((mp, kp), dtype=np.float32)
    pa[:m, :k] = a
    pb = np.zeros((kp, np_), dtype=np.float32)
    pb[:k, :n] = b
    pb[k:, :] = -0.0  # against A's +0.0 each padded term is -0.0, which leaves every sum's bits as they are
    return pa, pb


def crop(c: np.ndarray, m: int, n: int) -> np.ndarray:
    """The m×n product out of the padded one (itself where nothing was padded)."""
    return c if c.shape == (m, n) else np.ascontiguousarray(c[:m, :n])
