"""The process a kernel file's launches run in (started by :mod:`.launch`): one CUDA context, one submitter.

Run as ``python -m mmd.kernelfile.launch_child SOCKET_FD DEVICE PARENT_PID KERNEL_CACHE HOST_BYTES``. It opens
a :class:`~mmd.cuda.session.GpuSession` on ``DEVICE`` (mmd's text kernels from ``KERNEL_CACHE``, none where
empty; the context made on a thread beside its imports) and says on the socket that it is ready (with the
device's limits). A one-shot's child (``HOST_BYTES``: its input file's size, else 0) first makes the input's
memory file, page-locked, and sends it with ``ready``: its job's process reads the input into it. Then it takes
jobs until the parent closes the socket, each a JSON message with two memory files (the job's bytes, the
cubin):

* ``arrays``: padded A and B and room for C. It runs the course's five timed phases as the cuda backend
  does (``malloc`` includes zeroing C, which some kernels add into) and writes C into the job's memory.
* ``text``: an input file's bytes, in the memory file the parent read the file into (page-locked here where
  it lies, so that the device copies it with no staging; a one-shot's since the start).
  :class:`~mmd.cuda.text.GpuText` parses them on the GPU, the kernel multiplies (padded on the device where it
  needs it: A's padded columns +0.0, B's padded rows -0.0, as :mod:`.padding` explains) and GpuText formats the
  product; the answer brings a new memory file holding C and then the output's bytes.

It says ``launching`` before the launch and ``ran`` once the kernel has finished (its printf flushed), so
that the parent can hold the launch to its time limit and kill this process past it, then ``done``.

Its standard output is the kernel's: device ``printf`` writes there. A driver error ends the process
with CUDA's own error name (``CUDA_ERROR_ILLEGAL_ADDRESS``): pycuda's messages carry the driver's
description of an error, which the driver itself maps back to the name. Any error ends it: after a fault
its context is unusable, and the parent starts a fresh process for the next job. It leaves with
``os._exit``: the driver frees everything the process held as it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import faulthandler
import hashlib
import json
import os
import re
import resource
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..hostbuffers import INPUT_SLOT
from ..spawning import die_with_parent

if TYPE_CHECKING:
    from ..cuda.libcuda import HostMemory
    from .exchange import Shared

#: CUresult codes the driver knows descriptions of are below this.
_MAX_CODE = 1000
_NAME = re.compile(r"CUDA_ERROR_[A-Z0-9_]+")
#: The largest job message taken (the bytes travel in memory files).
_MESSAGE_BYTES = 1 << 20


def _flush_c_stdout() -> None:
    """Device printf goes through the C library's stdout, which buffers it when stdout is a pipe."""
    ctypes.CDLL(None).fflush(None)


def error_name(text: str) -> str | None:
    """CUDA's error name (``CUDA_ERROR_ILLEGAL_ADDRESS``) of a driver error's message: the name where the
    message has it, else the name of the code whose description (cuGetErrorString) the message holds."""
    found = _NAME.search(text)
    if found:
        return found.group(0)
    try:
        from ..cuda.libcuda import Driver

        lib = Driver().lib
    except Exception:  # no driver to ask: the message alone says what happened
        return None
    best: tuple[int, str] | None = None
    for code in range(1, _MAX_CODE):
        described, named = ctypes.c_char_p(), ctypes.c_char_p()
        if lib.cuGetErrorString(code, ctypes.byref(described)) or not described.value:
            continue
        words = described.value.decode("ascii", "replace")
        longer = best is None or len(words) > best[0]  # the longest description wins ("launch failed" is in others)
        if longer and words in text and lib.cuGetErrorName(code, ctypes.byref(named)) == 0 and named.value:
            best = (len(words), named.value.decode("ascii", "replace"))
    return best[1] if best is not None else None


