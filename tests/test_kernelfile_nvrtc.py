"""NVRTC compiles of kernel files: no GPU needed, so all of it runs here and in CI (the ``nvrtc`` extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmd.errors import KernelFileError, MissingExtra
from mmd.kernelfile import nvrtc
from mmd.kernelfile.nvrtc import CompileLimits, compile_kernel, compiler_lines
from mmd.kernelfile.reading import parse_kernel, read_kernel_file

from .conftest import ROOT

#: Each compile is a child process (NVRTC under limits), as nvcc's are: left out of `make quick`.
pytestmark = pytest.mark.integration

EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.cu"))
KERNEL = "__global__ void k(float* M, float* N, float* P, int Width) { P[threadIdx.x] = M[0] * N[0]; }\n"
ELF = b"\x7fELF"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_worked_examples_compile_to_sm_90_at_each_course_tile(path: Path, tmp_path: Path) -> None:
    kf = read_kernel_file(path)
    for tile in (4, 32):
        built = compile_kernel(kf, tile, "sm_90", tmp_path)
        assert built.cubin.startswith(ELF) and built.compiled and built.warnings == ()
        assert built.symbol.startswith(f"_Z{len(kf.kernel.name)}{kf.kernel.name}")  # C++: mangled


def test_the_cache_keeps_cubins_by_source_options_compiler_and_arch(tmp_path: Path) -> None:
    kf = parse_kernel(KERNEL.encode(), "k.cu")
    first = compile_kernel(kf, 16, "sm_90", tmp_path)
    again = compile_kernel(kf, 16, "sm_90", tmp_path)
    assert first.compiled and not again.compiled and again.cubin == first.cubin and again.symbol == first.symbol
    assert compile_kernel(kf, 8, "sm_90", tmp_path).compiled  # another -DTILE_WIDTH
    assert compile_kernel(kf, 16, "sm_80", tmp_path).compiled  # another architecture
    edited = parse_kernel(KERNEL.replace("M[0]", "M[1]").encode(), "k.cu")
    assert compile_kernel(edited, 16, "sm_90", tmp_path).compiled
    assert len(list(tmp_path.glob("*.cubin"))) == 4
    assert nvrtc.identity().startswith("nvrtc:") and "headers:" in nvrtc.identity()


def test_a_template_kernel_is_found_through_its_name_expression(tmp_path: Path) -> None:
    text = (
        "// mmd: {template: {BM: 2*T, BK: 8}, block_tile: [BM, BM, BK], block: [T, T], outputs_per_thread: 4}\n"
        "template <int BM, int BK>\n"
        "__global__ void mm(const float* A, const float* B, float* C, int M, int K, int N) { C[0] = BM * BK; }\n"
    )
    built = compile_kernel(parse_kernel(text.encode(), "t.cu"), 16, "sm_90", tmp_path)
    assert built.symbol == "_Z2mmILi32ELi8EEvPKfS1_Pfiii"


def test_errors_are_the_authors_own_lines(tmp_path: Path) -> None:
    text = "#include <cstdio>\n\n" + KERNEL.replace("M[0]", "Q[0]")
    with pytest.raises(KernelFileError) as caught:
        compile_kernel(parse_kernel(text.encode(), "mine.cu"), 16, "sm_90", tmp_path)
    reason = caught.value.reason
    assert reason == 'mine.cu:3: error: identifier "Q" is undefined'
    assert caught.value.details["line"] == 3 and caught.value.details["errors"] == [reason]
    assert not list(tmp_path.iterdir())  # a failed compile leaves no entry


def test_host_code_beside_the_kernel_is_named_by_its_line(tmp_path: Path) -> None:
    text = KERNEL + "int main() { cudaMalloc(0, 4); return 0; }\n"
    with pytest.raises(KernelFileError) as caught:
        compile_kernel(parse_kernel(text.encode(), "p1.cu"), 16, "sm_90", tmp_path)
    assert caught.value.reason.startswith("p1.cu:2: error: A function without execution space annotations")
    assert caught.value.reason.endswith("(and 1 more)")
    assert str(ROOT) not in str(caught.value.details) and "/tmp" not in str(caught.value.details)


def test_compiler_lines_keep_only_the_authors_file() -> None:
    log = (
        'k.cu(4): error: identifier "x" is undefined\n  x = 1;\n  ^\n\n'
        '__nv_name_map(2): error: identifier "k" is undefined\n'
        'cuda_runtime.h(1): warning: something\n1 error detected in the compilation of "k.cu".\n'
    )
    assert compiler_lines(log, "k.cu") == ['k.cu:4: error: identifier "x" is undefined']


#: Ten to the eighth tokens: far more than any compile may take.
BOMB = (
    "#define A0 x+x+x+x+x+x+x+x+x+x\n"
    + "".join(f"#define A{i} {'+'.join([f'A{i - 1}'] * 10)}\n" for i in range(1, 8))
    + "__device__ float f(float x) { return A7; }\n"
    + KERNEL
)


def test_a_compile_past_its_time_or_memory_is_stopped_and_refused(tmp_path: Path) -> None:
    kf = parse_kernel(BOMB.encode(), "bomb.cu")
    with pytest.raises(KernelFileError, match=r"^bomb.cu: compiling (took longer than 2 s|ran out of its 512 MiB)"):
        compile_kernel(kf, 16, "sm_90", tmp_path, CompileLimits(seconds=2, memory_bytes=512 << 20))


def test_the_wall_clock_limit_kills_the_child(tmp_path: Path) -> None:
    kf = parse_kernel(KERNEL.encode(), "k.cu")
    with pytest.raises(KernelFileError, match=r"^k.cu: compiling took longer than 0.01 s; it was stopped$"):
        compile_kernel(kf, 16, "sm_90", tmp_path, CompileLimits(seconds=0.01))


def test_the_memory_limit_holds_in_the_child(tmp_path: Path) -> None:
    kf = parse_kernel(KERNEL.encode(), "k.cu")
    with pytest.raises(KernelFileError, match=r"^k.cu: compiling ran out of its 32 MiB of memory; it was stopped$"):
        compile_kernel(kf, 16, "sm_90", tmp_path, CompileLimits(memory_bytes=32 << 20))


def test_without_nvrtc_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvrtc, "DISTRIBUTION", "no-such-distribution-of-nvrtc")
    with pytest.raises(MissingExtra, match=r"^kernel files need NVRTC, which this install of mmd lacks: .*\[nvrtc\]"):
        nvrtc.library_path()
