"""Reading a kernel file: its entry, what each parameter is, its declaration, its tile; the one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mmd import kernels as registry
from mmd.errors import KernelFileError
from mmd.kernelfile.declaration import KEYS, OWN_KEYS, Declaration, TensorMaps
from mmd.kernelfile.declaring import from_mapping, parse_yaml
from mmd.kernelfile.expressions import Expr
from mmd.kernelfile.reading import KernelFile, parse_kernel, read_kernel_file
from mmd.kernelfile.signature import KNOWN

from .conftest import ROOT

EXAMPLES = ROOT / "docs" / "examples"
BODY = "{ C[0] = A[0] * B[0]; }"
#: A square kernel named k.
SQ = f"__global__ void k(float* A, float* B, float* C, int W) {BODY}\n"


def parse(text: str, sidecar: str | None = None, name: str = "k.cu") -> KernelFile:
    return parse_kernel(text.encode(), name, sidecar, "k.kernel.yaml")


def refusal(text: str, sidecar: str | None = None) -> str:
    with pytest.raises(KernelFileError) as caught:
        parse(text, sidecar)
    reason = caught.value.reason
    assert "\n" not in reason and caught.value.kind == "kernel-file"
    return reason


@pytest.mark.parametrize(
    ("params", "roles"),
    [
        ("float *M, float *N, float *P, int Width", ("A", "B", "C", "width")),
        ("const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int K, int N",
         ("A", "B", "C", "M", "K", "N")),
        ("int M, int N, int K, float alpha, const float *A, const float *B, float beta, float *C",
         ("M", "N", "K", "alpha", "A", "B", "beta", "C")),
        ("float* const A, float* B, float *C, const int w", ("A", "B", "C", "width")),
    ],
)  # fmt: skip
def test_the_three_known_signatures_need_no_word(params: str, roles: tuple[str, ...]) -> None:
    kf = parse(f"__global__ void mm({params}) {BODY}\n")
    assert kf.roles == roles and kf.signature in KNOWN and kf.declared_in == ""


def test_the_course_kernel_parses_as_the_course_wrote_it() -> None:
    kf = read_kernel_file(EXAMPLES / "tiled.cu")
    assert (kf.kernel.name, kf.kernel.extern_c, kf.roles) == ("MatrixMulKernel", False, ("A", "B", "C", "width"))
    assert kf.fixed_tile is None and kf.includes == ("cuda_runtime.h",)
    assert kf.declaration.square and kf.declaration.multiples
    assert kf.name_expression(16) == "MatrixMulKernel" and kf.macros(16) == {"TILE_WIDTH": 16}


def test_a_header_comment_declaration() -> None:
    kf = read_kernel_file(EXAMPLES / "granularity.cu")
    assert kf.declared_in == "granularity.cu:15"
    d = kf.declaration
    assert d.block_shape(16) == (32, 32, 32) and d.outputs(16) == 4 and d.static_shared(16) == 8192
    assert d.grid_dims(64, 96, 16) == (3, 2, 1)


def test_a_same_stem_declaration_file() -> None:
    kf = read_kernel_file(EXAMPLES / "notebook.cu")
    assert kf.declared_in == "notebook.kernel.yaml" and kf.roles == ("A", "B", "C", "K", "N", "M", "K")
    assert not kf.declaration.square


def test_line_comment_declaration_and_entry_among_several() -> None:
    text = (
        "// two kernels; run the second\n// mmd:\n//   entry: second\n//   grid: [rows, columns]\n"
        f"__global__ void first(float* A, float* B, float* C, int M, int K, int N) {BODY}\n"
        f"__global__ void second(float* A, float* B, float* C, int M, int K, int N) {BODY}\n"
    )
    kf = parse(text)
    assert kf.kernel.name == "second" and kf.declared_in == "k.cu:2"
    assert kf.declaration.grid_dims(64, 32, 16) == (4, 2, 1)


def test_a_template_kernel_gets_its_arguments_from_the_declaration() -> None:
    text = """/*
 * mmd:
 *   template: {BM: 128, BN: 128, BK: 8, TM: 8, TN: 8}
 *   tile_macro: null
 *   block: [BM*BN/(TM*TN)]
 *   block_tile: [BM, BN, BK]
 */
