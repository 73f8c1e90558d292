"""The benchmark loop: run a plan of cases, check each result once, time every phase, write CSV and YAML.

A *case* is one kernel at one shape and one tile. For each case the inputs
are random (seeded by the shape, so every kernel multiplies the same
matrices), the first call's result is checked against the float64 product,
``warmup`` calls are thrown away and ``repeats`` calls are measured; every
phase gets its median, min and max (``compile``, which happens once per
kernel and tile and so usually in the warm-up, is kept from whichever call
built the kernel). A case ends in one of these statuses:

``ok``
    checked and timed.
``wrong``
    the result is outside the fp32 tolerance; not timed, and the run fails
    (``BenchRun.ok`` is False, ``mmd bench`` exits 1).
``refused``
    the backend refused it with a reason (a :class:`~mmd.errors.MmdError`:
    tile 64 needs 4096 threads per block); this is the graceful failure the
    course asks for, not a failure of the run.
``skipped``
    not run, with the reason (a GPU kernel on the cpu backend, the cpu
    backend above ``cpu_max_size``).
``error``
    anything else raised: a bug; the run fails.

Two modes. ``memory`` calls ``backend.multiply`` directly; its ``overall`` is
the wall time of that call. ``files`` (``through_files``) runs each call as a
real job through :func:`mmd.pipeline.run_job` on text files in a temporary
folder, so the phases are the ones a grader sees: read, parse, the CUDA
phases, emit, write and overall.

Results are rewritten after every case, so an interrupted run keeps what it
measured: ``<out>/<timestamp>/results.csv`` (one row per case) and
``results.yaml`` (the same rows, the plan and the environment).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import importlib.metadata
import io
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
import yaml

from . import __version__, textformat, verify
from . import kernels as registry
from .atomic import write_atomic
from .backends.base import CUDA_PHASES, Backend, MultiplyRequest
from .backends.cpu import CpuBackend
from .config import MEMORY_MODES, Settings
from .errors import MmdError
from .generate import input_chunks, random_matrix
from .job import describe
from .pipeline import run_job
from .record import TIMING_KEYS, TimingRecord
from .verify import reference_product

#: The course's size sweep (at tile 32) and tile sweep (at 4096). Tile 64 is
#: in the sweep on purpose: it must come out refused, with its reason.
COURSE_SIZES: tuple[int, ...] = (32, 256, 512, 1024, 2048, 4096)
COURSE_TILES: tuple[int, ...] = (*registry.TILES, 64)
COURSE_SIZES_AT_TILE = 32
COURSE_TILES_AT_SIZE = 4096

#: The cpu backend is not run above this size unless the plan says otherwise.
CPU_MAX_SIZE = 2048

#: Every phase, in the order they happen (the sidecar's timing keys).
PHASES: tuple[str, ...] = TIMING_KEYS

STATUSES: tuple[str, ...] = ("ok", "wrong", "refused", "skipped", "error")
#: Statuses that fail the run.
FAILING: frozenset[str] = frozenset({"wrong", "error"})

MODES: tuple[str, ...] = ("memory", "files")

#: Columns of results.csv, in order.
COLUMNS: tuple[str, ...] = (
    "kernel",
    "backend",
    "tile",
    "m",
    "k",
    "n",
    "memory",
    "mode",
    "text_path",
    "status",
    "reason",
    "repeats",
    "warmup",
    "device",
    "max_abs_error",
    "rel_error",
    *(f"{phase}_{stat}_ms" for phase in PHASES for stat in ("median", "min", "max")),
    "gflops",
)


@dataclass(frozen=True)
class Case:
    """One kernel at one shape and tile (tile None for kernels that take none)."""

    kernel: str
    m: int
    k: int
    n: int
    tile: int | None
    #: Why this case is not run (decided by the plan), or None.
    skip: str | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.k, self.n)

    def label(self) -> str:
        tile = f"tile {self.tile}" if self.tile is not None else "no tile"
        return f"{self.kernel} {tile} {self.m}x{self.k}x{self.n}"


@dataclass(frozen=True)
class Plan:
    """What to run.

    By default the plan has the course's shape: every size at tile
    ``sizes_at_tile``, and every tile at size ``tiles_at_size`` (the largest
    size when None). ``grid`` runs every size at every tile instead. Sizes
    are square (N×N times N×N). Kernels that use no tile (cublas, cpu) run
    once per size.
    """

    kernels: tuple[str, ...]
    sizes: tuple[int, ...]
    tiles: tuple[int, ...]
    repeats: int = 5
    warmup: int = 1
    memory: str = "device"
    through_files: bool = False
    #: How ``--through-files`` jobs handle their text: auto, host or gpu (docs/textpath.md).
    text_path: str = "auto"
    sizes_at_tile: int = COURSE_SIZES_AT_TILE
    tiles_at_size: int | None = None
    grid: bool = False
    #: The cpu kernel is skipped above this size (None: no limit).
    cpu_max_size: int | None = CPU_MAX_SIZE
    seed: int = 0

    def __post_init__(self) -> None:
        for name in self.kernels:
            registry.get(name)  # KernelError naming the choices
        if not self.kernels or not self.sizes or not self.tiles:
            raise ValueError("a plan needs at least one kernel, one size and one tile")
        if min(self.sizes) < 1 or min(self.tiles) < 1 or self.sizes_at_tile < 1:
            raise ValueError("sizes and tiles must be positive")
        if self.tiles_at_size is not None and self.tiles_at_size < 1:
            raise ValueError("tiles_at_size must be positive")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be at least 1 and warmup at least 0")
        if self.memory not in MEMORY_MODES:
            raise ValueError(f"memory must be one of {', '.join(MEMORY_MODES)}, got {self.memory!r}")

    @property
    def mode(self) -> str:
        return "files" if self.through_files else "memory"

    def pairs(self) -> list[tuple[int, int]]:
        """(size, tile) pairs, sizes ascending, without repeats."""
        if self.grid:
            pairs = [(s, t) for s in self.sizes for t in self.tiles]
        else:
            at = self.tiles_at_size if self.tiles_at_size is not None else max(self.sizes)
            pairs = [(s, self.sizes_at_tile) for s in self.sizes] + [(at, t) for t in self.tiles]
        return sorted(set(pairs))

    def cases(self) -> list[Case]:
        """Every case, grouped by size (each size's inputs are made once)."""
        order = {name: i for i, name in enumerate(registry.NAMES)}
        kernels = sorted(dict.fromkeys(self.kernels), key=order.__getitem__)
        seen: set[tuple[str, int, int | None]] = set()
        cases: list[Case] = []
        for size, tile in self.pairs():
            for name in kernels:
                spec = registry.get(name)
                case_tile = tile if spec.uses_tile else None
                key = (name, size, case_tile)
                if key in seen:
                    continue
                seen.add(key)
                skip = None
                if spec.kind == registry.HOST and self.cpu_max_size is not None and size > self.cpu_max_size:
                    skip = f"cpu above size {self.cpu_max_size} (raise --cpu-max-size to run it)"
                cases.append(Case(name, size, size, size, case_tile, skip))
        return cases


def course_plan(**changes: Any) -> Plan:
    """The course's plan: sizes 32..4096 at tile 32, tiles 4..64 at 4096, every registered kernel."""
    values: dict[str, Any] = dict(
        kernels=registry.NAMES,
        sizes=COURSE_SIZES,
        tiles=COURSE_TILES,
        sizes_at_tile=COURSE_SIZES_AT_TILE,
        tiles_at_size=COURSE_TILES_AT_SIZE,
    )
    values.update(changes)
    return Plan(**values)


def default_kernels(backend: Backend) -> tuple[str, ...]:
    """Every registered kernel on a GPU backend; on the cpu backend only ``cpu``."""
    if backend.name == "cpu":
        return tuple(s.name for s in registry.REGISTRY.values() if s.kind == registry.HOST)
    return registry.NAMES


# -- progress ----------------------------------------------------------------


class ProgressSink(Protocol):
    """What the loop tells whoever watches it."""

    def start(self, total: int, folder: Path) -> None: ...
    def begin(self, index: int, case: Case) -> None: ...
    def done(self, index: int, case: Case, row: dict[str, Any]) -> None: ...
    def finish(self, run: BenchRun) -> None: ...


class NullProgress:
    """Shows nothing."""

    def start(self, total: int, folder: Path) -> None:
        pass

    def begin(self, index: int, case: Case) -> None:
        pass

    def done(self, index: int, case: Case, row: dict[str, Any]) -> None:
        pass

    def finish(self, run: BenchRun) -> None:
        pass


def describe_row(row: dict[str, Any]) -> str:
    """One line for a finished case."""
    tile = f"t{row['tile']}" if row.get("tile") not in (None, "") else "-"
    shape = f"{row['m']}x{row['k']}x{row['n']}"
    width = max(map(len, registry.NAMES))
    head = f"{row['kernel']:<{width}} {tile:>4} {shape:<14}"
    status = row["status"]
    if status == "ok":
        parts = [f"kernel {row['kernel_median_ms']:.3f} ms"]
        if row.get("cuda_median_ms") is not None:
            parts.append(f"cuda {row['cuda_median_ms']:.3f} ms")
        parts.append(f"overall {row['overall_median_ms']:.3f} ms")
        if row.get("gflops") is not None:
            parts.append(f"{row['gflops']:.1f} GFLOP/s")
        return f"{head}  ok       " + ", ".join(parts)
    label = "WRONG" if status == "wrong" else status
    return f"{head}  {label:<8} {row.get('reason') or ''}"


class Progress:
    """A bar redrawn in place on a terminal; one plain line per case otherwise.

    Cases that are not ``ok`` are always printed on their own line, so a
    wrong result or a refusal stays on the screen when the bar moves on.
    """

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None, width: int = 24) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.width = width
        self.total = 0
        self.finished = 0
        self.t0 = time.monotonic()

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _bar(self, current: str) -> str:
        filled = int(self.width * self.finished / self.total) if self.total else self.width
        elapsed = time.monotonic() - self.t0
        return (
            f"\r[{'#' * filled}{'.' * (self.width - filled)}] {self.finished}/{self.total} "
            f"{elapsed:5.0f}s  {current}\x1b[K"
        )

    def start(self, total: int, folder: Path) -> None:
        self.total, self.finished, self.t0 = total, 0, time.monotonic()
        self._write(f"mmd bench: {total} cases -> {folder}\n")

    def begin(self, index: int, case: Case) -> None:
        if self.tty:
            self._write(self._bar(case.label()))

    def done(self, index: int, case: Case, row: dict[str, Any]) -> None:
        self.finished += 1
        line = f"[{index + 1:>{len(str(self.total))}}/{self.total}] {describe_row(row)}"
        if not self.tty:
            self._write(line + "\n")
        elif row["status"] != "ok":
            self._write("\r\x1b[K" + line + "\n" + self._bar(""))
        else:
            self._write(self._bar(describe_row(row)))

    def finish(self, run: BenchRun) -> None:
        if self.tty:
            self._write("\r\x1b[K")
        counts = ", ".join(f"{n} {s}" for s, n in run.counts().items() if n)
        self._write(f"mmd bench: {counts} in {time.monotonic() - self.t0:.1f} s\n")


