"""The kernel registry on a CPU: files ↔ entries, check_launch, geometry, and nvcc.

The compile tests build every ``kernels/*.cu`` for sm_90 at every tile with
``-Xptxas -v`` (skipped where nvcc is missing) and assert that nothing spills.
Run with ``MMD_WRITE_PTXAS_REPORT=1`` to rewrite ``docs/kernels-ptxas.txt``
from the compiler's report.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mmd import kernels as registry
from mmd import kernelspec
from mmd.errors import KernelError, TileError
from mmd.kernelfile.declaration import TensorMaps
from mmd.kernelfile.declaring import in_header
from mmd.kernelspec import KernelSpec, Variant
from mmd.resources import kernels_dir

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "kernels-ptxas.txt"
#: Read at import: the suite's autouse fixture clears MMD_* variables.
WRITE_REPORT = os.environ.get("MMD_WRITE_PTXAS_REPORT") == "1"
NVCC = shutil.which("nvcc")
ARCH = "sm_90"

H100 = registry.DeviceLimits(
    max_threads_per_block=1024,
    max_shared_per_block=48 * 1024,
    max_registers_per_block=64 * 1024,
    name="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0),
    max_shared_optin=227 * 1024,
)


# -- registry ----------------------------------------------------------------


def test_every_cu_file_is_registered_and_every_source_exists():
    # The text kernels (GPU parse and format) are not matrix products: mmd.cuda.text runs them.
    files = {p.name for p in kernels_dir().glob("*.cu")} - set(registry.TEXT_KERNEL_FILES)
    registered = {spec.source_file for spec in registry.REGISTRY.values() if spec.source_file}
    assert files == registered
    for spec in registry.REGISTRY.values():
        if spec.kind == registry.SOURCE:
            assert spec.source is not None and spec.source.is_file(), spec.name
            assert spec.entry == f"mmd_{spec.name}"
            declaration = rf'extern "C" __global__ void\s+(__launch_bounds__\([^)]*\)\s*)?{spec.entry}\('
            assert re.search(declaration, spec.source.read_text()), spec.name


def test_every_kernel_has_the_same_argument_list():
    signature = re.compile(
        r"const float\* __restrict__ A,\s*const float\* __restrict__ B,\s*float\* __restrict__ C,\s*"
        r"int M, int K, int N,\s*int lda, int ldb, int ldc\)"
    )
    for name in registry.SOURCE_KERNELS:
        spec = registry.get(name)
        text = spec.source.read_text()
        assert signature.search(text), name
        if spec.uses_tile:
            assert "#ifndef TILE" in text and "#error" in text, name


def test_registry_names_and_library_entries():
    assert registry.NAMES[:5] == ("naive", "tiled", "prefetch", "coarse", "aplus")
    assert registry.get("cublas").source is None and registry.get("cublas").on_gpu
    assert registry.get("cpu").kind == registry.HOST and not registry.get("cpu").on_gpu
    assert "cpu" not in registry.GPU_KERNELS and "cublas" in registry.GPU_KERNELS
    assert all(registry.get(n).description for n in registry.NAMES)
    with pytest.raises(KernelError, match="unknown kernel 'quick'; choose one of naive, tiled"):
        registry.get("quick")


# -- check_launch -------------------------------------------------------------


TILED = tuple(n for n in registry.SOURCE_KERNELS if registry.get(n).uses_tile)
FIXED = tuple(n for n in registry.SOURCE_KERNELS if not registry.get(n).uses_tile)


@pytest.mark.parametrize("kernel", TILED)
def test_tile_64_refused_with_reason(kernel):
    with pytest.raises(TileError) as info:
        registry.check_launch(kernel, 64, H100)
    assert str(info.value) == "tile 64 needs 4096 threads per block; this GPU allows 1024"
    assert info.value.kind == "tile"
    assert info.value.details["threads"] == 4096


@pytest.mark.parametrize("tile", registry.TILES)
@pytest.mark.parametrize("kernel", registry.NAMES)
def test_course_tiles_accepted(kernel, tile):
    registry.check_launch(kernel, tile, H100)
    if not registry.get(kernel).dynamic_shared_bytes:  # what every CUDA GPU launches
        registry.check_launch(kernel, tile, registry.COMMON_LIMITS, registers_per_thread=64)


@pytest.mark.parametrize("kernel", ["tc1", "tc3"])
def test_tensor_core_kernels_are_refused_before_ampere_with_the_reason(kernel):
    turing = registry.DeviceLimits(1024, 48 * 1024, 64 * 1024, name="Tesla T4", compute_capability=(7, 5))
    with pytest.raises(KernelError, match=rf"^{kernel} needs a GPU of compute capability 8.0 or newer \(TF32 tensor"):
        registry.check_launch(kernel, 32, turing)
    ampere = registry.DeviceLimits(1024, 48 * 1024, 64 * 1024, name="A100", compute_capability=(8, 0),
                                   max_shared_optin=163 * 1024)  # fmt: skip
    spec = registry.get(kernel)
    assert spec.arch_for("sm_80") == "sm_80" and spec.arch_for("sm_90") == "sm_90a"
    if spec.dynamic_shared_bytes > 163 * 1024:
        with pytest.raises(TileError, match="bytes of shared memory per block"):
            registry.check_launch(kernel, 32, ampere)
    else:
        registry.check_launch(kernel, 32, ampere)


@pytest.mark.parametrize("kernel", ["tc1", "tc3"])
def test_tensor_core_defaults_in_the_registry_are_the_files_own(kernel):
    text = (kernels_dir() / f"{kernel}.cu").read_text()
    defaults = registry.defaults(kernel)
    found = {k: int(v) for k, v in re.findall(r"#define (\w+) (\d+)", text) if k in defaults}
    assert found == defaults


def test_shared_memory_limit_refused():
    small = registry.DeviceLimits(1024, 16 * 1024, 64 * 1024)
    registry.check_launch("tiled", 32, small)  # 8 KiB
    with pytest.raises(TileError) as info:
        registry.check_launch("coarse", 32, small)  # 32 KiB
    assert str(info.value) == ("tile 32 needs 32768 bytes of shared memory per block for coarse; this GPU allows 16384")


def test_register_limit_refused_only_when_known():
    registry.check_launch("aplus", 32, H100)
    with pytest.raises(TileError) as info:
        registry.check_launch("aplus", 32, H100, registers_per_thread=72)
    assert str(info.value) == (
        "tile 32 needs 73728 registers per block (72 per thread) for aplus; this GPU allows 65536"
    )


@pytest.mark.parametrize("tile", [0, -4, 2.5, "32", True])
def test_nonsense_tiles_refused(tile):
    with pytest.raises(TileError, match="must be a whole number from 1 to 1024"):
        registry.check_launch("tiled", tile, H100)


def test_library_entries_ignore_the_tile():
    registry.check_launch("cublas", 64, H100)
    registry.check_launch("cpu", 1024, H100)


@pytest.mark.parametrize("kernel", FIXED)
def test_fixed_block_kernels_ignore_the_tile_but_not_the_limits(kernel):
    spec = registry.get(kernel)
    assert spec.block(4) == spec.block(64) == (256, 1, 1)
    registry.check_launch(kernel, 64, H100)
    with pytest.raises(TileError, match=rf"^{kernel} needs 256 threads per block; this GPU allows 128$"):
        registry.check_launch(kernel, 32, registry.DeviceLimits(128, 49152, 65536))


def test_grid_limit():
    tiny_grid = registry.DeviceLimits(1024, 49152, 65536, max_grid_y=10)
    registry.check_grid("tiled", 40, 40, 4, tiny_grid)
    with pytest.raises(TileError, match="grid of blocks"):
        registry.check_grid("tiled", 41, 40, 4, tiny_grid)


# -- geometry -------------------------------------------------------------------

AWKWARD = [(1, 1), (7, 7), (33, 33), (127, 127), (1000, 1000), (37, 29), (29, 37), (4096, 1)]


@pytest.mark.parametrize(("m", "n"), AWKWARD)
@pytest.mark.parametrize("tile", registry.TILES)
@pytest.mark.parametrize("kernel", registry.SOURCE_KERNELS)
def test_geometry_covers_every_output_without_a_spare_block(kernel, tile, m, n):
    spec = registry.get(kernel)
    bx, by, bz = spec.block(tile)
    gx, gy, gz = spec.grid(m, n, tile)
    assert (bz, gz) == (1, 1)
    assert bx * by == spec.threads_per_block(tile)
    rows, cols = spec.block_shape(tile)
    assert gx * cols >= n and gy * rows >= m
    # one block (along x: one cluster) fewer would leave outputs uncovered
    assert gx % spec.cluster_x == 0
    assert (gx - spec.cluster_x) * cols < n and (gy - 1) * rows < m
    # the block's threads that compute (all but its producers) cover its C tile exactly
    assert spec.producer_threads == 0 or spec.for_arch("sm_90") is not spec
    assert (bx * by - spec.producer_threads) * spec.outputs_per_thread == rows * cols
    assert gx * gy * (bx * by - spec.producer_threads) * spec.outputs_per_thread >= m * n


def test_shared_bytes_match_the_sources():
    assert registry.get("naive").shared_bytes(32) == 0
    assert registry.get("tiled").shared_bytes(32) == 2 * 32 * 32 * 4
    assert registry.get("coarse").shared_bytes(16) == 8 * 16 * 16 * 4
    assert registry.get("aplus").shared_bytes(32) == 32768


# -- the registry read from kernels/: each source kernel's declaration in its header --------------------------

#: The registry as mmd/kernels.py wrote it in Python before each source kernel's facts moved into the declaration
#: in its own file's header comment, value for value (printed from that code): reading kernels/ gives the same.
OLD_REGISTRY: tuple[KernelSpec, ...] = (
    KernelSpec(
        name="naive", kind="source", description="one thread per output, operands from global memory",
        source_file="naive.cu", entry="mmd_naive",
    ),
    KernelSpec(
        name="tiled", kind="source", description="shared-memory tiles of A and B, one output per thread",
        source_file="tiled.cu", entry="mmd_tiled", shared_floats_per_tile2=2,
    ),
    KernelSpec(
        name="prefetch", kind="source", description="tiled, with the next tile prefetched into registers",
        source_file="prefetch.cu", entry="mmd_prefetch", shared_floats_per_tile2=2,
    ),
    KernelSpec(
        name="coarse", kind="source", description="tiled, four outputs (2×2) per thread", source_file="coarse.cu",
        entry="mmd_coarse", outputs_edge=2, shared_floats_per_tile2=8,
    ),
    KernelSpec(
        name="aplus", kind="source",
        description="A+: four outputs per thread, prefetch interleaved with the partial products",
        source_file="aplus.cu", entry="mmd_aplus", outputs_edge=2, shared_floats_per_tile2=8,
    ),
    KernelSpec(
        name="blocktile2d", kind="source",
        description="2-D block tiling: 128×128 C per block, 8×8 outputs per thread (tile ignored)",
        source_file="blocktile2d.cu", entry="mmd_blocktile2d", block_tile=(128, 128, 8, 8), fixed_shared_bytes=8192,
    ),
    KernelSpec(
        name="vectorized", kind="source",
        description="blocktile2d with 16-byte loads and stores and A's slab transposed (tile ignored)",
        source_file="vectorized.cu", entry="mmd_vectorized", block_tile=(128, 128, 8, 8), fixed_shared_bytes=8320,
    ),
    KernelSpec(
        name="fast", kind="source",
        description="warp-tiled, double-buffered SGEMM with 16-byte accesses (tile ignored)", source_file="fast.cu",
        entry="mmd_fast", block_tile=(256, 128, 16, 8), fixed_shared_bytes=24832,
        variants=(
            Variant(
                label="256x128x8_reg_t16x8_w8",
                macros=(
                    ("BM", 256), ("BN", 128), ("BK", 8), ("TM", 16), ("TN", 8), ("WTM", 8), ("MIN_BLOCKS", 1),
                    ("GROUP_M", 8), ("DOUBLE_BUFFER", 1), ("ASYNC", 0), ("STAGES_ASYNC", 2), ("A_PAD", 4),
                    ("FRAG_PIPE", 0), ("INTERIOR", 1), ("A_SWIZZLE", 0),
                ),
                block_tile=(256, 128, 16, 8), shared_bytes=24832, classes=("medium", "large"),
            ),
            Variant(
                label="64x64x16_t4x8_reg",
                macros=(
                    ("BM", 64), ("BN", 64), ("BK", 16), ("TM", 4), ("TN", 8), ("WTM", 4), ("MIN_BLOCKS", 1),
                    ("GROUP_M", 8), ("DOUBLE_BUFFER", 1), ("ASYNC", 0), ("STAGES_ASYNC", 2), ("A_PAD", 4),
                    ("FRAG_PIPE", 0), ("INTERIOR", 1), ("A_SWIZZLE", 0),
                ),
                block_tile=(64, 64, 4, 8), shared_bytes=16896, classes=("small",),
            ),
        ),
    ),
    KernelSpec(
        name="tc1", kind="source",
        description="TF32 tensor cores, one pass: fastest, about 4e-4 relative error (tile ignored)",
        source_file="tc1.cu", entry="mmd_tc1", block_tile=(256, 128, 16, 8), dynamic_shared_bytes=201728,
        arch_specific=("sm_90",),
        arch_variants=(
            (
                "sm_90a",
                Variant(
                    label="tma",
                    macros=(
                        ("BM", 256), ("BN", 128), ("BK", 32), ("STAGES", 4), ("GROUP_M", 8), ("ROUND_A", 0),
                        ("PREFETCH_A", 0), ("TMA", 1), ("TMA_TF32", 1), ("CLUSTER_N", 1),
                    ),
                    block_tile=(256, 128, 16, 8), shared_bytes=0, dynamic_shared_bytes=197696,
                    tensor_maps=TensorMaps(a_box=(256, 32), b_box=(32, 32), tf32=True),
                ),
            ),
        ),
        min_compute_capability=(8, 0), requirement="TF32 tensor cores", precision="tf32", exact=False,
        macros=(
            ("BM", 256), ("BN", 128), ("BK", 32), ("STAGES", 4), ("GROUP_M", 8), ("ROUND_A", 0), ("PREFETCH_A", 0),
            ("TMA", 0), ("TMA_TF32", 0), ("CLUSTER_N", 1),
        ),
        course=False,
    ),
    KernelSpec(
        name="tc3", kind="source",
        description="3xTF32 tensor cores: fp32-class accuracy above fp32 speed (tile ignored)", source_file="tc3.cu",
        entry="mmd_tc3", block_tile=(128, 128, 8, 8), dynamic_shared_bytes=201728, arch_specific=("sm_90",),
        arch_variants=(
            (
                "sm_90a",
                Variant(
                    label="tma",
                    macros=(
                        ("BM", 128), ("BN", 128), ("BK", 32), ("STAGES", 4), ("PROMOTE", 1), ("GROUP_M", 8),
                        ("TMA", 1),
                    ),
                    block_tile=(128, 128, 8, 8), shared_bytes=0, dynamic_shared_bytes=197728,
                    tensor_maps=TensorMaps(a_box=(128, 32), b_box=(32, 32), tf32=False), producer_threads=128,
                ),
            ),
        ),
        min_compute_capability=(8, 0), requirement="TF32 tensor cores", exact=False,
        macros=(
            ("BM", 128), ("BN", 128), ("BK", 32), ("STAGES", 4), ("PROMOTE", 1), ("GROUP_M", 8), ("TMA", 0),
        ),
        course=False,
    ),
    KernelSpec(name="cublas", kind="library", description="cuBLAS SGEMM (the vendor library, for reference)"),
    KernelSpec(
        name="cublas_tf32", kind="library",
        description="cuBLAS with TF32 tensor cores (its speed ceiling, its accuracy)", min_compute_capability=(8, 0),
        requirement="TF32 tensor cores", precision="tf32", exact=False, course=False,
    ),
    KernelSpec(name="cpu", kind="host", description="numpy float32 matmul on the host"),
)  # fmt: skip
OLD_DEFAULTS: dict[str, dict[str, int]] = {
    "fast": {
        "BM": 256, "BN": 128, "BK": 8, "TM": 16, "TN": 8, "WTM": 8, "MIN_BLOCKS": 1, "GROUP_M": 8, "DOUBLE_BUFFER": 1,
        "ASYNC": 0, "STAGES_ASYNC": 2, "A_PAD": 4, "FRAG_PIPE": 0, "INTERIOR": 1, "A_SWIZZLE": 0,
    },
    "tc1": {
        "BM": 256, "BN": 128, "BK": 32, "STAGES": 4, "GROUP_M": 8, "ROUND_A": 0, "PREFETCH_A": 0, "TMA": 0,
        "TMA_TF32": 0, "CLUSTER_N": 1,
    },
    "tc3": {"BM": 128, "BN": 128, "BK": 32, "STAGES": 4, "PROMOTE": 1, "GROUP_M": 8, "TMA": 0},
}  # fmt: skip


def test_every_cu_file_has_a_declaration_the_registry_reads():
    stems = {p.stem for p in kernels_dir().glob("*.cu")} - {Path(n).stem for n in registry.TEXT_KERNEL_FILES}
    assert set(registry.DECLARATIONS) == stems == set(registry.SOURCE_KERNELS)
    for name, declared in registry.DECLARATIONS.items():
        assert declared == in_header((kernels_dir() / f"{name}.cu").read_text(encoding="utf-8"), f"{name}.cu")
        assert declared.origin.startswith(f"{name}.cu:") and declared.rung is not None


def test_the_registry_read_from_kernels_is_the_table_it_replaced():
    expected = {spec.name: spec for spec in OLD_REGISTRY}
    # The one change: fast's own entry spells out its file's defines, as tc1's and tc3's did (the old table left
    # them to the file). An entry with variants is never built as it stands: for_shape and builds() give its
    # variants, whose macros are unchanged, so no build is.
    expected["fast"] = dataclasses.replace(expected["fast"], macros=tuple(OLD_DEFAULTS["fast"].items()))
    assert tuple(expected) == registry.NAMES
    for name, spec in registry.REGISTRY.items():
        assert spec == expected[name], name
    assert {name: registry.defaults(name) for name in OLD_DEFAULTS} == OLD_DEFAULTS
    assert OLD_DEFAULTS["fast"] == registry.FAST_DEFAULTS
    assert (
        tuple(n for n, s in expected.items() if s.kind == registry.SOURCE),
        tuple(n for n, s in expected.items() if s.kind != registry.HOST),
        tuple(n for n, s in expected.items() if s.course),
    ) == (registry.SOURCE_KERNELS, registry.GPU_KERNELS, registry.COURSE_KERNELS)


def test_a_kernel_without_a_rung_or_two_of_one_rung_stop_the_registry(tmp_path):
    for path in kernels_dir().glob("*.c*"):
        shutil.copy(path, tmp_path)
    assert list(registry.read_declarations(tmp_path)) == list(registry.NAMES[: len(registry.SOURCE_KERNELS)])
    tiled = tmp_path / "tiled.cu"
    text = tiled.read_text(encoding="utf-8")
    tiled.write_text(text.replace(" *   rung: 2\n", " *   rung: 1\n"), encoding="utf-8")
    with pytest.raises(KernelError, match=r"^kernels/\*\.cu: naive and tiled declare the same rung$"):
        registry.read_declarations(tmp_path)
    tiled.write_text(text.replace(" *   rung: 2\n", ""), encoding="utf-8")
    with pytest.raises(KernelError, match=r"^kernels/tiled.cu: no rung declared in its header comment"):
        registry.read_declarations(tmp_path)


def test_a_variant_is_its_kernels_declaration_with_other_macros():
    """The geometry of any macro set comes from the declaration's expressions; its conditions are checked."""
    assert registry.variant("tc3", "x", STAGES=3).dynamic_shared_bytes == 3 * (2 * 128 * 32 + 32 * 136) * 4 + 1024
    assert dict(registry.variant("tc1", "x", USE_WGMMA=0).macros)["USE_WGMMA"] == 0  # a switch: no default here
    with pytest.raises(KernelError, match=r"^tc3 has no parameter CLUSTER_N$"):
        registry.variant("tc3", "x", CLUSTER_N=2)
    with pytest.raises(KernelError, match=r"^tc3: the TMA build promotes every slab \(PROMOTE=1\)$"):
        registry.variant("tc3", "x", TMA=1, PROMOTE=2)
    with pytest.raises(KernelError, match=r"^tiled takes the tile; its builds have no variants$"):
        registry.variant("tiled", "x")
    with pytest.raises(KernelError, match=r"^cublas is not a source kernel"):
        registry.defaults("cublas")


