"""pycuda's driver module, imported lazily, and the one rule for turning its errors into mmd's.

Nothing outside :mod:`mmd.cuda` imports pycuda; inside it, this is the one
place that does, so every other module of mmd imports and tests on machines
without CUDA. A missing pycuda or driver raises
:class:`~mmd.errors.BackendUnavailable`.

:class:`ContextWarmer` is the one use of the driver's library without
pycuda: a one-shot job starts the driver on a thread while Python imports and
reads the input.
"""

from __future__ import annotations

import ctypes
import threading
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


class ContextWarmer:
    """Start the CUDA driver and make ``device``'s primary context on a thread of its own, now.

    Starting the driver and making a context is a few hundred milliseconds of
    the driver's own work, which a one-shot job otherwise pays before it can
    begin. Called through ctypes, which lets go of the GIL, it runs beside the
    job's imports and its read. The context made is the one pycuda retains
    later (a device has one primary context), which then finds it ready.
    Nothing is raised: without a driver or device the thread just ends, and
    the backend says why when it opens. :meth:`release` gives back this
    thread's hold on the context once the job is done.
    """

    def __init__(self, device: int, library: str = "libcuda.so.1") -> None:
        self._held: tuple[ctypes.CDLL, ctypes.c_int] | None = None
        self._thread = threading.Thread(target=self._warm, args=(device, library), name="mmd-cuda-warm", daemon=True)
        self._thread.start()

    def _warm(self, device: int, library: str) -> None:
        try:
            lib = ctypes.CDLL(library)
        except OSError:
            return
        dev = ctypes.c_int()
        ctx = ctypes.c_void_p()
        if lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(dev), device):
            return
        if lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0:
            self._held = (lib, dev)

    def release(self) -> None:
        """Wait for the thread, and give back its hold on the context (pycuda keeps its own)."""
        self._thread.join()
        if self._held is not None:
            lib, dev = self._held
            self._held = None
            lib.cuDevicePrimaryCtxRelease_v2(dev)
