"""The SGEMM ladder kernels compile for sm_90 without spills and use 16-byte loads.

CPU-only: needs nvcc (skipped without it), no GPU. Each build the registry
lists of blocktile2d.cu, vectorized.cu and fast.cu (each of fast's variants)
is compiled with ``nvcc -arch=sm_90 -cubin -Xptxas -v``;
the ptxas report must show 0 bytes of spill stores and loads and no stack
frame. The 16-byte accesses are checked in the SASS when cuobjdump is
available (LDG.E.128 or cp.async's LDGSTS...128 from global memory, LDS.128
from shared memory), else in the PTX (ld.global.nc.v4 / cp.async 16, ld.shared.v4).
"""

from __future__ import annotations

import concurrent.futures as futures
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mmd import kernels as registry
from mmd.resources import kernels_dir

KERNELS = kernels_dir()
LADDER = ("blocktile2d", "vectorized", "fast")
VECTOR_KERNELS = ("vectorized", "fast")


def _tool(name: str) -> str | None:
    for cand in (shutil.which(name), f"/usr/local/cuda/bin/{name}"):
        if cand and Path(cand).exists():
            return cand
    return None


NVCC = _tool("nvcc")
CUOBJDUMP = _tool("cuobjdump")
pytestmark = [pytest.mark.skipif(NVCC is None, reason="nvcc is not installed"), pytest.mark.integration]


CASES = [
    (spec.name, spec.variant or "defaults", spec.defines(0)) for name in LADDER for spec in registry.get(name).builds()
]


def _build(case, tmp: Path) -> dict:
    kernel, label, macros = case
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{kernel}_{label}")
    defines = [f"-D{k}={v}" for k, v in macros.items()]
    src = str(KERNELS / f"{kernel}.cu")
    cubin = tmp / f"{stem}.cubin"
    proc = subprocess.run(
        [NVCC, "-arch=sm_90", "-cubin", "-Xptxas", "-v", *defines, "-o", str(cubin), src],
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = {"case": case, "rc": proc.returncode, "log": proc.stderr + proc.stdout, "code": ""}
    if proc.returncode != 0:
        return result
    if CUOBJDUMP:
        dump = subprocess.run([CUOBJDUMP, "--dump-sass", str(cubin)], capture_output=True, text=True, timeout=120)
        if dump.returncode == 0 and "FFMA" in dump.stdout:
            result["code"], result["kind"] = dump.stdout, "sass"
            return result
    ptx = tmp / f"{stem}.ptx"
    subprocess.run([NVCC, "-arch=sm_90", "-ptx", *defines, "-o", str(ptx), src], check=True, timeout=120)
    result["code"], result["kind"] = ptx.read_text(), "ptx"
    return result


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ladder")
    with futures.ThreadPoolExecutor(max_workers=4) as pool:
        return {r["case"][:2]: r for r in pool.map(lambda c: _build(c, tmp), CASES)}


@pytest.mark.parametrize("case", CASES, ids=[f"{k}-{label}" for k, label, _ in CASES])
def test_compiles_without_spills(builds, case):
    r = builds[case[:2]]
    assert r["rc"] == 0, r["log"]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r["log"])
    assert spills, f"no ptxas report in:\n{r['log']}"
    assert all(s == ("0", "0") for s in spills), r["log"]
    assert all(f == "0" for f in re.findall(r"(\d+) bytes stack frame", r["log"])), r["log"]


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if c[0] in VECTOR_KERNELS],
    ids=[f"{k}-{label}" for k, label, _ in CASES if k in VECTOR_KERNELS],
)
def test_sixteen_byte_loads(builds, case):
    r = builds[case[:2]]
    assert r["rc"] == 0, r["log"]
    code = r["code"]
    if r["kind"] == "sass":
        assert re.search(r"LDG\.E\.128|LDGSTS\.E[.A-Z]*\.128", code), "no 16-byte global loads in SASS"
        assert "LDS.128" in code, "no 16-byte shared loads in SASS"
        assert not re.search(r"\b(LDL|STL)\b", code), "local memory traffic in SASS"
    else:
        assert re.search(r"ld\.global\.nc\.v4\.f32|cp\.async\.cg\.shared\.global.*16", code), "no 16-byte global loads"
        assert re.search(r"ld\.shared\.v4\.f32", code), "no 16-byte shared loads in PTX"


def test_every_ladder_kernel_has_the_common_entry():
    signature = re.compile(
        r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s*)?mmd_(\w+)\s*\(\s*const float\* __restrict__ A,\s*'  # noqa: E501
        r"const float\* __restrict__ B,\s*float\* __restrict__ C,\s*int M, int K, int N,\s*int lda, int ldb, int ldc\)"
    )
    for kernel in LADDER:
        m = signature.search((KERNELS / f"{kernel}.cu").read_text())
        assert m and m.group(1) == kernel, kernel


def test_fast_defaults_in_the_registry_are_the_files_own():
    """The registry spells every macro of each variant; the file's #defines (its standalone build) agree."""
    text = (KERNELS / "fast.cu").read_text()
    found = {k: int(v) for k, v in re.findall(r"#define (\w+) (\d+)", text) if k in registry.FAST_DEFAULTS}
    assert found == registry.FAST_DEFAULTS


def test_every_tuned_variant_is_registered():
    for gpu, classes in registry.get("fast").tuned().items():
        for cls, label in classes.items():
            assert label in {v.label for v in registry.get("fast").variants}, (gpu, cls)
