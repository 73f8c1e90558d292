"""The benchmark loop: run a plan of cases, check each result once, time every phase, write CSV and YAML.

A *case* is one kernel at one shape and one tile. For each case the inputs
are random (seeded by the shape, so every kernel multiplies the same
matrices), the first call's result is checked against the float64 product,
``warmup`` calls are thrown away and then calls are measured; every phase
gets its median, min and max (``compile``, which happens once per kernel and
tile and so usually in the warm-up, is kept from whichever call built the
kernel). A case ends in one of these statuses:

``ok``
    checked and timed.
``wrong``
    the result is outside its tolerance (fp32's, or TF32's for the kernels the
    registry marks ``tf32``); not timed, and the run fails
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
phases, emit, write and overall; it makes exactly ``repeats`` timed calls.

In memory the timing follows nvbench: the L2 cache is flushed between the
copies and the kernel of every call (``flush_l2``), calls go on from
``repeats`` until the kernel median's noise (:func:`median_noise`) is under
``noise`` or ``max_repeats`` calls are made, and the SM clock is sampled
while they run (:class:`ClockWatch`), so a throttled case is flagged.

Results are rewritten after every case, so an interrupted run keeps what it
measured: ``<out>/<timestamp>/results.csv`` (one row per case) and
``results.yaml`` (the same rows, the plan and the environment).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import functools
import importlib.metadata
import io
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
import yaml

from . import __version__, textformat
from . import kernels as registry
from .atomic import write_atomic
from .backends.base import CUDA_PHASES, Backend, MultiplyRequest
from .backends.cpu import CpuBackend
from .check import compare as tally
from .check import full as verify
from .check import tolerance
from .check.full import reference
from .config import MEMORY_MODES, Settings
from .errors import MmdError
from .generate import input_chunks, random_matrix
from .job import describe
from .pipeline import run_job
from .record import TIMING_KEYS, TimingRecord

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
    # -- the timing's rigor (added after the course's columns, which keep their places)
    "kernel_noise",
    "overall_noise",
    "converged",
    "sm_clock_mhz",
    "throttled",
    "throttle_reasons",
)

#: Noise at which the bench stops repeating a case in memory (``--noise``): 2 % of the median.
NOISE = 0.02
#: Timed calls at most per case in memory (``--max-repeats``).
MAX_REPEATS = 100
#: Confidence of the interval behind :func:`median_noise`.
NOISE_CONFIDENCE = 0.95

#: The accuracy sweep (``--accuracy``): M = N = ACCURACY_MN, K = 32, 64, ..., 8192.
ACCURACY_KS: tuple[int, ...] = tuple(32 * 2**i for i in range(9))
ACCURACY_MN = 1024
#: Kernels the sweep measures beside the chosen ones on a GPU backend: cuBLAS in both modes.
ACCURACY_REFERENCES: tuple[str, ...] = ("cublas", "cublas_tf32")
#: Columns of accuracy.csv, in order.
ACCURACY_COLUMNS: tuple[str, ...] = (
    "kernel",
    "backend",
    "tile",
    "m",
    "k",
    "n",
    "status",
    "reason",
    "max_rel_error",
    "rms_rel_error",
    "max_abs_error",
    "within_fp32_tolerance",
    "device",
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
    #: In memory: stop once the kernel median's noise is below this (a fraction: 0.02 = 2 %) ...
    noise: float = NOISE
    #: ... or after this many timed calls (never fewer than ``repeats``).
    max_repeats: int = MAX_REPEATS
    #: In memory: evict the L2 cache before each call's kernel phase (:attr:`MultiplyRequest.flush_l2`).
    flush_l2: bool = True
    #: After the timed cases, measure each kernel's error against float64 over K (:func:`run_accuracy`).
    accuracy: bool = False
    accuracy_mn: int = ACCURACY_MN
    accuracy_ks: tuple[int, ...] = ACCURACY_KS

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
        if self.max_repeats < 1 or not self.noise >= 0:
            raise ValueError("max_repeats must be at least 1 and noise at least 0")
        if self.accuracy_mn < 1 or not self.accuracy_ks or min(self.accuracy_ks) < 1:
            raise ValueError("the accuracy sweep's M = N and its K values must be positive")
        if self.memory not in MEMORY_MODES:
            raise ValueError(f"memory must be one of {', '.join(MEMORY_MODES)}, got {self.memory!r}")

    @property
    def mode(self) -> str:
        return "files" if self.through_files else "memory"

    @property
    def adaptive(self) -> bool:
        """Whether cases repeat until their noise is low (in memory; through files each job costs seconds)."""
        return not self.through_files

    @property
    def cap(self) -> int:
        """The most timed calls one case makes: ``max_repeats`` in memory (at least ``repeats``), else ``repeats``."""
        return max(self.repeats, self.max_repeats) if self.adaptive else self.repeats

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


#: The ladder's plan (``mmd bench --plan ladder``): the top of the fp32 road (``fast``), the tensor-core
#: rung (``tc1``, ``tc3``) and cuBLAS in both its modes, at the sizes where they differ. None takes a tile.
LADDER_KERNELS: tuple[str, ...] = ("fast", "tc1", "tc3", "cublas", "cublas_tf32")
LADDER_SIZES: tuple[int, ...] = (1024, 2048, 4096, 8192)

#: The named plans' kernels, sizes and tiles; any of them may be changed (``--kernels``, ``--sizes`` ...).
PLANS: dict[str, dict[str, Any]] = {
    "course": dict(
        kernels=registry.COURSE_KERNELS,
        sizes=COURSE_SIZES,
        tiles=COURSE_TILES,
        sizes_at_tile=COURSE_SIZES_AT_TILE,
        tiles_at_size=COURSE_TILES_AT_SIZE,
    ),
    "ladder": dict(
        kernels=LADDER_KERNELS,
        sizes=LADDER_SIZES,
        tiles=(COURSE_SIZES_AT_TILE,),
        sizes_at_tile=COURSE_SIZES_AT_TILE,
        tiles_at_size=None,
    ),
}


def named_plan(name: str, **changes: Any) -> Plan:
    """Plan ``name`` of :data:`PLANS` with ``changes`` (any :class:`Plan` field)."""
    return Plan(**{**PLANS[name], **changes})


def course_plan(**changes: Any) -> Plan:
    """The course's plan: sizes 32..4096 at tile 32, tiles 4..64 at 4096, the course's kernels."""
    return named_plan("course", **changes)


def ladder_plan(**changes: Any) -> Plan:
    """The ladder's plan: fast, tc1, tc3, cublas and cublas_tf32 at 1024, 2048, 4096 and 8192."""
    return named_plan("ladder", **changes)