template <const int BM, const int BN, const int BK, const int TM, const int TN>
__global__ void __launch_bounds__((BM * BN) / (TM * TN), 1)
sgemm2DBlocktiling(int M, int N, int K, float alpha, const float *A, const float *B, float beta, float *C) {}
"""
    kf = parse(text)
    assert kf.kernel.template == ("BM", "BN", "BK", "TM", "TN")
    assert kf.name_expression(0) == "sgemm2DBlocktiling<128, 128, 8, 8, 8>"
    d = kf.declaration
    assert not d.uses_tile and d.threads_per_block(0) == 256 and d.outputs(0) == 64 and kf.macros(0) == {}


def test_a_template_parameters_default_may_hold_commas() -> None:
    """A default's own commas (inside its brackets) part no parameters: the names are the template's two."""
    text = """// mmd:
//   template: {BN: 64, BM: 32}
template <int BN = std::integral_constant<int, 64>::value, int BM = 32>
__global__ void k(float* A, float* B, float* C, int W) { C[0] = A[0] * B[0]; }
"""
    kf = parse(text)
    assert kf.kernel.template == ("BN", "BM") and kf.name_expression(16) == "k<64, 32>"


@pytest.mark.parametrize(
    ("macro", "fixed"),
    [
        ("#define TILE_WIDTH 32", 32),
        ("#define TILE_WIDTH (16)", 16),
        ("#ifndef TILE_WIDTH\n#define TILE_WIDTH 32\n#endif", None),
        ("#if !defined(TILE_WIDTH)\n#define TILE_WIDTH 32\n#endif", None),
        ("#ifdef X\n#define TILE_WIDTH 8\n#endif", 8),
        ("#define TILE_WIDTHS 8", None),
    ],
)
def test_a_file_that_fixes_its_tile_runs_only_at_it(macro: str, fixed: int | None) -> None:
    kf = parse(f"{macro}\n__global__ void k(float* A, float* B, float* C, int W) {BODY}\n")
    assert (kf.fixed_tile.tile if kf.fixed_tile else None) == fixed
    if fixed is not None:
        kf.check_tile(fixed)
        assert kf.macros(fixed) == {}  # its own define stands; -D would clash with it
        with pytest.raises(KernelFileError, match=rf"^k.cu:\d: the file fixes TILE_WIDTH to {fixed}: it runs only"):
            kf.check_tile(fixed // 2)


def test_another_tile_macro_is_named_by_the_declaration() -> None:
    kf = parse(
        f"/* mmd:\n     tile_macro: BLOCK_SIZE\n*/\n__global__ void k(float* A, float* B, float* C, int W) {BODY}\n"
    )
    assert kf.macros(8) == {"BLOCK_SIZE": 8}
    fixed = parse("// mmd: {tile_macro: TILE}\n#define TILE 16\n" + SQ)
    assert fixed.fixed_tile is not None and fixed.fixed_tile.tile == 16


REFUSALS: list[tuple[str, str, str | None, str]] = [
    ("no kernel", "__device__ float f(float x) { return x; }\n", None, "k.cu: no __global__ function"),
    ("host code only", "#include <cstdio>\nint main() { return 0; }\n", None, "k.cu:2: the file holds host code only"),
    ("two candidates", SQ.replace(" k(", " a(") + SQ.replace(" k(", " b("), None,
     "k.cu: 2 __global__ functions, a (line 1), b (line 2)"),
    ("an unknown signature", SQ.replace(" k(", " mm(").replace("int W", "int K, int N, int M, int L"),
     None, "k.cu:1: mm(float* A, float* B, float* C, int K, int N, int M, int L) is none of the signatures"),
    ("a known signature in another order", SQ.replace(" k(", " mm(").replace("int W", "int K, int M, int N"),
     None, "k.cu:1: mm names its sizes (K, M, N) in another order"),
    ("a double parameter", f"__global__ void mm(double* A, double* B, double* C, int W) {BODY}\n", None,
     "k.cu:1: mm(double * A, double * B, double * C, int W) is none"),
    ("the entry missing", f"// mmd: {{entry: nope}}\n__global__ void k(float* A, float* B, float* C, int W) {BODY}\n",
     None, "k.cu:1: the declared entry nope is not a __global__ function here (found: k)"),
    ("arguments of the wrong number", SQ,
     "arguments: [A, B, C, M, K, N]", "k.cu:1: k has 4 parameters; its declared arguments name 6"),
    ("an argument of the wrong type", f"__global__ void k(float* A, float* B, int C, int W) {BODY}\n",
     "arguments: [A, B, C, width]", "k.cu:1: k's parameter C is int; argument C must be float*"),
    ("declared twice", "// mmd: {}\n" + SQ, "{}",
     "k.cu: declared twice, in k.cu:1 and in k.kernel.yaml"),
    ("a template without arguments", "template <int BM> " + SQ,
     None, "k.cu:1: k is a template <BM>: declare its arguments"),
    ("an unknown field", SQ, "tiles: [4]",
     "k.kernel.yaml: declaration has no field tiles"),
    ("a bad expression", SQ, "block: [T**2]",
     "k.kernel.yaml: declaration block: 'T**2' is not an expression"),
    ("not YAML", SQ, "block: [T",
     "k.kernel.yaml: declaration is not valid YAML"),
    ("a fixed tile that is no number", "#define TILE_WIDTH N\n" + SQ,
     None, "k.cu:1: #define TILE_WIDTH N: the tile macro must be a whole number"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "text", "sidecar", "reason"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_with_a_one_line_reason(what: str, text: str, sidecar: str | None, reason: str) -> None:
    assert refusal(text, sidecar).startswith(reason)


def test_a_file_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(KernelFileError, match=r"^k\.cu:2: the file is not UTF-8 text$"):
        parse_kernel(b"// ok\n// \xff\n", "k.cu")


def test_a_host_program_with_a_kernel_is_the_compilers_to_refuse() -> None:
    """main beside a kernel parses (the kernel is found); NVRTC then names main's line (test_kernelfile_nvrtc)."""
    kf = parse(f"__global__ void k(float* A, float* B, float* C, int W) {BODY}\nint main() {{ return 0; }}\n")
    assert kf.kernel.name == "k"


