"""The CUDA backend's job logic on a CPU: the shared fake session (tests/fakes.py) stands in for mmd.cuda.

The fake computes with numpy and counts allocations and frees, so these tests
check phase accounting, compile-once, the tile check before any allocation,
freeing on every error path and the conversion of driver errors, with no GPU.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest

from mmd import config
from mmd import kernels as registry
from mmd.backends.base import CUDA_PHASES, MultiplyRequest
from mmd.backends.cpu import CpuBackend
from mmd.backends.cuda import CudaBackend, prepared_size
from mmd.cuda.libcuda import HostMemory
from mmd.cuda.pools import PinnedPool
from mmd.errors import BackendUnavailable, CudaError, KernelError, TileError
from mmd.hostbuffers import C_SLOT, INPUT_SLOT, TEXT_SLOT, input_bytes, kept_buffers, text_bytes
from mmd.textcore import FIELD_WIDTH

from .fakes import COMPILE_MS, PHASE_MS, FakeSession, cuda_backend


def backend_with(**kwargs) -> tuple[CudaBackend, FakeSession]:
    return cuda_backend(**kwargs)


def operands(m=5, k=7, n=3):
    rng = np.random.default_rng(0)
    return rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)


def test_phases_sum_to_cuda_and_compile_only_first_time():
    backend, session = backend_with()
    a, b = operands()
    first = backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=16))
    second = backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=16))
    for product in (first, second):
        assert [p for p in CUDA_PHASES if p in product.timings_ms] == list(CUDA_PHASES)
        assert product.timings_ms["cuda"] == sum(PHASE_MS[p] for p in CUDA_PHASES)
        np.testing.assert_allclose(product.c, a @ b, rtol=1e-6)
        assert (product.kernel, product.tile, product.memory) == ("tiled", 16, "device")
        assert product.device == "Fake GPU 0 (sm_90)"
    assert first.timings_ms["compile"] == COMPILE_MS
    assert "compile" not in second.timings_ms
    assert session.allocs == session.frees == 6


def test_first_use_of_each_tile_is_a_compile():
    backend, session = backend_with()
    a, b = operands()
    runs = [backend.multiply(a, b, MultiplyRequest(kernel="coarse", tile=t)) for t in (8, 8, 16, 8)]
    assert ["compile" in r.timings_ms for r in runs] == [True, False, True, False]
    assert session.compiles == 2


def test_cublas_has_no_tile_and_its_setup_is_kept_out_of_the_kernel_phase():
    backend, session = backend_with()
    a, b = operands()
    product = backend.multiply(a, b, MultiplyRequest(kernel="cublas", tile=64))
    # The first call of a shape warms cuBLAS up on scratch buffers, recorded as compile.
    assert product.tile is None and "compile" in product.timings_ms
    assert session.compiles == 0 and session.allocs == session.frees == 6
    np.testing.assert_allclose(product.c, a @ b, rtol=1e-6)
    again = backend.multiply(a, b, MultiplyRequest(kernel="cublas", tile=64))
    assert "compile" not in again.timings_ms and session.allocs == session.frees == 9


TILED = [n for n in registry.SOURCE_KERNELS if registry.get(n).uses_tile]
FIXED = [n for n in registry.SOURCE_KERNELS if not registry.get(n).uses_tile]


@pytest.mark.parametrize("kernel", TILED)
def test_tile_64_refused_before_any_allocation_or_compile(kernel):
    backend, session = backend_with()
    a, b = operands()
    with pytest.raises(TileError, match=r"^tile 64 needs 4096 threads per block; this GPU allows 1024$"):
        backend.multiply(a, b, MultiplyRequest(kernel=kernel, tile=64))
    assert session.allocs == 0 and session.compiles == 0


@pytest.mark.parametrize("kernel", FIXED)
def test_fixed_block_kernels_run_at_any_tile_and_compile_once(kernel):
    backend, session = backend_with()
    a, b = operands()
    products = [backend.multiply(a, b, MultiplyRequest(kernel=kernel, tile=t)) for t in (64, 8)]
    assert [p.tile for p in products] == [None, None]
    assert session.compiles == 1
    np.testing.assert_allclose(products[1].c, a @ b, rtol=1e-6)


def test_register_limit_refused_after_compile_before_allocation():
    backend, session = backend_with(registers=255)
    a, b = operands()
    with pytest.raises(TileError, match=r"registers per block"):
        backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=32))
    assert session.allocs == 0


@pytest.mark.parametrize("step", ["alloc", "upload", "launch", "download"])
def test_device_memory_freed_and_error_converted(step):
    backend, session = backend_with(fail_at=step)
    a, b = operands()
    with pytest.raises(CudaError) as info:
        backend.multiply(a, b, MultiplyRequest(kernel="naive", tile=8))
    assert "\n" not in info.value.reason
    assert session.allocs == session.frees > 0


def test_cublas_failure_frees_memory():
    backend, session = backend_with(fail_at="sgemm")
    a, b = operands()
    with pytest.raises(CudaError):
        backend.multiply(a, b, MultiplyRequest(kernel="cublas", memory="pitched"))
    assert session.allocs == session.frees == 3


def test_a_failing_free_still_frees_the_rest():
    backend, session = backend_with(fail_at="free")
    a, b = operands()
    with pytest.raises(CudaError):
        backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8))
    assert session.frees == 3  # one failed in the free phase, two freed in the cleanup


def test_compile_driver_error_is_cuda_error():
    backend, session = backend_with(fail_at="compile")
    a, b = operands()
    with pytest.raises(CudaError, match="cuFake failed: compile"):
        backend.multiply(a, b, MultiplyRequest(kernel="aplus", tile=8))
    assert session.allocs == 0


def test_too_little_device_memory_refused_before_allocation():
    backend, session = backend_with()
    session.free_bytes = 100
    a, b = operands()
    with pytest.raises(CudaError, match="MiB of device memory is free"):
        backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8))
    assert session.allocs == 0


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (MultiplyRequest(kernel="nope"), "unknown kernel 'nope'"),
        (MultiplyRequest(kernel="cpu"), "does not run on the cuda backend"),
        (MultiplyRequest(kernel="tiled", memory="texture"), "unknown memory mode"),
    ],
)
def test_bad_requests_are_kernel_errors(request_, match):
    backend, session = backend_with()
    a, b = operands()
    with pytest.raises(KernelError, match=match):
        backend.multiply(a, b, request_)
    assert session.allocs == 0


def test_shape_mismatch_refused():
    backend, _ = backend_with()
    a, _ = operands(4, 5, 6)
    with pytest.raises(KernelError, match="A's columns must equal B's rows"):
        backend.multiply(a, a, MultiplyRequest())


def test_other_thread_refused_and_close_idempotent():
    backend, session = backend_with()
    a, b = operands()
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_catch(backend.multiply, a, b, MultiplyRequest())))
    thread.start()
    thread.join()
    assert isinstance(errors[0], CudaError)
    backend.close()
    backend.close()
    assert session.closed
    with pytest.raises(CudaError, match="closed"):
        backend.multiply(a, b, MultiplyRequest())


def _catch(fn, *args):
    try:
        fn(*args)
    except Exception as exc:
        return exc
    return None


def test_real_backend_without_pycuda_is_unavailable():
    try:
        import pycuda  # noqa: F401
    except ImportError:
        with pytest.raises(BackendUnavailable, match="pycuda is not installed"):
            CudaBackend(0)
    else:
        pytest.skip("pycuda is installed here; the GPU tests cover the real session")


def test_cuda_package_imports_without_pycuda():
    from mmd.cuda import cublas, driver

    assert "pycuda" in (driver.load.__doc__ or "")
    assert all(path for path in cublas.cublas_candidates())


def test_fixed_block_kernels_launch_the_variant_tuned_for_the_shape():
    backend, session = backend_with()
    small = backend.multiply(*operands(), MultiplyRequest(kernel="fast"))
    large = backend.multiply(*operands(m=4096, k=1, n=4096), MultiplyRequest(kernel="fast"))
    built = {compiled.spec.variant: compiled.spec for compiled in session.built.values()}
    assert set(built) == {"64x64x16_t4x8_reg", "256x128x8_reg_t16x8_w8"}
    assert dict(built["64x64x16_t4x8_reg"].macros)["BM"] == 64
    assert small.kernel == large.kernel == "fast"


def test_the_device_reference_serves_every_thread_from_its_own():
    from concurrent.futures import ThreadPoolExecutor

    from mmd.backends.cuda import DeviceReference

    made: list[FakeSession] = []

    def open_session(device, kernel_cache):
        made.append(FakeSession(device, kernel_cache))
        return made[-1]

    a, b = operands(6, 5, 4)
    with DeviceReference(open_session=open_session) as gemm, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: gemm(a, b), range(8)))
    for c in results:
        assert c.dtype == np.float64
        np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64))
    assert len(made) == 1 and made[0].closed


def test_the_device_reference_says_why_there_is_none():
    from mmd.backends.cuda import DeviceReference

    def no_gpu(device, kernel_cache):
        raise BackendUnavailable("no CUDA device: the driver sees no GPU")

    with pytest.raises(BackendUnavailable, match="driver sees no GPU"):
        DeviceReference(open_session=no_gpu)


def test_l2_flush_comes_between_the_copies_and_the_kernel_untimed():
    backend, session = backend_with()
    a, b = operands()
    plain = backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=16))
    assert session.flushes == 0 and session.events == ["product"]
    flushed = backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=16, flush_l2=True))
    assert session.flushes == 1 and session.events == ["product", "flush_l2", "product"]
    # in no phase: the course's CUDA time is unchanged (the first call also built the kernel)
    assert flushed.timings_ms == {k: v for k, v in plain.timings_ms.items() if k != "compile"}
    np.testing.assert_array_equal(flushed.c, plain.c)
    cublas = backend.multiply(a, b, MultiplyRequest(kernel="cublas", flush_l2=True))
    # cuBLAS's warm-up product (untimed, first use of the shape) is not flushed before; the timed one is.
    assert session.events[-3:] == ["product", "flush_l2", "product"] and cublas.kernel == "cublas"
    assert session.device.limits.l2_cache_bytes == 50 * 2**20


def test_prepare_sets_aside_the_largest_square_job_the_budget_holds():
    backend, session = backend_with()
    default = config.Settings().warm_up_mib << 20
    held = backend.prepare(default)
    n = prepared_size(default)
    assert n >= 4096  # the default warm_up_mib covers the course's largest size
    assert session.reserved == {INPUT_SLOT: input_bytes(n), "c": 4 * n * n, "text_out": text_bytes(n, n)}
    assert held == session.memory.pinned_bytes() <= default
    assert session.text.built  # the text kernels are loaded too


def test_prepare_with_no_budget_holds_nothing_and_a_failure_is_a_cuda_error():
    backend, session = backend_with()
    assert backend.prepare(0) == 0 and session.reserved == {}
    backend, session = backend_with(fail_at="reserve_host")
    with pytest.raises(CudaError):
        backend.prepare(64 << 20)


def test_a_reserved_page_locked_buffer_is_kept_for_smaller_jobs():
    made: list[int] = []

    def allocate(nbytes: int) -> np.ndarray:
        made.append(nbytes)
        return np.empty(nbytes, np.uint8)

    pool = PinnedPool(allocate, lambda buf: None)
    pool.reserve("input", 1000)
    small = pool.get("input", 10, np.uint8)  # far below the reuse fraction: kept all the same
    assert made == [1000] and pool.holds(small)
    grown = pool.get("input", 4000, np.uint8)  # bigger than the reserve: it grows
    assert pool.holds(grown) and not pool.holds(small)  # the buffer it was a view of is the slot's no more
    pool.get("input", 10, np.uint8)  # and shrinks back to the reserve, not below
    assert made == [1000, 4000, 1000] and pool.held_bytes == 1000 and not pool.holds(grown)
    pool.get("other", 4000, np.uint8)
    pool.get("other", 10, np.uint8)  # an unreserved slot is not held for small requests
    assert made[-1] == 10


def test_page_locked_memory_made_elsewhere_is_the_slot_s_and_freed_once_with_the_pool():
    freed: list[str] = []
    pool = PinnedPool(lambda n: np.empty(n, np.uint8), lambda buf: freed.append("pool"))
    made = np.empty(1000, np.uint8)
    pool.adopt("input", made, lambda: freed.append("adopted"))
    view = pool.get("input", 900, np.uint8)
    assert pool.holds(view) and view.__array_interface__["data"][0] == made.__array_interface__["data"][0]
    pool.get("input", 5000, np.uint8)  # outgrown: a new buffer, the adopted one kept until the pool is freed
    pool.free_all()
    assert sorted(freed) == ["adopted", "pool"] and not pool.holds(view)
    pool.free_all()
    assert sorted(freed) == ["adopted", "pool"]


@pytest.mark.parametrize(("m", "n"), [(64, 64), (300, 100), (1, 1)])
def test_the_output_s_buffers_made_before_a_job_are_the_ones_its_text_path_asks_for(m: int, n: int) -> None:
    """A one-shot adopts C's and the text's buffers (kept_buffers): the text path's C (float32, m×n) and its text
    (6 to 8 bytes a field, a newline a row) are views of them; a wider text outgrows its buffer, which is then
    freed with the pool, once."""
    freed: list[str] = []
    pool = PinnedPool(lambda nbytes: np.empty(nbytes, np.uint8), lambda buf: freed.append("pool"))
    made = {slot: np.empty(nbytes, np.uint8) for slot, nbytes in kept_buffers(m, n).items()}
    for slot, buffer in made.items():
        pool.adopt(slot, buffer, functools.partial(freed.append, slot))

    def address(array: np.ndarray) -> int:
        return int(array.__array_interface__["data"][0])

    assert address(pool.get(C_SLOT, (m, n), np.float32)) == address(made[C_SLOT])
    for size in (m * (FIELD_WIDTH * n + 1), text_bytes(m, n)):  # the narrowest text and the widest it holds
        assert address(pool.get(TEXT_SLOT, size, np.uint8)) == address(made[TEXT_SLOT])
    assert address(pool.get(TEXT_SLOT, text_bytes(m, n) + 1, np.uint8)) != address(made[TEXT_SLOT])
    assert freed == []
    pool.free_all()
    assert sorted(freed) == sorted([C_SLOT, TEXT_SLOT, "pool"])


def test_the_cuda_backend_gives_adopted_memory_to_its_session_and_the_cpu_frees_it():
    backend, session = backend_with()
    freed: list[int] = []
    memory = HostMemory(1234, 64, lambda: freed.append(1))
    backend.adopt_host(INPUT_SLOT, memory)
    assert session.adopted == {INPUT_SLOT: memory} and freed == []
    CpuBackend().adopt_host(INPUT_SLOT, memory)
    assert freed == [1]


# -- a worker's device cache: small jobs keep their device memory for the next (mmd.cuda.pools.DeviceCache) --

CACHE_NOTE = "malloc/free timed the device cache, not cuMemAlloc (reused {}/3, kept {}/3)"


def test_without_prepare_every_job_allocates_and_frees_its_own_device_memory():
    """`mmd run` and `mmd bench` never prepare: their malloc and free stay cuMemAlloc and cuMemFree."""
    backend, session = backend_with()
    a, b = operands(32, 32, 32)
    for _ in range(3):
        assert backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8)).notes == []
    assert session.device_cache is None and session.live_blocks == {}


def test_a_prepared_backend_reuses_small_jobs_device_memory_and_says_so():
    backend, session = backend_with()
    backend.prepare(0)
    a, b = operands(32, 32, 32)
    first = backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8))
    second = backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8))
    assert first.notes == [CACHE_NOTE.format(0, 3)]
    assert second.notes == [CACHE_NOTE.format(3, 3)]
    for product in (first, second):
        np.testing.assert_allclose(product.c, a.astype(np.float64) @ b, rtol=1e-5)
    assert len(session.live_blocks) == 3 and session.device_cache is not None
    assert session.device_cache.held_bytes == 3 * 4096
    backend.close()
    assert session.live_blocks == {}


def test_the_cache_note_leaves_the_sidecar_to_mmd_s_own_writer():
    """The note is on every small GPU job's sidecar: a note PyYAML must write (a long line, a quote, ": ") sent
    the whole sidecar through PyYAML, a quarter of such a job's Python on the H200 box."""
    from mmd.record import writer

    backend, _session = backend_with()
    backend.prepare(0)
    a, b = operands(32, 32, 32)
    notes = [backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8)).notes[0] for _ in range(2)]
    for note in notes:
        assert writer._plain_yaml({"notes": [note]}) == f"notes:\n- {note}\n"