# -- environment ---------------------------------------------------------------


def _command_output(argv: Sequence[str], timeout: float = 10.0) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(backend: Backend) -> dict[str, Any]:
    """Where the numbers come from: device, driver, CUDA, versions, host and date."""
    env: dict[str, Any] = {
        "device": backend.device_name(),
        "backend": backend.name,
        "driver_version": None,
        "cuda_version": None,
        "cuda_toolkit": None,
        "pycuda_version": _package_version("pycuda"),
        "mmd_version": __version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        found = backend.versions()
    except Exception:  # versions are facts for the record, never a reason to stop
        found = {}
    env["driver_version"] = found.get("driver")
    env["cuda_version"] = found.get("pycuda_built_for")
    env["pycuda_version"] = env["pycuda_version"] or found.get("pycuda")
    smi = _command_output(["nvidia-smi"])
    if smi:
        if env["driver_version"] is None:
            match = re.search(r"Driver Version:\s*([\d.]+)", smi)
            env["driver_version"] = match.group(1) if match else None
        match = re.search(r"CUDA Version:\s*([\d.]+)", smi)
        env["cuda_driver_api"] = match.group(1) if match else None
    nvcc = _command_output(["nvcc", "--version"])
    if nvcc:
        match = re.search(r"release ([\d.]+)", nvcc)
        env["cuda_toolkit"] = match.group(1) if match else None
    if env["cuda_version"] is None:
        env["cuda_version"] = env.get("cuda_toolkit")
    return env


# -- checking ---------------------------------------------------------------


@dataclass
class _Inputs:
    """One shape's inputs and what results are checked against."""

    a: np.ndarray
    b: np.ndarray
    ref: np.ndarray
    allowed: np.ndarray
    text: Path | None = None  # the input file (files mode), written on first use


def make_inputs(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The case's A and B: random, never zero, the same for every kernel at this shape."""
    rng = np.random.default_rng([seed, m, k, n])
    return random_matrix(rng, m, k), random_matrix(rng, k, n)


def check_product(c: np.ndarray, ref: np.ndarray, allowed: np.ndarray | float, tolerance: str) -> verify.CheckReport:
    """Compare ``c`` elementwise with the float64 ``ref`` under ``allowed``."""
    if c.shape != ref.shape:
        return verify.CheckReport(False, tuple(c.shape), c.size, float("inf"), None, float("inf"), tolerance)
    diff = c.astype(np.float64) - ref
    err = np.abs(diff)
    excess = err - allowed
    bad = (excess > 0) | ~np.isfinite(c)
    worst = np.unravel_index(int(np.argmax(np.where(np.isfinite(excess), excess, np.inf))), excess.shape)
    norm = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(diff)) / norm if norm else float(np.linalg.norm(diff))
    return verify.CheckReport(
        ok=not bool(bad.any()),
        shape=(int(c.shape[0]), int(c.shape[1])),
        mismatches=int(bad.sum()),
        max_abs_error=float(err.max()) if err.size else 0.0,
        worst=(int(worst[0]), int(worst[1])),
        rel_error=rel,
        tolerance=tolerance,
    )


# -- one case ---------------------------------------------------------------


class _Wrong(Exception):
    """A result that does not match its reference; the message says how."""


def phase_stats(samples: list[dict[str, float]]) -> dict[str, float | None]:
    """``<phase>_median_ms``, ``_min_ms`` and ``_max_ms`` for every phase (None where no sample has it)."""
    out: dict[str, float | None] = {}
    for phase in PHASES:
        values = [s[phase] for s in samples if s.get(phase) is not None]
        out[f"{phase}_median_ms"] = round(statistics.median(values), 3) if values else None
        out[f"{phase}_min_ms"] = round(min(values), 3) if values else None
        out[f"{phase}_max_ms"] = round(max(values), 3) if values else None
    return out


def _with_cuda(timings: dict[str, float]) -> dict[str, float]:
    out = {k: float(v) for k, v in timings.items() if v is not None}
    if "cuda" not in out and all(p in out for p in CUDA_PHASES):
        out["cuda"] = sum(out[p] for p in CUDA_PHASES)
    return out


class _Runner:
    """Runs cases on a backend (and the host backend for ``cpu``) in one mode."""

    TOLERANCE = "4·sqrt(K)·eps·|A||B|"

    def __init__(self, plan: Plan, backend: Backend, host: Backend, workdir: Path | None) -> None:
        self.plan = plan
        self.backend = backend
        self.host = host
        self.workdir = workdir
        self._inputs: tuple[tuple[int, int, int], _Inputs] | None = None

    def inputs(self, case: Case) -> _Inputs:
        if self._inputs is None or self._inputs[0] != case.shape:
            self._inputs = None  # free the previous shape's arrays first
            a, b = make_inputs(case.m, case.k, case.n, self.plan.seed)
            self._inputs = (case.shape, _Inputs(a, b, reference_product(a, b), verify.fp32_tolerance(a, b)))
        return self._inputs[1]

    def backend_for(self, case: Case) -> Backend:
        return self.host if registry.get(case.kernel).kind == registry.HOST else self.backend

    def run(self, case: Case) -> dict[str, Any]:
        plan = self.plan
        spec = registry.get(case.kernel)
        backend = self.backend_for(case)
        row: dict[str, Any] = {c: None for c in COLUMNS}
        row.update(
            kernel=case.kernel,
            backend=backend.name,
            tile=case.tile,
            m=case.m,
            k=case.k,
            n=case.n,
            memory=plan.memory if spec.on_gpu else None,
            mode=plan.mode,
            status="ok",
            reason=None,
            repeats=0,
            warmup=plan.warmup,
            device=backend.device_name(),
        )
        skip = case.skip
        if skip is None and spec.on_gpu and backend.name == "cpu":
            skip = f"{case.kernel} needs a GPU backend; this run has the cpu backend"
        if skip is not None:
            row.update(status="skipped", reason=skip)
            return row
        request = MultiplyRequest(
            kernel=case.kernel, tile=case.tile or plan.sizes_at_tile, memory=plan.memory, text_path=plan.text_path
        )
        inputs = self.inputs(case)
        samples: list[dict[str, float]] = []
        compiles: list[float] = []  # a kernel is built once, usually in the warm-up: keep that time
        try:
            for i in range(plan.warmup + plan.repeats):
                timings = self._call(backend, request, inputs, check=i == 0, row=row)
                if "compile" in timings:
                    compiles.append(timings["compile"])
                if i >= plan.warmup:
                    samples.append(timings)
        except _Wrong as exc:
            row.update(status="wrong", reason=str(exc))
            return row
        except MmdError as exc:
            row.update(status="refused", reason=exc.reason)
            return row
        except Exception as exc:  # a bug must not cost the rest of a long run
            row.update(status="error", reason=f"{type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
            return row
        row["repeats"] = len(samples)
        row.update(phase_stats(samples))
        if row["compile_median_ms"] is None and compiles:
            row.update({k: v for k, v in phase_stats([{"compile": c} for c in compiles]).items() if "compile" in k})
        kernel_ms = row["kernel_median_ms"]
        row["gflops"] = round(2.0 * case.m * case.k * case.n / (kernel_ms * 1e6), 3) if kernel_ms else None
        return row

    def _call(
        self, backend: Backend, request: MultiplyRequest, inputs: _Inputs, *, check: bool, row: dict[str, Any]
    ) -> dict[str, float]:
        if not self.plan.through_files:
            t0 = time.perf_counter()
            product = backend.multiply(inputs.a, inputs.b, request)
            wall = (time.perf_counter() - t0) * 1e3
            if check:
                self._check(product.c, inputs, row)
            return {**_with_cuda(product.timings_ms), "overall": wall}
        return self._call_files(backend, request, inputs, check=check, row=row)

    def _call_files(
        self, backend: Backend, request: MultiplyRequest, inputs: _Inputs, *, check: bool, row: dict[str, Any]
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
            row["text_path"] = result.record.text.path
            if check:
                assert result.product is not None
                self._check(result.product.c, inputs, row)
                try:
                    printed = textformat.parse_output(output.read_bytes())
                except MmdError as exc:
                    raise _Wrong(f"the output file is malformed: {exc.reason}") from None
                report = check_product(
                    printed, inputs.ref, verify.PRINT_HALF_UNIT + inputs.allowed, "0.005 + " + self.TOLERANCE
                )
                if not report.ok:
                    raise _Wrong(report.summary())
            return {k: v for k, v in dataclasses.asdict(result.record.timings_ms).items() if v is not None}
        finally:
            for path in (output, result.sidecar):
                path.unlink(missing_ok=True)

    def _check(self, c: np.ndarray, inputs: _Inputs, row: dict[str, Any]) -> None:
        report = check_product(c, inputs.ref, inputs.allowed, self.TOLERANCE)
        row["max_abs_error"] = float(f"{report.max_abs_error:.6g}")
        row["rel_error"] = float(f"{report.rel_error:.6g}")
        if not report.ok:
            raise _Wrong(report.summary())


# -- the run -----------------------------------------------------------------


@dataclass
class BenchRun:
    """A finished (or interrupted) run: its folder, rows and environment."""

    folder: Path
    plan: Plan
    environment: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = False

    @property
    def csv_path(self) -> Path:
        return self.folder / "results.csv"

    @property
    def yaml_path(self) -> Path:
        return self.folder / "results.yaml"

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for r in self.rows if r["status"] == s) for s in STATUSES}

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Rows that fail the run (wrong results, errors)."""
        return [r for r in self.rows if r["status"] in FAILING]

    @property
    def ok(self) -> bool:
        return self.complete and not self.failures


def rows_to_csv(rows: Iterable[dict[str, Any]]) -> str:
    """The rows as CSV text with :data:`COLUMNS` (None as an empty field)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in COLUMNS})
    return buf.getvalue()


