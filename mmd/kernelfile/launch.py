"""Running a kernel file's launches in a process of its own (:mod:`.launch_child`), each held to a time limit.

A kernel file is anyone's code: it runs in a child process with its own CUDA context, never in the
process that serves other jobs. One :class:`LaunchProcess` serves one backend, that is one kernel file for
one submitter (a daemon's job, a one-shot run, one student's kernel in a grading), and it is kept for that
backend's next launch only while it is sound: a fault, a time limit or an error ends it, and the next
launch starts a fresh one. Every buffer its kernel can reach holds that submitter's data only (its own
context's allocations; C zeroed before each launch).

The parent and the child talk over a Unix socket of whole messages (``SOCK_SEQPACKET``): a JSON object
each, with the memory files (:class:`~.exchange.Shared`) that hold the job's bytes passed alongside. A job
is one of two kinds: ``arrays`` (padded A and B, and room for C, in one memory file: ``mmd bench``,
``mmd grade`` and the host text path) or ``text`` (the input file's bytes: the child parses, multiplies and
formats on the GPU as the cuda backend's text path does, and answers with a memory file of C and the
output's text). The child says ``launching`` before the launch and ``ran`` once the kernel has finished,
so that the parent can hold the launch to its time limit and kill the child past it; a fault comes back
with CUDA's error name; the kernel's ``printf`` output, read from the child's standard output, is kept up
to :data:`PRINTF_CAP` bytes a job.

Starting one imports nothing heavy (numpy comes where a job needs it): ``mmd run`` starts its launch process
before its own imports, so that both run side by side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..errors import KernelLaunchError, MmdError
from ..spawning import exit_status
from .exchange import Operands, Shared

if TYPE_CHECKING:  # numpy, the kernel registry and the text format are imported where they are used (below)
    import numpy as np

    from ..kernels import DeviceLimits
    from ..textformat import Header

#: The most bytes of a kernel's printf output kept per job (the rest is counted and dropped).
PRINTF_CAP = 4096
#: The most bytes of the child's own error output kept, for a child that dies unexplained.
STDERR_CAP = 8192
#: The lines of a dead child's error output its error carries.
STDERR_LINES = 20
#: How long a child may take to start (its imports, the CUDA context) and to take a job in (parse included).
START_S = 60.0
#: How long the copies back, the formatting and the answer may take once the kernel has run.
ANSWER_S = 60.0
#: How long a killed child is waited for (a context spinning in a kernel takes the driver a moment).
REAP_S = 5.0
#: The largest message either side sends (a job's or an answer's JSON; the bytes travel in memory files).
MESSAGE_BYTES = 1 << 20
#: Bytes the printf pipe is asked to hold (Linux's default for unprivileged users at most).
PIPE_BYTES = 1 << 20

#: pycuda's argument code per role of a kernel's parameter (:data:`~.signature.ROLES`).
_CODES = {"A": "P", "B": "P", "C": "P", "alpha": "f", "beta": "f"}


@dataclass(frozen=True)
class Launch:
    """One launch of a compiled kernel file on operands padded to (mp, kp, np_)."""

    cubin: bytes
    symbol: str
    #: Each parameter as (pycuda's code, value): ``("P", "A")`` a matrix, ``("i", 4096)``, ``("f", 1.0)``.
    arguments: tuple[tuple[str, Any], ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared: int
    padded: tuple[int, int, int]

    @property
    def signature(self) -> str:
        return "".join(code for code, _ in self.arguments)

    def message(self) -> dict[str, Any]:
        """What the child needs of it, the cubin aside."""
        return {
            "symbol": self.symbol,
            "signature": self.signature,
            "arguments": [list(arg) for arg in self.arguments],
            "grid": list(self.grid),
            "block": list(self.block),
            "dynamic_shared": self.dynamic_shared,
            "padded": list(self.padded),
        }


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
    """What the child gave back: the product (padded for an ``arrays`` job, cropped for a ``text`` one), the
    phases' milliseconds and the kernel's printf output; a ``text`` job's output bytes and what made them."""

    c: np.ndarray
    timings_ms: dict[str, float]
    printf: bytes = b""
    printf_bytes: int = 0
    #: The output file's bytes, header line first (``text`` jobs).
    chunks: list[memoryview] = field(default_factory=list)
    #: The child's wall-clock ``parse`` and ``emit`` (``text`` jobs).
    stage_ms: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The GPU text path's facts (``parse_gpu``, ``emit_gpu``, ``host_parse``, ``exotic_runs``).
    text: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Drain:
    """A pipe read to its end on a thread of its own, its first ``cap`` bytes kept."""

    stream: IO[bytes]
    cap: int
    kept: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := os.read(self.stream.fileno(), 1 << 16):
                room = self.cap - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]

    def done(self, timeout: float) -> bytes:
        self.thread.join(timeout)
        return bytes(self.kept)


