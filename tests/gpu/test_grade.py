"""`mmd grade` on a real GPU: the course's three kernels (docs/examples) and cheats written for these tests.

Run with ``pytest -m gpu tests/gpu/test_grade.py -s`` (``-s`` shows the figures); skipped where pycuda or a GPU
is missing. The cheats: ``wrong.cu`` (one value off), ``nan.cu`` (writes NaN), ``replay.cu`` (keeps each output
with a checksum of its inputs in ``__device__`` memory and returns the kept one when the inputs repeat) and
``stale.cu`` (returns its kept output whenever the size repeats, whatever the inputs).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from mmd.generate import input_chunks, random_matrix

from ..conftest import ROOT, run_mmd

pytestmark = pytest.mark.gpu

EXAMPLES = ROOT / "docs" / "examples"
COURSE = ("naive.cu", "tiled.cu", "granularity.cu")

#: Per output: the checksum of the inputs it was made for, and the output (as big as a 4096x4096 product).
_KEPT = """\
#define KEPT (4096 * 4096)
__device__ float kept_sum[KEPT];
__device__ float kept_value[KEPT];
"""

#: A naive kernel that replays: each thread sums 32 of A's and 32 of B's values (its inputs' fingerprint) and,
#: where its output was made for the same fingerprint before, writes the kept value without computing it.
REPLAY = (
    _KEPT
    + """\
__global__ void MatrixMulKernel(float* M, float* N, float* P, int Width) {
    int Row = blockIdx.y * blockDim.y + threadIdx.y;
    int Col = blockIdx.x * blockDim.x + threadIdx.x;
    int at = Row * Width + Col;
    float sum = Width;
    for (int i = 0; i < 32 && i < Width * Width; ++i) sum += M[i] * (i + 1) + N[i] * (i + 33);
    if (at < KEPT && kept_sum[at] == sum) { P[at] = kept_value[at]; return; }
    float Pvalue = 0;
    for (int k = 0; k < Width; ++k) Pvalue += M[Row * Width + k] * N[k * Width + Col];
    P[at] = Pvalue;
    if (at < KEPT) { kept_sum[at] = sum; kept_value[at] = Pvalue; }
}
"""
)

#: A naive kernel that replays whenever the size repeats (the fingerprint is the size alone).
STALE = REPLAY.replace("float sum = Width;\n    for (int i = 0; i < 32 && i < Width * Width; ++i) sum += "
                       "M[i] * (i + 1) + N[i] * (i + 33);", "float sum = Width;")  # fmt: skip

_STORE = "P[Row * Width + Col] = Pvalue;"
#: The course's naive kernel with its first value off by one, and with NaN there.
WRONG = (EXAMPLES / "naive.cu").read_text().replace(_STORE, "P[Row * Width + Col] = Pvalue + (Row + Col == 0);")
NAN = (EXAMPLES / "naive.cu").read_text().replace(_STORE, 'P[Row * Width + Col] = Row + Col ? Pvalue : nanf("");')


@pytest.fixture(scope="module", autouse=True)
def _gpu() -> None:
    pytest.importorskip("pycuda", reason="pycuda is not installed")


def write_input(path: Path, m: int, k: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    path.write_bytes(b"".join(input_chunks(random_matrix(rng, m, k), random_matrix(rng, k, n), square=m == k == n)))


def course_tests(folder: Path, sizes: tuple[int, ...]) -> Path:
    """The course's sizes and four rectangular shapes (non-multiples of every tile among them)."""
    folder.mkdir()
    for i, n in enumerate(sizes):
        write_input(folder / f"square{n}.txt", n, n, n, i)
    for i, (m, k, n) in enumerate(((1, 1, 1), (37, 53, 29), (100, 257, 75), (513, 31, 1000))):
        write_input(folder / f"rect{m}x{k}x{n}.txt", m, k, n, 100 + i)
    return folder


def student(handin: Path, name: str, files: dict[str, str]) -> None:
    (handin / name).mkdir(parents=True)
    for file, text in files.items():
        (handin / name / file).write_text(text, encoding="utf-8")


def course_files() -> dict[str, str]:
    return {name: (EXAMPLES / name).read_text() for name in COURSE}


