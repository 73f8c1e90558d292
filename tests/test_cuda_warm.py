"""ContextWarmer: the driver started and the primary context made on a thread, held until released.

A stand-in libcuda (compiled here) records the calls: the real one needs a GPU.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from mmd.cuda.libcuda import ContextWarmer, Driver

FAKE_LIBCUDA = r"""
int inits, retained, released, device_asked = -1, fail_init;
int cuInit(unsigned flags) { inits++; return fail_init ? 100 : 0; }
int cuDeviceGet(int *dev, int ordinal) { device_asked = ordinal; *dev = ordinal; return ordinal > 3 ? 101 : 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { retained++; *ctx = (void *)1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { released++; return 0; }
int cuGetErrorName(int code, const char **name) { *name = "CUDA_ERROR_FAKE"; return 0; }
#include <stdlib.h>
int pushed, popped, allocated, freed, fail_alloc;
int cuCtxPushCurrent_v2(void *ctx) { pushed++; return 0; }
int cuCtxPopCurrent_v2(void **ctx) { popped++; return 0; }
int cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    if (fail_alloc) return 2;
    allocated += (int)n; *p = malloc(n); return 0;
}
int cuMemFreeHost(void *p) { freed++; free(p); return 0; }
"""


@pytest.fixture
def libcuda(tmp_path: Path) -> ctypes.CDLL:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    (tmp_path / "fake.c").write_text(FAKE_LIBCUDA)
    lib = tmp_path / "libfakecuda.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "fake.c")], check=True)
    return ctypes.CDLL(str(lib))


def counter(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.c_int.in_dll(lib, name).value


def test_the_context_is_made_on_the_device_asked_and_released_once(libcuda):
    lib = libcuda

    warmer = ContextWarmer(2, driver=lambda: Driver(lib))
    warmer.release()
    assert (counter(lib, "inits"), counter(lib, "device_asked")) == (1, 2)
    assert (counter(lib, "retained"), counter(lib, "released")) == (1, 1)
    warmer.release()  # a second release gives back nothing more
    assert counter(lib, "released") == 1


def test_a_driver_that_fails_holds_nothing(libcuda):
    lib = libcuda

    ctypes.c_int.in_dll(lib, "fail_init").value = 1
    ContextWarmer(0, driver=lambda: Driver(lib)).release()
    assert (counter(lib, "retained"), counter(lib, "released")) == (0, 0)


def test_no_such_device_holds_nothing(libcuda):
    lib = libcuda

    ContextWarmer(7, driver=lambda: Driver(lib)).release()
    assert (counter(lib, "retained"), counter(lib, "released")) == (0, 0)


def test_no_driver_library_is_no_error():
    ContextWarmer(0, driver=lambda: Driver(ctypes.CDLL("libmmd-no-such-cuda.so.1"))).release()


def test_the_input_s_page_locked_memory_is_made_in_the_context_and_freed_once(libcuda):
    lib = libcuda
    warmer = ContextWarmer(0, driver=lambda: Driver(lib), host_bytes=4096)
    memory = warmer.take_host_memory()
    assert memory is not None and memory.nbytes == 4096 and counter(lib, "allocated") == 4096
    assert warmer.take_host_memory() is None  # taken once
    warmer.release()
    assert counter(lib, "freed") == 0  # the taker frees what it took
    memory.free()
    assert counter(lib, "freed") == 1
    assert counter(lib, "pushed") == counter(lib, "popped") == 2  # the context current for each call, then not


def test_memory_no_one_took_is_freed_at_release_and_a_failed_allocation_costs_nothing(libcuda):
    lib = libcuda
    ContextWarmer(0, driver=lambda: Driver(lib), host_bytes=64).release()
    assert (counter(lib, "allocated"), counter(lib, "freed"), counter(lib, "released")) == (64, 1, 1)
    ctypes.c_int.in_dll(lib, "fail_alloc").value = 1
    warmer = ContextWarmer(0, driver=lambda: Driver(lib), host_bytes=64)
    assert warmer.take_host_memory() is None
    warmer.release()
    assert counter(lib, "pushed") == counter(lib, "popped")
