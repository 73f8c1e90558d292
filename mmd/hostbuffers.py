"""The host buffers a job's bytes pass through, by slot name, and the bytes each is given before a job comes.

A daemon's worker sets them aside while it is idle (:meth:`mmd.backends.cuda.CudaBackend.prepare`); `mmd run`
has them made beside its start (:mod:`mmd.oneshot`); the pipeline and the GPU text path (:mod:`mmd.cuda.text`)
then ask their slots for them. It imports no numpy: `mmd run` sizes them before numpy is imported.
"""

from __future__ import annotations

#: The host buffer a job's input bytes are read into (:meth:`mmd.backends.base.Backend.host_array`'s slot).
INPUT_SLOT = "input"
#: The page-locked slots the GPU text path downloads C and the output's text into.
C_SLOT, TEXT_SLOT = "c", "text_out"


def input_bytes(n: int) -> int:
    """Bytes a square n×n input takes, for buffers made ready before one comes: two matrices of fields
    up to 8 bytes ("-999.99 ")."""
    return 16 * n * n


def text_bytes(m: int, n: int) -> int:
    """Bytes set aside for an m×n product's text: fields up to 8 bytes ("99999.99"), a newline a row.

    Every ``%6.2f`` field takes 6 bytes at least, so the text path's request for any output that fits is
    at least three quarters of this: within what :class:`~mmd.cuda.pools.PinnedPool` reuses a buffer for.
    Wider fields outgrow it, and the text path then makes a bigger buffer.
    """
    return m * (8 * n + 1)


def kept_buffers(m: int, n: int) -> dict[str, int]:
    """The page-locked slots, and their bytes, that the GPU text path is given ready for an m×n product: its C
    (float32) and its text."""
    return {C_SLOT: 4 * m * n, TEXT_SLOT: text_bytes(m, n)} if m > 0 and n > 0 else {}
