"""A benchmark's rows as typed records: one dataclass per file, the one definition of its columns.

:class:`BenchRow` is a line of ``results.csv`` (and an entry of
``results.yaml``'s ``rows``), :class:`AccuracyRow` one of ``accuracy.csv``.
The runner makes them, :func:`to_csv` and :func:`to_cells` write them, the
report reads them back with :func:`from_cells`, and the column tables of
docs/bench.md are generated from the fields' docs (``python -m mmd.bench``;
a test keeps them current), as :mod:`mmd.record` does for the sidecar.

A field may be missing from a file: files written before a column existed
(docs/results/course has no timing-rigor columns) read it as None.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from ..atomic import write_atomic
from ..record import TIMING_KEYS

#: Every phase, in the order they happen (the sidecar's timing keys).
PHASES: tuple[str, ...] = TIMING_KEYS

STATUSES: tuple[str, ...] = ("ok", "wrong", "refused", "skipped", "error")
#: Statuses that fail the run.
FAILING: frozenset[str] = frozenset({"wrong", "error"})


def _doc(text: str, *, phases: type | None = None) -> dict[str, Any]:
    """Field metadata: ``doc`` for the docs' table; ``phases``: the field is a map by phase of that record
    (:class:`Spread`, :class:`Quartiles`), written as one column per phase and statistic (``kernel_median_ms``
    ...)."""
    return {"doc": text, "phases": phases}


@dataclass(frozen=True)
class Spread:
    """One phase over a case's timed calls, in ms."""

    median: float
    min: float
    max: float


@dataclass(frozen=True)
class Quartiles:
    """One phase's first and third quartiles over a case's timed calls, in ms: the interquartile range, which
    the report draws around the median (one slow call stretches the min–max, not this)."""

    q1: float
    q3: float


def stats_of(record: type) -> tuple[str, ...]:
    """The statistics a phases field's record holds, in column order (``median``, ``min``, ``max``)."""
    return tuple(f.name for f in dataclasses.fields(record))


@dataclass(frozen=True, kw_only=True)
class BenchRow:
    """One case of ``mmd bench`` (or, in the report, the pooled sidecars of one case)."""

    kernel: str | None = field(
        metadata=_doc("registry name, or a kernel file's name (`p1.cu`; null: a refused job that named none)")
    )
    backend: str | None = field(default=None, metadata=_doc("`cuda`, `cpu`, ... — where it ran"))
    tile: int | None = field(default=None, metadata=_doc("the tile, empty for kernels that take none"))
    m: int | None = field(default=None, metadata=_doc("A is m×k"))
    k: int | None = field(default=None, metadata=_doc("B is k×n"))
    n: int | None = field(default=None, metadata=_doc("C is m×n"))
    memory: str | None = field(default=None, metadata=_doc("device memory mode (empty on the CPU)"))
    mode: str = field(default="memory", metadata=_doc("`memory` or `files`"))
    text_path: str | None = field(
        default=None,
        metadata=_doc("`files` mode: where the text was parsed and formatted, `host` or `gpu` (setting `text_path`)"),
    )
    status: str = field(default="ok", metadata=_doc("ok, wrong, refused, skipped or error (see above)"))
    reason: str | None = field(default=None, metadata=_doc("why, for any status but ok"))
    repeats: int = field(default=0, metadata=_doc("timed calls made (in a sidecar folder: jobs pooled)"))
    warmup: int = field(default=0, metadata=_doc("untimed calls asked for"))
    device: str | None = field(default=None, metadata=_doc("the device's name"))
    max_abs_error: float | None = field(default=None, metadata=_doc("max\\|C − ref\\| of the correctness check"))
    rel_error: float | None = field(default=None, metadata=_doc("‖C − ref‖ / ‖ref‖ of the correctness check"))
    phases: Mapping[str, Spread] = field(
        default_factory=dict,
        metadata=_doc("over the timed calls, for each phase below (empty: a phase this case has not)", phases=Spread),
    )
    gflops: float | None = field(default=None, metadata=_doc("2·m·k·n / median kernel time"))
    # -- the timing's rigor: after the course's columns, which keep their places
    kernel_noise: float | None = field(
        default=None,
        metadata=_doc(
            "how well the kernel median is known: half its 95 % confidence interval over it (0.013 = ±1.3 %)"
        ),
    )
    overall_noise: float | None = field(default=None, metadata=_doc("the same for the overall median"))
    converged: bool | None = field(
        default=None,
        metadata=_doc("in memory: the kernel's noise got under `--noise` before `--max-repeats`; empty through files"),
    )
    sm_clock_mhz: float | None = field(
        default=None,
        metadata=_doc(
            "the SM clock during the timed calls (median of NVML's readings); empty without NVML or on the host"
        ),
    )
    throttled: bool | None = field(default=None, metadata=_doc("whether the GPU slowed itself during the case"))
    throttle_reasons: str | None = field(default=None, metadata=_doc('why (see "Timing rigor")'))
    load_avg: float | None = field(
        default=None, metadata=_doc("the machine's 1-minute load average, the highest read during the timed calls")
    )
    gpu_processes: int | None = field(
        default=None,
        metadata=_doc(
            "processes with a context on the GPU (this one's, and a kernel file's launch process, included), the "
            "most read; empty on the host"
        ),
    )
    busy: bool | None = field(
        default=None, metadata=_doc("whether the case ran on a busy machine, its times not the kernel's alone")
    )
    busy_reasons: str | None = field(default=None, metadata=_doc('why (see "Timing rigor")'))
    quartiles: Mapping[str, Quartiles] = field(
        default_factory=dict,
        metadata=_doc(
            "first and third quartiles over the timed calls, for each phase (the report's error bars)",
            phases=Quartiles,
        ),
    )
    kernel_file: str | None = field(
        default=None,
        metadata=_doc("where `kernel` is a kernel file (`--kernel-file`): its path as given; empty for mmd's own"),
    )
    kernel_sha256: str | None = field(
        default=None, metadata=_doc("the sha256 of that file's bytes, as its jobs' sidecars record it (`kernel_file`)")
    )

    def spread(self, phase: str) -> Spread | None:
        """``phase`` over the timed calls, None where the case has no such phase."""
        return self.phases.get(phase)

    def median(self, phase: str) -> float | None:
        """``phase``'s median in ms, None where the case has no such phase."""
        spread = self.phases.get(phase)
        return None if spread is None else spread.median

    @property
    def size(self) -> int | None:
        """N for an N×N×N case; None for other shapes (not graphed)."""
        return self.m if self.m is not None and self.m == self.k == self.n else None

    @property
    def key(self) -> tuple[Any, ...]:
        """What makes two rows of two runs the same case: kernel, tile, m, k, n, memory, mode (a kernel file by its
        name: two runs compare its versions)."""
        return (self.kernel, self.tile, self.m, self.k, self.n, self.memory, self.mode)


