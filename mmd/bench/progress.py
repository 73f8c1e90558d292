"""What ``mmd bench`` shows while it runs: one line per finished case, under rich's bar on a terminal."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Protocol, TextIO

from .. import kernels as registry
from .. import progress
from .plan import Case
from .results import BenchRun
from .rows import AccuracyRow, BenchRow


class ProgressSink(Protocol):
    """What the loop tells whoever watches it."""

    def start(self, total: int, folder: Path) -> None: ...
    def begin(self, index: int, case: Case) -> None: ...
    def done(self, index: int, case: Case, row: BenchRow) -> None: ...
    def accuracy(self, row: AccuracyRow) -> None: ...
    def finish(self, run: BenchRun) -> None: ...


class NullProgress:
    """Shows nothing."""

    def start(self, total: int, folder: Path) -> None:
        pass

    def begin(self, index: int, case: Case) -> None:
        pass

    def done(self, index: int, case: Case, row: BenchRow) -> None:
        pass

    def accuracy(self, row: AccuracyRow) -> None:
        pass

    def finish(self, run: BenchRun) -> None:
        pass


def describe_row(row: BenchRow) -> str:
    """One line for a finished case."""
    tile = f"t{row.tile}" if row.tile is not None else "-"
    shape = f"{row.m}x{row.k}x{row.n}"
    width = max(map(len, registry.NAMES))
    head = f"{row.kernel:<{width}} {tile:>4} {shape:<14}"
    kernel_ms, overall_ms = row.median("kernel"), row.median("overall")
    if row.status == "ok" and kernel_ms is not None and overall_ms is not None:
        kernel = f"kernel {kernel_ms:.3f} ms"
        if row.kernel_noise is not None:
            kernel += f" ±{row.kernel_noise:.1%}"
        parts = [kernel]
        cuda_ms = row.median("cuda")
        if cuda_ms is not None:
            parts.append(f"cuda {cuda_ms:.3f} ms")
        parts.append(f"overall {overall_ms:.3f} ms")
        if row.gflops is not None:
            parts.append(f"{row.gflops:.1f} GFLOP/s")
        parts.append(
            f"{row.repeats} calls" + (" (the cap: noise still over --noise)" if row.converged is False else "")
        )
        if row.sm_clock_mhz is not None:
            parts.append(f"SM {row.sm_clock_mhz:.0f} MHz")
        line = f"{head}  ok       " + ", ".join(parts)
        line += f"  THROTTLED ({row.throttle_reasons})" if row.throttled else ""
        return line + (f"  BUSY ({row.busy_reasons.replace(',', ', ')})" if row.busy and row.busy_reasons else "")
    label = "WRONG" if row.status == "wrong" else row.status
    return f"{head}  {label:<8} {row.reason or ''}"


def describe_accuracy(row: AccuracyRow) -> str:
    """One line for an accuracy measurement."""
    width = max(map(len, registry.NAMES))
    head = f"accuracy {row.kernel:<{width}} {row.m}x{row.k}x{row.n:<6}"
    if row.status != "ok" or row.max_rel_error is None or row.rms_rel_error is None:
        return f"{head} {row.status} {row.reason or ''}"
    fp32 = "within" if row.within_fp32_tolerance else "outside"
    return f"{head} max rel {row.max_rel_error:.2e}, rms rel {row.rms_rel_error:.2e} ({fp32} fp32's tolerance)"


class Progress:
    """Plain lines, one per case, where the stream is not a terminal; on a terminal, rich's bar
    (:mod:`mmd.progress`) below them, each finished case printed above it, so that no result is overwritten.
    ``tty``: whether to draw the bar (default: whether the stream is a terminal); ``width``: the terminal's
    columns where the stream cannot say (tests)."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None, width: int | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = progress.on_terminal(self.stream) if tty is None else tty
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
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

            columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"))
            self._bar = progress.bar(*columns, stream=self.stream, width=self.width)
            self._bar.start()
            self._task = self._bar.add_task("", total=total)

    def begin(self, index: int, case: Case) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=case.label())

    def done(self, index: int, case: Case, row: BenchRow) -> None:
        self._line(f"[{index + 1:>{len(str(self.total))}}/{self.total}] {describe_row(row)}")
        if self._bar is not None:
            self._bar.advance(self._task)

    def accuracy(self, row: AccuracyRow) -> None:
        self._line(describe_accuracy(row))

    def finish(self, run: BenchRun) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        counts = ", ".join(f"{n} {s}" for s, n in run.counts().items() if n)
        self._write(f"mmd bench: {counts} in {time.monotonic() - self.t0:.1f} s\n")
        busy = [row for row in run.rows if row.busy]
        if busy:
            self._write(
                f"mmd bench: warning: {len(busy)} cases ran on a busy machine (BUSY above: the load, or other "
                f"processes on the GPU): their times are not the kernels' alone; run again on a quiet machine\n"
            )