def default_kernels(backend: Backend, plan: str = "course") -> tuple[str, ...]:
    """Plan ``plan``'s kernels on a GPU backend (the course's: :data:`mmd.kernels.COURSE_KERNELS`);
    on the cpu backend only ``cpu``, whatever the plan."""
    if backend.name == "cpu":
        return tuple(s.name for s in registry.REGISTRY.values() if s.kind == registry.HOST)
    kernels: tuple[str, ...] = PLANS[plan]["kernels"]
    return kernels


# -- progress ----------------------------------------------------------------


class ProgressSink(Protocol):
    """What the loop tells whoever watches it."""

    def start(self, total: int, folder: Path) -> None: ...
    def begin(self, index: int, case: Case) -> None: ...
    def done(self, index: int, case: Case, row: dict[str, Any]) -> None: ...
    def accuracy(self, row: dict[str, Any]) -> None: ...
    def finish(self, run: BenchRun) -> None: ...


class NullProgress:
    """Shows nothing."""

    def start(self, total: int, folder: Path) -> None:
        pass

    def begin(self, index: int, case: Case) -> None:
        pass

    def done(self, index: int, case: Case, row: dict[str, Any]) -> None:
        pass

    def accuracy(self, row: dict[str, Any]) -> None:
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
        kernel = f"kernel {row['kernel_median_ms']:.3f} ms"
        if row.get("kernel_noise") is not None:
            kernel += f" ±{row['kernel_noise']:.1%}"
        parts = [kernel]
        if row.get("cuda_median_ms") is not None:
            parts.append(f"cuda {row['cuda_median_ms']:.3f} ms")
        parts.append(f"overall {row['overall_median_ms']:.3f} ms")
        if row.get("gflops") is not None:
            parts.append(f"{row['gflops']:.1f} GFLOP/s")
        parts.append(
            f"{row['repeats']} calls"
            + (" (the cap: noise still over --noise)" if row.get("converged") is False else "")
        )
        if row.get("sm_clock_mhz") is not None:
            parts.append(f"SM {row['sm_clock_mhz']:.0f} MHz")
        line = f"{head}  ok       " + ", ".join(parts)
        return line + (f"  THROTTLED ({row['throttle_reasons']})" if row.get("throttled") else "")
    label = "WRONG" if status == "wrong" else status
    return f"{head}  {label:<8} {row.get('reason') or ''}"


