"""The sidecar: what one job did, as a typed record written beside its output.

``<stem>.timing.yaml`` (:class:`TimingRecord`) when the job produced an
output, ``<stem>.error.yaml`` (:class:`ErrorRecord`) when it was refused. The
dataclasses below are the one definition of both, each field with its
meaning; the package's parts do one thing each with them:
:mod:`mmd.record.writer` writes a record's YAML, :mod:`mmd.record.reader`
reads a sidecar back into its record (the report, the daemon's recovery,
``mmd check``), and :mod:`mmd.record.published` generates the published JSON
Schema (``docs/sidecar.schema.json``) and field table (``docs/sidecar.md``)
from them (``python -m mmd.record.published docs``; a test keeps both
current).

Why a small converter of our own instead of a validation library: the
sidecar's types are a closed set (strings, numbers, booleans, null, lists of
strings, string-keyed maps and nested records), the daemon writes one per job
and its import must cost nothing; the tests validate every sidecar they write
against the generated schema with the ``jsonschema`` library.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from .. import __version__

TIMING_SUFFIX = ".timing.yaml"
ERROR_SUFFIX = ".error.yaml"


def _doc(text: str, *, omit: bool = False, flatten: bool = False) -> dict[str, Any]:
    """Field metadata: ``doc`` for the table and schema; ``omit``: left out when None; ``flatten``:
    a map whose entries sit beside the record's own fields."""
    return {"doc": text, "omit": omit, "flatten": flatten}


@dataclass(frozen=True)
class FileFacts:
    """A file the job read or wrote."""

    name: str = field(metadata=_doc("the file's name (the input's as claimed; the output's in the outbox)"))
    bytes: int | None = field(default=None, metadata=_doc("its size", omit=True))
    sha256: str | None = field(default=None, metadata=_doc("the sha256 of its bytes", omit=True))
    written: bool | None = field(
        default=None, metadata=_doc("false in an error record: no output was written", omit=True)
    )


@dataclass(frozen=True)
class Shape:
    """A is m×k, B is k×n, C is m×n."""

    m: int = field(metadata=_doc("rows of A and C"))
    k: int = field(metadata=_doc("columns of A, rows of B"))
    n: int = field(metadata=_doc("columns of B and C"))


@dataclass(frozen=True)
class Requested:
    """What the job asked for (the backend may run something else: the cpu runs numpy)."""

    kernel: str = field(metadata=_doc("kernel name"))
    tile: int = field(metadata=_doc("tile T: T×T threads per block"))
    memory: str = field(metadata=_doc("device memory mode"))


@dataclass(frozen=True)
class Timings:
    """Milliseconds per phase, in the order they happen (null: a phase this backend does not have)."""

    read: float | None = field(default=None, metadata=_doc("reading the input file"))
    parse: float | None = field(default=None, metadata=_doc("parsing the text into A and B"))
    compile: float | None = field(default=None, metadata=_doc("building or loading the kernel (first use)"))
    malloc: float | None = field(
        default=None, metadata=_doc("device allocations (CUDA events; from a worker's cache when notes say so)")
    )
    h2d: float | None = field(default=None, metadata=_doc("copies to the device"))
    kernel: float | None = field(default=None, metadata=_doc("the product itself"))
    d2h: float | None = field(default=None, metadata=_doc("copies from the device"))
    free: float | None = field(default=None, metadata=_doc("device frees (into a worker's cache when notes say so)"))
    cuda: float | None = field(
        default=None, metadata=_doc("malloc + h2d + kernel + d2h + free: the course's CUDA time")
    )
    emit: float | None = field(default=None, metadata=_doc("formatting the output text"))
    write: float | None = field(
        default=None, metadata=_doc("writing the output (synced after, with its sidecar, before either is renamed)")
    )
    overall: float | None = field(
        default=None, metadata=_doc("from the claim (or start) to the output written (its sync and rename follow)")
    )


#: Every timing key a sidecar carries, in order.
TIMING_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Timings))


def timings(values: Mapping[str, float | None]) -> Timings:
    """A :data:`Timings` from a phase → ms map (rounded to µs; other keys are ignored)."""
    return Timings(*[None if (v := values.get(k)) is None else round(v, 3) for k in TIMING_KEYS])