@dataclass(frozen=True, kw_only=True)
class AccuracyRow:
    """One kernel at one K of the accuracy sweep (``mmd bench --accuracy``)."""

    kernel: str = field(metadata=_doc("registry name"))
    backend: str = field(metadata=_doc("where it ran"))
    tile: int | None = field(default=None, metadata=_doc("the tile, empty for kernels that take none"))
    m: int = field(metadata=_doc("M (`--accuracy-mn`)"))
    k: int = field(metadata=_doc("K, the inner dimension"))
    n: int = field(metadata=_doc("N (`--accuracy-mn`)"))
    status: str = field(default="ok", metadata=_doc("`ok`, or `refused` / `skipped` / `error` with the reason"))
    reason: str | None = field(default=None, metadata=_doc("why, for any status but ok"))
    max_rel_error: float | None = field(default=None, metadata=_doc("max\\|C − ref\\| / max\\|ref\\|"))
    rms_rel_error: float | None = field(default=None, metadata=_doc("‖C − ref‖ / ‖ref‖ (Frobenius)"))
    max_abs_error: float | None = field(default=None, metadata=_doc("max\\|C − ref\\|"))
    within_fp32_tolerance: bool | None = field(
        default=None,
        metadata=_doc(
            "every element within fp32's tolerance (the timed cases' check): the bar of an fp32-class kernel "
            "(`tc3`'s target); TF32 kernels are expected to miss it"
        ),
    )
    device: str | None = field(default=None, metadata=_doc("the device's name"))


Row = BenchRow | AccuracyRow
RowType = type[BenchRow] | type[AccuracyRow]


def phase_column(phase: str, stat: str) -> str:
    """``kernel``, ``median`` → ``kernel_median_ms``."""
    return f"{phase}_{stat}_ms"


def columns(cls: RowType) -> tuple[str, ...]:
    """The file's columns, in order: each field's name, a phases field as its phase columns."""
    out: list[str] = []
    for f in dataclasses.fields(cls):
        record = f.metadata.get("phases")
        if record is not None:
            out += [phase_column(p, s) for p in PHASES for s in stats_of(record)]
        else:
            out.append(f.name)
    return tuple(out)