def describe_accuracy(row: dict[str, Any]) -> str:
    """One line for an accuracy measurement."""
    width = max(map(len, registry.NAMES))
    head = f"accuracy {row['kernel']:<{width}} {row['m']}x{row['k']}x{row['n']:<6}"
    if row["status"] != "ok":
        return f"{head} {row['status']} {row.get('reason') or ''}"
    fp32 = "within" if row["within_fp32_tolerance"] else "outside"
    return f"{head} max rel {row['max_rel_error']:.2e}, rms rel {row['rms_rel_error']:.2e} ({fp32} fp32's tolerance)"


class Progress:
    """Plain lines, one per case, where the stream is not a terminal; on a terminal, rich's bar (the CLI's one
    progress library) kept to the terminal's width, each finished case printed above it, so that no result
    is overwritten. ``width``: the terminal's columns where the stream cannot say (tests)."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None, width: int | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.width = width
        self.total = 0
        self.t0 = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            self._write(text + "\n")

    def start(self, total: int, folder: Path) -> None:
        self.total, self.t0 = total, time.monotonic()
        self._write(f"mmd bench: {total} cases -> {folder}\n")
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            console = Console(file=self.stream, force_terminal=True, width=self.width)
            columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"))
            self._bar = Bar(*columns, console=console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("", total=total)

    def begin(self, index: int, case: Case) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=case.label())

    def done(self, index: int, case: Case, row: dict[str, Any]) -> None:
        self._line(f"[{index + 1:>{len(str(self.total))}}/{self.total}] {describe_row(row)}")
        if self._bar is not None:
            self._bar.advance(self._task)

    def accuracy(self, row: dict[str, Any]) -> None:
        self._line(describe_accuracy(row))

    def finish(self, run: BenchRun) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
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
    if env["cuda_version"] is None and backend.name == "cuda":
        # The installed toolkit stands in only where CUDA ran the numbers: beside the cpu backend it ran nothing.
        env["cuda_version"] = env.get("cuda_toolkit")
    return env


# -- the SM clock -------------------------------------------------------------


@dataclass(frozen=True)
class ClockSample:
    """One reading of the GPU's clocks (None: the field is not available)."""

    sm_mhz: float | None
    max_sm_mhz: float | None = None
    #: NVML's clock event ("throttle") reasons, a bit mask.
    reasons: int | None = None


class ClockReader(Protocol):
    """Reads the GPU's clocks now (None when it cannot)."""

    def read(self) -> ClockSample | None: ...


