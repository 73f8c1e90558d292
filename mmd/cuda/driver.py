"""pycuda's driver module, imported lazily, a device's context in one thread, and the one rule for turning
the driver's errors into mmd's.

Nothing outside :mod:`mmd.cuda` imports pycuda; inside it, this is the one
place that does, so every other module of mmd imports and tests on machines
without CUDA. A missing pycuda, driver or device raises
:class:`~mmd.errors.BackendUnavailable`.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import BackendUnavailable, CudaError
from . import libcuda


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


class Context:
    """Device ``ordinal``'s primary context, pushed on the calling thread's context stack (the context cuBLAS,
    through the runtime API, uses too), and its one stream: what every part of a
    :class:`~mmd.cuda.session.GpuSession` shares, with the rules each of their driver calls keeps
    (:meth:`check`, :meth:`converting`). Open, use and close it in one thread.
    """

    def __init__(self, ordinal: int) -> None:
        cuda = load()
        #: ``pycuda.driver``.
        self.cuda = cuda
        #: Exception classes the driver raises, for callers' nets.
        self.errors: tuple[type[BaseException], ...] = (cuda.Error, MemoryError)
        try:
            cuda.init()
            count = cuda.Device.count()
        except cuda.Error as exc:
            raise BackendUnavailable(f"no CUDA device: {one_line(exc)}") from exc
        if count == 0:
            raise BackendUnavailable("no CUDA device: the driver sees no GPU")
        if not 0 <= ordinal < count:
            raise BackendUnavailable(f"no CUDA device {ordinal}: this machine has {count} (0..{count - 1})")
        self._thread = threading.get_ident()
        #: pycuda's Device.
        self.device = cuda.Device(ordinal)
        self._context = self.device.retain_primary_context()
        self._context.push()
        self.closed = False
        self._libcuda: libcuda.Driver | None = None
        #: pycuda's Stream everything is queued on; dropped in :meth:`close` while the context is current, as
        #: pycuda needs.
        self.stream: Any = None
        try:
            self.stream = cuda.Stream()
        except cuda.Error as exc:
            self.close()
            raise CudaError(f"opening CUDA device {ordinal} failed: {one_line(exc)}") from exc

    def driver(self) -> libcuda.Driver:
        """libcuda through ctypes (for what pycuda cannot do), acting on this thread's current context (this
        one), made on first use."""
        if self._libcuda is None:
            self._libcuda = libcuda.Driver()
        return self._libcuda

    def check(self) -> None:
        """CudaError unless this is the thread that opened the context, and it is open."""
        if self.closed:
            raise CudaError("the CUDA session is closed")
        if threading.get_ident() != self._thread:
            raise CudaError("the CUDA session was opened in another thread; open, use and close it in one thread")

    def converting(self, doing: str) -> Converting:
        """Turn driver errors raised while ``doing`` into CudaError."""
        return Converting(doing, self.errors)

    def close(self) -> list[BaseException]:
        """Drop the stream and pop the context (once the parts let go of what they held in it); what failed."""
        self.closed = True
        # Freed here, in the context's thread: left to the garbage collector it would be freed at exit in
        # another thread, out of its context ("stream in out-of-thread context could not be cleaned up").
        self.stream = None
        try:
            self._context.pop()
        except self.cuda.Error as exc:
            return [exc]
        return []


class Converting:
    """:meth:`Context.converting`'s context: a class, not a generator, since every driver call of a job goes
    through one and a generator's costs several times more to enter and leave."""

    __slots__ = ("doing", "errors")

    def __init__(self, doing: str, errors: tuple[type[BaseException], ...]) -> None:
        self.doing = doing
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and isinstance(exc, self.errors):
            doing = self.doing
            raise CudaError(f"{doing} failed: {one_line(exc)}", details={"during": doing}) from exc