# -- nvcc / ptxas -----------------------------------------------------------------

#: Every kernel at every tile; kernels with a fixed block once per variant, without -DTILE.
BUILDS = {
    (build.name if build.variant is None else f"{build.name}:{build.variant}", tile): build
    for name in registry.SOURCE_KERNELS
    for build in registry.get(name).builds()
    for tile in (registry.TILES if build.uses_tile else (0,))
}
CASES = list(BUILDS)


def _compile(name: str, tile: int, out_dir: Path) -> tuple[int, str]:
    spec = BUILDS[(name, tile)]
    macros = [f"-D{key}={value}" for key, value in spec.macros]
    cmd = [NVCC, f"-arch={ARCH}", "-cubin", "-Xptxas", "-v", *([f"-DTILE={tile}"] if tile else []), *macros,
           "-o", str(out_dir / f"{name.replace(':', '-')}-{tile}.cubin"), str(spec.source)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def ptxas_reports(tmp_path_factory) -> dict[tuple[str, int], tuple[int, str]]:
    """Every kernel × tile compiled once, a few at a time."""
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    out_dir = tmp_path_factory.mktemp("cubin")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {case: pool.submit(_compile, *case, out_dir) for case in CASES}
        reports = {case: future.result() for case, future in futures.items()}
    if WRITE_REPORT:
        _write_report(reports)
    return reports


def _summary(text: str) -> str:
    keep = [
        ln.replace("ptxas info    :", "").strip()
        for ln in text.splitlines()
        if "bytes stack frame" in ln or "Used" in ln
    ]
    return " | ".join(keep)


def _write_report(reports: dict[tuple[str, int], tuple[int, str]]) -> None:
    version = subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    lines = [
        f"# ptxas -v for every kernel and tile: nvcc -arch={ARCH} -cubin -Xptxas -v -DTILE=T",
        "# (kernels with a fixed block are built once, without -DTILE)",
        f"# {version}",
        "# regenerate: MMD_WRITE_PTXAS_REPORT=1 python -m pytest tests/test_kernels.py -m slow",
        "",
    ]
    for (name, tile), (rc, text) in reports.items():
        label = f"{name} TILE={tile}" if tile else f"{name} (fixed block)"
        lines.append(f"{label}: {_summary(text) if rc == 0 else 'FAILED: ' + text.strip()}")
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("\n".join(lines) + "\n")


@pytest.mark.integration
@pytest.mark.parametrize(("name", "tile"), CASES, ids=[f"{n}-{t}" for n, t in CASES])
def test_kernel_compiles_without_spills(ptxas_reports, name, tile):
    rc, text = ptxas_reports[(name, tile)]
    assert rc == 0, text
    assert "0 bytes spill stores" in text and "0 bytes spill loads" in text, text
    assert "0 bytes stack frame" in text, text
    used = re.search(r"Used (\d+) registers", text)
    assert used, text
    registers = int(used.group(1))
    spec = BUILDS[(name, tile)]
    # The registry's check passes with the real register count ...
    registry.check_launch(spec, tile, H100, registers_per_thread=registers)
    # ... and its shared-memory figure is what ptxas reports.
    smem = re.search(r"(\d+) bytes smem", text)
    assert (int(smem.group(1)) if smem else 0) == spec.shared_bytes(tile)


@pytest.mark.integration
def test_kernel_without_tile_does_not_compile(tmp_path):
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    source = registry.get("tiled").source
    proc = subprocess.run(
        [NVCC, f"-arch={ARCH}", "-cubin", "-o", str(tmp_path / "x.cubin"), str(source)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "-DTILE" in proc.stdout + proc.stderr


def test_fast_picks_its_variant_by_shape_class():
    h200 = registry.DeviceLimits(1024, 48 * 1024, 64 * 1024, name="some GPU", multiprocessors=132)
    fast = registry.get("fast")
    small = fast.for_shape(1000, 1000, h200)
    large = fast.for_shape(4096, 4096, h200)
    assert small.block_tile == (64, 64, 4, 8) and dict(small.macros)["BM"] == 64
    assert large.block_tile == (256, 128, 16, 8) and dict(large.macros) == registry.FAST_DEFAULTS
    assert small.grid(1000, 1000, 0) == (16, 16, 1)
    # unknown multiprocessor count: the default (large) build
    assert fast.for_shape(1000, 1000, registry.COMMON_LIMITS).block_tile == (256, 128, 16, 8)
    # kernels without variants resolve to themselves
    assert registry.get("tiled").for_shape(7, 7, h200) is registry.get("tiled")


def test_a_tuning_entry_that_names_no_variant_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "fast.tune.yaml").write_text("NVIDIA X:\n  large:\n    params: 999x999_bogus\n")
    monkeypatch.setattr(kernelspec, "kernels_dir", lambda: tmp_path)
    kernelspec.tuning.cache_clear()
    try:
        with pytest.raises(KernelError, match="names variant '999x999_bogus', which fast does not have"):
            registry.get("fast").tuned()
    finally:
        kernelspec.tuning.cache_clear()


def test_fast_variants_take_their_geometry_from_their_macros():
    small = registry.variant("fast", "s", BM=64, BN=64, BK=16, TM=4, TN=8, A_PAD=4)
    assert small.block_tile == (64, 64, 4, 8) and small.shared_bytes == 2 * 16 * (64 + 4 + 64) * 4
    async3 = registry.variant("fast", "a", BM=128, BN=256, BK=16, A_PAD=0, ASYNC=1, STAGES_ASYNC=3)
    assert async3.shared_bytes == 3 * 16 * (128 + 256) * 4
    with pytest.raises(KernelError, match="no parameter BX"):
        registry.variant("fast", "x", BX=1)


@pytest.mark.parametrize(("m", "n"), AWKWARD)
def test_a_cluster_grid_pads_x_to_whole_clusters_and_no_more(m, n):
    spec = registry.get("tc1").with_variant(registry.variant("tc1", "tma2", TMA=1, CLUSTER_N=2))
    gx, gy, _ = spec.grid(m, n, 0)
    assert gx % 2 == 0 and gx * 128 >= n and (gx - 2) * 128 < n and gy == -(-m // 256)


def test_the_tma_builds_shared_memory_is_unpadded_stages_and_their_mbarriers():
    variant = registry.variant("tc1", "tma", TMA=1)
    assert variant.dynamic_shared_bytes == 4 * (256 * 32 + 32 * 128) * 4 + 1024 + 16 * 4 == 197696
    assert variant.cluster_x == 1


@pytest.mark.parametrize("changes", [{"CLUSTER_N": 2}, {"TMA_TF32": 1}, {"TMA": 1, "CLUSTER_N": 3}])
def test_cluster_and_tf32_maps_are_settings_of_the_tma_build_only(changes):
    with pytest.raises(KernelError, match="settings of the TMA build"):
        registry.variant("tc1", "x", **changes)


# -- the TMA build: tc1's on sm_90a, the one per-architecture choice ---------------


def test_tc1_on_sm_90_is_the_tma_build_with_tf32_maps_and_the_cp_async_build_behind_it():
    tc1 = registry.get("tc1")
    tma = tc1.for_arch("sm_90")
    macros = dict(tma.macros)
    assert (macros["TMA"], macros["TMA_TF32"], macros["CLUSTER_N"]) == (1, 1, 1)
    assert tma.arch_for("sm_90") == "sm_90a" and tma.variant == "tma"
    assert tma.tensor_maps == TensorMaps(a_box=(256, 32), b_box=(32, 32), swizzle=128, tf32=True)
    assert tma.dynamic_shared_bytes == 197696 and tma.cluster_x == 1
    assert tma.block_tile == tc1.block_tile and tma.grid(4095, 1000, 0) == tc1.grid(4095, 1000, 0)
    fallback = tma.fallback
    assert fallback is not None and dict(fallback.macros)["TMA"] == 0 and fallback.tensor_maps is None
    assert fallback.for_arch("sm_90") is fallback  # resolved once: compiling the fallback gives the fallback


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_100"])
def test_tc1_elsewhere_is_the_cp_async_build(arch):
    tc1 = registry.get("tc1")
    assert tc1.for_arch(arch) is tc1 and dict(tc1.macros)["TMA"] == 0 and tc1.tensor_maps is None


def test_tc3_on_sm_90_is_the_tma_build_with_a_producer_warpgroup_and_the_cp_async_build_behind_it():
    tc3 = registry.get("tc3")
    tma = tc3.for_arch("sm_90")
    assert dict(tma.macros)["TMA"] == 1 and tma.variant == "tma" and tma.arch_for("sm_90") == "sm_90a"
    assert tma.tensor_maps == TensorMaps(a_box=(128, 32), b_box=(32, 32), swizzle=128, tf32=False)
    # two warpgroups own the outputs, a third copies and splits: 384 threads, 256 of them 64 outputs each
    assert tma.block(0) == (384, 1, 1) and tma.producer_threads == 128 and tma.outputs_per_thread == 64
    assert tma.dynamic_shared_bytes == 197728 and tma.grid(4095, 1000, 0) == tc3.grid(4095, 1000, 0)
    fallback = tma.fallback
    assert fallback is not None and fallback.block(0) == (256, 1, 1) and fallback.producer_threads == 0
    assert fallback.tensor_maps is None and fallback.for_arch("sm_90") is fallback


@pytest.mark.parametrize("kernel", [n for n in registry.SOURCE_KERNELS if n not in ("tc1", "tc3")])
def test_no_other_kernel_changes_on_sm_90(kernel):
    spec = registry.get(kernel)
    assert spec.for_arch("sm_90") is spec


@pytest.mark.parametrize(("m", "n"), AWKWARD)
@pytest.mark.parametrize("kernel", ["tc1", "tc3"])
def test_the_tma_builds_geometry_covers_every_output_without_a_spare_block(kernel, m, n):
    spec = registry.get(kernel).for_arch("sm_90")
    gx, gy, _ = spec.grid(m, n, 0)
    rows, cols = spec.block_shape(0)
    assert gx * cols >= n and (gx - 1) * cols < n and gy * rows >= m and (gy - 1) * rows < m
    assert (spec.block(0)[0] - spec.producer_threads) * spec.outputs_per_thread == rows * cols


@pytest.mark.parametrize("cluster", [1, 2])
def test_a_tma_builds_maps_follow_its_macros(cluster):
    maps = registry.variant("tc1", "x", TMA=1, CLUSTER_N=cluster).tensor_maps
    assert maps == TensorMaps(a_box=(256 // cluster, 32), b_box=(32, 32), tf32=False)
    assert registry.variant("tc1", "x").tensor_maps is None


def test_the_tma_builds_b_box_is_the_files_own():
    """tc1's declaration says how wide B's boxes are; the kernel copies boxes TMA_B_BOX_COLS wide."""
    maps = registry.variant("tc1", "x", TMA=1).tensor_maps
    assert maps is not None
    assert re.search(rf"#define TMA_B_BOX_COLS {maps.b_box[1]}\b", (kernels_dir() / "tc_common.cuh").read_text())