#: NVML's reasons that mean the GPU slowed itself down (power or heat). Idle (0x1), an
#: applications-clocks setting (0x2), sync boost (0x10) and the display clock (0x100) are not throttling.
THROTTLE_REASONS: dict[int, str] = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
#: A case whose SM clock dropped under this fraction of the maximum is throttled, reason or not.
LOW_CLOCK = 0.9


class NvidiaSmi:
    """The SM clock and throttle reasons of one GPU, from ``nvidia-smi --query-gpu`` (NVML underneath).

    Drivers since 535 call the reasons ``clocks_event_reasons``; older ones
    ``clocks_throttle_reasons``; the first query the driver answers is kept.
    ``device`` is nvidia-smi's index: :meth:`find` looks it up by PCI bus id,
    since CUDA's ordinals follow ``CUDA_VISIBLE_DEVICES`` and nvidia-smi's do not.
    """

    QUERIES: tuple[str, ...] = (
        "clocks.sm,clocks.max.sm,clocks_event_reasons.active",
        "clocks.sm,clocks.max.sm,clocks_throttle_reasons.active",
        "clocks.sm,clocks.max.sm",
    )

    def __init__(self, device: int, run: Callable[[Sequence[str]], str | None] | None = None) -> None:
        self.device = device
        self._run = run or _command_output
        self._queries = list(self.QUERIES)
        self._settled = False  # a query was answered: keep it, and take a failure for a failed reading

    @classmethod
    def find(
        cls, ordinal: int, pci_bus_id: str = "", run: Callable[[Sequence[str]], str | None] | None = None
    ) -> NvidiaSmi | None:
        """A reader for the GPU at ``pci_bus_id`` (else CUDA ``ordinal``), or None where there is no nvidia-smi."""
        run = run or _command_output
        listing = run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
        if listing is None:
            return None
        for line in listing.splitlines():
            index, _, bus = (part.strip() for part in line.partition(","))
            if pci_bus_id and index.isdigit() and _bus(bus) == _bus(pci_bus_id):
                return cls(int(index), run)
        return cls(ordinal, run)  # no bus id known (or not listed): the ordinal, right on one-GPU machines

    def read(self) -> ClockSample | None:
        while self._queries:
            out = self._run(
                [
                    "nvidia-smi",
                    f"--id={self.device}",
                    f"--query-gpu={self._queries[0]}",
                    "--format=csv,noheader,nounits",
                ]
            )
            sample = self.parse(out) if out else None
            if sample is not None or self._settled:
                self._settled = True
                return sample
            self._queries.pop(0)  # before any answer, a refusal means a field this driver does not know
        return None

    @staticmethod
    def parse(out: str) -> ClockSample | None:
        """``1980, 1980, 0x0000000000000000`` → a sample (None if the line is not that)."""
        fields = [f.strip() for f in out.strip().splitlines()[0].split(",")] if out.strip() else []
        if len(fields) < 2:
            return None

        def number(text: str) -> float | None:
            try:
                return float(text)
            except ValueError:  # "[N/A]", "[Not Supported]"
                return None

        reasons = None
        if len(fields) >= 3:
            try:
                reasons = int(fields[2], 16)
            except ValueError:
                reasons = None
        return ClockSample(number(fields[0]), number(fields[1]), reasons)