class _Socket:
    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        socket.send_fds(self.sock, [json.dumps(message).encode()], fds or [])

    def receive(self) -> tuple[dict[str, Any], list[int]] | None:
        """The next job and its descriptors; None once the parent has closed its end."""
        data, fds, _, _ = socket.recv_fds(self.sock, _MESSAGE_BYTES, 2)
        if not data:
            return None
        job: dict[str, Any] = json.loads(data)
        return job, fds


class _Kernels:
    """The cubins loaded in this context, by their hash and entry: a kept process loads each build once."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.loaded: dict[tuple[str, str], Any] = {}

    def function(self, cubin: bytes, job: dict[str, Any]) -> Any:
        key = (hashlib.sha256(cubin).hexdigest(), job["symbol"])
        if key not in self.loaded:
            self.loaded[key] = self.session.modules.load_cubin(
                cubin, job["symbol"], job["signature"], job["dynamic_shared"]
            )
        return self.loaded[key]


def _launch(session: Any, function: Any, job: dict[str, Any], a: Any, b: Any, c: Any, control: _Socket) -> None:
    """The kernel on device matrices a, b, c, queued, waited for, said ``launching`` before and ``ran`` after."""
    pointers = {"A": a.ptr, "B": b.ptr, "C": c.ptr}
    args = tuple(pointers[value] if kind == "P" else value for kind, value in job["arguments"])
    control.send({"launching": True})
    session.stream.launch(function, tuple(job["grid"]), tuple(job["block"]), args, job["dynamic_shared"])


def _ran(session: Any, control: _Socket) -> None:
    session.stream.synchronize()  # the kernel has finished (or faulted): the parent's clock stops here
    _flush_c_stdout()
    control.send({"ran": True})


def _arrays(session: Any, kernels: _Kernels, job: dict[str, Any], data: Any, cubin: bytes, control: _Socket) -> None:
    import numpy as np

    mp, kp, np_ = job["padded"]
    a = data.array(0, (mp, kp))
    b = data.array(a.nbytes, (kp, np_))
    c_out = data.array(a.nbytes + b.nbytes, (mp, np_))
    function = kernels.function(cubin, job)
    staged = {
        name: session.memory.host_empty(x.shape, np.float32, slot=name)
        for name, x in (("a", a), ("b", b), ("c", c_out))
    }
    np.copyto(staged["a"], a)  # page-locked before the clock starts, as the cuda backend's operands are
    np.copyto(staged["b"], b)
    timer = session.stream.phase_timer()
    held = []
    with timer.phase("malloc"):
        for rows, cols in ((mp, kp), (kp, np_), (mp, np_)):
            held.append(session.memory.alloc("device", rows, cols))
        da, db, dc = held
        session.memory.fill(dc, 0.0)  # every launch starts from a zero C: some kernels add into it (+=)
    with timer.phase("h2d", follows=True):
        session.memory.upload(da, staged["a"], "a")
        session.memory.upload(db, staged["b"], "b")
    with timer.phase("kernel", follows=True):
        _launch(session, function, job, da, db, dc, control)
    _ran(session, control)
    with timer.phase("d2h", follows=True):
        session.memory.download(dc, "c", out=staged["c"])
    with timer.phase("free", follows=True):
        while held:
            session.memory.free(held.pop())
    np.copyto(c_out, staged["c"])
    control.send({"done": {"timings": timer.elapsed_ms()}})


class _Premade:
    """A one-shot's input memory, made before its job: a memory file of the input file's size, made and
    page-locked on the context's thread as the process starts (:class:`~mmd.cuda.libcuda.ContextWarmer`), and sent
    with ``ready``; its job's process reads the input into it. It serves the job that brings it."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.input: Shared | None = None
        self._identity = (0, 0)

    def make(self) -> tuple[int, int]:
        """The memory file made and mapped (its pages are made as the driver page-locks it): its address and size
        (ContextWarmer's ``mapped``)."""
        from .exchange import Shared

        # made here (populate) its pages would hold the GIL, and the imports beside it would wait
        self.input = Shared(self.nbytes)
        self._identity = _identity(self.input.fd)
        return self.input.address(), self.nbytes

    def holds(self, fd: int) -> bool:
        """Whether ``fd`` is the premade input's memory file (the job's process read its input into it)."""
        return self.input is not None and _identity(fd) == self._identity


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _text(
    session: Any, kernels: _Kernels, job: dict[str, Any], data_fd: int, cubin: bytes, control: _Socket,
    premade: _Premade | None,
) -> None:  # fmt: skip
    import numpy as np

    from ..cuda.memory import DeviceMatrix
    from ..cuda.text import Timer
    from ..textformat import Header, output_bytes_at_least
    from .exchange import Shared

    header = Header(**job["header"])
    mp, kp, np_ = job["padded"]
    function = kernels.function(cubin, job)
    if premade is not None and premade.input is not None and premade.holds(data_fd):  # page-locked since the start
        os.close(data_fd)
        body = premade.input.bytes_at(job["offset"], job["nbytes"])
    else:
        # the input's memory file, page-locked where it lies (the last job's unlocked: a kept process would
        # otherwise hold every job's locked): the device copies it in with no staging
        data = Shared(fd=data_fd)
        session.memory.drop_host("input")
        session.memory.adopt_mapped("input", data.array(0, data.nbytes, "u1"))
        body = data.bytes_at(job["offset"], job["nbytes"])
        data.close()  # the mapping stays while the body is used

    def multiply(a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix, timer: Timer) -> None:
        padded = (mp, kp, np_) != (a.rows, a.cols, b.cols)
        held: list[DeviceMatrix] = []
        try:
            with timer.phase("malloc"):
                if padded:
                    held = [
                        session.memory.alloc("device", rows, cols) for rows, cols in ((mp, kp), (kp, np_), (mp, np_))
                    ]
                pa, pb, pc = held if padded else (a, b, c)
                session.memory.fill(pc, 0.0)  # every launch starts from a zero C: some kernels add into it (+=)
            if padded:
                with timer.phase("pad_gpu"):
                    session.memory.fill(pa, 0.0)
                    session.memory.fill(pb, -0.0)  # against A's +0.0 each padded term is -0.0: no sum's bits change
                    session.memory.copy_matrix(pa, a)
                    session.memory.copy_matrix(pb, b)
            with timer.phase("kernel"):
                _launch(session, function, job, pa, pb, pc, control)
            _ran(session, control)
            if padded:
                with timer.phase("pad_gpu"):
                    session.memory.copy_matrix(c, dataclasses.replace(pc, rows=c.rows, cols=c.cols))
        finally:
            with timer.phase("free"):
                while held:
                    session.memory.free(held.pop())

    # the answer's memory file made (its pages too) while the GPU multiplies and formats: room for C and text
    # of fields up to two bytes wider than the narrowest; a wider answer gets a memory file of its own
    ahead = _Ahead(header.m * header.n * 4 + output_bytes_at_least(header.m, header.n) + 2 * header.m * header.n)
    try:
        result = session.text.multiply_text(body, header, multiply)
    except BaseException:
        ahead.take().close()
        raise
    phases = result.phases_ms
    facts = {
        "parse_gpu": round(phases.get("parse_gpu", 0.0), 3),
        "emit_gpu": round(phases.get("emit_gpu", 0.0), 3),
        "host_parse": result.host_parse,
        "exotic_runs": result.exotic_runs,
    }
    done = {"timings": phases, "stage": result.stage_ms, "notes": result.notes, "text": facts}
    sizes = [memoryview(chunk).nbytes for chunk in result.chunks]
    out = ahead.take()
    if out.nbytes < result.c.nbytes + sum(sizes):
        out.close()
        out = Shared(result.c.nbytes + sum(sizes))
    try:
        np.copyto(out.array(0, result.c.shape), result.c)
        at = result.c.nbytes
        for chunk, size in zip(result.chunks, sizes, strict=True):
            out.bytes_at(at, size)[:] = memoryview(chunk).cast("B")
            at += size
        control.send({"done": {**done, "text_bytes": sum(sizes)}}, [out.fd])
    finally:
        out.close()