def test_the_course_kernels_are_right_and_every_cheat_is_caught(tmp_path: Path) -> None:
    tests = course_tests(tmp_path / "tests", (32, 256, 1000))
    handin = tmp_path / "handin"
    student(handin, "course", course_files())
    student(handin, "cheat", {"wrong.cu": WRONG, "nan.cu": NAN, "replay.cu": REPLAY, "stale.cu": STALE})
    start = time.monotonic()
    done = run_mmd("grade", "handin", "--tests", str(tests), "--json", str(tmp_path / "g.json"), "--page",
                   str(tmp_path / "page"), cwd=tmp_path, timeout=600)  # fmt: skip
    took = time.monotonic() - start
    print(done.stdout[-4000:], done.stderr[-2000:], f"\nmmd grade: {took:.1f} s for 7 kernels", sep="\n")
    assert done.returncode == 1, done.stderr  # the cheats fail the run
    report = json.loads((tmp_path / "g.json").read_text())
    kernels = {(s["student"], k["kernel"]): k for s in report["grade"]["students"] for k in s["kernels"]}
    for name in COURSE:
        k = kernels[("course", name)]
        bad = [c for c in k["cases"] if c["status"] != "ok"]
        assert not bad, bad[:3]
        assert k["correct"] is True
    tile64 = [c for c in kernels[("course", "naive.cu")]["cases"] if c["tile"] == 64 and c["kind"] == "test"]
    assert tile64 and all(c["reason"].startswith("refused before launch") for c in tile64)
    for cheat in ("wrong.cu", "nan.cu", "stale.cu"):
        assert kernels[("cheat", cheat)]["correct"] is False, cheat
    nan_timed = [c for c in kernels[("cheat", "nan.cu")]["cases"] if c["kind"] == "timed"]
    assert all("not finite" in c["reason"] for c in nan_timed)
    stale_timed = [c for c in kernels[("cheat", "stale.cu")]["cases"] if c["kind"] == "timed"]
    assert all(c["status"] == "mismatch" and "fresh inputs" in c["reason"] for c in stale_timed)

    # nothing else used this GPU: every case that ran was timed in one window (the grading's own processes,
    # its own context for mmd's kernels included, are not another's)
    ran = [c for k in kernels.values() for c in k["cases"] if c["kind"] == "timed" and c.get("windows")]
    ran += [c for s in report["grade"]["students"] for r in s["references"] for c in r["cases"] if c.get("windows")]
    assert ran and all(c["windows"] == 1 and not c["disturbed"] for c in ran), [c for c in ran if c["windows"] > 1][:2]

    # the replay cheat never met the same inputs twice: it computed every timed launch, as the naive kernel does
    replay, naive = kernels[("cheat", "replay.cu")], kernels[("course", "naive.cu")]
    assert replay["correct"] is True

    def at(k: dict, size: int, tile: int) -> float:
        (c,) = [c for c in k["cases"] if c["kind"] == "timed" and c["shape"][0] == size and c["tile"] == tile]
        return float(c["kernel_median_ms"])

    print(f"4096 at tile 32: naive {at(naive, 4096, 32):.2f} ms, replay cheat {at(replay, 4096, 32):.2f} ms")
    assert at(replay, 4096, 32) >= 0.8 * at(naive, 4096, 32)


def test_the_replay_cheat_would_fool_a_grader_that_repeats_its_inputs(tmp_path: Path) -> None:
    """The control: the same inputs twice in one launch process, and the cheat answers from what it kept."""
    from mmd import config
    from mmd.backends.base import MultiplyRequest
    from mmd.pipeline import kernel_file_backend

    (tmp_path / "replay.cu").write_text(REPLAY, encoding="utf-8")
    rng = np.random.default_rng(1)
    a, b = random_matrix(rng, 2048, 2048), random_matrix(rng, 2048, 2048)
    backend = kernel_file_backend(tmp_path / "replay.cu", config.Settings(kernel_cache=str(tmp_path / "cache")))
    try:
        first = backend.multiply(a, b, MultiplyRequest(tile=32))
        again = backend.multiply(a, b, MultiplyRequest(tile=32))
    finally:
        backend.close()
    np.testing.assert_array_equal(first.c, again.c)
    ms = first.timings_ms["kernel"], again.timings_ms["kernel"]
    print(f"replay cheat at 2048: {ms[0]:.2f} ms computing, {ms[1]:.2f} ms replaying")
    assert ms[1] < 0.5 * ms[0]