def _bus(bus_id: str) -> tuple[int, str]:
    """A PCI bus id comparable across spellings: CUDA writes ``0000:65:00.0``, nvidia-smi ``00000000:65:00.0``."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    try:
        return int(domain, 16), rest
    except ValueError:
        return -1, bus_id.strip().lower()


@dataclass
class ClockWatch:
    """Samples a :class:`ClockReader` in a thread while a case's timed calls run.

    One reading at the start and one at the end are taken in the caller's
    thread, so even a short case has two; between them one every
    ``interval`` seconds.
    """

    reader: ClockReader | None
    interval: float = 0.25
    samples: list[ClockSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> None:
        assert self.reader is not None
        try:
            found = self.reader.read()
        except Exception:  # a clock is a fact for the record, never a reason to stop a case
            found = None
        if found is not None:
            self.samples.append(found)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> ClockWatch:
        if self.reader is not None:
            self._sample()
            self._thread = threading.Thread(target=self._loop, name="mmd-bench-clock", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()

    def summary(self) -> dict[str, Any]:
        """``sm_clock_mhz`` (median), ``throttled`` and ``throttle_reasons`` for a row (None where unknown)."""
        clocks = [c.sm_mhz for c in self.samples if c.sm_mhz is not None]
        if not clocks:
            return {"sm_clock_mhz": None, "throttled": None, "throttle_reasons": None}
        names: list[str] = []
        mask = 0
        for c in self.samples:
            mask |= c.reasons or 0
        names += [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
        tops = [c.max_sm_mhz for c in self.samples if c.max_sm_mhz]
        if tops and min(clocks) < LOW_CLOCK * max(tops):
            names.append(f"sm_clock_{min(clocks):.0f}_of_{max(tops):.0f}_mhz")
        return {
            "sm_clock_mhz": round(statistics.median(clocks), 1),
            "throttled": bool(names),
            "throttle_reasons": ",".join(names) or None,
        }


# -- checking ---------------------------------------------------------------


@dataclass
class _Inputs:
    """One shape's inputs and what results are checked against."""

    a: np.ndarray
    b: np.ndarray
    ref: np.ndarray
    allowed: np.ndarray  # fp32's tolerance
    text: Path | None = None  # the input file (files mode), written on first use
    _tf32: np.ndarray | None = None

    def allowed_for(self, precision: str) -> np.ndarray:
        """The elementwise tolerance for a kernel of ``precision`` (TF32's made on first use)."""
        if precision != "tf32":
            return self.allowed
        if self._tf32 is None:
            self._tf32 = verify.tf32_tolerance(self.allowed, self.a.shape[1])
        return self._tf32


