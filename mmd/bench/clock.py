"""The GPU's SM clock during a case: nvidia-smi's readings, sampled in a thread, and whether the GPU throttled."""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .machine import command_output


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
        self._run = run or command_output
        self._queries = list(self.QUERIES)
        self._settled = False  # a query was answered: keep it, and take a failure for a failed reading

    @classmethod
    def find(
        cls, ordinal: int, pci_bus_id: str = "", run: Callable[[Sequence[str]], str | None] | None = None
    ) -> NvidiaSmi | None:
        """A reader for the GPU at ``pci_bus_id`` (else CUDA ``ordinal``), or None where there is no nvidia-smi."""
        run = run or command_output
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