def test_a_reused_block_holds_the_last_job_s_values_and_the_next_job_overwrites_them():
    backend, session = backend_with()
    backend.prepare(0)
    rng = np.random.default_rng(3)
    for m, k, n in [(20, 30, 25), (25, 30, 20), (1, 1, 1), (30, 20, 30)]:  # all in the smallest size class
        a = rng.random((m, k), dtype=np.float32)
        b = rng.random((k, n), dtype=np.float32)
        product = backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8))
        np.testing.assert_allclose(product.c, a.astype(np.float64) @ b, rtol=1e-5)
    assert len(session.live_blocks) == 3


@pytest.mark.parametrize("memory", ["pitched", "managed"])
def test_only_device_memory_is_cached(memory):
    backend, session = backend_with()
    backend.prepare(0)
    a, b = operands(32, 32, 32)
    for _ in range(2):
        assert backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8, memory=memory)).notes == []
    assert session.live_blocks == {}


def test_a_big_job_is_untouched_and_a_mixed_one_says_which_matrices_the_cache_had():
    backend, session = backend_with()
    backend.prepare(0)
    a, b = operands(300, 300, 300)  # 352 KiB a matrix: cuMemAlloc and cuMemFree as before
    assert backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8)).notes == []
    assert session.live_blocks == {}
    a, b = operands(2, 300, 300)  # A and C are small, B is not
    assert backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8)).notes == [CACHE_NOTE.format(0, 2)]
    assert backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8)).notes == [CACHE_NOTE.format(2, 2)]


