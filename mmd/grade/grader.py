"""One kernel graded as the course's instructor grades it: compiled, checked over TESTS, timed, every product checked.

For each kernel a student handed in (:class:`~.handins.Handin`), in kernel-file backends
(:func:`mmd.pipeline.kernel_file_backend`: the kernel runs in a launch process of its own, never in this one):

1. compiled at the first tile of the plan its file allows (a compile refusal fails every case of the kernel
   with the compiler's first line, and nothing runs);
2. each test of TESTS at every tile of the plan (:data:`mmd.bench.plan.COURSE_TILES`: 4 to 64), judged as
   ``mmd check`` judges that output (:meth:`~.testset.Test.judge`); a tile that no GPU launches (tile 64 of a
   kernel with a thread per output) is refused before launch and recorded as such, not as a wrong answer;
3. timed over the course's plan (each size at tile 32, the largest size at tiles 4 to 32). Every timed launch
   is given fresh random inputs, made here from a seed no one can know, and its product is checked
   (Freivalds' check, :func:`mmd.check.quickarrays.quick_of`, with a fresh seed too; a value that is not finite is
   wrong): a kernel that replays an earlier product, or one it kept for inputs it saw before, is caught as
   wrong, and one that computes what it is given is timed computing it. A case runs :meth:`GradePlan.enough`
   launches (the least, then until its kernel median is known or enough time is measured), sampled by NVML: a
   case another process used the GPU during runs again (:attr:`GradePlan.windows`). It reports the medians of
   the CUDA kernel time and of the five phases' total, with its noise and what the GPU did.

A class is graded in two phases (:func:`grade_class`): steps 1 and 2 for several kernels at once, then step 3
one kernel at a time in a fresh launch process, with nothing else of the grading on the GPU beside its launches
(only CPU work overlaps them: the next kernel's process starting, the next inputs made, earlier products checked).

Every kernel is held to fp32's tolerance: a declaration's ``precision`` does not widen a grade's.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np

from .. import kernels as registry
from ..backends import open_backend
from ..backends.base import Backend, MultiplyRequest, Product
from ..backends.kernelfile import KernelFileBackend
from ..bench.clock import ClockReader, ClockSampler
from ..bench.plan import COURSE_SIZES, COURSE_SIZES_AT_TILE, COURSE_TILES
from ..bench.stats import noise_of, settled
from ..check.results import Status
from ..config import Settings, kernel_cache_dir
from ..errors import BackendUnavailable, KernelFileError, MmdError, ProductRangeError, TileError
from ..kernelfile.exchange import Operands
from ..kernelfile.nvrtc import CompileLimits, compile_kernel
from ..pipeline import kernel_file_backend
from .fresh import CHECKERS, FreshInputs, Going, fresh_check
from .handins import Handin, Student
from .records import CUBLAS, NAIVE, NO_TILE, Case, KernelGrade, Reference, StudentGrade
from .service import Held, alone
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
    #: Timed launches at least per case, then more until the kernel median's noise (half its 95% confidence
    #: interval, as ``mmd bench`` measures it) is under ``noise`` ...
    repeats: int = 3
    noise: float = 0.02
    #: ... or this much kernel time (ms) is measured in the case, or ``max_repeats`` launches ran.
    enough_ms: float = 200.0
    max_repeats: int = 10
    #: A case during which another process used the GPU runs again, in up to this many windows in all.
    windows: int = 3

    def __post_init__(self) -> None:
        if not self.tiles or min(self.tiles) < 1 or (self.sizes and min(self.sizes) < 1):
            raise ValueError("tiles and sizes must be positive")
        if not 1 <= self.repeats <= self.max_repeats or not self.enough_ms > 0 or not self.noise > 0:
            raise ValueError("repeats must be from 1 to max_repeats, and enough_ms and noise positive")
        if self.windows < 1:
            raise ValueError("windows must be at least 1")

    def as_dict(self) -> dict[str, Any]:
        return {
            "tiles": list(self.tiles),
            "sizes": list(self.sizes),
            "sizes_at_tile": self.sizes_at_tile,
            "timing_tiles": list(self.timing_tiles),
            "repeats": self.repeats,
            "noise": self.noise,
            "enough_ms": self.enough_ms,
            "max_repeats": self.max_repeats,
            "windows": self.windows,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GradePlan:
        return cls(
            tiles=tuple(int(t) for t in d["tiles"]),
            sizes=tuple(int(s) for s in d["sizes"]),
            sizes_at_tile=int(d["sizes_at_tile"]),
            timing_tiles=tuple(int(t) for t in d["timing_tiles"]),
            repeats=int(d["repeats"]),
            noise=float(d["noise"]),
            enough_ms=float(d["enough_ms"]),
            max_repeats=int(d["max_repeats"]),
            windows=int(d["windows"]),
        )

    def enough(self, kernel_ms: Sequence[float]) -> bool:
        """Whether a case's launches so far (their kernel times) are enough: the least, and a settled median or
        enough time measured; or the most."""
        if len(kernel_ms) >= self.max_repeats:
            return True
        samples = [{"kernel": ms} for ms in kernel_ms]
        return len(kernel_ms) >= self.repeats and (settled(samples, self.noise) or sum(kernel_ms) >= self.enough_ms)

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
    #: Reads the GPU's clock and the processes using it while a case is timed (None: nothing to read it with).
    clock: ClockReader | None = None
    #: Each timed case's window: asked of the class's service with ``--service`` (its other GPU work waits it out),
    #: else nothing to ask; what it yields says which GPU processes are the service's and whether it was kept.
    window: Callable[[], AbstractContextManager[Held]] = field(default=alone)


def probe(settings: Settings) -> tuple[str, registry.DeviceLimits]:
    """(the GPU's name, its limits), from a launch process of the kernel files' kind; BackendUnavailable
    where there is none (no pycuda, no GPU): grading stops before any kernel is marked for it."""
    from ..kernelfile.launch import LaunchProcess  # a process of its own: only to grade

    process = LaunchProcess(settings.device, "mmd grade")
    try:
        return process.ready()
    finally:
        process.close()


def default_workers() -> int:
    """Phase 1's workers: a kernel each, up to 8 (each holds a launch process and its CUDA context)."""
    return min(8, os.cpu_count() or 1)


@dataclass(frozen=True)
class Phases:
    """Where a grading's time went: phase 1 (compile and correctness, ``workers`` kernels at once) and phase 2
    (the timed cases, one kernel at a time), in seconds."""

    workers: int
    correctness_s: float
    timing_s: float

    def line(self) -> str:
        return (
            f"phase 1, compile and correctness ({self.workers} worker{'s' if self.workers != 1 else ''}): "
            f"{self.correctness_s:.2f} s; phase 2, timed cases (one kernel at a time): {self.timing_s:.2f} s"
        )


@dataclass
class _Checked:
    """A kernel after phase 1: its correctness cases, or its whole grade where none of it ran."""

    handin: Handin
    late: bool
    sha256: str | None
    cases: list[Case]
    seconds: float
    refused: KernelGrade | None = None


def grade_class(
    students: Sequence[Student], grading: Grading, device: str, workers: int
) -> tuple[list[StudentGrade], Phases]:
    """Each of ``students``' kernels graded in two phases, their grades in the students' order.

    Phase 1 compiles and checks every kernel over the tests, ``workers`` kernels at once: their launches share
    the GPU, and no time of theirs counts. Phase 2 times the kernels that compiled, one after another, each in a
    fresh launch process (phase 1's are closed: each holds a CUDA context), no other launch of the grading
    beside its timed ones; the next kernel's process starts while the current one is timed."""
    start = time.perf_counter()
    workers = max(1, workers)
    going = Going()
    with ThreadPoolExecutor(workers, "mmd-grade-correct") as pool:
        handins = [h for s in students for h in s.handins]
        checked = list(pool.map(lambda h: _correctness(h, grading, going), handins))
    middle = time.perf_counter()
    references: list[Reference] = []  # filled before the first kernel's grade comes
    kernels = zip(checked, _timing(checked, grading, references, going), strict=True)
    parts = []
    for s in students:
        grades = []
        took = 0.0
        for c, (grade, timing_s) in itertools.islice(kernels, len(s.handins)):
            grading.told(s.name, grade)
            grades.append(grade)
            took += c.seconds + timing_s
        parts.append(StudentGrade(s.name, tuple(grades), s.skipped, s.problem, s.unreadable, device, took,
                                  tuple(references)))  # fmt: skip
    return parts, Phases(workers, middle - start, time.perf_counter() - middle)


def _correctness(handin: Handin, grading: Grading, going: Going) -> _Checked:
    """Phase 1 of ``handin``: compiled, and checked over the tests at every tile of the plan (its launch process
    closed through ``going``)."""
    start = time.perf_counter()
    deadline = grading.deadline
    late = deadline is not None and not handin.arrival.in_time(deadline)
    try:
        backend = kernel_file_backend(handin.path, grading.settings)
    except KernelFileError as exc:
        return _Checked(handin, late, None, [], 0.0, _refused(handin, None, late, exc.reason, grading))
    try:
        sha256 = backend.kernel.sha256
        why = _compiles(backend, grading)
        if why:
            return _Checked(handin, late, sha256, [], 0.0, _refused(handin, sha256, late, why, grading))
        cases = [case for test in grading.tests for case in _test_cases(backend, test, grading.plan.tiles)]
    finally:
        going.close(backend)
    return _Checked(handin, late, sha256, cases, time.perf_counter() - start)


def _test_cases(backend: KernelFileBackend, test: Test, tiles: Sequence[int]) -> list[Case]:
    """``test`` at each tile, its operands copied once into memory the launch process reads them from (each
    launch's product lands there too, judged before the next launch)."""
    ops = Operands(*test.shape)
    try:
        ops.a[:], ops.b[:] = test.a, test.b
        return [_test_case(backend, replace(test, a=ops.a, b=ops.b), tile) for tile in tiles]
    finally:
        ops.close()


def _timing(
    checked: Sequence[_Checked], grading: Grading, references: list[Reference], going: Going
) -> Iterator[tuple[KernelGrade, float]]:
    """Phase 2: each kernel's grade (and the seconds its timing took), in order; the timed cases of one kernel
    at a time, while the next one's launch process starts and the last one's is killed and waited for. First,
    mmd's own reference kernels are timed (into ``references``) as the first kernel's process starts."""
    pairs = grading.plan.timed()
    timed = [c for c in checked if c.refused is None] if pairs else []
    with (
        ThreadPoolExecutor(1, "mmd-grade-start") as starter,
        ThreadPoolExecutor(2, "mmd-grade-close") as closer,
        FreshInputs() as inputs,
        ThreadPoolExecutor(CHECKERS, "mmd-grade-freivalds") as checks,
    ):
        if pairs:
            inputs.ahead(pairs[0][0])
        starting = [starter.submit(_timing_backend, c, grading.settings) for c in timed[:1]]
        upcoming = timed[1:]
        # the GPU's processes of the grading's own beside a timed kernel's, as each window starts: this one once it
        # has opened a context for mmd's own kernels (it keeps it to the end), the next kernel's process starting
        # and the last ones going (killed: they run nothing while the driver tears their contexts down)
        this = kernel = 0

        def own() -> int:
            return this + kernel + len(starting) + going.count()

        try:
            if timed:
                this = 1  # timing mmd's own kernels, beside the first kernel's process starting
                found = _references(grading, _Timing(grading.plan, inputs, checks, grading.clock, own, grading.window))
                this, kernel = int(found is not None), 1
                references += found or []
            for c in checked:
                if c.refused is not None or not pairs:
                    yield c.refused or _graded(c, []), 0.0
                    continue
                start = time.perf_counter()
                made = starting.pop(0).result()
                if upcoming:
                    starting.append(starter.submit(_timing_backend, upcoming.pop(0), grading.settings))
                if isinstance(made, str):
                    cases = _refused_timing(made, grading.plan)
                else:
                    try:
                        timing = _Timing(grading.plan, inputs, checks, grading.clock, own, grading.window)
                        cases = _timed_cases(made, timing, pairs)
                    finally:
                        closer.submit(going.close, made)
                yield _graded(c, cases), time.perf_counter() - start
        finally:
            for pending in starting:
                made = pending.result()
                if not isinstance(made, str):
                    made.close()


def _references(grading: Grading, timing: _Timing) -> list[Reference] | None:
    """mmd's naive kernel over the plan's timed cases and cuBLAS SGEMM at each size (:data:`NO_TILE`), timed on
    the grading's GPU by the cuda backend, in this process (mmd's own code: no process of its own), with the same
    fresh inputs and checks; None where that backend cannot open (this process then holds no CUDA context, and
    the ratios are left blank). Closing the backend pops its context but keeps the process's hold on it: the
    GPU lists this process to the end."""
    try:
        backend, _ = open_backend("cuda", grading.settings.device, kernel_cache_dir(grading.settings))
    except MmdError:
        return None
    out = []
    try:
        for kernel, pairs in (
            (NAIVE, grading.plan.timed()),
            (CUBLAS, [(s, NO_TILE) for s in sorted(grading.plan.sizes)]),
        ):
            try:
                out.append(Reference(kernel, tuple(_timed_cases(backend, timing, pairs, kernel))))
            except BackendUnavailable:
                continue  # a library this box lacks (cuBLAS): that ratio is left blank
    finally:
        backend.close()
    return out


def _graded(checked: _Checked, timed: list[Case]) -> KernelGrade:
    h = checked.handin
    return KernelGrade(h.kernel, checked.sha256, h.arrival, checked.late, (*checked.cases, *timed), precision=PRECISION)


def _timing_backend(checked: _Checked, settings: Settings) -> KernelFileBackend | str:
    """A fresh backend (its launch process starting) for the kernel phase 1 checked; why not where the file is
    gone or changed since (phase 2 times the kernel phase 1 judged, or none)."""
    try:
        backend = kernel_file_backend(checked.handin.path, settings)
    except KernelFileError as exc:
        return exc.reason
    if backend.kernel.sha256 != checked.sha256:
        backend.close()
        return f"{checked.handin.kernel}: changed while it was graded"
    return backend


def _refused_timing(why: str, plan: GradePlan) -> list[Case]:
    return [Case("timed", _shape_name(s), (s, s, s), tile, Status.REFUSED, why) for s, tile in plan.timed()]


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
    cases += _refused_timing(why, grading.plan)
    return KernelGrade(handin.kernel, sha256, handin.arrival, late, tuple(cases), refused=why, precision=PRECISION)


def _shape_name(size: int) -> str:
    return f"{size}x{size}x{size}"


def _multiply(
    backend: Backend, a: np.ndarray, b: np.ndarray, request: MultiplyRequest
) -> tuple[Status, str, Product | None]:
    """(status, reason, product) of one launch: a tile no GPU launches is refused before launch (ok: not the
    kernel's fault), any other refusal or fault is the kernel's."""
    try:
        return Status.OK, "", backend.multiply(a, b, request)
    except TileError as exc:
        return Status.OK, f"refused before launch: {exc.reason}", None
    except BackendUnavailable:
        raise
    except MmdError as exc:
        return Status.REFUSED, exc.reason, None


def _test_case(backend: KernelFileBackend, test: Test, tile: int) -> Case:
    start = time.perf_counter()
    status, reason, product = _multiply(backend, test.a, test.b, MultiplyRequest(tile=tile))
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


@dataclass(frozen=True)
class _Timing:
    """What every timed case of phase 2 shares: the plan, the fresh inputs, the checkers, and how launches are
    sampled: the GPU's reader (None: not sampled) and how many processes on the GPU are the grading's own (more is
    another's, and the window is disturbed)."""

    plan: GradePlan
    inputs: FreshInputs
    checks: ThreadPoolExecutor
    clock: ClockReader | None
    #: How many there are as a window starts.
    own_processes: Callable[[], int]
    window: Callable[[], AbstractContextManager[Held]] = alone


def _timed_cases(backend: Backend, timing: _Timing, pairs: Sequence[tuple[int, int]], kernel: str = "") -> list[Case]:
    """The timed cases (size, tile) of one kernel (``kernel``: one of mmd's own by name; empty: the backend's
    kernel file), in order. Each launch's product is checked while the next launch runs; a case is decided once
    all its launches' checks are in. A tile of :data:`NO_TILE` (cuBLAS's) runs at the plan's sweep tile."""
    sizes = [s for s, _ in pairs[1:]] + [s for s, _ in timing.plan.timed()[:1]]  # after the last: the next kernel's
    pending = []
    for (size, tile), then in zip(pairs, sizes, strict=True):
        # a kernel file's backend runs its own kernel whatever the request names
        request = MultiplyRequest(kernel=kernel or MultiplyRequest.kernel, tile=tile or timing.plan.sizes_at_tile)
        pending.append(_timed_case(backend, request, Case("timed", _shape_name(size), (size, size, size), tile,
                                                          Status.OK), then, timing))  # fmt: skip
    return [p.decided() for p in pending]


@dataclass
class _Launches:
    """A timed case's launches so far: each one's (kernel ms, cuda ms) in the window kept, every launch's
    product check (of every window: a wrong product is wrong in any), what stopped them where a launch was
    refused or faulted, and what the GPU did during the window kept."""

    case: Case
    launches: list[tuple[float, float]] = field(default_factory=list)
    checks: list[Future[tuple[str, str]]] = field(default_factory=list)
    stopped: tuple[Status, str] | None = None
    seconds: float = 0.0
    gpu: dict[str, Any] = field(default_factory=dict)
    windows: int = 0

    def failed(self) -> bool:
        return any(check.done() and check.result()[0] for check in self.checks)

    def disturbed(self) -> bool:
        """Whether another process used the GPU during the last window (unknown: not)."""
        return bool(self.gpu.get("gpu_busy"))

    def decided(self) -> Case:
        """The case, once every check is in: wrong at the first launch whose product is wrong (as though it
        had stopped there), else refused where a launch was, else timed."""
        start = time.perf_counter()
        case = self.case
        for launch, check in enumerate(self.checks, 1):
            wrong, detail = check.result()
            if wrong:
                said = f"timed launch {launch} (fresh inputs): {wrong}"
                return self._took(_with(case, Status.MISMATCH, said, detail or said), start)
        if self.stopped is not None:
            return self._took(_with(case, *self.stopped), start)
        kernel_ms = [k for k, _ in self.launches]
        cuda_ms = [c for _, c in self.launches]
        noise = noise_of([{"kernel": k} for k in kernel_ms], "kernel")
        parts = [f"kernel {np.median(kernel_ms):.4f} ms (noise {100 * (noise or 0):.1f}%), cuda "
                f"{np.median(cuda_ms):.4f} ms: medians of {len(kernel_ms)} timed launches, each on fresh inputs, "
                "each product checked"]  # fmt: skip
        if self.gpu.get("sm_clock_mhz") is not None:
            parts.append(f"SM clock {self.gpu['sm_clock_mhz']:g} MHz{' (throttled)' if self.gpu['throttled'] else ''}")
        if self.windows > 1:
            parts.append(f"run {self.windows} times: another process used the GPU"
                        + (" every time" if self.disturbed() else "")
                        + f" (the last window: {self.gpu.get('gpu_processes')} processes listed, "
                        f"{self.gpu.get('own_processes')} the grading's own)")  # fmt: skip
        timed = replace(case, detail="; ".join(parts), kernel_ms=tuple(kernel_ms), cuda_ms=tuple(cuda_ms),
                        noise=noise, sm_clock_mhz=self.gpu.get("sm_clock_mhz"), throttled=self.gpu.get("throttled"),
                        gpu_processes=self.gpu.get("gpu_processes"), windows=self.windows,
                        disturbed=self.disturbed())  # fmt: skip
        return self._took(timed, start)

    def _took(self, case: Case, start: float) -> Case:
        return replace(case, seconds=self.seconds + time.perf_counter() - start)


def _timed_case(backend: Backend, request: MultiplyRequest, case: Case, then: int, timing: _Timing) -> _Launches:
    """A timed case's launches, in windows sampled for other processes on the GPU (each held on the class's
    service with ``--service``): one where another used it is run again (up to ``plan.windows`` in all; the last
    one's times are kept). One whose hold on the service ended first (its time up, or the service gone) is
    disturbed, and not run again: another would end the same way."""
    start = time.perf_counter()
    done = _Launches(case)
    while done.windows < timing.plan.windows:
        done.windows += 1
        done.launches = []
        own = timing.own_processes()
        sampler = ClockSampler(timing.clock, own_processes=own)
        with timing.window() as held, sampler:
            _timed_launches(backend, request, case.shape[0], then, timing, done)
        facts = sampler.summary()
        processes = facts["gpu_processes"]
        others = processes is not None and processes > own + held.own_processes
        done.gpu = {**facts, "gpu_busy": others or not held.kept, "own_processes": own + held.own_processes}
        if not done.disturbed() or done.stopped is not None or done.failed() or not held.kept:
            break
    done.seconds = time.perf_counter() - start
    return done


def _timed_launches(
    backend: Backend, request: MultiplyRequest, size: int, then: int, timing: _Timing, done: _Launches
) -> None:
    """Launches on fresh inputs into ``done`` until :meth:`GradePlan.enough` (or a product is found wrong, or a
    launch is refused); the inputs of the next launch (of ``then``'s size after the last) are made while each
    runs."""
    plan, inputs = timing.plan, timing.inputs
    while True:
        ops = inputs.take(size)
        a, b = ops.a, ops.b
        # made while this one runs: another launch's, unless this one is surely the last
        inputs.ahead(then if len(done.launches) + 1 >= plan.max_repeats else size)
        try:
            status, reason, product = _multiply(backend, a, b, request)
        except BaseException:
            inputs.done_with(ops)
            raise
        if product is None:
            inputs.done_with(ops)
            inputs.ahead(then)
            done.stopped = (status, reason)
            return
        check = timing.checks.submit(fresh_check, product.c, a, b)
        check.add_done_callback(functools.partial(_checked, inputs, ops))
        done.checks.append(check)
        done.launches.append((float(product.timings_ms["kernel"]), float(product.timings_ms["cuda"])))
        if plan.enough([k for k, _ in done.launches]) or done.failed():
            inputs.ahead(then)
            return


def _checked(inputs: FreshInputs, ops: Operands, check: Future[tuple[str, str]]) -> None:
    inputs.done_with(ops)  # its product (there, for a kernel file) checked: nothing reads them any more


def _with(case: Case, status: Status, reason: str, detail: str = "", max_error: float | None = None) -> Case:
    return replace(case, status=status, reason=reason, detail=detail, max_error=max_error)


def _timed(case: Case, start: float) -> Case:
    return replace(case, seconds=time.perf_counter() - start)