@dataclass(frozen=True)
class TextFacts:
    """Where the text was parsed and formatted (docs/textpath.md)."""

    path: str = field(metadata=_doc("host (the CPU parsed and formatted) or gpu"))
    parse_gpu: float | None = field(default=None, metadata=_doc("GPU parse, ms (CUDA events)", omit=True))
    emit_gpu: float | None = field(default=None, metadata=_doc("GPU formatting, ms (CUDA events)", omit=True))
    host_parse: bool | None = field(
        default=None, metadata=_doc("the GPU handed the parse to the host parser", omit=True)
    )
    exotic_runs: int | None = field(
        default=None, metadata=_doc("runs the host converted for the GPU parser", omit=True)
    )


@dataclass(frozen=True)
class KernelFileFacts:
    """The kernel file the job ran (``mmd run --kernel-file``)."""

    name: str = field(metadata=_doc("the kernel file's name"))
    sha256: str = field(metadata=_doc("the sha256 of its bytes"))
    entry: str = field(metadata=_doc("the __global__ function that ran"))
    signature: str = field(metadata=_doc("the signature mmd knew it by, or declared"))
    precision: str = field(metadata=_doc("the arithmetic its declaration says (fp32 unless it says tf32): mmd check's"))
    padded: Shape | None = field(
        default=None,
        metadata=_doc("the sizes it ran at, where mmd padded A and B to them (the output is cropped back)", omit=True),
    )


@dataclass(frozen=True)
class Collision:
    """The output name was taken: the job's output went to the next free version."""

    wanted: str = field(metadata=_doc("the name the output would have had"))
    existing: list[str] = field(metadata=_doc("the files that took it"))
    used: str = field(metadata=_doc("the name the output got"))


@dataclass(frozen=True)
class Context:
    """Facts about how the job came in (the daemon's; absent when not so)."""

    name_settings: dict[str, Any] | None = field(
        default=None, metadata=_doc("settings the file name gave (NAME@kernel=aplus.txt)", omit=True)
    )
    original_name: str | None = field(
        default=None, metadata=_doc("the inbox name, when the job was claimed under a safe one", omit=True)
    )
    collision: Collision | None = field(default=None, metadata=_doc("why the output has a version number", omit=True))
    resumed: bool | None = field(
        default=None, metadata=_doc("an earlier daemon claimed the job and was stopped", omit=True)
    )
    device_index: int | None = field(default=None, metadata=_doc("the GPU (worker) that ran it", omit=True))
    host: str | None = field(default=None, metadata=_doc("the host that ran it (shared inbox)", omit=True))
    submitter: str | None = field(
        default=None, metadata=_doc("who dropped the input: its owner's login (the uid where there is none)", omit=True)
    )


@dataclass(frozen=True)
class ErrorFacts:
    """Why the job was refused."""

    kind: str = field(
        metadata=_doc(
            "the kind of failure: input, limit, jobname, overflow, kernel, kernel-file, kernel-launch, tile, cuda, "
            "backend, output, spool, timeout, crashed, cancelled, internal"
        )
    )
    reason: str = field(metadata=_doc("one line for a person"))
    details: dict[str, Any] = field(
        default_factory=dict,
        metadata=_doc("facts that locate the fault (line, value, limits ...), beside kind and reason", flatten=True),
    )


@dataclass(frozen=True)
class TimingRecord:
    """``<stem>.timing.yaml``: the job produced its output."""

    job: str = field(metadata=_doc("job id (12 hex digits)"))
    input: FileFacts = field(metadata=_doc("the input file"))
    output: FileFacts = field(metadata=_doc("the output file"))
    shape: Shape = field(metadata=_doc("the product's shape"))
    backend: str = field(metadata=_doc("cpu or cuda"))
    kernel: str = field(metadata=_doc("the kernel that ran"))
    tile: int | None = field(metadata=_doc("its tile (null: the kernel takes none)"))
    memory: str | None = field(metadata=_doc("device memory mode (null on the cpu)"))
    device: str = field(metadata=_doc("the device, as its driver names it"))
    requested: Requested = field(metadata=_doc("what the job asked for"))
    timings_ms: Timings = field(metadata=_doc("milliseconds per phase"))
    text: TextFacts = field(metadata=_doc("how the text was handled"))
    gflops: float | None = field(metadata=_doc("2·m·k·n / kernel time"))
    notes: list[str] | None = field(
        default=None,
        metadata=_doc("remarks (a kernel the backend replaced, device memory from the worker's cache ...)", omit=True),
    )
    kernel_file: KernelFileFacts | None = field(
        default=None, metadata=_doc("the kernel file that ran, where one did (then kernel is its name)", omit=True)
    )
    turnaround_ms: float | None = field(
        default=None,
        metadata=_doc(
            "milliseconds from the input's arrival to this record's making (its sync and rename follow): the "
            "job's time as its user sees it, beside overall (from the claim); arrival is the daemon's first sight "
            "of the file (none for a job an earlier daemon had claimed), mmd run's start of the job",
            omit=True,
        ),
    )
    context: Context = field(default_factory=Context, metadata=_doc("how the job came in", flatten=True))
    mmd_version: str = field(default=__version__, metadata=_doc("the mmd that wrote it"))
    finished_at: str = field(default="", metadata=_doc("when the record was committed (UTC, ISO 8601)"))
    status: Literal["ok"] = field(default="ok", metadata=_doc("ok"))


