"""mmd.cuda.libcuda, without a GPU: its pure parts (tensor-map geometry, kernel-argument packing, launch configs),
the driver wrapper's errors, and ContextWarmer (the driver started and the primary context made on a thread, held
until released) against a stand-in libcuda compiled here that records the calls."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmd.cuda import libcuda
from mmd.cuda.libcuda import MAPPED, ContextWarmer, Driver, Int, Pointer, TensorMap, TileMap
from mmd.errors import CudaError, KernelError


def test_matrix_map_is_innermost_first_in_bytes() -> None:
    tile = libcuda.matrix_map(rows=4095, cols=1000, ld=1004, box_rows=256, box_cols=32, swizzle=128)
    assert tile == TileMap(dims=(1000, 4095), strides=(1004 * 4,), box=(32, 256), swizzle=128)
    assert tile.box_bytes == 32 * 256 * 4


@pytest.mark.parametrize(
    ("rows", "cols", "ld", "box_rows", "box_cols", "swizzle", "says"),
    [
        (0, 4, 4, 1, 4, 0, "has no tensor map"),
        (4, 4, 3, 1, 4, 0, "row stride 3"),
        (4, 5, 5, 1, 4, 0, "row stride 5"),  # 20 bytes: not a multiple of 16
        (4, 4, 4, 257, 4, 0, "257×4 box"),
        (4, 4, 4, 1, 0, 0, "1×0 box"),
        (4, 64, 64, 1, 64, 128, "256 bytes does not fit a 128-byte swizzle"),
        (4, 4, 4, 1, 2, 0, "8 bytes"),  # a box row must be whole 16-byte units
        (4, 4, 4, 1, 4, 16, "no 16-byte swizzle"),
    ],
)
def test_matrix_map_refuses_what_the_driver_would(
    rows: int, cols: int, ld: int, box_rows: int, box_cols: int, swizzle: int, says: str
) -> None:
    with pytest.raises(KernelError, match=says):
        libcuda.matrix_map(rows, cols, ld, box_rows, box_cols, swizzle)


@pytest.mark.parametrize(("ptr", "ld", "ok"), [(0x1000, 4, True), (0x1004, 4, False), (0x1000, 6, False)])
def test_tma_ok_needs_16_byte_base_and_stride(ptr: int, ld: int, ok: bool) -> None:
    assert libcuda.tma_ok(ptr, ld) is ok


def _read(pointer: int, size: int) -> bytes:
    return ctypes.string_at(pointer, size)


@given(
    st.lists(
        st.one_of(
            st.builds(Int, st.integers(-(2**31), 2**31 - 1)),
            st.builds(Pointer, st.integers(0, 2**64 - 1)),
            st.builds(TensorMap, st.binary(min_size=128, max_size=128)),
        ),
        max_size=8,
    )
)
def test_pack_args_points_at_each_value_as_the_kernel_reads_it(args: list[libcuda.Arg]) -> None:
    packed = libcuda.pack_args(args)
    assert len(packed.pointers) == len(args)
    for arg, pointer in zip(args, packed.pointers, strict=True):
        assert pointer is not None
        if isinstance(arg, TensorMap):
            assert pointer % libcuda.TENSOR_MAP_ALIGN == 0
            assert _read(pointer, 128) == arg.data
        elif isinstance(arg, Int):
            assert _read(pointer, 4) == arg.value.to_bytes(4, "little", signed=True)
        else:
            assert _read(pointer, 8) == arg.value.to_bytes(8, "little")


@pytest.mark.parametrize(
    ("arg", "says"),
    [(Int(2**31), "32-bit int"), (Pointer(-1), "device address"), (TensorMap(b"x" * 64), "128 bytes, not 64")],
)
def test_pack_args_refuses_values_that_would_wrap(arg: libcuda.Arg, says: str) -> None:
    with pytest.raises(KernelError, match=says):
        libcuda.pack_args([arg])


def test_launch_config_lays_out_cuLaunchConfig_and_the_cluster_attribute() -> None:
    # cuda.h: 7 unsigned ints, a stream pointer, the attribute pointer, a count; an attribute is 72 bytes
    assert ctypes.sizeof(libcuda._LaunchConfig) == 56
    assert ctypes.sizeof(libcuda._LaunchAttribute) == 72
    config, attrs = libcuda.launch_config((32, 16, 1), (256, 1, 1), 197_632, 0x1234, (2, 1, 1))
    assert list(config.grid) == [32, 16, 1] and list(config.block) == [256, 1, 1]
    assert config.shared == 197_632 and config.stream == 0x1234 and config.num_attrs == 1
    assert attrs[0].id == 4 and list(attrs[0].value[:3]) == [2, 1, 1]
    plain, _ = libcuda.launch_config((3, 1, 1), (256, 1, 1), 0, 0, (1, 1, 1))
    assert plain.num_attrs == 0 and plain.stream is None


@pytest.mark.parametrize(("grid", "cluster"), [((3, 1, 1), (2, 1, 1)), ((4, 1, 1), (0, 1, 1))])
def test_launch_config_refuses_a_grid_the_cluster_does_not_divide(
    grid: tuple[int, int, int], cluster: tuple[int, int, int]
) -> None:
    with pytest.raises(KernelError, match="clusters"):
        libcuda.launch_config(grid, (256, 1, 1), 0, 0, cluster)


class _FakeLib:
    """libcuda's entry points as a test drives them: every call answers ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code

    def cuInit(self, flags: int) -> int:
        return 0

    def cuGetErrorName(self, code: int, out: object) -> int:
        return 1  # the driver cannot name it either

    def cuModuleLoadData(self, module: object, image: object) -> int:
        return self.code


