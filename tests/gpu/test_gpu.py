"""Every kernel on a real GPU: correct at awkward sizes, every memory mode, no leaks.

Run with ``pytest -m gpu tests/gpu``; skipped where pycuda or a GPU is missing.
Results are compared with a float64 numpy reference by the relative Frobenius
error, and the output buffer is poisoned with NaN first, so an element a
kernel forgets to write fails the check.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mmd import kernels as registry
from mmd import textformat
from mmd.backends.base import CUDA_PHASES, MultiplyRequest
from mmd.check import tolerance
from mmd.config import MEMORY_MODES
from mmd.errors import TileError

pytestmark = pytest.mark.gpu

#: (M, K, N): C is M×N. Square sizes around the tiles' edges, one tiny, one
#: with every dimension different and none a multiple of any tile.
SIZES = [
    (1, 1, 1),
    (7, 7, 7),
    (32, 32, 32),
    (33, 33, 33),
    (127, 127, 127),
    (256, 256, 256),
    (1000, 1000, 1000),
    (37, 53, 29),
]


def size_id(size: tuple[int, int, int]) -> str:
    return "x".join(map(str, size))


def operands(m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1.0, 1.0, (m, k)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, (k, n)).astype(np.float32)
    return a, b


def assert_close(c: np.ndarray, a: np.ndarray, b: np.ndarray, what: str, precision: str = "fp32") -> float:
    """Relative error against float64, under 1e-5·sqrt(K) (TF32: plus its operands' rounding, 2^-9);
    NaN (unwritten) never passes."""
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert c.shape == ref.shape, what
    assert np.isfinite(c).all(), f"{what}: {np.count_nonzero(~np.isfinite(c))} elements unwritten (NaN)"
    err = float(np.linalg.norm(c - ref) / max(np.linalg.norm(ref), 1e-30))
    bound = 1e-5 * math.sqrt(a.shape[1]) + (tolerance.TF32_OPERAND_ERROR if precision == "tf32" else 0.0)
    assert err < bound, f"{what}: relative error {err:.2e} >= {bound:.2e}"
    return err


def poisoned_product(
    backend, kernel: str | registry.KernelSpec, tile: int, memory: str, a: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """C from the session's own steps, with C filled with NaN before the launch.

    A kernel name launches the build the backend would pick for the shape; a
    spec launches exactly that build (every variant gets tested at every size).
    """
    session = backend.session
    spec = kernel if isinstance(kernel, registry.KernelSpec) else registry.get(kernel)
    m, k = a.shape
    n = b.shape[1]
    if not isinstance(kernel, registry.KernelSpec):
        spec = spec.for_shape(m, n, session.device.limits)
    held = []
    try:
        for rows, cols in ((m, k), (k, n), (m, n)):
            held.append(session.memory.alloc(memory, rows, cols))
        da, db, dc = held
        session.memory.upload(da, a, "a")
        session.memory.upload(db, b, "b")
        session.memory.fill(dc, float("nan"))
        if spec.compiled:
            compiled, _ = session.modules.compile(spec, tile)
            session.stream.multiply(compiled, da, db, dc)
        else:  # cuBLAS, in its TF32 mode for cublas_tf32
            session.stream.multiply(None, da, db, dc, tf32=spec.precision == "tf32")
        return session.memory.download(dc, "c")
    finally:
        for matrix in held:
            session.memory.free(matrix)


@pytest.mark.parametrize("size", SIZES, ids=size_id)
@pytest.mark.parametrize("tile", registry.TILES)
@pytest.mark.parametrize("kernel", registry.SOURCE_KERNELS)
def test_kernel_matches_reference(cuda_backend, kernel, tile, size):
    a, b = operands(*size, seed=hash((kernel, tile, size)) % 2**32)
    c = poisoned_product(cuda_backend, kernel, tile, "device", a, b)
    assert_close(c, a, b, f"{kernel} tile {tile} {size_id(size)}", registry.get(kernel).precision)


BUILDS = [build for name in registry.SOURCE_KERNELS for build in registry.get(name).builds() if build.variant]


@pytest.mark.parametrize("size", [*SIZES, (4096, 1024, 2048)], ids=size_id)
@pytest.mark.parametrize("build", BUILDS, ids=lambda b: f"{b.name}-{b.variant}")
def test_every_variant_matches_reference_at_every_shape(cuda_backend, build, size):
    a, b = operands(*size, seed=hash((build.variant, size)) % 2**32)
    c = poisoned_product(cuda_backend, build, 0, "device", a, b)
    assert_close(c, a, b, f"{build.name} {build.variant} {size_id(size)}", build.precision)


@pytest.mark.parametrize("size", SIZES, ids=size_id)
def test_cublas_matches_reference(cuda_backend, size):
    a, b = operands(*size, seed=7)
    c = poisoned_product(cuda_backend, "cublas", 0, "device", a, b)
    assert_close(c, a, b, f"cublas {size_id(size)}")


def test_cublas_tf32_mode_is_tf32_and_sgemm_stays_fp32_after_it(cuda_backend):
    if cuda_backend.limits.compute_capability < (8, 0):
        pytest.skip("no TF32 tensor cores")
    a, b = operands(1000, 1000, 1000, seed=8)
    tf32 = assert_close(poisoned_product(cuda_backend, "cublas_tf32", 0, "device", a, b), a, b, "cublas_tf32", "tf32")
    sgemm = assert_close(poisoned_product(cuda_backend, "cublas", 0, "device", a, b), a, b, "cublas after tf32")
    assert tf32 > 3e-5, f"cublas_tf32's error {tf32:.2e} is fp32's: TF32 mode not in effect"
    assert sgemm < 3e-6, f"cublas's error {sgemm:.2e} after cublas_tf32: the math mode was not reset"


def test_l2_flush_between_h2d_and_kernel(cuda_backend):
    session = cuda_backend.session
    assert session.device.limits.l2_cache_bytes > 0
    session.memory.flush_l2()
    session.memory.flush_l2()  # the scratch buffer is made once and reused
    a, b = operands(300, 200, 100, seed=12)
    product = cuda_backend.multiply(a, b, MultiplyRequest(kernel="fast", flush_l2=True))
    assert_close(product.c, a, b, "fast after an L2 flush")


@pytest.mark.parametrize("memory", MEMORY_MODES)
@pytest.mark.parametrize("kernel", registry.GPU_KERNELS)
def test_memory_modes(cuda_backend, kernel, memory):
    for size in [(37, 53, 29), (33, 33, 33)]:
        a, b = operands(*size, seed=11)
        precision = registry.get(kernel).precision
        c = poisoned_product(cuda_backend, kernel, 16, memory, a, b)
        assert_close(c, a, b, f"{kernel} {memory} {size_id(size)} (poisoned)", precision)
        product = cuda_backend.multiply(a, b, MultiplyRequest(kernel=kernel, tile=8, memory=memory))
        assert_close(product.c, a, b, f"{kernel} {memory} {size_id(size)} (backend)", precision)


def test_phases_and_compile_once(cuda_backend):
    a, b = operands(64, 48, 80, seed=3)
    request = MultiplyRequest(kernel="tiled", tile=4, memory="device")
    first = cuda_backend.multiply(a, b, request)
    second = cuda_backend.multiply(a, b, request)
    for product in (first, second):
        t = product.timings_ms
        assert all(t[p] >= 0 for p in CUDA_PHASES)
        assert t["cuda"] == pytest.approx(sum(t[p] for p in CUDA_PHASES))
    assert "compile" not in second.timings_ms
    assert second.device.endswith(")") and "sm_" in second.device


TILED = [n for n in registry.SOURCE_KERNELS if registry.get(n).uses_tile]
FIXED = [n for n in registry.SOURCE_KERNELS if not registry.get(n).uses_tile]


@pytest.mark.parametrize("kernel", TILED)
def test_tile_64_refused_before_allocation(cuda_backend, kernel):
    a, b = operands(128, 128, 128, seed=5)
    free_before, _ = cuda_backend.session.device.mem_info()
    with pytest.raises(TileError, match=r"^tile 64 needs 4096 threads per block; this GPU allows 1024$"):
        cuda_backend.multiply(a, b, MultiplyRequest(kernel=kernel, tile=64))
    free_after, _ = cuda_backend.session.device.mem_info()
    assert free_after == free_before


@pytest.mark.parametrize("kernel", FIXED)
def test_fixed_block_kernels_ignore_tile_64(cuda_backend, kernel):
    a, b = operands(130, 70, 260, seed=6)
    product = cuda_backend.multiply(a, b, MultiplyRequest(kernel=kernel, tile=64))
    assert product.tile is None
    assert_close(product.c, a, b, f"{kernel} at tile 64", registry.get(kernel).precision)


#: The driver's own reservations (local memory for the largest stack frame
#: launched so far, cuBLAS workspaces) move free memory by tens of MiB (seen:
#: +66 and -62 MiB on an H200); a job's matrices are 4 MiB each, so a leak of
#: even one per job over 100 jobs (400 MiB) stands far above this.
DRIVER_NOISE = 128 * 2**20


def test_device_memory_returns_to_start_after_100_jobs(cuda_backend):
    kernels = registry.GPU_KERNELS
    a, b = operands(1024, 1024, 1024, seed=9)
    for kernel in kernels:  # warm up: modules loaded, cuBLAS handle made
        for memory in MEMORY_MODES:
            cuda_backend.multiply(a, b, MultiplyRequest(kernel=kernel, tile=16, memory=memory))
    free_before, _ = cuda_backend.session.device.mem_info()
    for job in range(100):
        kernel = kernels[job % len(kernels)]
        memory = MEMORY_MODES[job % len(MEMORY_MODES)]
        cuda_backend.multiply(a, b, MultiplyRequest(kernel=kernel, tile=16, memory=memory))
    free_after, _ = cuda_backend.session.device.mem_info()
    lost = free_before - free_after
    assert lost < DRIVER_NOISE, f"{lost / 2**20:.1f} MiB not returned after 100 jobs"


def test_a_worker_s_device_cache_stays_within_its_cap_and_close_frees_it(cuda_backend):
    """A prepared backend (a daemon's worker) keeps small jobs' device memory: never more than the cap
    while open, its jobs still right and saying so, and all of it back after close."""
    from mmd import config
    from mmd.backends.cuda import CudaBackend
    from mmd.cuda.pools import DEVICE_CACHE_CAP_BYTES

    free_before, _ = cuda_backend.session.device.mem_info()
    backend = CudaBackend(device=0, kernel_cache=config.kernel_cache_dir(config.Settings()))
    try:
        backend.prepare(0)
        sizes = [(n, (n * 7) % 250 + 1, (n * 13) % 256 + 1) for n in range(1, 257, 3)]
        for job, size in enumerate(sizes + sizes):
            a, b = operands(*size, seed=job)
            kernel = ("tiled", "cublas", "fast")[job % 3]
            product = backend.multiply(a, b, MultiplyRequest(kernel=kernel, tile=16))
            assert_close(product.c, a, b, f"{kernel} {size_id(size)} from the cache", registry.get(kernel).precision)
            assert len(product.notes) == 1 and "timed the device cache" in product.notes[0]
            assert backend.session.memory.cached_device_bytes() <= DEVICE_CACHE_CAP_BYTES
        assert "(reused 3/3, kept 3/3)" in product.notes[0]
    finally:
        backend.close()
    lost = free_before - cuda_backend.session.device.mem_info()[0]
    assert lost < DRIVER_NOISE, f"{lost / 2**20:.1f} MiB not returned by close"


def test_device_memory_the_cache_holds_is_freed_at_close(cuda_backend):
    """Filled far past the driver's noise (a cap raised for the test), the cache gives it all back at close."""
    from mmd.cuda.pools import DEVICE_CACHE_BLOCK_BYTES
    from mmd.cuda.session import GpuSession

    blocks = 4 * DRIVER_NOISE // DEVICE_CACHE_BLOCK_BYTES
    free_before, _ = cuda_backend.session.device.mem_info()
    session = GpuSession(0)
    try:
        session.memory.keep_device_memory(cap_bytes=blocks * DEVICE_CACHE_BLOCK_BYTES)
        held = [session.memory.alloc("device", 256, 256) for _ in range(blocks)]
        for matrix in held:
            session.memory.free(matrix)
        assert session.memory.cached_device_bytes() == blocks * DEVICE_CACHE_BLOCK_BYTES
        kept = free_before - session.device.mem_info()[0]
        assert kept > 3 * DRIVER_NOISE, f"only {kept / 2**20:.1f} MiB held by a cache of {blocks} blocks"
        again = session.memory.alloc("device", 200, 300)  # the same size class: a kept block
        assert again.reused and again.ptr in {m.ptr for m in held}
        session.memory.free(again)
    finally:
        session.close()
    lost = free_before - cuda_backend.session.device.mem_info()[0]
    assert lost < DRIVER_NOISE, f"{lost / 2**20:.1f} MiB not returned by close"


def test_driver_out_of_memory_becomes_cuda_error(cuda_backend):
    from mmd.errors import CudaError

    session = cuda_backend.session
    free_before, total = session.device.mem_info()
    rows = total // (4 * 100_000) + 1  # one plain allocation larger than the whole card
    with pytest.raises(CudaError, match=r"allocating .* MiB of device memory failed"):
        session.memory.alloc("device", rows, 100_000)
    assert session.device.mem_info()[0] >= free_before - DRIVER_NOISE


def test_a_second_backend_in_another_thread(cuda_backend):
    """Each thread pushes the primary context onto its own stack and pops it at close."""
    import threading

    from mmd.backends.cuda import CudaBackend

    a, b = operands(65, 31, 17, seed=12)
    results = []

    def work() -> None:
        backend = CudaBackend(device=0)
        try:
            results.append(backend.multiply(a, b, MultiplyRequest(kernel="coarse", tile=8)).c)
        finally:
            backend.close()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert len(results) == 1
    assert_close(results[0], a, b, "coarse in a second thread")
    # the session-wide backend still works in this thread afterwards
    assert_close(cuda_backend.multiply(a, b, MultiplyRequest(kernel="aplus", tile=8)).c, a, b, "aplus after")


EXACT = [name for name in registry.GPU_KERNELS if registry.get(name).exact]


@pytest.mark.parametrize("size", [(33, 70, 45), (128, 256, 128)], ids=size_id)
@pytest.mark.parametrize("kernel", EXACT)
def test_exact_kernels_print_an_exact_product_as_printf_does(cuda_backend, kernel, size):
    """Small integers times multiples of 1/8: every partial sum is exact in fp32, in any order, so an
    exact kernel's output is printf's bytes, ties (0.125 → 0.12, 0.375 → 0.38) included. The
    tensor-core kernels are registered as not exact (``KernelSpec.exact``) and are not held to it."""
    m, k, n = size
    rng = np.random.default_rng(hash(size) % 2**32)
    a = rng.integers(-4, 5, (m, k)).astype(np.float32)
    b = (rng.integers(-512, 513, (k, n)) / 8).astype(np.float32)
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    spec = registry.get(kernel)
    c = poisoned_product(cuda_backend, kernel, 16 if spec.uses_tile else 0, "device", a, b)
    assert textformat.emit(c) == textformat.format_reference(want)


# -- tc1 and tc3: the TMA build on sm_90a, the cp.async build wherever the copy engine cannot read A or B ------------

TMA_KERNELS = ("tc1", "tc3")
TC1_SIZES = [(1, 1, 1), (1, 4, 4), (7, 8, 12), (33, 32, 36), (33, 33, 33), (37, 53, 29), (127, 128, 100),
             (257, 1000, 132), (1000, 1000, 1000), (4095, 1000, 1028)]  # fmt: skip


def tma_kernel_build(session, kernel: str, memory: str, m: int, k: int, n: int) -> registry.KernelSpec:
    """The build session.stream.multiply launches for ``kernel`` on matrices of this mode and shape."""
    from mmd.cuda.stream import launch_build

    held = [session.memory.alloc(memory, rows, cols) for rows, cols in ((m, k), (k, n))]
    try:
        compiled, _ = session.modules.compile(registry.get(kernel), 0)
        return launch_build(compiled.spec, *held)
    finally:
        for matrix in held:
            session.memory.free(matrix)


@pytest.mark.parametrize("size", TC1_SIZES, ids=size_id)
@pytest.mark.parametrize("memory", MEMORY_MODES)
@pytest.mark.parametrize("kernel", TMA_KERNELS)
def test_the_tensor_core_kernels_take_the_tma_build_where_they_can_and_are_right_everywhere(
    cuda_backend, kernel, memory, size
):
    session = cuda_backend.session
    m, k, n = size
    precision = registry.get(kernel).precision
    build = tma_kernel_build(session, kernel, memory, m, k, n)
    hopper = session.device.limits.arch == "sm_90"
    rows_aligned = memory == "pitched" or (k % 4 == 0 and n % 4 == 0)
    assert (build.tensor_maps is not None) == (hopper and rows_aligned), f"{memory} {size_id(size)}: {build.variant}"
    a, b = operands(m, k, n, seed=hash((memory, size)) % 2**32)
    c = poisoned_product(cuda_backend, kernel, 0, memory, a, b)
    assert_close(c, a, b, f"{kernel} ({build.variant or 'cp.async'}) {memory} {size_id(size)} (poisoned)", precision)
    product = cuda_backend.multiply(a, b, MultiplyRequest(kernel=kernel, memory=memory))
    assert_close(product.c, a, b, f"{kernel} {memory} {size_id(size)} (backend)", precision)


def product_on_views(session, kernel: str, a, b, a_off: int, b_off: int, a_pad: int, b_pad: int) -> tuple:
    """``kernel``'s A·B with A and B as views into larger NaN-filled matrices, starting ``*_off`` floats in, rows
    ``*_pad`` floats longer; and whether the TMA build ran."""
    from mmd.cuda.memory import DeviceMatrix
    from mmd.cuda.stream import launch_build

    (m, k), n = a.shape, b.shape[1]
    lda, ldb = k + a_off + a_pad, n + b_off + b_pad
    big_a = np.full((m, lda), np.nan, np.float32)
    big_b = np.full((k, ldb), np.nan, np.float32)
    big_a[:, a_off : a_off + k], big_b[:, b_off : b_off + n] = a, b
    held = [
        session.memory.alloc("device", *big_a.shape),
        session.memory.alloc("device", *big_b.shape),
        session.memory.alloc("device", m, n),
    ]
    try:
        da, db, dc = held
        session.memory.upload(da, big_a, "a")
        session.memory.upload(db, big_b, "b")
        session.memory.fill(dc, float("nan"))
        va = DeviceMatrix("device", m, k, lda, da.ptr + 4 * a_off)
        vb = DeviceMatrix("device", k, n, ldb, db.ptr + 4 * b_off)
        compiled, _ = session.modules.compile(registry.get(kernel), 0)
        tma = launch_build(compiled.spec, va, vb).tensor_maps is not None
        session.stream.multiply(compiled, va, vb, dc)
        return session.memory.download(dc, "c"), tma
    finally:
        for matrix in held:
            session.memory.free(matrix)


@pytest.mark.parametrize(("a_off", "b_off", "a_pad", "b_pad"), [(0, 0, 0, 0), (1, 0, 0, 0), (0, 3, 0, 0),
                                                                 (0, 0, 1, 0), (0, 0, 0, 2), (2, 2, 3, 1)])  # fmt: skip
@pytest.mark.parametrize("kernel", TMA_KERNELS)
def test_the_tensor_core_kernels_on_views_of_any_alignment(cuda_backend, kernel, a_off, b_off, a_pad, b_pad):
    """The copy engine reads only 16-byte aligned rows, and each kernel is right at every alignment."""
    session = cuda_backend.session
    a, b = operands(300, 260, 200, seed=a_off * 64 + b_off * 16 + a_pad * 4 + b_pad)
    c, tma = product_on_views(session, kernel, a, b, a_off, b_off, a_pad, b_pad)
    lda, ldb = 260 + a_off + a_pad, 200 + b_off + b_pad
    assert tma == (session.device.limits.arch == "sm_90" and all(x % 4 == 0 for x in (a_off, b_off, lda, ldb)))
    where = f"{kernel} on views at offsets {a_off}, {b_off}, ld {lda}, {ldb}"
    assert_close(c, a, b, where, registry.get(kernel).precision)


@pytest.mark.parametrize("size", [(129, 257, 130), (1000, 1000, 1000), (300, 4096, 200)], ids=size_id)
def test_tc3s_tma_build_has_the_cp_async_builds_error(cuda_backend, size):
    """The TMA build's producer makes A's small part once, A's big part being A as loaded (the tensor cores
    truncate it), where the cp.async build rounds A's big part: the same error class."""
    session = cuda_backend.session
    if session.device.limits.arch != "sm_90":
        pytest.skip("the TMA build is sm_90a's")
    m, k, n = size
    a, b = operands(m, k, n, seed=m + k + n)
    by_tma, tma = product_on_views(session, "tc3", a, b, 0, 0, -k % 4, -n % 4)  # rows of 16-byte multiples
    by_cp_async, other = product_on_views(session, "tc3", a, b, 1, 0, 0, 0)  # A one float off
    assert (tma, other) == (True, False)
    ours = assert_close(by_tma, a, b, f"tc3 (tma) {size_id(size)}", "fp32")
    theirs = assert_close(by_cp_async, a, b, f"tc3 (cp.async) {size_id(size)}", "fp32")
    assert ours < 1.5 * theirs, f"tc3's TMA build {ours:.2e} against its cp.async build {theirs:.2e}"


def test_tc1s_tma_build_has_cublas_tf32s_error(cuda_backend):
    """The copy engine rounds both operands to TF32 (to nearest), as cuBLAS TF32 does: the same error class."""
    if cuda_backend.session.device.limits.arch != "sm_90":
        pytest.skip("the TMA build is sm_90a's")
    a, b = operands(1024, 1024, 1024, seed=33)
    ours = assert_close(poisoned_product(cuda_backend, "tc1", 0, "device", a, b), a, b, "tc1", "tf32")
    theirs = assert_close(poisoned_product(cuda_backend, "cublas_tf32", 0, "device", a, b), a, b, "cublas_tf32", "tf32")
    assert ours < 1.3 * theirs, f"tc1 {ours:.2e} against cuBLAS TF32 {theirs:.2e}"