def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KernelFileError, match=r"^nope.cu: cannot be read: No such file"):
        read_kernel_file(tmp_path / "nope.cu")


# -- the vocabulary --------------------------------------------------------------------------------------

BAD_DECLARATIONS: list[tuple[dict[str, object], str]] = [
    ({"arguments": ["A", "B", "C", "X"]}, "arguments: X not among"),
    ({"arguments": ["A", "A", "C", "width"]}, "arguments name A 2 times"),
    ({"arguments": ["A", "B", "C", "M", "N"]}, "arguments must name M, K and N"),
    ({"arguments": ["A", "B", "C", "width", "M"]}, "width (a square kernel's one size) beside M"),
    ({"grid": ["rows", "rows"]}, "grid is [columns, rows] or [rows, columns]"),
    ({"block_tile": ["T", "T"]}, "block_tile (rows, columns, depth) takes 3 values"),
    ({"block": ["BM"]}, "BM uses BM, which defines and template lack"),
    ({"precision": "fp16"}, "precision is one of fp32, tf32"),
    ({"thread_tile": ["T"]}, "thread_tile (rows, columns) takes 2 values"),
    ({"requires": ["T > 1"]}, "requires: is a mapping of conditions to the reason each gives"),
    ({"block": ["T if"]}, "'T if' is not an expression of T"),
    ({"multiples": "yes"}, "multiples is true or false"),
    ({"tile_macro": "TILE-WIDTH"}, "'TILE-WIDTH' is not a C identifier"),
    ({"defines": {"T": 4}}, "defines and template names must differ"),
    ({"defines": {"BM": "BN"}}, "BM: BN may use only T"),
    ({"template": ["BM"]}, "template is a mapping"),
    ({"outputs_per_thread": 1.5}, "1.5 is not a whole number"),
]