class _Ahead:
    """A memory file of ``nbytes``, its pages made on a thread of its own from now (:meth:`take` waits for it)."""

    def __init__(self, nbytes: int) -> None:
        self._made: list[Shared] = []
        self._thread = threading.Thread(target=self._make, args=(nbytes,), name="mmd-answer-memory", daemon=True)
        self._thread.start()

    def _make(self, nbytes: int) -> None:
        from .exchange import Shared

        with contextlib.suppress(OSError):  # no memory file now: take() gives an empty one
            made = Shared(nbytes)
            try:
                # its pages made by the kernel outside the GIL (a populated mapping would hold it: the launch waits)
                os.posix_fallocate(made.fd, 0, nbytes)
            except OSError:
                made.close()
                raise
            self._made.append(made)

    def take(self) -> Shared:
        """The memory file (an empty one where it could not be made: the caller then makes its own)."""
        from .exchange import Shared

        self._thread.join()
        return self._made[0] if self._made else Shared(0)


def _fault(control: _Socket, error: dict[str, Any]) -> None:
    _flush_c_stdout()
    found = error_name(str(error.get("reason", ""))) if error.get("kind") in (None, "cuda", "kernel-launch") else None
    control.send({"error": {**error, **({"cuda_error": found} if found else {})}})


def _premade(session: Any, premade: _Premade | None, locked: HostMemory | None) -> _Premade | None:
    """The one-shot's input memory, adopted by ``session`` (unlocked when it closes), where the context's thread
    made and page-locked it; else None (none asked for, or not made: the job's process then makes its own)."""
    if premade is None or premade.input is None:
        return None
    if locked is None:
        premade.input.close()
        return None
    session.memory.adopt_host(INPUT_SLOT, locked)
    return premade