def test_a_failing_driver_call_is_a_cuda_error_with_the_drivers_name() -> None:
    driver = Driver(_FakeLib(1))
    with pytest.raises(CudaError, match="loading a module failed: CUDA error 1"):
        driver.load_module(b"\0")


def test_encode_refuses_an_unaligned_matrix_before_the_driver_sees_it() -> None:
    driver = Driver(_FakeLib(0))
    tile = libcuda.matrix_map(8, 8, 8, 8, 8, 0)
    with pytest.raises(KernelError, match="16-byte boundary"):
        driver.encode(0x1004, tile)


# -- ContextWarmer, against a stand-in libcuda compiled here (the real one needs a GPU) ----------------------------

FAKE_LIBCUDA = r"""
int inits, retained, released, device_asked = -1, fail_init;
int cuInit(unsigned flags) { inits++; return fail_init ? 100 : 0; }
int cuDeviceGet(int *dev, int ordinal) { device_asked = ordinal; *dev = ordinal; return ordinal > 3 ? 101 : 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { retained++; *ctx = (void *)1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { released++; return 0; }
int cuGetErrorName(int code, const char **name) { *name = "CUDA_ERROR_FAKE"; return 0; }
#include <stdlib.h>
int pushed, popped, allocated, freed, fail_alloc;
size_t fail_alloc_of;  /* an allocation of exactly this many bytes fails */
int cuCtxPushCurrent_v2(void *ctx) { pushed++; return 0; }
int cuCtxPopCurrent_v2(void **ctx) { popped++; return 0; }
int cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    if (fail_alloc || n == fail_alloc_of) return 2;
    allocated += (int)n; *p = malloc(n); return 0;
}
int cuMemFreeHost(void *p) { freed++; free(p); return 0; }
int registered, unregistered, fail_register;
int cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    if (fail_register) return 2;
    registered += (int)n; return 0;
}
int cuMemHostUnregister(void *p) { unregistered++; return 0; }
"""