@pytest.mark.parametrize(("data", "reason"), BAD_DECLARATIONS, ids=[r[1] for r in BAD_DECLARATIONS])
def test_each_field_is_checked_where_it_is_read(data: dict[str, object], reason: str) -> None:
    with pytest.raises(KernelFileError) as caught:
        from_mapping(data, "k.kernel.yaml")
    assert caught.value.reason.startswith("k.kernel.yaml: declaration ") and reason in caught.value.reason


def test_the_geometry_is_checked_at_each_tile() -> None:
    d = parse_yaml("block: [T, T]\nblock_tile: [T, T, T]\noutputs_per_thread: 2\n", "x")
    with pytest.raises(ValueError, match="256 threads × 2 outputs per thread do not cover a 16×16 block tile"):
        d.check_tile(16)
    with pytest.raises(ValueError, match="T - 8 is 0; it must be at least 1"):
        parse_yaml("block: [T - 8, 1]\nblock_tile: [T-8, 1, 1]\n", "x").check_tile(8)


def test_defaults_are_one_thread_per_output_in_t_by_t_blocks() -> None:
    d = Declaration()
    assert (d.block_dims(8), d.block_shape(8), d.outputs(8), d.grid_dims(20, 33, 8)) == (
        (8, 8, 1), (8, 8, 8), 1, (5, 3, 1))  # fmt: skip
    assert d.uses_tile and d.multiples and d.precision == "fp32"


# -- growing the vocabulary: conditions, thread tiles, and mmd's own fields --------------------------------


@pytest.mark.parametrize(
    ("text", "env", "value"),
    [
        ("2 if DOUBLE_BUFFER else 1", {"DOUBLE_BUFFER": 1}, 2),
        ("STAGES_ASYNC if ASYNC else 2 if DOUBLE_BUFFER else 1", {"ASYNC": 1, "STAGES_ASYNC": 3}, 3),
        ("STAGES_ASYNC if ASYNC else 2 if DOUBLE_BUFFER else 1", {"ASYNC": 0, "DOUBLE_BUFFER": 0}, 1),
        ("CLUSTER_N == 1 or TMA and CLUSTER_N == 2", {"CLUSTER_N": 2, "TMA": 0}, 0),
        ("CLUSTER_N == 1 or TMA and CLUSTER_N == 2", {"CLUSTER_N": 2, "TMA": 1}, 1),
        ("not TMA_TF32", {"TMA_TF32": 1}, 0),
        ("1 <= T < 64", {"T": 32}, 1),
        ("1 <= T < 64", {"T": 64}, 0),
        ("-7 / 2", {}, -3),  # C's division, towards zero
    ],
)  # fmt: skip
def test_expressions_take_conditions(text: str, env: dict[str, int], value: int) -> None:
    assert Expr(text).value(env) == value


def test_a_condition_not_met_is_refused_with_its_reason() -> None:
    d = parse_yaml("requires: {T <= 16: tiles past 16 spill}\n", "x")
    d.check_tile(16)
    with pytest.raises(ValueError, match=r"^at tile 32: tiles past 16 spill$"):
        d.check_tile(32)


