"""One kernel graded as the course's instructor grades it: compiled, checked over TESTS, timed, every product checked.

For each kernel a student handed in (:class:`~.handins.Handin`), in one kernel-file backend
(:func:`mmd.pipeline.kernel_file_backend`: the kernel runs in a launch process of its own, never in this one):

1. compiled at the first tile of the plan its file allows (a compile refusal fails every case of the kernel
   with the compiler's first line, and nothing runs);
2. each test of TESTS at every tile of the plan (:data:`mmd.bench.plan.COURSE_TILES`: 4 to 64), judged as
   ``mmd check`` judges that output (:meth:`~.testset.Test.judge`); a tile that no GPU launches (tile 64 of a
   kernel with a thread per output) is refused before launch and recorded as such, not as a wrong answer;
3. timed over the course's plan (each size at tile 32, the largest size at tiles 4 to 32). Every timed launch
   is given fresh random inputs, made here from a seed no one can know, and its product is checked
   (Freivalds' check, :func:`mmd.check.full.quick_of`, with a fresh seed too; a value that is not finite is
   wrong): a kernel that replays an earlier product, or one it kept for inputs it saw before, is caught as
   wrong, and one that computes what it is given is timed computing it. A case repeats up to
   :attr:`GradePlan.repeats` launches, fewer once :attr:`GradePlan.enough_ms` of kernel time is measured,
   and reports the medians of the CUDA kernel time and of the five phases' total.

Every kernel is held to fp32's tolerance: a declaration's ``precision`` does not widen a grade's.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np

from .. import kernels as registry
from ..backends.base import MultiplyRequest, Product
from ..backends.kernelfile import KernelFileBackend
from ..bench.plan import COURSE_SIZES, COURSE_SIZES_AT_TILE, COURSE_TILES
from ..check import full
from ..check.quick import fresh_seed
from ..check.results import Status
from ..config import Settings, kernel_cache_dir
from ..errors import BackendUnavailable, KernelFileError, MmdError, ProductRangeError, TileError
from ..kernelfile.nvrtc import CompileLimits, compile_kernel
from ..pipeline import kernel_file_backend
from ..textformat import check_product
from .handins import Handin, Student
from .records import Case, KernelGrade, StudentGrade
from .testset import Test

#: The arithmetic every kernel is graded in.
PRECISION = "fp32"


@dataclass(frozen=True)
class GradePlan:
    """What each kernel is run on: the tiles of the correctness cases, and the timing plan."""

    #: Every test runs at each of these tiles.
    tiles: tuple[int, ...] = COURSE_TILES
    #: Timed: each size at ``sizes_at_tile``, and the largest size at each of ``timing_tiles``.
    sizes: tuple[int, ...] = COURSE_SIZES
    sizes_at_tile: int = COURSE_SIZES_AT_TILE
    timing_tiles: tuple[int, ...] = registry.TILES
    #: Timed launches at most per case ...
    repeats: int = 3
    #: ... and no more once this much kernel time (ms) is measured in the case.
    enough_ms: float = 200.0

    def __post_init__(self) -> None:
        if not self.tiles or min(self.tiles) < 1 or (self.sizes and min(self.sizes) < 1):
            raise ValueError("tiles and sizes must be positive")
        if self.repeats < 1 or not self.enough_ms > 0:
            raise ValueError("repeats must be at least 1 and enough_ms positive")

    def timed(self) -> list[tuple[int, int]]:
        """(size, tile) of each timed case, without repeats: the size sweep, then the tile sweep."""
        if not self.sizes:
            return []
        pairs = [(s, self.sizes_at_tile) for s in sorted(self.sizes)]
        pairs += [(max(self.sizes), t) for t in self.timing_tiles]
        return list(dict.fromkeys(pairs))


@dataclass
class Grading:
    """What grading a class shares: the tests (read once), the plan, the settings and the GPU."""

    tests: Sequence[Test]
    plan: GradePlan
    settings: Settings
    #: The GPU's architecture, which compiles are made for (``sm_90``).
    arch: str
    deadline: datetime | None = None
    #: Told of each kernel graded.
    told: Callable[[str, KernelGrade], None] = field(default=lambda student, grade: None)


def probe(settings: Settings) -> tuple[str, str]:
    """(the GPU's name, its architecture), from a launch process of the kernel files' kind; BackendUnavailable
    where there is none (no pycuda, no GPU): grading stops before any kernel is marked for it."""
    from ..kernelfile.launch import LaunchProcess  # a process of its own: only to grade

    process = LaunchProcess(settings.device, "mmd grade")
    try:
        name, limits = process.ready()
    finally:
        process.close()
    return name, limits.arch


def grade_student(student: Student, grading: Grading, device: str) -> StudentGrade:
    """Each of ``student``'s kernels graded."""
    start = time.perf_counter()
    grades = []
    for handin in student.handins:
        grade = grade_kernel(handin, grading)
        grading.told(student.name, grade)
        grades.append(grade)
    return StudentGrade(
        student.name, tuple(grades), student.skipped, student.problem, student.unreadable, device,
        time.perf_counter() - start,
    )  # fmt: skip


def grade_kernel(handin: Handin, grading: Grading) -> KernelGrade:
    """``handin`` compiled, checked over the tests and timed. BackendUnavailable where the GPU went."""
    deadline = grading.deadline
    late = deadline is not None and not handin.arrival.in_time(deadline)
    try:
        backend = kernel_file_backend(handin.path, grading.settings)
    except KernelFileError as exc:
        return _refused(handin, None, late, exc.reason, grading)
    try:
        sha256 = backend.kernel.sha256
        why = _compiles(backend, grading)
        if why:
            return _refused(handin, sha256, late, why, grading)
        cases = [_test_case(backend, test, tile) for test in grading.tests for tile in grading.plan.tiles]
        rng = np.random.default_rng(secrets.randbits(128))
        cases += [_timed_case(backend, size, tile, grading.plan, rng) for size, tile in grading.plan.timed()]
    finally:
        backend.close()
    return KernelGrade(handin.kernel, sha256, handin.arrival, late, tuple(cases), precision=PRECISION)


def _compiles(backend: KernelFileBackend, grading: Grading) -> str:
    """Why the kernel does not compile (the compiler's first line), at the first tile of the plan its file
    allows; empty where it compiles (or no tile is allowed: each case then says why)."""
    kf = backend.kernel
    for tile in grading.plan.tiles:
        try:
            kf.check_launch(tile, registry.COMMON_LIMITS)
        except MmdError:
            continue
        try:
            compile_kernel(kf, tile, grading.arch, kernel_cache_dir(grading.settings), CompileLimits())
        except KernelFileError as exc:
            return exc.reason
        return ""
    return ""


def _refused(handin: Handin, sha256: str | None, late: bool, why: str, grading: Grading) -> KernelGrade:
    """A kernel none of which ran: every case fails with ``why``."""
    cases = [
        Case("test", t.name, t.shape, tile, Status.REFUSED, why, reference=str(t.reference))
        for t in grading.tests
        for tile in grading.plan.tiles
    ]
    cases += [Case("timed", _shape_name(s), (s, s, s), tile, Status.REFUSED, why) for s, tile in grading.plan.timed()]
    return KernelGrade(handin.kernel, sha256, handin.arrival, late, tuple(cases), refused=why, precision=PRECISION)


def _shape_name(size: int) -> str:
    return f"{size}x{size}x{size}"


def _multiply(
    backend: KernelFileBackend, a: np.ndarray, b: np.ndarray, tile: int
) -> tuple[Status, str, Product | None]:
    """(status, reason, product) of one launch: a tile no GPU launches is refused before launch (ok: not the
    kernel's fault), any other refusal or fault is the kernel's."""
    try:
        return Status.OK, "", backend.multiply(a, b, MultiplyRequest(tile=tile))
    except TileError as exc:
        return Status.OK, f"refused before launch: {exc.reason}", None
    except BackendUnavailable:
        raise
    except MmdError as exc:
        return Status.REFUSED, exc.reason, None


def _test_case(backend: KernelFileBackend, test: Test, tile: int) -> Case:
    start = time.perf_counter()
    status, reason, product = _multiply(backend, test.a, test.b, tile)
    case = Case("test", test.name, test.shape, tile, status, reason, reference=str(test.reference))
    if product is None:
        return _timed(case, start)
    try:
        report = test.judge(product.c, PRECISION)
    except ProductRangeError as exc:
        return _timed(_with(case, Status.MISMATCH, exc.reason), start)
    status = Status.OK if report.ok else Status.MISMATCH
    case = _with(case, status, "" if report.ok else report.summary(), report.summary(), report.max_abs_error)
    return _timed(case, start)


def _timed_case(backend: KernelFileBackend, size: int, tile: int, plan: GradePlan, rng: np.random.Generator) -> Case:
    start = time.perf_counter()
    case = Case("timed", _shape_name(size), (size, size, size), tile, Status.OK)
    kernel_ms: list[float] = []
    cuda_ms: list[float] = []
    for launch in range(1, plan.repeats + 1):
        a, b = fresh_inputs(rng, size, size, size)
        status, reason, product = _multiply(backend, a, b, tile)
        if product is None:
            return _timed(_with(case, status, reason), start)
        wrong, detail = _fresh_check(product.c, a, b)
        if wrong:
            said = f"timed launch {launch} (fresh inputs): {wrong}"
            return _timed(_with(case, Status.MISMATCH, said, detail or said), start)
        kernel_ms.append(float(product.timings_ms["kernel"]))
        cuda_ms.append(float(product.timings_ms["cuda"]))
        if sum(kernel_ms) >= plan.enough_ms:
            break
    detail = (
        f"kernel {np.median(kernel_ms):.4f} ms, cuda {np.median(cuda_ms):.4f} ms: medians of {len(kernel_ms)} "
        "timed launches, each on fresh inputs, each product checked"
    )
    return _timed(replace(case, detail=detail, kernel_ms=tuple(kernel_ms), cuda_ms=tuple(cuda_ms)), start)


def fresh_inputs(rng: np.random.Generator, m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A and B of new random values in [-1, 1) (float32, made in place: cheap at 4096)."""
    out = []
    for rows, cols in ((m, k), (k, n)):
        x = rng.random((rows, cols), dtype=np.float32)
        x *= 2
        x -= 1
        out.append(x)
    return out[0], out[1]


def _fresh_check(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[str, str]:
    """(why ``c`` is not A·B, the check's summary line); why is empty where it is. A value that is not finite
    is wrong at once; else Freivalds' check, with a fresh seed, judges it."""
    try:
        check_product(c)
    except ProductRangeError as exc:
        return exc.reason, ""
    report = full.quick_of(c, a, b, seed=fresh_seed())
    return report.reason(), report.summary()


def _with(case: Case, status: Status, reason: str, detail: str = "", max_error: float | None = None) -> Case:
    return replace(case, status=status, reason=reason, detail=detail, max_error=max_error)


def _timed(case: Case, start: float) -> Case:
    return replace(case, seconds=time.perf_counter() - start)
