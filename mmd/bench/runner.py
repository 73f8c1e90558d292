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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import textoutput
from ..atomic import write_atomic
from ..backends import open_backend
from ..backends.base import CUDA_PHASES, Backend, MultiplyRequest
from ..backends.kernelfile import KernelFileBackend
from ..check import tolerance
from ..config import Settings
from ..errors import KernelLaunchError, MmdError
from ..generate import input_chunks
from ..job import describe
from ..kernelchoice import KernelChoice
from ..pipeline import kernel_file_backend, run_job
from ..record import TimingRecord
from .accuracy import run_accuracy
from .checking import Inputs, Wrong, check_product, make_inputs
from .clock import ClockReader, ClockSampler, load_average
from .machine import environment
from .plan import Case, Plan, backend_for, cannot_run
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
    #: The GPU a job through files ran on, as its sidecar says (a kernel file's job's own process names it).
    device: str | None = None


@dataclass
class _Call:
    """What each call of one case is made of, in memory or through files, and what its checks found."""

    backend: Backend
    request: MultiplyRequest
    inputs: Inputs
    choice: KernelChoice
    checked: _Checked = field(default_factory=_Checked)

    def check(self, c: np.ndarray) -> None:
        """Hold ``c`` to the float64 product within the precision's tolerance (Wrong where it is not); the
        errors go into :attr:`checked`."""
        precision = self.choice.precision
        report = check_product(c, self.inputs.ref, self.inputs.allowed_for(precision), tolerance.TOLERANCES[precision])
        self.checked.max_abs_error = float(f"{report.max_abs_error:.6g}")
        self.checked.rel_error = float(f"{report.rel_error:.6g}")
        if not report.ok:
            raise Wrong(report.summary())


def _compile_of(timings: Sample) -> list[float]:
    return [timings["compile"]] if "compile" in timings else []


def _with_cuda(timings: dict[str, float]) -> dict[str, float]:
    out = {k: float(v) for k, v in timings.items() if v is not None}
    if "cuda" not in out and all(p in out for p in CUDA_PHASES):
        out["cuda"] = sum(out[p] for p in CUDA_PHASES)
    return out