def fake_libcuda(folder: Path) -> ctypes.CDLL:
    """The stand-in libcuda, built in ``folder`` (a test's own: its counters start at 0); skips the test where
    there is no C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    (folder / "fake.c").write_text(FAKE_LIBCUDA)
    so = folder / "libfakecuda.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(folder / "fake.c")], check=True)
    return ctypes.CDLL(str(so))


@pytest.fixture
def lib(tmp_path: Path) -> ctypes.CDLL:
    """The stand-in libcuda, built for this test."""
    return fake_libcuda(tmp_path)


def counter(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.c_int.in_dll(lib, name).value


def test_the_context_is_made_on_the_device_asked_and_released_once(lib: ctypes.CDLL) -> None:
    warmer = ContextWarmer(2, driver=lambda: Driver(lib))
    warmer.release()
    assert (counter(lib, "inits"), counter(lib, "device_asked")) == (1, 2)
    assert (counter(lib, "retained"), counter(lib, "released")) == (1, 1)
    warmer.release()  # a second release gives back nothing more
    assert counter(lib, "released") == 1


def test_a_driver_that_fails_holds_nothing(lib: ctypes.CDLL) -> None:
    ctypes.c_int.in_dll(lib, "fail_init").value = 1
    ContextWarmer(0, driver=lambda: Driver(lib)).release()
    assert (counter(lib, "retained"), counter(lib, "released")) == (0, 0)


def test_no_such_device_holds_nothing(lib: ctypes.CDLL) -> None:
    ContextWarmer(7, driver=lambda: Driver(lib)).release()
    assert (counter(lib, "retained"), counter(lib, "released")) == (0, 0)


def test_no_driver_library_is_no_error():
    ContextWarmer(0, driver=lambda: Driver(ctypes.CDLL("libmmd-no-such-cuda.so.1"))).release()


def test_each_slot_s_page_locked_memory_is_made_in_the_context_in_order_and_freed_once(lib: ctypes.CDLL) -> None:
    warmer = ContextWarmer(0, driver=lambda: Driver(lib), host={"input": 4096, "c": 64, "text_out": 128})
    made = warmer.take_host_memory()
    assert [(slot, memory.nbytes) for slot, memory in made.items()] == [("input", 4096), ("c", 64), ("text_out", 128)]
    assert counter(lib, "allocated") == 4096 + 64 + 128
    assert warmer.take_host_memory() == {}  # taken once
    warmer.release()
    assert counter(lib, "freed") == 0  # the taker frees what it took
    for memory in made.values():
        memory.free()
    assert counter(lib, "freed") == 3
    assert counter(lib, "pushed") == counter(lib, "popped") == 6  # the context current for each call, then not


def test_memory_no_one_took_is_freed_at_release_and_a_failed_allocation_costs_nothing(lib: ctypes.CDLL) -> None:
    ContextWarmer(0, driver=lambda: Driver(lib), host={"input": 64, "c": 32}).release()
    assert (counter(lib, "allocated"), counter(lib, "freed"), counter(lib, "released")) == (96, 2, 1)
    ctypes.c_int.in_dll(lib, "fail_alloc").value = 1
    warmer = ContextWarmer(0, driver=lambda: Driver(lib), host={"input": 64})
    assert warmer.take_host_memory() == {}
    warmer.release()
    assert counter(lib, "pushed") == counter(lib, "popped")


def test_a_slot_that_cannot_be_made_is_left_to_the_job_and_the_others_are_made(lib: ctypes.CDLL) -> None:
    ctypes.c_size_t.in_dll(lib, "fail_alloc_of").value = 32
    # "c" fails; an empty input (0 bytes) has nothing to make
    warmer = ContextWarmer(0, driver=lambda: Driver(lib), host={"input": 0, "c": 32, "text_out": 128, "other": 64})
    made = warmer.take_host_memory()
    assert {slot: memory.nbytes for slot, memory in made.items()} == {"text_out": 128, "other": 64}
    assert counter(lib, "allocated") == 128 + 64
    warmer.release()
    for memory in made.values():
        memory.free()
    assert counter(lib, "freed") == 2 and counter(lib, "pushed") == counter(lib, "popped")


def test_mapped_memory_is_page_locked_where_it_lies_in_the_context_and_unlocked_once(lib: ctypes.CDLL) -> None:
    buffer = ctypes.create_string_buffer(4096)
    warmer = ContextWarmer(0, driver=lambda: Driver(lib), mapped=lambda: (ctypes.addressof(buffer), 4096))
    made = warmer.take_host_memory()
    assert list(made) == [MAPPED]
    memory = made[MAPPED]
    assert (memory.address, memory.nbytes) == (ctypes.addressof(buffer), 4096)
    assert warmer.take_host_memory() == {}  # taken once
    assert counter(lib, "registered") == 4096 and counter(lib, "allocated") == 0
    warmer.release()
    assert counter(lib, "unregistered") == 0  # the taker unlocks what it took
    memory.free()
    assert counter(lib, "unregistered") == 1
    assert counter(lib, "pushed") == counter(lib, "popped") == 2  # its context current for each call, then not


def test_memory_that_cannot_be_mapped_or_locked_is_not_made_and_what_no_one_took_is_unlocked(lib: ctypes.CDLL) -> None:
    buffer = ctypes.create_string_buffer(64)

    def no_memory_file() -> tuple[int, int]:
        raise OSError(24, "Too many open files")

    warmer = ContextWarmer(0, driver=lambda: Driver(lib), mapped=no_memory_file)
    assert warmer.take_host_memory() == {}
    warmer.release()
    ContextWarmer(0, driver=lambda: Driver(lib), mapped=lambda: (ctypes.addressof(buffer), 64)).release()
    assert (counter(lib, "registered"), counter(lib, "unregistered")) == (64, 1)
    ctypes.c_int.in_dll(lib, "fail_register").value = 1
    warmer = ContextWarmer(0, driver=lambda: Driver(lib), mapped=lambda: (ctypes.addressof(buffer), 64))
    assert warmer.take_host_memory() == {}
    warmer.release()
    assert counter(lib, "released") == 3 and counter(lib, "pushed") == counter(lib, "popped")
