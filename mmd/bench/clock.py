"""What the machine did during a case: the GPU's SM clock, whether it throttled and how many processes used it
(NVML, read in a thread), and the machine's load; whether the case ran on a busy machine."""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..cpus import usable_cores


@dataclass(frozen=True)
class ClockSample:
    """One reading of the GPU (None: the field is not available)."""

    sm_mhz: float | None
    max_sm_mhz: float | None = None
    #: NVML's clock event ("throttle") reasons, a bit mask.
    reasons: int | None = None
    #: Processes with a context on the GPU, this benchmark's included.
    processes: int | None = None


class ClockReader(Protocol):
    """Reads the GPU now (None when it cannot)."""

    def read(self) -> ClockSample | None: ...


class NvmlLib(Protocol):
    """The part of NVML the benchmark calls, as nvidia-ml-py's ``pynvml`` module has it (tests/fakes.py has
    a fake)."""

    NVML_CLOCK_SM: int
    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> Any: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...


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
#: A case ran on a busy machine when the load average went over the cores this process may use plus this
#: (the runnable tasks beyond the benchmark's own thread: on the cpu backend numpy's threads fill the cores).
BUSY_LOAD_OVER_CORES = 1.0


def _pynvml() -> NvmlLib | None:
    """nvidia-ml-py's module (it loads the driver's library only when :meth:`NvmlLib.nvmlInit` is called)."""
    try:
        import pynvml
    except ImportError:
        return None
    lib: NvmlLib = pynvml
    return lib


class Nvml:
    """The SM clock, clock event reasons and compute processes of one GPU, through NVML: a library call each
    (nvidia-smi was a process of its own every 0.25 s, on the CPU the case shares). ``find`` looks the GPU up
    by PCI bus id, since CUDA's ordinals follow ``CUDA_VISIBLE_DEVICES`` and NVML's do not. A field the
    driver does not give (older drivers have no clock event reasons) reads None."""

    def __init__(self, lib: NvmlLib, handle: Any) -> None:
        self.lib = lib
        self.handle = handle

    @classmethod
    def find(cls, ordinal: int, pci_bus_id: str = "", lib: NvmlLib | None = None) -> Nvml | None:
        """A reader for the GPU at ``pci_bus_id`` (else CUDA ``ordinal``); None without NVML or its driver."""
        lib = lib if lib is not None else _pynvml()
        if lib is None:
            return None
        try:
            lib.nvmlInit()
        except lib.NVMLError:
            return None
        if pci_bus_id:
            try:
                return cls(lib, lib.nvmlDeviceGetHandleByPciBusId(pci_bus_id))
            except lib.NVMLError:
                pass  # not listed under that spelling: the ordinal, right on one-GPU machines
        try:
            return cls(lib, lib.nvmlDeviceGetHandleByIndex(ordinal))
        except lib.NVMLError:
            return None

    def _field(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self.lib.NVMLError:
            return None

    def read(self) -> ClockSample | None:
        lib, h = self.lib, self.handle
        sm = self._field(lambda: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM))
        top = self._field(lambda: lib.nvmlDeviceGetMaxClockInfo(h, lib.NVML_CLOCK_SM))
        reasons = self._field(lambda: lib.nvmlDeviceGetCurrentClocksEventReasons(h))
        processes = self._field(lambda: lib.nvmlDeviceGetComputeRunningProcesses(h))
        return ClockSample(
            None if sm is None else float(sm),
            None if top is None else float(top),
            reasons,
            None if processes is None else len(processes),
        )


def load_average() -> float:
    """The machine's load average over the last minute (runnable and waiting tasks)."""
    return os.getloadavg()[0]


@dataclass
class ClockSampler:
    """Reads the GPU (a :class:`ClockReader`, where the case runs on one) and the machine's load in a thread
    while a case's timed calls run.

    One reading at the start and one at the end are taken in the caller's
    thread, so even a short case has two; between them one every
    ``interval`` seconds.
    """

    reader: ClockReader | None
    interval: float = 0.25
    load: Callable[[], float] = load_average
    cores: int = field(default_factory=usable_cores)
    #: The benchmark's own processes on the GPU during the case: this one, and a kernel file's launch process
    #: beside it. More than these is another's.
    own_processes: int = 1
    samples: list[ClockSample] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> None:
        # the readings are facts for the record, never a reason to stop a case
        found: ClockSample | None = None
        if self.reader is not None:
            try:
                found = self.reader.read()
            except Exception:
                found = None
        if found is not None:
            self.samples.append(found)
        with contextlib.suppress(OSError):  # no load average on this system
            self.loads.append(self.load())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> ClockSampler:
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
        """A row's ``sm_clock_mhz`` (median), ``throttled``, ``throttle_reasons``, ``load_avg`` (the highest),
        ``gpu_processes`` (the most), ``busy`` and ``busy_reasons`` (None where unknown)."""
        return {**self._clock(), **self._busy()}

    def _clock(self) -> dict[str, Any]:
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

    def _busy(self) -> dict[str, Any]:
        load = round(max(self.loads), 2) if self.loads else None
        counts = [c.processes for c in self.samples if c.processes is not None]
        processes = max(counts) if counts else None
        reasons = []
        if load is not None and load > self.cores + BUSY_LOAD_OVER_CORES:
            reasons.append(f"load {load:g} on {self.cores} cores")
        if processes is not None and processes > self.own_processes:
            reasons.append(f"{processes} processes on the GPU")
        known = load is not None or processes is not None
        return {
            "load_avg": load,
            "gpu_processes": processes,
            "busy": bool(reasons) if known else None,
            "busy_reasons": ",".join(reasons) or None,
        }