class LaunchProcess:
    """A child process with its own CUDA context on ``device``, serving one backend's launches: started at
    once, so that its imports and context are made while the first job's input is read. ``kernel_cache``:
    where mmd's own text kernels are built and kept.

    :meth:`ready` waits for it (the device's name and limits); :meth:`run` and :meth:`run_text` run one job
    each; :attr:`alive` says whether it can take another; :meth:`close` kills it wherever it is (and waits for
    it, unless ``reap`` is False). ``label`` names the kernel in messages.
    """

    def __init__(
        self, device: int, label: str, kernel_cache: Path | None = None, *, reap: bool = True, host_bytes: int = 0
    ) -> None:
        self.label = label
        #: A one-shot's input file's size: the child makes its input's memory, page-locked, before the job
        #: (:meth:`input_memory`); 0: each job brings its own.
        self.host_bytes = host_bytes
        self._premade: Shared | None = None
        #: Whether :meth:`close` waits for the killed child (False: a caller whose own process ends next leaves
        #: it to the system, and does not wait out the driver's teardown of the child's context).
        self.reap = reap
        self.device = device
        self.kernel_cache = kernel_cache
        # mmd's own text kernels come from the kernel cache as the worker's do (built there once, not per process)
        cache = str(kernel_cache) if kernel_cache is not None else ""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    __package__ + ".launch_child",
                    *map(str, (theirs.fileno(), device, os.getpid())),
                    cache,
                    str(host_bytes),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._stdout: int | None = self._proc.stdout.fileno()
        os.set_blocking(self._stdout, False)
        with contextlib.suppress(OSError):  # a smaller pipe only means more wake-ups
            fcntl.fcntl(self._stdout, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._stderr = _Drain(self._proc.stderr, STDERR_CAP)
        self._printf = bytearray()
        self._printf_bytes = 0
        self._ready: tuple[str, DeviceLimits] | None = None
        self._closed = False
        #: Seconds its kernels held the GPU: from each launch to its end, its fault or its kill (what a student's
        #: GPU time is charged by).
        self.launched_s = 0.0

    @property
    def alive(self) -> bool:
        """Whether it can take another job (not closed: no fault, no time limit, no death so far)."""
        return not self._closed

    # -- messages -----------------------------------------------------------------------------------------

    def _read_printf(self) -> None:
        """Take what the kernel's printf has written so far (the first PRINTF_CAP bytes of a job kept)."""
        while self._stdout is not None:
            try:
                chunk = os.read(self._stdout, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._stdout = None  # the child has gone: its end of the pipe is closed
                return
            self._printf_bytes += len(chunk)
            room = PRINTF_CAP - len(self._printf)
            if room > 0:
                self._printf += chunk[:room]

    def _receive(self, deadline: float) -> tuple[dict[str, Any], list[int]]:
        """The child's next message and the descriptors that came with it, reading printf output meanwhile;
        TimeoutError past ``deadline``, EOFError where the child has gone."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            waiting = [self._sock] + ([self._stdout] if self._stdout is not None else [])
            readable, _, _ = select.select(waiting, [], [], left)
            if self._stdout is not None and self._stdout in readable:
                self._read_printf()
            if self._sock in readable:
                try:
                    data, fds, _, _ = socket.recv_fds(self._sock, MESSAGE_BYTES, 2)
                except ConnectionResetError:
                    data, fds = b"", []
                if not data:
                    for fd in fds:
                        os.close(fd)
                    raise EOFError
                message: dict[str, Any] = json.loads(data)
                return message, fds

    def _expect(self, key: str, deadline: float, doing: str) -> tuple[dict[str, Any], list[int]]:
        """The next message, which must hold ``key``; the child's error, its death or a timeout raised."""
        try:
            message, fds = self._receive(deadline)
        except EOFError:
            raise self._died(doing) from None
        except TimeoutError:
            self.close()
            raise KernelLaunchError(
                f"{self.label}: its process did not answer while {doing} (it was stopped)",
                {"kernel_file": self.label, "during": doing},
            ) from None
        if "error" in message or key not in message:
            for fd in fds:
                os.close(fd)
            if "error" in message:
                raise self._fault(message["error"])
            self.close()
            raise KernelLaunchError(f"{self.label}: its process answered out of turn while {doing}")
        return message[key], fds

    def _fault(self, error: dict[str, Any]) -> MmdError:
        """The child's error as the job's: a driver's fault as KernelLaunchError with CUDA's error name, any
        other (the input's, no GPU) as its own type. The child has gone or goes: it is closed."""
        self._read_printf()
        self.close()
        name = error.get("cuda_error")
        if not name and error.get("kind") not in ("cuda", KernelLaunchError.kind):
            return MmdError.from_dict(error)
        reason = str(error.get("reason", "failed"))
        details = {"kernel_file": self.label, **({"cuda_error": name} if name else {})}
        if "during" in error:
            details["during"] = error["during"]
        if self._printf:
            details["printf"] = bytes(self._printf).decode("utf-8", "replace")
        said = f"{name} ({reason})" if name else reason
        return KernelLaunchError(f"{self.label} failed on the GPU: {said}", details)

    def _died(self, doing: str) -> KernelLaunchError:
        status = self._reap()
        self.close()
        why = exit_status(status)
        last = self._stderr.done(1.0).decode("utf-8", "replace").strip().splitlines()
        tail = f": {last[-1]}" if last else ""
        # the error output's end (a crash's traceback) goes with the error, to the job's error sidecar
        said = {"stderr": "\n".join(last[-STDERR_LINES:])} if last else {}
        return KernelLaunchError(
            f"{self.label}: its process ended while {doing} ({why}){tail}",
            {"kernel_file": self.label, "during": doing, "status": why, **said},
        )

    # -- jobs ---------------------------------------------------------------------------------------------

    def ready(self) -> tuple[str, DeviceLimits]:
        """(the device's name, its limits) once the child has its context; BackendUnavailable where it
        cannot have one (no pycuda, no GPU), KernelLaunchError where it died."""
        if self._ready is None:
            from ..kernels import DeviceLimits

            message, fds = self._expect("ready", time.monotonic() + START_S, "starting")
            if fds:  # the one-shot's input memory, page-locked there: its pages exist, mapped in one call
                self._premade = Shared(fd=fds[0], populate=True)
            raw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in message["limits"].items()}
            self._ready = (str(message["device"]), DeviceLimits(**raw))
        return self._ready

    def input_memory(self, nbytes: int) -> Shared | None:
        """The memory the child made for a one-shot's input (:attr:`host_bytes`), once, where ``nbytes`` fit it
        (waiting for the child's start); None where it made none (the caller makes its own)."""
        if not self.host_bytes:
            return None
        self.ready()
        premade, self._premade = self._premade, None
        if premade is not None and premade.nbytes < nbytes:
            premade.close()
            return None
        return premade

    def _job(self, job: dict[str, Any], data: Shared, cubin: bytes, limit_s: float) -> tuple[dict[str, Any], list[int]]:
        """Send ``job`` with ``data`` and the cubin; hold the launch to ``limit_s``; the child's answer."""
        self.ready()
        if self._closed:
            raise KernelLaunchError(f"{self.label}: its launch process has ended")
        self._printf, self._printf_bytes = bytearray(), 0
        code = Shared(len(cubin))
        try:
            code.bytes_at(0, len(cubin))[:] = cubin
            socket.send_fds(self._sock, [json.dumps(job).encode()], [data.fd, code.fd])
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                raise
            raise self._died("taking the job") from None
        finally:
            code.close()
        self._expect("launching", time.monotonic() + START_S, "loading the kernel and its operands")
        started = time.monotonic()
        try:
            self._expect_ran(started + limit_s)
        except TimeoutError:
            self.launched_s += time.monotonic() - started
            self.close()  # killed and reaped: the context is gone
            stopped = round(time.monotonic() - started, 3)
            raise KernelLaunchError(
                f"{self.label} ran past its time limit, {limit_s:g} s (kernel_file_launch_timeout_s): "
                "its process was killed",
                {"kernel_file": self.label, "limit_s": limit_s, "stopped_after_s": stopped},
            ) from None
        except BaseException:
            self.launched_s += time.monotonic() - started  # a fault: the GPU was the kernel's until then
            raise
        self.launched_s += time.monotonic() - started
        self._read_printf()  # the child flushed the kernel's printf before it said ``ran``
        return self._expect("done", time.monotonic() + ANSWER_S, "copying the product back")

    def _expect_ran(self, deadline: float) -> None:
        """Wait for ``ran`` until ``deadline`` (TimeoutError past it); the child's error or death raised."""
        try:
            message, fds = self._receive(deadline)
        except EOFError:
            raise self._died("running the kernel") from None
        for fd in fds:
            os.close(fd)
        if "error" in message:
            raise self._fault(message["error"])

    def _printed(self) -> tuple[bytes, int]:
        return bytes(self._printf), self._printf_bytes

    def run(self, launch: Launch, a: np.ndarray, b: np.ndarray, limit_s: float) -> Ran:
        """``launch`` on padded ``a`` and ``b``: the padded product (a view of memory shared with the child) and
        the phases' times. The kernel may run ``limit_s`` seconds; past them the child is killed and
        KernelLaunchError raised. Operands made in an :class:`~.exchange.Operands` go as they lie, others are
        copied into one."""
        import numpy as np

        ops = Operands.of(a, b)
        own = ops is None
        if ops is None:  # made elsewhere: copied into a memory file of the layout the child reads
            ops = Operands(a.shape[0], a.shape[1], b.shape[1])
            np.copyto(ops.a, a)
            np.copyto(ops.b, b)
        try:
            done, fds = self._job({"arrays": launch.message()}, ops.shared, launch.cubin, limit_s)
        finally:
            if own:
                ops.close()
        for fd in fds:
            os.close(fd)
        printf, printed = self._printed()
        return Ran(ops.c, {str(k): float(v) for k, v in done["timings"].items()}, printf, printed)

    def run_text(self, launch: Launch, data: memoryview, header: Header, limit_s: float, shared: Shared | None) -> Ran:
        """``launch`` on the matrices of an input file's bytes ``data`` (``header`` parsed), parsed, padded,
        multiplied and formatted in the child as the cuda backend's text path does: the output's bytes, the
        (cropped) product and the phases' times. ``shared``: the memory file ``data`` was read into, where it lies
        there (else it is copied into a new one): the child page-locks it where it lies and copies it to the device
        with no staging."""
        own = None
        if shared is None or not shared.holds(data):
            own = shared = Shared(len(data))
            shared.bytes_at(0, len(data))[:] = data
        try:
            job = {"text": {**launch.message(), "offset": shared.offset_of(data), "nbytes": len(data),
                            "header": dataclasses.asdict(header)}}  # fmt: skip
            done, fds = self._job(job, shared, launch.cubin, limit_s)
        finally:
            if own is not None:
                own.close()
        try:
            out = Shared(fd=fds[0], writable=False)
        except (IndexError, OSError):
            for fd in fds:
                os.close(fd)
            self.close()
            raise KernelLaunchError(f"{self.label}: its process gave no output") from None
        try:
            c = out.array(0, (header.m, header.n))
            text = out.bytes_at(c.nbytes, int(done["text_bytes"]))
        except ValueError:
            self.close()
            raise KernelLaunchError(f"{self.label}: its process gave an output of the wrong size") from None
        finally:
            out.close()
        printf, printed = self._printed()
        return Ran(
            c,
            {str(k): float(v) for k, v in done["timings"].items()},
            printf,
            printed,
            chunks=[text],
            stage_ms={str(k): float(v) for k, v in done["stage"].items()},
            notes=[str(note) for note in done["notes"]],
            text=dict(done["text"]),
        )

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
        if self.reap:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(REAP_S)
        self._read_printf()
        if self._premade is not None:  # made for a job that never asked for it (a small input's host path)
            self._premade.close()
            self._premade = None
        for stream in (self._proc.stdout, self._proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()
        self._stdout = None
        self._sock.close()
