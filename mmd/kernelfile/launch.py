"""Running a kernel file's launch in a process of its own (:mod:`.launch_child`), held to a time limit.

A kernel file is anyone's code: it runs in a child process with its own CUDA context, never in the
process that serves other jobs, and that child runs one job and ends, so every buffer its kernel can
reach holds only that job's data (a fresh context's allocations, C zeroed before the launch). The parent
(the job's process) sends the padded operands over a pipe, the child answers with the product and the
five phases' CUDA-event timings. A launch past its time limit is stopped by killing the child (its
context goes with it); a fault comes back with CUDA's error name; the kernel's ``printf`` output is kept
up to :data:`PRINTF_CAP` bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from ..errors import BackendUnavailable, KernelLaunchError
from ..fileops import OPS, write_all
from ..kernels import DeviceLimits
from ..spawning import exit_status

#: The most bytes of a kernel's printf output kept (the rest is counted and dropped).
PRINTF_CAP = 4096
#: The most bytes of the child's own error output kept, for a child that dies unexplained.
STDERR_CAP = 8192
#: How long a child may take to start (its imports, the CUDA context) and to move a job's data.
START_S = 60.0
#: How long the copies back and the answer may take once the kernel has run.
ANSWER_S = 60.0
#: How long a killed child is waited for (a context spinning in a kernel takes the driver a moment).
REAP_S = 5.0
#: Bytes a pipe between parent and child is asked to hold (Linux's default for unprivileged users at most):
#: fewer system calls for the operands and the product.
PIPE_BYTES = 1 << 20

#: pycuda's argument code per role of a kernel's parameter (:data:`~.signature.ROLES`).
_CODES = {"A": "P", "B": "P", "C": "P", "alpha": "f", "beta": "f"}


@dataclass(frozen=True)
class Launch:
    """One launch of a compiled kernel file on padded operands."""

    cubin: bytes
    symbol: str
    #: Each parameter as (pycuda's code, value): ``("P", "A")`` a matrix, ``("i", 4096)``, ``("f", 1.0)``.
    arguments: tuple[tuple[str, Any], ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared: int

    @property
    def signature(self) -> str:
        return "".join(code for code, _ in self.arguments)


def arguments(roles: tuple[str, ...], mp: int, kp: int, np_: int) -> tuple[tuple[str, Any], ...]:
    """Each parameter's value for padded sizes (mp, kp, np_): A, B and C by name, the sizes, the row strides
    (row-major: lda = K, ldb = ldc = N), alpha 1 and beta 0; ``width`` is the square kernel's one size."""
    sizes = {"M": mp, "K": kp, "N": np_, "width": mp, "lda": kp, "ldb": np_, "ldc": np_}
    scalars = {"alpha": 1.0, "beta": 0.0}
    out: list[tuple[str, Any]] = []
    for role in roles:
        if role in ("A", "B", "C"):
            out.append(("P", role))
        elif role in scalars:
            out.append((_CODES[role], scalars[role]))
        else:
            out.append(("i", sizes[role]))
    return tuple(out)


@dataclass
class Ran:
    """What the child gave back: the padded product, the phases' milliseconds, the kernel's printf output."""

    c: np.ndarray
    timings_ms: dict[str, float]
    printf: bytes = b""
    printf_bytes: int = 0


@dataclass
class _Drain:
    """A pipe read to its end on a thread of its own, its first ``cap`` bytes kept."""

    stream: IO[bytes]
    cap: int
    kept: bytearray = field(default_factory=bytearray)
    total: int = 0

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := os.read(self.stream.fileno(), 1 << 16):
                self.total += len(chunk)
                room = self.cap - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]

    def done(self, timeout: float) -> bytes:
        self.thread.join(timeout)
        return bytes(self.kept)


def _widen(fd: int) -> None:
    with contextlib.suppress(OSError):  # a smaller pipe only costs more system calls
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


