"""pycuda's driver module, imported lazily, and the one rule for turning its errors into mmd's.

Nothing outside :mod:`mmd.cuda` imports pycuda; inside it, this is the one
place that does, so every other module of mmd imports and tests on machines
without CUDA. A missing pycuda or driver raises
:class:`~mmd.errors.BackendUnavailable`.
"""

from __future__ import annotations

from typing import Any

from ..errors import BackendUnavailable


def load() -> Any:
    """``pycuda.driver``, or BackendUnavailable saying why it cannot be had."""
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise BackendUnavailable(
            f"pycuda is not installed ({exc}); install pycuda with the CUDA toolkit, or use the cpu backend"
        ) from exc
    except OSError as exc:  # libcuda.so missing: no NVIDIA driver on this machine
        raise BackendUnavailable(f"no CUDA device: the NVIDIA driver library cannot be loaded ({exc})") from exc
    return cuda


def device_count() -> int:
    """How many CUDA devices the driver shows (after CUDA_VISIBLE_DEVICES); 0 without pycuda or a driver.

    Initialises the driver only: no context is made in the calling thread.
    """
    try:
        cuda = load()
        cuda.init()
        return int(cuda.Device.count())
    except Exception:  # no pycuda, no driver, no device: no GPU workers
        return 0


def one_line(exc: BaseException) -> str:
    """A driver error's text on one line (pycuda's messages span several)."""
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())
