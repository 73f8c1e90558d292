"""mmd.cuda.libcuda's pure parts: tensor-map geometry, kernel-argument packing, launch configs; and which build
the session launches where a TMA build has a fallback (no GPU)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmd import kernels as registry
from mmd.backends.base import MultiplyRequest
from mmd.cuda import libcuda
from mmd.cuda.libcuda import Int, Pointer, TensorMap, TileMap
from mmd.cuda.memory import DeviceMatrix
from mmd.cuda.stream import launch_build
from mmd.errors import CudaError, KernelError

from . import fakes


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
    driver = libcuda.Driver(_FakeLib(1))
    with pytest.raises(CudaError, match="loading a module failed: CUDA error 1"):
        driver.load_module(b"\0")


def test_encode_refuses_an_unaligned_matrix_before_the_driver_sees_it() -> None:
    driver = libcuda.Driver(_FakeLib(0))
    tile = libcuda.matrix_map(8, 8, 8, 8, 8, 0)
    with pytest.raises(KernelError, match="16-byte boundary"):
        driver.encode(0x1004, tile)


# -- which build Stream.multiply launches: the TMA build where the copy engine can read A and B ----------------


def _matrix(rows: int, cols: int, ld: int, ptr: int) -> DeviceMatrix:
    return DeviceMatrix("device", rows, cols, ld, ptr)


@given(
    a_off=st.integers(0, 15), b_off=st.integers(0, 15), a_pad=st.integers(0, 7), b_pad=st.integers(0, 7),
    k=st.integers(0, 70), n=st.integers(1, 70),
)  # fmt: skip
def test_the_tma_build_runs_exactly_where_both_operands_are_16_byte_aligned(
    a_off: int, b_off: int, a_pad: int, b_pad: int, k: int, n: int
) -> None:
    tma = registry.get("tc1").for_arch("sm_90")
    a = _matrix(33, k, k + a_pad, 0x7F0000000000 + 4 * a_off)
    b = _matrix(k, n, n + b_pad, 0x7F0000100000 + 4 * b_off)
    aligned = a_off % 4 == 0 and b_off % 4 == 0 and (k + a_pad) % 4 == 0 and (n + b_pad) % 4 == 0 and k >= 1
    chosen = launch_build(tma, a, b)
    assert chosen is (tma if aligned else tma.fallback)
    assert (chosen.tensor_maps is not None) == aligned


@pytest.mark.parametrize("kernel", ["tc1", "tc3", "fast", "tiled"])
def test_builds_without_tensor_maps_are_launched_as_they_are(kernel: str) -> None:
    spec = registry.get(kernel)
    assert launch_build(spec, _matrix(7, 5, 5, 4), _matrix(5, 3, 3, 4)) is spec


@pytest.mark.parametrize(
    ("m", "k", "n", "tma"),
    [(64, 64, 64, True), (37, 52, 28, True), (1, 4, 4, True), (37, 53, 28, False), (37, 52, 29, False)],
)
def test_tc1_through_the_backend_takes_the_tma_build_where_it_can(m: int, k: int, n: int, tma: bool) -> None:
    backend, session = fakes.cuda_backend()
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    first = backend.multiply(a, b, MultiplyRequest(kernel="tc1"))
    second = backend.multiply(a, b, MultiplyRequest(kernel="tc1"))
    assert "compile" in first.timings_ms and "compile" not in second.timings_ms and session.compiles == 1
    assert [s.tensor_maps is not None for s in session.launched] == [tma, tma]
    assert {s.name for s in session.launched} == {"tc1"} and first.kernel == "tc1"
    np.testing.assert_allclose(first.c, a @ b, rtol=1e-5, atol=1e-5)