def make_inputs(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The case's A and B: random, never zero, the same for every kernel at this shape."""
    rng = np.random.default_rng([seed, m, k, n])
    return random_matrix(rng, m, k), random_matrix(rng, k, n)


def check_product(c: np.ndarray, ref: np.ndarray, allowed: np.ndarray | float, tolerance: str) -> tally.CheckReport:
    """Compare ``c`` elementwise with the float64 ``ref`` under ``allowed``."""
    if c.shape != ref.shape:
        return tally.CheckReport(False, tuple(c.shape), c.size, float("inf"), None, float("inf"), tolerance)
    diff = c.astype(np.float64) - ref
    err = np.abs(diff)
    excess = err - allowed
    bad = (excess > 0) | ~np.isfinite(c)
    worst = np.unravel_index(int(np.argmax(np.where(np.isfinite(excess), excess, np.inf))), excess.shape)
    norm = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(diff)) / norm if norm else float(np.linalg.norm(diff))
    return tally.CheckReport(
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


@functools.cache
def _median_rank(n: int, confidence: float = NOISE_CONFIDENCE) -> int:
    """The 0-based rank j such that [x_(j), x_(n-1-j)] of n sorted samples holds the median at ``confidence``.

    Distribution-free: the number of samples below the true median is
    Binomial(n, 1/2), so the interval misses it with probability
    2·P(B ≤ j). j is the largest rank keeping that within 1 − confidence;
    with 5 samples or fewer no rank does (2·2^-5 > 5 %) and the whole range
    stands in (87.5 % at 4 samples, 94 % at 5).
    """
    tail = (1.0 - confidence) / 2.0
    j, below = 0, 0.0
    for i in range(n // 2):
        below += math.comb(n, i) / 2.0**n
        if below > tail:
            break
        j = i
    return j


def median_noise(values: Sequence[float]) -> float | None:
    """How well the median of ``values`` is known: half the width of its 95 % confidence interval, over it.

    nvbench and friends stop on the samples' relative spread, which does not
    shrink with more samples; the median's interval does (as 1/√n), so
    "repeat until the noise is under 2 %" ends for any steady distribution,
    and a noisy start (a cold clock, a neighbour's job) drops out of the
    interval as samples come. None without samples; 0 for one sample.
    """
    if not values:
        return None
    xs = sorted(values)
    med = statistics.median(xs)
    j = _median_rank(len(xs))
    width = xs[len(xs) - 1 - j] - xs[j]
    if med <= 0:
        return 0.0 if width == 0 else math.inf
    return width / (2.0 * med)


def _noise_of(samples: list[dict[str, float]], phase: str) -> float | None:
    """:func:`median_noise` of one phase over the samples, to 4 significant digits."""
    noise = median_noise([s[phase] for s in samples if s.get(phase) is not None])
    return None if noise is None else float(f"{noise:.4g}")


def _settled(samples: list[dict[str, float]], target: float) -> bool:
    """Whether the kernel median is known well enough: its noise under ``target`` (the kernel phase is
    the one GFLOP/s and every comparison rest on)."""
    noise = median_noise([s["kernel"] for s in samples if s.get("kernel") is not None])
    return noise is not None and noise < target


def _compile_of(timings: dict[str, float]) -> list[float]:
    return [timings["compile"]] if "compile" in timings else []


def _with_cuda(timings: dict[str, float]) -> dict[str, float]:
    out = {k: float(v) for k, v in timings.items() if v is not None}
    if "cuda" not in out and all(p in out for p in CUDA_PHASES):
        out["cuda"] = sum(out[p] for p in CUDA_PHASES)
    return out


class _Runner:
    """Runs cases on a backend (and the host backend for ``cpu``) in one mode."""

    def __init__(
        self, plan: Plan, backend: Backend, host: Backend, workdir: Path | None, clock: ClockReader | None = None
    ) -> None:
        self.plan = plan
        self.backend = backend
        self.host = host
        self.workdir = workdir
        self.clock = clock
        self._inputs: tuple[tuple[int, int, int], _Inputs] | None = None

    def inputs(self, case: Case) -> _Inputs:
        if self._inputs is None or self._inputs[0] != case.shape:
            self._inputs = None  # free the previous shape's arrays first
            a, b = make_inputs(case.m, case.k, case.n, self.plan.seed)
            self._inputs = (case.shape, _Inputs(a, b, reference(a, b), verify.fp32_tolerance(a, b)))
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
            kernel=case.kernel,
            tile=case.tile or plan.sizes_at_tile,
            memory=plan.memory,
            text_path=plan.text_path,
            flush_l2=plan.flush_l2 and not plan.through_files,  # warm-ups too: they run as the timed calls do
        )
        inputs = self.inputs(case)
        samples: list[dict[str, float]] = []
        compiles: list[float] = []  # a kernel is built once, usually in the warm-up: keep that time
        watch = ClockWatch(self.clock if spec.on_gpu else None)
        try:
            for i in range(plan.warmup):
                compiles += _compile_of(self._call(backend, request, inputs, check=i == 0, row=row))
            with watch:
                while len(samples) < plan.cap:
                    timings = self._call(backend, request, inputs, check=not plan.warmup and not samples, row=row)
                    compiles += _compile_of(timings)
                    samples.append(timings)
                    if plan.adaptive and len(samples) >= plan.repeats and _settled(samples, plan.noise):
                        break
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
        noise = {phase: _noise_of(samples, phase) for phase in ("kernel", "overall")}
        row.update(kernel_noise=noise["kernel"], overall_noise=noise["overall"])
        if plan.adaptive and noise["kernel"] is not None:
            row["converged"] = _settled(samples, plan.noise)  # the loop's own test, not the rounded figure
        row.update(watch.summary())
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
                precision = registry.get(request.kernel).precision
                report = check_product(
                    printed,
                    inputs.ref,
                    tolerance.PRINT_HALF_UNIT + inputs.allowed_for(precision),
                    "0.005 + " + verify.TOLERANCES[precision],
                )
                if not report.ok:
                    raise _Wrong(report.summary())
            return {k: v for k, v in dataclasses.asdict(result.record.timings_ms).items() if v is not None}
        finally:
            for path in (output, result.sidecar):
                path.unlink(missing_ok=True)

    def _check(self, c: np.ndarray, inputs: _Inputs, row: dict[str, Any]) -> None:
        precision = registry.get(row["kernel"]).precision
        report = check_product(c, inputs.ref, inputs.allowed_for(precision), verify.TOLERANCES[precision])
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
    #: The accuracy sweep's rows (``plan.accuracy``), in :data:`ACCURACY_COLUMNS`.
    accuracy: list[dict[str, Any]] = field(default_factory=list)

    @property
    def csv_path(self) -> Path:
        return self.folder / "results.csv"

    @property
    def yaml_path(self) -> Path:
        return self.folder / "results.yaml"

    @property
    def accuracy_csv_path(self) -> Path:
        return self.folder / "accuracy.csv"

    @property
    def accuracy_yaml_path(self) -> Path:
        return self.folder / "accuracy.yaml"

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for r in self.rows if r["status"] == s) for s in STATUSES}

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Rows that fail the run (wrong results, errors)."""
        return [r for r in self.rows if r["status"] in FAILING]

    @property
    def ok(self) -> bool:
        return self.complete and not self.failures


def rows_to_csv(rows: Iterable[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    """The rows as CSV text with ``columns`` (:data:`COLUMNS`; None as an empty field)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in columns})
    return buf.getvalue()


