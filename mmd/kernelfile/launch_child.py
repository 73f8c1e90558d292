"""The process a kernel file's launch runs in (started by :mod:`.launch`): one CUDA context, one job, then gone.

Run as ``python -m mmd.kernelfile.launch_child CONTROL_FD DEVICE``. It opens a
:class:`~mmd.cuda.session.GpuSession` on ``DEVICE`` and says on ``CONTROL_FD`` that it is ready (with the
device's limits); then it reads one job on its standard input (a JSON line, the cubin, A, B), runs the
course's five timed phases as the cuda backend does (``malloc`` includes zeroing C, which some kernels
add into), and answers on ``CONTROL_FD``: each message one JSON line, the product's bytes after the last.
It says ``launching`` before the launch and ``ran`` once the kernel has finished, so that the parent can
hold the launch to its time limit and kill this process past it.

Its standard output is the kernel's: device ``printf`` writes there (the parent keeps the first bytes).
A driver error ends the job with CUDA's own error name (``CUDA_ERROR_ILLEGAL_ADDRESS``): pycuda's
messages carry the driver's description of an error, which the driver itself maps back to the name.
The process leaves with ``os._exit``: after a fault its context is unusable, and a clean close would
only fail; the driver frees everything the process held as it ends.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import resource
import sys
from typing import Any

from ..fileops import OPS, write_all
from ..spawning import die_with_parent

#: CUresult codes the driver knows descriptions of are below this.
_MAX_CODE = 1000
_NAME = re.compile(r"CUDA_ERROR_[A-Z0-9_]+")


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


class _Control:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, message: dict[str, Any], payload: memoryview | None = None) -> None:
        write_all(OPS, self.fd, json.dumps(message).encode() + b"\n")
        if payload is not None:
            write_all(OPS, self.fd, payload)


def _read_job(fd: int) -> dict[str, Any]:
    """The job's JSON, after its length (8 bytes, big-endian)."""
    size = bytearray(8)
    _read_into(fd, memoryview(size))
    text = bytearray(int.from_bytes(size, "big"))
    _read_into(fd, memoryview(text))
    job: dict[str, Any] = json.loads(text)
    return job


def _read_into(fd: int, view: memoryview) -> None:
    view = view.cast("B")
    while view:
        got = os.readv(fd, [view])
        if not got:
            raise EOFError("the parent closed the job's pipe")
        view = view[got:]


def _run(session: Any, job: dict[str, Any], stdin: int, control: _Control) -> None:
    import numpy as np

    cubin = bytearray(job["cubin_bytes"])
    _read_into(stdin, memoryview(cubin))
    (mp, kp), (_, np_) = job["a_shape"], job["b_shape"]
    function = session.load_cubin(bytes(cubin), job["symbol"], job["signature"], job["dynamic_shared"])
    a = session.host_empty((mp, kp), np.float32, slot="a")
    b = session.host_empty((kp, np_), np.float32, slot="b")
    _read_into(stdin, memoryview(a))
    _read_into(stdin, memoryview(b))
    c = session.host_empty((mp, np_), np.float32, slot="c")  # page-locked before the clock starts, as a, b
    timer = session.phase_timer()
    held = []
    with timer.phase("malloc"):
        for rows, cols in ((mp, kp), (kp, np_), (mp, np_)):
            held.append(session.alloc("device", rows, cols))
        da, db, dc = held
        session.fill(dc, 0.0)  # every launch starts from a zero C: some kernels add into it (+=)
    with timer.phase("h2d", follows=True):
        session.upload(da, a, "a")
        session.upload(db, b, "b")
    pointers = {"A": da.ptr, "B": db.ptr, "C": dc.ptr}
    args = tuple(pointers[value] if kind == "P" else value for kind, value in job["arguments"])
    control.send({"launching": True})
    with timer.phase("kernel", follows=True):
        session.launch(function, tuple(job["grid"]), tuple(job["block"]), args, job["dynamic_shared"])
    session.synchronize()  # the kernel has finished (or faulted): the parent's clock stops here
    _flush_c_stdout()
    control.send({"ran": True})
    with timer.phase("d2h", follows=True):
        session.download(dc, "c", out=c)
    with timer.phase("free", follows=True):
        while held:
            session.free(held.pop())
    timings = timer.elapsed_ms()
    control.send({"timings": timings, "c_bytes": c.nbytes}, memoryview(c))


def _fault(control: _Control, error: dict[str, Any]) -> None:
    _flush_c_stdout()
    found = error_name(str(error.get("reason", "")))
    control.send({"error": {**error, **({"cuda_error": found} if found else {})}})


def main() -> None:
    control_fd, device = int(sys.argv[1]), int(sys.argv[2])
    parent = int(sys.argv[3])
    die_with_parent(parent)  # a kernel left spinning would hold the GPU with no one to stop it
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    control = _Control(control_fd)
    from ..errors import MmdError

    try:
        from ..cuda.session import GpuSession

        session = GpuSession(device)
    except MmdError as exc:
        control.send({"error": {**exc.as_dict()}})
        os._exit(0)
    control.send({"ready": {"device": session.device_name(), "limits": dataclasses.asdict(session.limits)}})
    stdin = sys.stdin.fileno()
    try:
        job = _read_job(stdin)
        _run(session, job, stdin, control)
    except EOFError:
        os._exit(0)
    except MmdError as exc:
        _fault(control, exc.as_dict())
    except Exception as exc:  # a driver error no session call turned into mmd's (pycuda's own)
        _fault(control, {"kind": "cuda", "reason": " ".join(str(exc).split()) or type(exc).__name__})
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