def test_a_small_shape_is_checked_and_looked_up_once_and_another_request_or_shape_is_checked_again(monkeypatch):
    backend, session = backend_with()
    backend.prepare(0)
    looked: list[int] = []
    compile_ = session.modules.compile
    monkeypatch.setattr(session.modules, "compile", lambda spec, tile: looked.append(tile) or compile_(spec, tile))
    a, b = operands(32, 32, 32)
    products = [backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=16)) for _ in range(3)]
    assert looked == [16] and ["compile" in p.timings_ms for p in products] == [True, False, False]
    np.testing.assert_allclose(products[-1].c, a @ b, rtol=1e-6)
    with pytest.raises(TileError):
        backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=64))
    session.free_bytes = 100
    a, b = operands(300, 300, 300)
    with pytest.raises(CudaError, match="MiB of device memory is free"):
        backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=16))
    assert looked == [16, 16]  # the big job was looked up (and its memory asked for) each time


def test_a_job_the_cache_serves_does_not_ask_for_free_memory_and_a_big_one_still_does():
    backend, session = backend_with()
    backend.prepare(0)
    session.free_bytes = 100
    a, b = operands(32, 32, 32)
    backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8))
    a, b = operands(300, 300, 300)
    with pytest.raises(CudaError, match="MiB of device memory is free"):
        backend.multiply(a, b, MultiplyRequest(kernel="tiled", tile=8))


