"""The benchmark loop: run a plan's cases, check each result once, time every phase, keep the results
folder current (:mod:`.results`) and tell a :class:`~.progress.ProgressSink` as it goes."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import kernels as registry
from .. import textformat
from ..atomic import write_atomic
from ..backends.base import CUDA_PHASES, Backend, MultiplyRequest
from ..backends.cpu import CpuBackend
from ..check import full as verify
from ..check import tolerance
from ..config import Settings
from ..errors import MmdError
from ..generate import input_chunks
from ..job import describe
from ..pipeline import run_job
from ..record import TimingRecord
from .accuracy import run_accuracy
from .checking import Inputs, Wrong, check_product, make_inputs
from .clock import ClockReader, ClockWatch, load_average
from .machine import environment
from .plan import Case, Plan, backend_for
from .progress import NullProgress, ProgressSink
from .results import BenchRun, new_folder, write_results
from .rows import BenchRow
from .stats import Sample, gflops, noise_of, phase_quartiles, phase_stats, settled


@dataclass
class _Checked:
    """What a case's check and its jobs found, beside the timings."""

    max_abs_error: float | None = None
    rel_error: float | None = None
    text_path: str | None = None


def _compile_of(timings: Sample) -> list[float]:
    return [timings["compile"]] if "compile" in timings else []


def _with_cuda(timings: dict[str, float]) -> dict[str, float]:
    out = {k: float(v) for k, v in timings.items() if v is not None}
    if "cuda" not in out and all(p in out for p in CUDA_PHASES):
        out["cuda"] = sum(out[p] for p in CUDA_PHASES)
    return out


class _Runner:
    """Runs cases on a backend (and the host backend for ``cpu``) in one mode."""

    def __init__(
        self,
        plan: Plan,
        backend: Backend,
        host: Backend,
        workdir: Path | None,
        clock: ClockReader | None = None,
        load: Callable[[], float] = load_average,
    ) -> None:
        self.plan = plan
        self.backend = backend
        self.host = host
        self.workdir = workdir
        self.clock = clock
        self.load = load
        self._inputs: tuple[tuple[int, int, int], Inputs] | None = None

    def inputs(self, case: Case) -> Inputs:
        if self._inputs is None or self._inputs[0] != case.shape:
            self._inputs = None  # free the previous shape's arrays first
            self._inputs = (case.shape, Inputs.of(*make_inputs(case.m, case.k, case.n, self.plan.seed)))
        return self._inputs[1]

    def run(self, case: Case) -> BenchRow:
        plan = self.plan
        spec = registry.get(case.kernel)
        backend = backend_for(case.kernel, self.backend, self.host)
        row = BenchRow(
            kernel=case.kernel,
            backend=backend.name,
            tile=case.tile,
            m=case.m,
            k=case.k,
            n=case.n,
            memory=plan.memory if spec.on_gpu else None,
            mode=plan.mode,
            warmup=plan.warmup,
            device=backend.device_name(),
        )
        skip = case.skip
        if skip is None and spec.on_gpu and backend.name == "cpu":
            skip = f"{case.kernel} needs a GPU backend; this run has the cpu backend"
        if skip is not None:
            return replace(row, status="skipped", reason=skip)
        request = MultiplyRequest(
            kernel=case.kernel,
            tile=case.tile or plan.sizes_at_tile,
            memory=plan.memory,
            text_path=plan.text_path,
            flush_l2=plan.flush_l2 and not plan.through_files,  # warm-ups too: they run as the timed calls do
        )
        inputs = self.inputs(case)
        checked = _Checked()
        samples: list[dict[str, float]] = []
        compiles: list[float] = []  # a kernel is built once, usually in the warm-up: keep that time
        watch = ClockWatch(self.clock if spec.on_gpu else None, load=self.load)
        try:
            for i in range(plan.warmup):
                compiles += _compile_of(self._call(backend, request, inputs, check=i == 0, checked=checked))
            with watch:
                while len(samples) < plan.cap:
                    first = not plan.warmup and not samples
                    timings = self._call(backend, request, inputs, check=first, checked=checked)
                    compiles += _compile_of(timings)
                    samples.append(timings)
                    if plan.adaptive and len(samples) >= plan.repeats and settled(samples, plan.noise):
                        break
        except Wrong as exc:
            return replace(row, **dataclasses.asdict(checked), status="wrong", reason=str(exc))
        except MmdError as exc:
            return replace(row, **dataclasses.asdict(checked), status="refused", reason=exc.reason)
        except Exception as exc:  # a bug must not cost the rest of a long run
            traceback.print_exc(file=sys.stderr)
            return replace(row, **dataclasses.asdict(checked), status="error", reason=f"{type(exc).__name__}: {exc}")
        phases = phase_stats(samples)
        if "compile" not in phases and compiles:
            phases.update(phase_stats([{"compile": c} for c in compiles]))
        kernel = phases.get("kernel")
        kernel_noise = noise_of(samples, "kernel")
        return replace(
            row,
            **dataclasses.asdict(checked),
            repeats=len(samples),
            phases=phases,
            quartiles=phase_quartiles(samples),
            gflops=gflops(case.m, case.k, case.n, kernel.median if kernel else None),
            kernel_noise=kernel_noise,
            overall_noise=noise_of(samples, "overall"),
            # the loop's own test, not the rounded figure
            converged=settled(samples, plan.noise) if plan.adaptive and kernel_noise is not None else None,
            **watch.summary(),
        )

    def _call(
        self, backend: Backend, request: MultiplyRequest, inputs: Inputs, *, check: bool, checked: _Checked
    ) -> dict[str, float]:
        if not self.plan.through_files:
            t0 = time.perf_counter()
            product = backend.multiply(inputs.a, inputs.b, request)
            wall = (time.perf_counter() - t0) * 1e3
            if check:
                self._check(product.c, inputs, request.kernel, checked)
            return {**_with_cuda(product.timings_ms), "overall": wall}
        return self._call_files(backend, request, inputs, check=check, checked=checked)

    def _call_files(
        self, backend: Backend, request: MultiplyRequest, inputs: Inputs, *, check: bool, checked: _Checked
    ) -> dict[str, float]:
        assert self.workdir is not None
        if inputs.text is None:
            inputs.text = self.workdir / f"in-{inputs.a.shape[0]}x{inputs.a.shape[1]}x{inputs.b.shape[1]}.txt"
            write_atomic(inputs.text, input_chunks(inputs.a, inputs.b, square=True), durable=False)
        output = self.workdir / "out.txt"
        settings = Settings().with_values(
            {"backend": backend.name, "kernel": request.kernel, "tile": request.tile, "memory": request.memory,
             "text_path": request.text_path},
            "mmd bench",
        )  # fmt: skip
        result = run_job(describe(inputs.text, output, settings), lambda _settings: backend)
        try:
            if not isinstance(result.record, TimingRecord):
                assert result.error is not None
                raise result.error
            checked.text_path = result.record.text.path
            if check:
                assert result.product is not None
                self._check(result.product.c, inputs, request.kernel, checked)
                try:
                    printed = textformat.parse_output(output.read_bytes())
                except MmdError as exc:
                    raise Wrong(f"the output file is malformed: {exc.reason}") from None
                precision = registry.get(request.kernel).precision
                report = check_product(
                    printed,
                    inputs.ref,
                    tolerance.PRINT_HALF_UNIT + inputs.allowed_for(precision),
                    "0.005 + " + verify.TOLERANCES[precision],
                )
                if not report.ok:
                    raise Wrong(report.summary())
            return {k: v for k, v in dataclasses.asdict(result.record.timings_ms).items() if v is not None}
        finally:
            for path in (output, result.sidecar):
                path.unlink(missing_ok=True)

    def _check(self, c: np.ndarray, inputs: Inputs, kernel: str, checked: _Checked) -> None:
        precision = registry.get(kernel).precision
        report = check_product(c, inputs.ref, inputs.allowed_for(precision), verify.TOLERANCES[precision])
        checked.max_abs_error = float(f"{report.max_abs_error:.6g}")
        checked.rel_error = float(f"{report.rel_error:.6g}")
        if not report.ok:
            raise Wrong(report.summary())