class LaunchProcess:
    """A child process with its own CUDA context on ``device``, for one job: started at once, so that its
    imports and context are made while the job's input is read.

    :meth:`ready` waits for it (the device's limits and name); :meth:`run` runs one launch and leaves it
    ended; :meth:`close` kills it wherever it is. ``label`` names the kernel in messages.
    """

    def __init__(self, device: int, label: str) -> None:
        self.label = label
        control, child_end = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "mmd.kernelfile.launch_child", str(child_end), str(device), str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(child_end,),
                close_fds=True,
            )
        finally:
            os.close(child_end)
        self._control = control
        os.set_blocking(control, False)
        _widen(control)
        assert self._proc.stdin is not None and self._proc.stdout is not None and self._proc.stderr is not None
        _widen(self._proc.stdin.fileno())
        self._printf = _Drain(self._proc.stdout, PRINTF_CAP)
        self._stderr = _Drain(self._proc.stderr, STDERR_CAP)
        self._buffer = bytearray()
        self._ready: tuple[str, DeviceLimits] | None = None
        self._closed = False

    # -- the control pipe ---------------------------------------------------------------------------------

    def _fill(self, deadline: float) -> bool:
        """Read what the control pipe holds into the buffer, waiting until ``deadline``; False at its end."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        readable, _, _ = select.select([self._control], [], [], left)
        if not readable:
            raise TimeoutError
        try:
            chunk = os.read(self._control, 1 << 20)
        except BlockingIOError:
            return True
        self._buffer += chunk
        return bool(chunk)

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            if not self._fill(deadline):
                raise EOFError
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        message: dict[str, Any] = json.loads(line)
        return message

    def _payload(self, out: np.ndarray, deadline: float) -> None:
        view = out.data.cast("B")
        have = min(len(self._buffer), len(view))
        view[:have] = self._buffer[:have]
        del self._buffer[:have]
        at = have
        while at < len(view):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._control], [], [], left)[0]:
                raise TimeoutError
            try:
                got = os.readv(self._control, [view[at:]])
            except BlockingIOError:
                continue
            if not got:
                raise EOFError
            at += got

    def _expect(self, key: str, deadline: float, doing: str) -> dict[str, Any]:
        """The next message, which must hold ``key``; the child's error, its death or a timeout raised."""
        try:
            message = self._message(deadline)
        except EOFError:
            raise self._died(doing) from None
        except TimeoutError:
            self.close()
            raise KernelLaunchError(
                f"{self.label}: its process did not answer while {doing} (it was stopped)",
                {"kernel_file": self.label, "during": doing},
            ) from None
        if "error" in message:
            raise self._fault(message["error"])
        if key not in message:
            self.close()
            raise KernelLaunchError(f"{self.label}: its process answered out of turn while {doing}")
        return message

    def _fault(self, error: dict[str, Any]) -> BackendUnavailable | KernelLaunchError:
        self.close()
        reason = str(error.get("reason", "failed"))
        if error.get("kind") == BackendUnavailable.kind:
            return BackendUnavailable(reason, {"kernel_file": self.label})
        name = error.get("cuda_error")
        details = {"kernel_file": self.label, **({"cuda_error": name} if name else {})}
        if "during" in error:
            details["during"] = error["during"]
        printf = self._printf.done(1.0)
        if printf:
            details["printf"] = printf.decode("utf-8", "replace")
        said = f"{name} ({reason})" if name else reason
        return KernelLaunchError(f"{self.label} failed on the GPU: {said}", details)

    def _died(self, doing: str) -> KernelLaunchError:
        status = self._reap()
        why = exit_status(status)
        last = self._stderr.done(1.0).decode("utf-8", "replace").strip().splitlines()
        tail = f": {last[-1]}" if last else ""
        return KernelLaunchError(
            f"{self.label}: its process ended while {doing} ({why}){tail}",
            {"kernel_file": self.label, "during": doing, "status": why},
        )

    # -- the job ------------------------------------------------------------------------------------------

    def ready(self) -> tuple[str, DeviceLimits]:
        """(the device's name, its limits) once the child has its context; BackendUnavailable where it
        cannot have one (no pycuda, no GPU), KernelLaunchError where it died."""
        if self._ready is None:
            message = self._expect("ready", time.monotonic() + START_S, "starting")["ready"]
            raw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in message["limits"].items()}
            limits = DeviceLimits(**raw)
            self._ready = (str(message["device"]), limits)
        return self._ready

    def run(self, launch: Launch, a: np.ndarray, b: np.ndarray, limit_s: float) -> Ran:
        """``launch`` on (padded) ``a`` and ``b``: the padded product and the phases' times. The kernel may run
        ``limit_s`` seconds; past them the child is killed and KernelLaunchError raised."""
        self.ready()
        (mp, kp), np_ = a.shape, b.shape[1]
        job = {
            "cubin_bytes": len(launch.cubin),
            "symbol": launch.symbol,
            "signature": launch.signature,
            "arguments": [list(arg) for arg in launch.arguments],
            "grid": list(launch.grid),
            "block": list(launch.block),
            "dynamic_shared": launch.dynamic_shared,
            "a_shape": [mp, kp],
            "b_shape": [kp, np_],
        }
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            head = json.dumps(job).encode()
            for piece in (
                memoryview(len(head).to_bytes(8, "big")),
                memoryview(head),
                memoryview(launch.cubin),
                a.data,
                b.data,
            ):
                write_all(OPS, stdin.fileno(), piece)
            stdin.close()
        except BrokenPipeError:
            raise self._died("taking the job") from None
        self._expect("launching", time.monotonic() + START_S, "loading the kernel and copying the operands")
        started = time.monotonic()
        try:
            self._message_after_launch(started + limit_s)
        except TimeoutError:
            self.close()  # killed and reaped: the context is gone
            stopped = round(time.monotonic() - started, 3)
            raise KernelLaunchError(
                f"{self.label} ran past its time limit, {limit_s:g} s (kernel_file_launch_timeout_s): "
                "its process was killed",
                {"kernel_file": self.label, "limit_s": limit_s, "stopped_after_s": stopped},
            ) from None
        answer = self._expect("timings", time.monotonic() + ANSWER_S, "copying the product back")
        c = np.empty((mp, np_), np.float32)
        try:
            self._payload(c, time.monotonic() + ANSWER_S)
        except (EOFError, TimeoutError):
            raise self._died("copying the product back") from None
        self._reap()
        printf = self._printf.done(REAP_S)
        timings = {str(k): float(v) for k, v in answer["timings"].items()}
        return Ran(c, timings, printf, self._printf.total)

    def _message_after_launch(self, deadline: float) -> None:
        """Wait for ``ran`` until ``deadline`` (TimeoutError past it); the child's error or death raised."""
        try:
            message = self._message(deadline)
        except EOFError:
            raise self._died("running the kernel") from None
        if "error" in message:
            raise self._fault(message["error"])

    def _reap(self) -> int | None:
        try:
            return self._proc.wait(REAP_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                return self._proc.wait(REAP_S)
        return None

    def close(self) -> None:
        """Kill the child wherever it is (its context and memory go with it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(REAP_S)
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()
        with contextlib.suppress(OSError):
            os.close(self._control)