#: Columns of results.csv, in order.
COLUMNS: tuple[str, ...] = columns(BenchRow)
#: Columns of accuracy.csv, in order.
ACCURACY_COLUMNS: tuple[str, ...] = columns(AccuracyRow)


def to_cells(row: Row) -> dict[str, Any]:
    """Column → value (None where empty), every column of the row's file in order: a row of results.yaml."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(row):
        value = getattr(row, f.name)
        record = f.metadata.get("phases")
        if record is not None:
            for phase in PHASES:
                stats = value.get(phase)
                for stat in stats_of(record):
                    out[phase_column(phase, stat)] = None if stats is None else getattr(stats, stat)
        else:
            out[f.name] = value
    return out


def to_csv(cls: RowType, rows: Iterable[Row]) -> str:
    """The rows as CSV text under ``cls``'s columns (None as an empty field)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns(cls))
    for row in rows:
        writer.writerow(["" if v is None else v for v in to_cells(row).values()])
    return buf.getvalue()


# -- reading back ---------------------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(sys.modules[__name__]))


def _scalar_type(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _value(tp: Any, value: Any, where: str) -> Any:
    """A cell (CSV text or a YAML scalar) as ``tp``: int, float, bool or str; None where it is empty."""
    tp, nullable = _scalar_type(tp)
    if value is None or value == "":
        if nullable:
            return None
        raise ValueError(f"{where} is empty")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() not in ("true", "false"):
            raise ValueError(f"{where} is not true or false: {value!r}")
        return str(value).lower() == "true"
    if tp is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{where} is not an integer: {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"{where} is not a number: {value!r}")
        return float(value)
    return str(value)


def from_cells(cls: RowType, cells: Mapping[str, Any], where: str = "row") -> Any:
    """A row of ``cls`` from column → value (a CSV row's text or a YAML row's values); columns the file
    lacks are None. ValueError when a value does not fit its column."""
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        record = f.metadata.get("phases")
        if record is not None:
            names = stats_of(record)
            phases = {}
            for phase in PHASES:
                stats = [_value(float | None, cells.get(phase_column(phase, s)), f"{where}: {phase}") for s in names]
                if stats[0] is None:
                    continue
                if None in stats:
                    raise ValueError(f"{where}: {phase} has a {names[0]} but not its {' and '.join(names[1:])}")
                phases[phase] = record(*stats)
            values[f.name] = phases
        elif f.name in cells or f.default is dataclasses.MISSING:
            values[f.name] = _value(hints[f.name], cells.get(f.name), f"{where}: {f.name}")
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from None


# -- the docs' tables ------------------------------------------------------------------

#: Where each table goes in docs/bench.md: between these two lines.
BEGIN = "<!-- the {name} columns: generated by `python -m mmd.bench` from mmd/bench/rows.py -->"
END = "<!-- end of the {name} columns -->"


def markdown_table(cls: RowType) -> str:
    """The columns of ``cls``'s file with their meaning."""
    lines = ["| column | meaning |", "| --- | --- |"]
    for f in dataclasses.fields(cls):
        record = f.metadata.get("phases")
        name = ", ".join(f"`{phase_column('<phase>', s)}`" for s in stats_of(record)) if record else f"`{f.name}`"
        lines.append(f"| {name} | {f.metadata['doc']} |")
    return "\n".join(lines) + "\n"


TABLES: dict[str, RowType] = {"results.csv": BenchRow, "accuracy.csv": AccuracyRow}


def with_tables(text: str) -> str:
    """docs/bench.md's text with each generated table made anew between its marker lines."""
    for name, cls in TABLES.items():
        begin, end = BEGIN.format(name=name), END.format(name=name)
        head, found, rest = text.partition(begin + "\n")
        if not found or end not in rest:
            raise ValueError(f"no {begin!r} ... {end!r} block")
        text = head + begin + "\n\n" + markdown_table(cls) + "\n" + rest[rest.index(end) :]
    return text


def main(argv: list[str] | None = None) -> int:
    """Rewrite the column tables of docs/bench.md (run from the repository root)."""
    args = sys.argv[1:] if argv is None else argv
    doc = Path(args[0]) if args else Path("docs/bench.md")
    write_atomic(doc, [with_tables(doc.read_text(encoding="utf-8")).encode()], durable=False)
    return 0