def test_a_thread_tile_gives_the_outputs_per_thread() -> None:
    d = parse_yaml("block_tile: [2*T, 2*T, T]\nthread_tile: [2, 2]\n", "x")
    assert d.outputs(16) == 4 and d.thread_shape(16) == (2, 2)
    d.check_tile(16)
    with pytest.raises(KernelFileError, match="thread_tile and outputs_per_thread say the same"):
        parse_yaml("thread_tile: [2, 2]\noutputs_per_thread: 4\n", "x")


@pytest.mark.parametrize("key", OWN_KEYS)
def test_the_registrys_own_fields_are_refused_in_a_kernel_file(key: str) -> None:
    """A kernel file runs once through the common arguments: a field only mmd's own kernels use would be ignored."""
    reason = refusal(SQ, f"{key}: 1\n")
    assert reason == f"k.kernel.yaml: declaration {key}: for mmd's own kernels only (kernels/*.cu)"
    assert refusal(f"// mmd: {{{key}: 1}}\n" + SQ).startswith("k.cu:1: declaration ")


BAD_OWN: list[tuple[dict[str, object], str]] = [
    ({"cluster_x": 0}, "cluster_x is a whole number of at least 1"),
    ({"min_compute_capability": "8.0"}, "min_compute_capability is [major, minor]"),
    ({"rung": "first"}, "rung is a whole number"),
    ({"switches": ["T"]}, "switches: 'T' is not a name apart from"),
    ({"defines": {"BM": 64}, "variants": [{"label": "x", "defines": {"BN": 1}}]}, "variants: no parameter BN"),
    ({"variants": [{"label": "x"}, {"label": "x"}]}, "variant labels must differ"),
    ({"variants": [{"defines": {}}]}, "a variant is a mapping of label, defines, classes, with a label"),
    ({"arch_variants": {"sm_90a": {"label": "x", "classes": ["small"]}}}, "a variant is a mapping of label, defines"),
    ({"tensor_maps": {"a_box": [1, 1]}}, "tensor_maps: is a mapping of a_box, b_box"),
    ({"tensor_maps": {"a_box": [1, 1], "b_box": ["BK", 32]}}, "BK uses BK, which defines and template lack"),
]


@pytest.mark.parametrize(("data", "reason"), BAD_OWN, ids=[r[1] for r in BAD_OWN])
def test_each_own_field_is_checked_where_it_is_read(data: dict[str, object], reason: str) -> None:
    with pytest.raises(KernelFileError) as caught:
        from_mapping(data, "k.cu:2", own=True)
    assert caught.value.reason.startswith("k.cu:2: declaration ") and reason in caught.value.reason


def test_a_variant_is_the_declaration_with_its_defines_changed() -> None:
    text = (
        "tile_macro: null\ndefines: {BM: 128, TMA: 0}\nswitches: [FAST]\nblock: [BM*2]\nblock_tile: [BM, 64, 8]\n"
        "cluster_x: 1 + TMA\ntensor_maps: {when: TMA, a_box: [BM/2, 8], b_box: [8, 32], tf32: TMA}\n"
        "variants: [{label: small, classes: [small], defines: {BM: 64}}]\n"
        "arch_variants: {sm_90a: {label: tma, defines: {TMA: 1, FAST: 1}}}\n"
    )
    d = from_mapping(yaml.safe_load(text), "k.cu:2", own=True)
    small = d.variant(d.variants[0])
    assert (small.defined(0), small.block_dims(0), small.block_shape(0), small.maps(0)) == (
        {"BM": 64, "TMA": 0}, (128, 1, 1), (64, 64, 8), None)  # fmt: skip
    target, tma = d.arch_variants[0]
    built = d.variant(tma)
    assert target == "sm_90a" and built.defined(0) == {"BM": 128, "TMA": 1, "FAST": 1} and built.cluster(0) == 2
    assert built.maps(0) == TensorMaps(a_box=(64, 8), b_box=(8, 32), swizzle=128, tf32=True)
    assert built.grid_dims(100, 65, 0) == (2, 1, 1)  # 2 column blocks: one whole cluster
    with pytest.raises(ValueError, match=r"^no parameter BX$"):
        d.with_defines({"BX": 1})