def main() -> None:
    control_fd, device = int(sys.argv[1]), int(sys.argv[2])
    parent, cache, host_bytes = int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    die_with_parent(parent)  # a kernel left spinning would hold the GPU with no one to stop it
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    faulthandler.enable()  # a crash (the driver's, a library's) says where on the error output the parent keeps
    from ..cuda.libcuda import MAPPED, ContextWarmer

    # The driver's start, the context (pycuda retains the same primary context) and a one-shot's input memory on
    # a thread beside the imports below (numpy's first): the parent is waiting for them.
    premade = _Premade(host_bytes) if host_bytes > 0 else None
    warmer = ContextWarmer(device, mapped=premade.make if premade is not None else None)
    from .exchange import Shared

    control = _Socket(control_fd)
    from ..errors import MmdError

    try:
        from ..cuda.session import GpuSession

        session = GpuSession(device, Path(cache) if cache else None)
        premade = _premade(session, premade, warmer.take_host_memory().get(MAPPED))
    except MmdError as exc:
        control.send({"error": exc.as_dict()})
        os._exit(0)
    finally:
        warmer.release()  # pycuda holds the context now
    ready = {"device": session.device.name(), "limits": dataclasses.asdict(session.device.limits)}
    control.send({"ready": ready}, [premade.input.fd] if premade is not None and premade.input is not None else [])
    kernels = _Kernels(session)
    while True:
        try:
            got = control.receive()
        except OSError:
            got = None
        if got is None:
            os._exit(0)
        job, fds = got
        try:
            code = Shared(fd=fds[1], writable=False)
            cubin = bytes(code.bytes_at(0, code.nbytes))
            code.close()
            if "arrays" in job:
                # the job's pages mapped in one call rather than one fault at a time
                data = Shared(fd=fds[0], populate=True)
                _arrays(session, kernels, job["arrays"], data, cubin, control)
                data.close()
            else:
                _text(session, kernels, job["text"], fds[0], cubin, control, premade)
        except MmdError as exc:
            _fault(control, exc.as_dict())
            break
        except Exception as exc:  # a driver error no session call turned into mmd's (pycuda's own)
            _fault(control, {"kind": "cuda", "reason": " ".join(str(exc).split()) or type(exc).__name__})
            break
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