@dataclass(frozen=True)
class ErrorRecord:
    """``<stem>.error.yaml``: the job was refused; no output was written."""

    job: str = field(metadata=_doc("job id (12 hex digits)"))
    input: FileFacts = field(metadata=_doc("the input file (size and hash when it was read)"))
    output: FileFacts = field(metadata=_doc("the output it would have had"))
    error: ErrorFacts = field(metadata=_doc("why it was refused"))
    shape: Shape | None = field(default=None, metadata=_doc("the product's shape, when the header was read", omit=True))
    backend: str | None = field(default=None, metadata=_doc("the backend, when one was opened", omit=True))
    requested: Requested | None = field(
        default=None, metadata=_doc("what the job asked for, when its settings were read", omit=True)
    )
    timings_ms: Timings = field(default_factory=lambda: Timings(), metadata=_doc("milliseconds per phase so far"))
    turnaround_ms: float | None = field(
        default=None, metadata=_doc("milliseconds from the input's arrival to this record's making", omit=True)
    )
    context: Context = field(default_factory=Context, metadata=_doc("how the job came in", flatten=True))
    mmd_version: str = field(default=__version__, metadata=_doc("the mmd that wrote it"))
    finished_at: str = field(default="", metadata=_doc("when the record was committed (UTC, ISO 8601)"))
    status: Literal["error"] = field(default="error", metadata=_doc("error"))


@dataclass(frozen=True)
class TileFacts:
    """One tile of the course's, as a hand-in runs at it."""

    tile: int = field(metadata=_doc("the tile"))
    runs: bool = field(
        metadata=_doc("whether jobs may run the kernel at it (it launches on every CUDA GPU, and built)")
    )
    detail: str = field(metadata=_doc("its block and what NVRTC built, or why it cannot run there"))


@dataclass(frozen=True)
class HandInRecord:
    """``outbox/<login>/<NAME>.handin.yaml``: a kernel a student handed in (``NAME.cu`` in the inbox), kept
    or refused."""

    handin: str = field(metadata=_doc("the file handed in (NAME.cu)"))
    kernel: str = field(metadata=_doc("what a job names to run it: NAME@kernel=<kernel>.txt"))
    received_at: str = field(metadata=_doc("when mmd took it from the inbox (UTC, ISO 8601)"))
    reason: str | None = field(default=None, metadata=_doc("why it was refused (one line)", omit=True))
    errors: list[str] | None = field(
        default=None,
        metadata=_doc("the compiler's lines on the file (FILE:LINE: message), where it did not build", omit=True),
    )
    sha256: str | None = field(default=None, metadata=_doc("the sha256 of NAME.cu", omit=True))
    version: str | None = field(
        default=None, metadata=_doc("the version kept: the sha256 of NAME.cu and NAME.kernel.yaml", omit=True)
    )
    entry: str | None = field(default=None, metadata=_doc("the __global__ function jobs run", omit=True))
    signature: str | None = field(default=None, metadata=_doc("the signature mmd knew it by, or declared", omit=True))
    parameters: list[str] | None = field(default=None, metadata=_doc("each parameter and its role", omit=True))
    declared_in: str | None = field(
        default=None, metadata=_doc("where its declaration was read (empty: the defaults)", omit=True)
    )
    precision: str | None = field(default=None, metadata=_doc("the arithmetic its declaration says", omit=True))
    tiles: list[TileFacts] | None = field(default=None, metadata=_doc("each course tile: whether it runs", omit=True))
    warnings: list[str] | None = field(default=None, metadata=_doc("the compiler's warnings", omit=True))
    submitter: str | None = field(default=None, metadata=_doc("who handed it in: its owner's login", omit=True))
    mmd_version: str = field(default=__version__, metadata=_doc("the mmd that wrote it"))
    status: Literal["kept", "refused"] = field(
        default="kept", metadata=_doc("kept (jobs may name it) or refused (the earlier version, if any, stays)")
    )