@pytest.mark.parametrize("step", ["alloc", "upload", "launch", "download"])
def test_a_failed_job_gives_its_cached_memory_back_and_close_frees_it(step):
    backend, session = backend_with(fail_at=step)
    backend.prepare(0)
    a, b = operands(32, 32, 32)
    with pytest.raises(CudaError):
        backend.multiply(a, b, MultiplyRequest(kernel="naive", tile=8))
    assert session.allocs == session.frees > 0
    assert session.device_cache is not None
    assert session.device_cache.held_bytes == 4096 * len(session.live_blocks) == 4096 * session.allocs
    backend.close()
    assert session.live_blocks == {}


@pytest.mark.parametrize(
    ("m", "k", "n", "tma"),
    [(64, 64, 64, True), (37, 52, 28, True), (1, 4, 4, True), (37, 53, 28, False), (37, 52, 29, False)],
)
def test_tc1_through_the_backend_takes_the_tma_build_where_it_can(m: int, k: int, n: int, tma: bool) -> None:
    backend, session = cuda_backend()
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    first = backend.multiply(a, b, MultiplyRequest(kernel="tc1"))
    second = backend.multiply(a, b, MultiplyRequest(kernel="tc1"))
    assert "compile" in first.timings_ms and "compile" not in second.timings_ms and session.compiles == 1
    assert [s.tensor_maps is not None for s in session.launched] == [tma, tma]
    assert {s.name for s in session.launched} == {"tc1"} and first.kernel == "tc1"
    np.testing.assert_allclose(first.c, a @ b, rtol=1e-5, atol=1e-5)