def test_producer_threads_compute_no_outputs_and_the_others_cover_the_tile() -> None:
    """A warp-specialized build's copying warpgroup is declared as producers: the block's other threads cover
    its tile; producers that leave no thread to compute, or that break the cover, are refused at the tile."""
    text = "tile_macro: null\ndefines: {P: 128}\nblock: [384]\nproducers: P\nblock_tile: [128, 128, 32]\n"
    d = from_mapping(yaml.safe_load(text), "k.cu:2", own=True)
    d.check_tile(0)
    assert (d.threads_per_block(0), d.producer_threads(0), d.outputs(0)) == (384, 128, 64)
    with pytest.raises(ValueError, match=r"P is 384 producer threads; the block has 384$"):
        d.with_defines({"P": 384}).check_tile(0)
    with pytest.raises(ValueError, match=r"at tile 0: 320 threads × 51 outputs per thread do not cover a 128×128"):
        d.with_defines({"P": 64}).check_tile(0)


# -- mmd's own kernels: the registry reads their declarations from their files ------------------------------


@pytest.mark.parametrize("name", registry.SOURCE_KERNELS)
def test_mmds_own_kernels_are_launched_as_their_declarations_say(name: str) -> None:
    """The registry's entry (and each of its variants' and architecture builds') launches as the declaration in
    the kernel's header says at every tile and shape, and the kernel-file reader reads the same declaration."""
    spec, declared = registry.get(name), registry.DECLARATIONS[name]
    assert (spec.description, spec.precision, spec.exact, spec.uses_tile, spec.course) == (
        declared.description, declared.precision, declared.exact, declared.uses_tile, declared.course)  # fmt: skip
    assert (spec.min_compute_capability, spec.requirement, spec.arch_specific) == (
        declared.min_compute_capability, declared.needs, declared.arch_specific)  # fmt: skip
    builds = [(spec, declared)]
    builds += [
        (spec.with_variant(v), declared.variant(d)) for v, d in zip(spec.variants, declared.variants, strict=True)
    ]
    builds += [(spec.for_arch(target.removesuffix("a")), declared.variant(d)) for target, d in declared.arch_variants]
    for build, d in builds:
        for tile in registry.TILES if spec.uses_tile else (0,):
            d.check_tile(tile)
            assert d.block_dims(tile) == build.block(tile)
            assert d.block_shape(tile)[:2] == build.block_shape(tile)
            assert d.outputs(tile) == build.outputs_per_thread
            assert d.static_shared(tile) == build.shared_bytes(tile)
            assert d.dynamic_shared(tile) == build.dynamic_shared_bytes
            assert (d.cluster(tile), d.maps(tile)) == (build.cluster_x, build.tensor_maps)
            assert d.macros(tile) == build.defines(tile)
            for m, n in ((1, 1), (37, 53), (4096, 1024)):
                assert d.grid_dims(m, n, tile) == build.grid(m, n, tile)
    assert spec.source is not None
    kf = parse_kernel(spec.source.read_bytes(), spec.source.name, sandboxed=False)
    assert (kf.kernel.name, kf.kernel.extern_c, kf.roles) == (spec.entry, True, declared.arguments)
    assert kf.declaration == declared and kf.declared_in == declared.origin


def test_the_vocabulary_keys_are_documented() -> None:
    doc = (ROOT / "docs" / "kernels.md").read_text(encoding="utf-8")
    section = doc.split("## Writing a kernel mmd can run", 1)[1]
    for key in KEYS:
        assert f"`{key}`" in section, key
    for example in sorted(EXAMPLES.glob("*.kernel.yaml")):
        assert isinstance(yaml.safe_load(example.read_text(encoding="utf-8")), dict)