#: A hand-in's answer: ``outbox/<login>/<NAME>.handin.yaml``.
#: A hand-in's answer: ``outbox/<login>/<NAME>.handin.yaml``.
HANDIN_SUFFIX = ".handin.yaml"


Record = TimingRecord | ErrorRecord

#: The order keys are written in: status first, then each record's own fields.
_LEAD = ("status",)


@dataclass(frozen=True, slots=True)
class Tally:
    """What the metrics and the fair share count of one finished job: the few facts of its sidecar record
    they need (a worker sends these, not the whole record, which costs several times as much to pickle)."""

    ok: bool
    #: The kernel that ran it ("" for a refused job: none ran, whatever it asked for).
    kernel: str
    #: A refused job's kind of refusal.
    error_kind: str | None
    input_bytes: int
    output_bytes: int
    submitter: str | None
    overall_ms: float | None
    #: Each measured phase of a job that ran (not "overall", nor "cuda": a sum of phases).
    phases_ms: tuple[tuple[str, float], ...]


def tally(rec: Record) -> Tally:
    """A finished job's :class:`Tally` from its sidecar record."""
    overall = rec.timings_ms.overall
    if isinstance(rec, ErrorRecord):
        return Tally(False, "", rec.error.kind, rec.input.bytes or 0, 0, rec.context.submitter, overall, ())
    phases = tuple(
        (phase, ms)
        for phase in TIMING_KEYS
        if phase not in ("overall", "cuda") and (ms := getattr(rec.timings_ms, phase)) is not None
    )
    return Tally(
        True, rec.kernel, None, rec.input.bytes or 0, rec.output.bytes or 0, rec.context.submitter, overall, phases
    )


def now_iso(at: float | None = None) -> str:
    """The wall-clock time (now, or ``at``: seconds since the epoch) for people and for ``finished_at``: UTC,
    to the millisecond, as ``datetime.isoformat`` writes it (which costs several times more: one job's commit
    waits for it). Durations use the monotonic clock."""
    if at is None:
        seconds, us = divmod(time.time_ns() // 1000, 1_000_000)
    else:  # rounded to the microsecond from its fraction, as datetime.fromtimestamp rounds
        fraction, whole = math.modf(at)
        seconds, us = divmod(int(whole) * 1_000_000 + round(fraction * 1e6), 1_000_000)
    return f"{_iso_second(seconds)}.{us // 1000:03d}+00:00"


@functools.lru_cache(maxsize=2)
def _iso_second(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def timing_path(output: Path) -> Path:
    """``outbox/m.out`` → ``outbox/m.timing.yaml``."""
    return output.with_name(output.stem + TIMING_SUFFIX)


def error_path(output: Path) -> Path:
    """``outbox/m.out`` → ``outbox/m.error.yaml``."""
    return output.with_name(output.stem + ERROR_SUFFIX)


# -- to and from plain data -------------------------------------------------------


@functools.cache
def ordered_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """Record class ``cls``'s fields in written order (status first)."""
    own = list(dataclasses.fields(cls))
    return sorted(own, key=lambda f: 0 if f.name in _LEAD else 1)


@functools.cache
def layout(cls: type) -> tuple[tuple[str, bool, bool], ...]:
    """(name, omitted when None, flattened) of each field of record class ``cls``, in written order."""
    return tuple((f.name, bool(f.metadata.get("omit")), bool(f.metadata.get("flatten"))) for f in ordered_fields(cls))


def as_dict(value: Any) -> Any:
    """A record (or part of one) as plain data in its written order; None-valued optional fields left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for name, omit, flatten in layout(type(value)):
            item = getattr(value, name)
            if item is None and omit:
                continue
            plain = as_dict(item)
            if flatten:
                out.update(plain)
            else:
                out[name] = plain
        return out
    if isinstance(value, (list, tuple)):
        return [as_dict(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): as_dict(v) for k, v in value.items()}
    return value


def field_types(cls: type) -> dict[str, Any]:
    """Record class ``cls``'s field types, resolved."""
    return typing.get_type_hints(cls, vars(sys.modules[__name__]))


def strip_none(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else Union[tuple(args)]), len(args) < len(typing.get_args(tp))  # noqa: UP007
    return tp, False