class _Runner:
    """Runs cases on a backend (the host backend for ``cpu``, each kernel file's own for it) in one mode."""

    def __init__(
        self,
        plan: Plan,
        backend: Backend,
        host: Backend,
        workdir: Path | None,
        clock: ClockReader | None = None,
        load: Callable[[], float] = load_average,
        files: dict[KernelChoice, KernelFileBackend] | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.plan = plan
        self.backend = backend
        self.host = host
        self.workdir = workdir
        self.clock = clock
        self.load = load
        self.files = files or {}
        #: What a job through files runs with besides the case's own settings (a kernel file's limits, its cache).
        self.settings = settings or Settings()
        self._inputs: tuple[tuple[int, int, int], Inputs] | None = None

    def inputs(self, case: Case) -> Inputs:
        if self._inputs is None or self._inputs[0] != case.shape:
            self._inputs = None  # free the previous shape's arrays first
            self._inputs = (case.shape, Inputs.of(*make_inputs(case.m, case.k, case.n, self.plan.seed)))
        return self._inputs[1]

    def run(self, case: Case) -> BenchRow:
        choice = case.choice
        backend = backend_for(choice, self.backend, self.host, self.files)
        row = BenchRow(
            kernel=case.kernel,
            backend=backend.name,
            tile=case.tile,
            m=case.m,
            k=case.k,
            n=case.n,
            memory=self.plan.memory if choice.on_gpu else None,
            mode=self.plan.mode,
            warmup=self.plan.warmup,
            kernel_file=None if choice.path is None else str(choice.path),
            kernel_sha256=choice.sha256,
        )
        skip = case.skip or cannot_run(choice, backend)
        if skip is not None:
            return replace(row, status="skipped", reason=skip, device=backend.device_name())
        row = self._run(case, backend, row)
        # a kernel file's GPU is named by its launch process, once one has started
        return replace(row, device=row.device or backend.device_name())

    def _run(self, case: Case, backend: Backend, row: BenchRow) -> BenchRow:
        plan, choice = self.plan, case.choice
        # Each call of a kernel file runs in a fresh process: started and ready before the call is timed, as a
        # built-in kernel's context is made before its calls (the process's start is not the kernel's time).
        ready = backend.start if isinstance(backend, KernelFileBackend) and not plan.through_files else None
        request = MultiplyRequest(
            kernel=case.kernel,
            tile=case.tile or plan.sizes_at_tile,
            memory=plan.memory,
            text_path=plan.text_path,
            flush_l2=plan.flush_l2 and not plan.through_files,  # warm-ups too: they run as the timed calls do
        )
        call = _Call(backend, request, self.inputs(case), choice)
        timed = self._through_files if plan.through_files else self._in_memory
        samples: list[dict[str, float]] = []
        compiles: list[float] = []  # a kernel is built once, usually in the warm-up: keep that time
        # a kernel file's launch process is the benchmark's own, beside this one's context (if it has one)
        own = 1 + (choice.is_file and self.backend.name != "cpu")
        sampler = ClockSampler(self.clock if choice.on_gpu else None, load=self.load, own_processes=own)
        try:
            for i in range(plan.warmup):
                if ready is not None:
                    ready()
                compiles += _compile_of(timed(call, check=i == 0))
            with sampler:
                while len(samples) < plan.cap:
                    first = not plan.warmup and not samples
                    if ready is not None:
                        ready()
                    timings = timed(call, check=first)
                    compiles += _compile_of(timings)
                    samples.append(timings)
                    if plan.adaptive and len(samples) >= plan.repeats and settled(samples, plan.noise):
                        break
        except Wrong as exc:
            return replace(row, **dataclasses.asdict(call.checked), status="wrong", reason=str(exc))
        except KernelLaunchError as exc:  # a kernel file faulted, or ran past its time limit: not a refusal
            return replace(row, **dataclasses.asdict(call.checked), status="error", reason=exc.reason)
        except MmdError as exc:
            return replace(row, **dataclasses.asdict(call.checked), status="refused", reason=exc.reason)
        except Exception as exc:  # a bug must not cost the rest of a long run
            traceback.print_exc(file=sys.stderr)
            return replace(
                row, **dataclasses.asdict(call.checked), status="error", reason=f"{type(exc).__name__}: {exc}"
            )
        phases = phase_stats(samples)
        if "compile" not in phases and compiles:
            phases.update(phase_stats([{"compile": c} for c in compiles]))
        kernel = phases.get("kernel")
        kernel_noise = noise_of(samples, "kernel")
        return replace(
            row,
            **dataclasses.asdict(call.checked),
            repeats=len(samples),
            phases=phases,
            quartiles=phase_quartiles(samples),
            gflops=gflops(case.m, case.k, case.n, kernel.median if kernel else None),
            kernel_noise=kernel_noise,
            overall_noise=noise_of(samples, "overall"),
            # the loop's own test, not the rounded figure
            converged=settled(samples, plan.noise) if plan.adaptive and kernel_noise is not None else None,
            **sampler.summary(),
        )

    def _in_memory(self, call: _Call, *, check: bool) -> dict[str, float]:
        t0 = time.perf_counter()
        product = call.backend.multiply(call.inputs.a, call.inputs.b, call.request)
        wall = (time.perf_counter() - t0) * 1e3
        if check:
            call.check(product.c)
        return {**_with_cuda(product.timings_ms), "overall": wall}

    def _through_files(self, call: _Call, *, check: bool) -> dict[str, float]:
        assert self.workdir is not None
        inputs, request, choice = call.inputs, call.request, call.choice
        if inputs.text is None:
            inputs.text = self.workdir / f"in-{inputs.a.shape[0]}x{inputs.a.shape[1]}x{inputs.b.shape[1]}.txt"
            write_atomic(inputs.text, input_chunks(inputs.a, inputs.b, square=True), durable=False)
        output = self.workdir / "out.txt"
        # A kernel file's job is run as `mmd run --kernel-file` runs it: the pipeline makes its backend.
        kernel = {} if choice.is_file else {"kernel": choice.name}
        settings = self.settings.with_values(
            {"backend": call.backend.name, **kernel, "tile": request.tile, "memory": request.memory,
             "text_path": request.text_path},
            "mmd bench",
        )  # fmt: skip
        job = describe(inputs.text, output, settings, kernel_file=choice.path)
        result = run_job(job, lambda _settings: call.backend)
        try:
            if not isinstance(result.record, TimingRecord):
                assert result.error is not None
                raise result.error
            call.checked.text_path = result.record.text.path
            call.checked.device = result.record.device
            if check:
                assert result.product is not None
                call.check(result.product.c)
                try:
                    printed = textoutput.parse_output(output.read_bytes())
                except MmdError as exc:
                    raise Wrong(f"the output file is malformed: {exc.reason}") from None
                report = check_product(
                    printed,
                    inputs.ref,
                    tolerance.PRINT_HALF_UNIT + inputs.allowed_for(choice.precision),
                    tolerance.tolerance_of(None, choice.precision),
                )
                if not report.ok:
                    raise Wrong(report.summary())
            return {k: v for k, v in dataclasses.asdict(result.record.timings_ms).items() if v is not None}
        finally:
            for path in (output, result.sidecar):
                path.unlink(missing_ok=True)


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
    settings: Settings | None = None,
) -> BenchRun:
    """Run every case of ``plan``; results go to ``folder`` (default: a new ``out/<timestamp>``).

    GPU kernels run on ``backend``; the ``cpu`` kernel runs on ``host`` (the
    cpu backend by default); each kernel file on a backend of its own
    (:func:`mmd.pipeline.kernel_file_backend`: a fresh process per call, its
    device, kernel cache and launch time limit from ``settings``, which jobs
    through files also run with; default: mmd's defaults). ``clock`` reads
    the GPU's SM clock and processes during each GPU case
    (:class:`~.clock.Nvml`; None: not recorded), ``load`` the machine's load
    average during every case. The results files are rewritten after each
    case; ``run.complete`` is set when every case has run.
    """
    progress = progress or NullProgress()
    host = host or (backend if backend.name == "cpu" else open_backend("cpu")[0])
    folder = folder if folder is not None else new_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    run = BenchRun(folder, plan, env if env is not None else environment(backend))
    cases = plan.cases()
    settings = settings or Settings()
    files: dict[KernelChoice, KernelFileBackend] = {}
    progress.start(len(cases), folder)
    try:
        for choice in plan.kernel_files:
            assert choice.path is not None
            files[choice] = kernel_file_backend(choice.path, settings)
            # the process a backend starts when made would sit on the GPU through other kernels' cases (and be
            # counted there as another's): each call of its own starts one (KernelFileBackend.start)
            files[choice].close()
        with tempfile.TemporaryDirectory(prefix="mmd-bench-") if plan.through_files else nullcontext() as tmp:
            runner = _Runner(plan, backend, host, Path(tmp) if tmp else None, clock, load, files, settings)
            for index, case in enumerate(cases):
                progress.begin(index, case)
                row = runner.run(case)
                run.rows.append(row)
                write_results(run)
                progress.done(index, case, row)
            if plan.accuracy:
                for accuracy_row in run_accuracy(plan, backend, host, files, progress=progress):
                    run.accuracy.append(accuracy_row)
                    write_results(run)
    finally:
        for made in files.values():
            made.close()
    run.complete = True
    write_results(run)
    progress.finish(run)
    return run