def run_plan(
    plan: Plan,
    backend: Backend,
    *,
    out: Path = Path("bench"),
    folder: Path | None = None,
    host: Backend | None = None,
    progress: ProgressSink | None = None,
    env: dict[str, Any] | None = None,
    clock: ClockReader | None = None,
    load: Callable[[], float] = load_average,
) -> BenchRun:
    """Run every case of ``plan``; results go to ``folder`` (default: a new ``out/<timestamp>``).

    GPU kernels run on ``backend``; the ``cpu`` kernel runs on ``host`` (a
    :class:`CpuBackend` by default). ``clock`` reads the GPU's SM clock and
    processes during each GPU case (:class:`~.clock.Nvml`; None: not recorded),
    ``load`` the machine's load average during every case. The results files
    are rewritten after each case; ``run.complete`` is set when every case has run.
    """
    progress = progress or NullProgress()
    host = host or (backend if backend.name == "cpu" else CpuBackend())
    folder = folder if folder is not None else new_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    run = BenchRun(folder, plan, env if env is not None else environment(backend))
    cases = plan.cases()
    progress.start(len(cases), folder)
    with tempfile.TemporaryDirectory(prefix="mmd-bench-") if plan.through_files else nullcontext() as tmp:
        runner = _Runner(plan, backend, host, Path(tmp) if tmp else None, clock, load)
        for index, case in enumerate(cases):
            progress.begin(index, case)
            row = runner.run(case)
            run.rows.append(row)
            write_results(run)
            progress.done(index, case, row)
        if plan.accuracy:
            for accuracy_row in run_accuracy(plan, backend, host, progress=progress):
                run.accuracy.append(accuracy_row)
                write_results(run)
    run.complete = True
    write_results(run)
    progress.finish(run)
    return run