def write_results(run: BenchRun) -> None:
    """(Re)write results.csv and results.yaml atomically."""
    write_atomic(run.csv_path, [rows_to_csv(run.rows).encode()], durable=False)
    document = {
        "complete": run.complete,
        "environment": run.environment,
        "plan": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(run.plan).items()},
        "columns": list(COLUMNS),
        "rows": [{k: row.get(k) for k in COLUMNS} for row in run.rows],
    }
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True)
    write_atomic(run.yaml_path, [text.encode()], durable=False)


def new_folder(root: Path, now: _dt.datetime | None = None) -> Path:
    """``root/<YYYYmmdd-HHMMSS>`` (with ``-2``, ``-3`` ... when taken), created."""
    stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, 1000):
        folder = root / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"no free results folder for {stamp} in {root}")


def run_plan(
    plan: Plan,
    backend: Backend,
    *,
    out: Path = Path("bench"),
    folder: Path | None = None,
    host: Backend | None = None,
    progress: ProgressSink | None = None,
    env: dict[str, Any] | None = None,
    on_case: Callable[[dict[str, Any]], None] | None = None,
) -> BenchRun:
    """Run every case of ``plan``; results go to ``folder`` (default: a new ``out/<timestamp>``).

    GPU kernels run on ``backend``; the ``cpu`` kernel runs on ``host`` (a
    :class:`CpuBackend` by default). The results files are rewritten after
    each case; ``run.complete`` is set when every case has run.
    """
    progress = progress or NullProgress()
    host = host or (backend if backend.name == "cpu" else CpuBackend())
    folder = folder if folder is not None else new_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    run = BenchRun(folder, plan, env if env is not None else environment(backend))
    cases = plan.cases()
    progress.start(len(cases), folder)
    with tempfile.TemporaryDirectory(prefix="mmd-bench-") if plan.through_files else nullcontext() as tmp:
        runner = _Runner(plan, backend, host, Path(tmp) if tmp else None)
        for index, case in enumerate(cases):
            progress.begin(index, case)
            row = runner.run(case)
            run.rows.append(row)
            write_results(run)
            progress.done(index, case, row)
            if on_case is not None:
                on_case(row)
    run.complete = True
    write_results(run)
    progress.finish(run)
    return run