def _write_table(run: BenchRun, csv_path: Path, yaml_path: Path, columns: Sequence[str], rows: list[Any]) -> None:
    write_atomic(csv_path, [rows_to_csv(rows, columns).encode()], durable=False)
    document = {
        "complete": run.complete,
        "environment": run.environment,
        "plan": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(run.plan).items()},
        "columns": list(columns),
        "rows": [{k: row.get(k) for k in columns} for row in rows],
    }
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True)
    write_atomic(yaml_path, [text.encode()], durable=False)


def write_results(run: BenchRun) -> None:
    """(Re)write results.csv and results.yaml atomically, and accuracy.csv/yaml once the sweep has rows."""
    _write_table(run, run.csv_path, run.yaml_path, COLUMNS, run.rows)
    if run.accuracy:
        _write_table(run, run.accuracy_csv_path, run.accuracy_yaml_path, ACCURACY_COLUMNS, run.accuracy)


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
    clock: ClockReader | None = None,
) -> BenchRun:
    """Run every case of ``plan``; results go to ``folder`` (default: a new ``out/<timestamp>``).

    GPU kernels run on ``backend``; the ``cpu`` kernel runs on ``host`` (a
    :class:`CpuBackend` by default). ``clock`` reads the GPU's SM clock during
    each GPU case (:class:`NvidiaSmi`; None: not recorded). The results files
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
        runner = _Runner(plan, backend, host, Path(tmp) if tmp else None, clock)
        for index, case in enumerate(cases):
            progress.begin(index, case)
            row = runner.run(case)
            run.rows.append(row)
            write_results(run)
            progress.done(index, case, row)
            if on_case is not None:
                on_case(row)
        if plan.accuracy:
            for accuracy_row in run_accuracy(plan, backend, host, progress=progress):
                run.accuracy.append(accuracy_row)
                write_results(run)
    run.complete = True
    write_results(run)
    progress.finish(run)
    return run


# -- the accuracy sweep ------------------------------------------------------------


def accuracy_inputs(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The sweep's A and B: uniform in [−1, 1] (the usual GEMM accuracy test), seeded by the shape."""
    rng = np.random.default_rng([seed, m, k, n, 1])  # 1: not the timed cases' stream
    return (
        rng.uniform(-1.0, 1.0, (m, k)).astype(np.float32),
        rng.uniform(-1.0, 1.0, (k, n)).astype(np.float32),
    )


