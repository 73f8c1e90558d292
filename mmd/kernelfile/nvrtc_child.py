"""One NVRTC compile, in a process of its own under a time and memory limit (run by :mod:`.nvrtc`).

Run as ``python -I -S nvrtc_child.py``: it imports nothing but the standard library (not mmd, not
site-packages), sets its limits first, reads its job as JSON on stdin and writes one JSON line and
then the cubin on stdout. The job names the library, the source and its file name, NVRTC's options,
the name expressions to lower and the headers, each handed to NVRTC in memory as an empty file.

NVRTC is called through ctypes, not NVIDIA's ``cuda-bindings``: the calls are a dozen C functions of
plain pointers and sizes; ctypes is in the standard library, so this process needs no site-packages
and starts in tens of milliseconds, where cuda-bindings is a compiled package of its own to install
and import in each compile; mmd binds libcuda and cuBLAS through ctypes the same way.
"""

from __future__ import annotations

import ctypes
import errno
import json
import resource
import sys

#: The exit status of a child that ran out of its address space (loading NVRTC or allocating in Python).
OUT_OF_MEMORY = 3


def _limit(seconds: float, memory: int) -> None:
    cpu = int(seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # a compile writes no file


def _compile(job: dict) -> tuple[dict, bytes]:
    lib = ctypes.CDLL(job["lib"])
    vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    lib.nvrtcGetErrorString.restype = cp
    prog = vp()
    headers = [h.encode() for h in job["headers"]]
    contents = (cp * len(headers))(*([b""] * len(headers)))
    names = (cp * len(headers))(*headers)
    status = lib.nvrtcCreateProgram(
        ctypes.byref(prog), job["source"].encode(), job["name"].encode(), len(headers), contents, names
    )
    if status:
        return {"status": status, "error": lib.nvrtcGetErrorString(status).decode()}, b""
    try:
        for expr in job["names"]:
            lib.nvrtcAddNameExpression(prog, expr.encode())
        options = [o.encode() for o in job["options"]]
        status = lib.nvrtcCompileProgram(prog, len(options), (cp * len(options))(*options))
        size = sz()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        answer: dict = {"status": status, "log": log.value.decode("utf-8", "replace")}
        if status:
            answer["error"] = lib.nvrtcGetErrorString(status).decode()
            return answer, b""
        lowered = {}
        for expr in job["names"]:
            out = cp()
            if lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(out)) == 0 and out.value:
                lowered[expr] = out.value.decode()
        answer["lowered"] = lowered
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, cubin)
        return answer, cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    _limit(job["seconds"], job["memory"])
    try:
        answer, cubin = _compile(job)
    except MemoryError:
        sys.exit(OUT_OF_MEMORY)
    except OSError as exc:  # the loader could not map libnvrtc within the limit
        if exc.errno == errno.ENOMEM or "failed to map segment" in str(exc):
            sys.exit(OUT_OF_MEMORY)
        raise
    answer["cubin_bytes"] = len(cubin)
    sys.stdout.buffer.write(json.dumps(answer).encode() + b"\n" + cubin)
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