def accuracy_kernels(plan: Plan, backend: Backend) -> tuple[str, ...]:
    """The plan's kernels and, on a GPU backend, :data:`ACCURACY_REFERENCES`, in registry order."""
    names = set(plan.kernels) | (set(ACCURACY_REFERENCES) if backend.name != "cpu" else set())
    return tuple(n for n in registry.NAMES if n in names)


def error_stats(c: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """``max_rel_error`` = max|C − ref| / max|ref|, ``rms_rel_error`` = ‖C − ref‖ / ‖ref‖, ``max_abs_error``.

    Both relative errors are normalised by the whole product, not element by
    element: an element near zero would otherwise stand for the kernel.
    """
    diff = c.astype(np.float64) - ref
    top, norm = float(np.abs(ref).max()), float(np.linalg.norm(ref))
    worst = float(np.abs(diff).max())
    return {
        "max_rel_error": float(f"{worst / top if top else worst:.4g}"),
        "rms_rel_error": float(f"{float(np.linalg.norm(diff)) / norm if norm else 0.0:.4g}"),
        "max_abs_error": float(f"{worst:.4g}"),
    }


def run_accuracy(
    plan: Plan, backend: Backend, host: Backend, progress: ProgressSink | None = None
) -> Iterator[dict[str, Any]]:
    """Each kernel's error against float64 at M = N = ``plan.accuracy_mn`` for every K of ``plan.accuracy_ks``.

    Yields one row per kernel and K (:data:`ACCURACY_COLUMNS`). A kernel's
    first call at a shape compiles or warms it up; the product is a product
    all the same, so one call is enough. ``within_fp32_tolerance``: every
    element within fp32's tolerance (:func:`mmd.verify.fp32_tolerance`), the
    bar a fp32-class kernel is held to; TF32 kernels are expected to miss it.
    """
    runner = _Runner(plan, backend, host, None)
    kernels = accuracy_kernels(plan, backend)
    mn = plan.accuracy_mn
    for k in plan.accuracy_ks:
        a, b = accuracy_inputs(mn, k, mn, plan.seed)
        ref = reference(a, b)
        allowed = verify.fp32_tolerance(a, b)
        for name in kernels:
            spec = registry.get(name)
            case = Case(name, mn, k, mn, plan.sizes_at_tile if spec.uses_tile else None)
            use = runner.backend_for(case)
            row: dict[str, Any] = {c: None for c in ACCURACY_COLUMNS}
            row.update(kernel=name, backend=use.name, tile=case.tile, m=mn, k=k, n=mn, status="ok")
            row["device"] = use.device_name()
            if spec.on_gpu and use.name == "cpu":
                row.update(status="skipped", reason=f"{name} needs a GPU backend; this run has the cpu backend")
            else:
                request = MultiplyRequest(kernel=name, tile=case.tile or plan.sizes_at_tile, memory=plan.memory)
                _measure_accuracy(row, use, request, a, b, ref, allowed)
            if progress is not None:
                progress.accuracy(row)
            yield row


def _measure_accuracy(
    row: dict[str, Any],
    backend: Backend,
    request: MultiplyRequest,
    a: np.ndarray,
    b: np.ndarray,
    ref: np.ndarray,
    allowed: np.ndarray,
) -> None:
    try:
        c = backend.multiply(a, b, request).c
    except MmdError as exc:
        row.update(status="refused", reason=exc.reason)
    except Exception as exc:  # a bug must not cost the rest of the sweep
        row.update(status="error", reason=f"{type(exc).__name__}: {exc}")
        traceback.print_exc(file=sys.stderr)
    else:
        row.update(error_stats(c, ref))
        row["within_fp32_tolerance"] = check_product(c, ref, allowed, "").ok
