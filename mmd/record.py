"""The sidecar: what one job did, as a typed record written beside its output.

``<stem>.timing.yaml`` (:class:`TimingRecord`) when the job produced an
output, ``<stem>.error.yaml`` (:class:`ErrorRecord`) when it was refused. The
dataclasses below are the one definition of both: the pipeline writes them,
the report and the daemon's recovery read them back (:func:`read`), and the
published JSON Schema (``docs/sidecar.schema.json``) and the field table
(``docs/sidecar.md``) are generated from them (``python -m mmd.record``; a
test keeps both current).

Why a small converter of our own instead of a validation library: the
sidecar's types are a closed set (strings, numbers, booleans, null, lists of
strings, string-keyed maps and nested records), the daemon writes one per job
and its import must cost nothing; the tests validate every sidecar they write
against the generated schema with the ``jsonschema`` library.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sys
import time
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from . import __version__

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
HANDIN_SUFFIX = ".handin.yaml"


def dumps_handin(record: HandInRecord) -> bytes:
    """A hand-in's sidecar: block-style YAML in the record's own key order."""
    text = yaml.dump(as_dict(record), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return text.encode("utf-8")


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
def _fields(cls: type) -> list[dataclasses.Field[Any]]:
    own = list(dataclasses.fields(cls))
    return sorted(own, key=lambda f: 0 if f.name in _LEAD else 1)


@functools.cache
def _layout(cls: type) -> tuple[tuple[str, bool, bool], ...]:
    """(name, omitted when None, flattened) of each field of record class ``cls``, in written order."""
    return tuple((f.name, bool(f.metadata.get("omit")), bool(f.metadata.get("flatten"))) for f in _fields(cls))


def as_dict(value: Any) -> Any:
    """A record (or part of one) as plain data in its written order; None-valued optional fields left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for name, omit, flatten in _layout(type(value)):
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


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(sys.modules[__name__]))


def _strip_none(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else Union[tuple(args)]), len(args) < len(typing.get_args(tp))  # noqa: UP007
    return tp, False


def _build(tp: Any, data: Any, where: str) -> Any:
    tp, nullable = _strip_none(tp)
    if data is None:
        if nullable:
            return None
        raise ValueError(f"{where} must not be null")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(data, Mapping):
            raise ValueError(f"{where} must be a mapping")
        return from_dict(tp, data, where)
    if typing.get_origin(tp) is list:
        if not isinstance(data, list):
            raise ValueError(f"{where} must be a list")
        return list(data)
    return data


def from_dict(cls: type, data: Mapping[str, Any], where: str = "record") -> Any:
    """Build record class ``cls`` from plain data written by :func:`as_dict` (ValueError when it does not fit)."""
    hints = _hints(cls)
    own = {f.name for f in dataclasses.fields(cls) if not f.metadata.get("flatten")}
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("flatten"):
            inner = hints[f.name]
            if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                names = {g.name for g in dataclasses.fields(inner)}
                values[f.name] = from_dict(inner, {k: v for k, v in data.items() if k in names}, where)
            else:  # a free map: every key that is not a field of its own
                values[f.name] = {k: v for k, v in data.items() if k not in own}
            continue
        if f.name in data:
            values[f.name] = _build(hints[f.name], data[f.name], f"{where}.{f.name}")
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from None


# -- sidecar files ------------------------------------------------------------------

#: libyaml's dumper when PyYAML was built with it: the same bytes, several times faster, and the sidecar is
#: the largest fixed cost of a small job.
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def dumps(record: Record) -> bytes:
    """The sidecar's bytes: block-style YAML in the record's own key order."""
    text = _lines(_items(record), "")
    if text is None:
        data = as_dict(record)
        text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return text.encode("utf-8")


# PyYAML spends most of a small job's sidecar time building and resolving nodes in Python (a small job's CPU
# time: docs/daemon.md, "What limits what"). Nearly every sidecar holds only mappings, lists of scalars, numbers and
# short strings of safe characters, which YAML writes one way only, so mmd writes those itself, straight
# from the record's fields (as_dict's walk of every value cost as much again), and leaves anything else (a
# long or unusual string, an empty container) to PyYAML. Tests hold the two to the same bytes
# (tests/test_record.py).

#: Strings YAML writes as they are (or single-quoted where they would read back as another type): no
#: indicator first, no ": " or " #", no quotes or escapes (a line with a space is also kept within the
#: width the dumper folds at: :data:`_WIDTH`).
_SAFE = re.compile(r"[A-Za-z0-9_(/][A-Za-z0-9_.()/+=,;: -]*")
_WIDTH = 80
_STR = "tag:yaml.org,2002:str"
#: How the dumper decides whether a plain string would read back as another type (a date, a number).
_RESOLVER = yaml.resolver.Resolver()


def _scalar(value: Any) -> str | None:
    """``value`` as the dumper writes it, or None where mmd leaves it to PyYAML."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return ".nan"
        if value in (float("inf"), float("-inf")):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value).lower()
        return text.replace("e", ".0e", 1) if "." not in text and "e" in text else text
    if isinstance(value, str):
        return _string(value)
    return None


@functools.lru_cache(maxsize=4096)
def _string(value: str) -> str | None:
    """A string as the dumper writes it, or None where mmd leaves it to PyYAML (kept: a sidecar's keys and
    most of its values are the same in every sidecar)."""
    if _SAFE.fullmatch(value) and not value.endswith((" ", ",", ":")) and "  " not in value and ": " not in value:
        if _RESOLVER.resolve(yaml.ScalarNode, value, (True, False)) == _STR:
            return value
        return f"'{value}'"
    return None


def _plain_yaml(data: Mapping[str, Any], indent: str = "") -> str | None:
    """``data`` in block style as :func:`yaml.dump` writes it, or None where that is PyYAML's to decide."""
    return _lines(data.items(), indent) if data else None


def _items(record: Any) -> Iterator[tuple[str, Any]]:
    """A record's entries as :func:`as_dict` gives them (its own order, None-valued optional fields left out,
    flattened ones in place), its parts left as they are."""
    cls: type = type(record)
    for name, omit, flatten in _layout(cls):
        item = getattr(record, name)
        if item is None and omit:
            continue
        if not flatten:
            yield name, item
        elif dataclasses.is_dataclass(item):
            yield from _items(item)
        else:
            yield from item.items()


def _part(record: Any, indent: str) -> str | None:
    """A record's nested record as :func:`_plain_yaml` writes its plain data (None: empty, or PyYAML's)."""
    items = list(_items(record))
    return _lines(items, indent) if items else None


def _lines(items: Iterable[tuple[str, Any]], indent: str) -> str | None:
    """Entries in block style as :func:`yaml.dump` writes a mapping of them, or None where that is PyYAML's
    to decide (a record among the values is written as its plain data)."""
    lines = []
    for key, value in items:
        kind = type(value)
        if value is None or kind is str or kind is bool or kind is int:
            line = _scalar_line(indent, key, value)
            if line is None:
                return None
            lines.append(line)
        elif type(key) is not str or _string(key) != key:
            return None
        elif kind is float:  # timings: nearly every float differs from the last, so none is kept
            number = repr(value)
            if "e" in number or "n" in number:  # an exponent, inf or nan: _scalar's rules
                number = str(_scalar(value))
            lines.append(f"{indent}{key}: {number}\n")
        elif kind in _REPEATED:
            part = _repeated_part(value, indent + "  ")
            if part is None:
                return None
            lines.append(f"{indent}{key}:\n{part}")
        elif isinstance(value, (str, int, float)):  # a subclass: as its base type
            line = _scalar_line(indent, key, value)
            if line is None:
                return None
            lines.append(line)
        elif isinstance(value, Mapping):
            inner = _plain_yaml(value, indent + "  ") if value else None
            if inner is None:
                return None
            lines.append(f"{indent}{key}:\n{inner}")
        elif isinstance(value, (list, tuple)):
            if not value:
                return None
            listed = []
            for item in value:
                text = None if isinstance(item, (Mapping, list, tuple)) else _scalar(item)
                if text is None or (" " in text and len(indent) + 2 + len(text) > _WIDTH):
                    return None
                listed.append(f"{indent}- {text}\n")
            lines.append(f"{indent}{key}:\n" + "".join(listed))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            inner = _part(value, indent + "  ")
            if inner is None:
                return None
            lines.append(f"{indent}{key}:\n{inner}")
        else:
            return None  # not plain data: PyYAML's to write (or refuse)
    return "".join(lines)


@functools.lru_cache(maxsize=4096, typed=True)
def _scalar_line(indent: str, key: Any, value: Any) -> str | None:
    """``key: value`` (a scalar) as the dumper writes it, or None where that is PyYAML's to decide (kept: most
    of a sidecar's lines are the same in every sidecar)."""
    if type(key) is not str or _string(key) != key:
        return None
    text = _scalar(value)
    line = f"{indent}{key}: {text}"
    if text is None or (" " in text and len(line) > _WIDTH):
        return None
    return line + "\n"


#: A record's parts that are the same for most jobs of a worker (what it asked for, how it handled the
#: text, its shape), written once and kept.
_REPEATED = frozenset({Shape, Requested, TextFacts})


@functools.lru_cache(maxsize=256)
def _repeated_part(record: Any, indent: str) -> str | None:
    return _part(record, indent)


def load_dict(path: Path) -> dict[str, Any]:
    """A sidecar's plain data (ValueError when it is not a mapping; OSError when it cannot be read)."""
    with open(path, encoding="utf-8") as fh:
        return _mapping(yaml.load(fh, Loader=_Loader), path)


def _mapping(data: Any, path: Path) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a sidecar mapping")
    return data


def read(path: Path) -> Record:
    """A sidecar as its record (ValueError when it is not one of mmd's)."""
    return _record(load_dict(path), path)


def parse(text: bytes, path: Path) -> Record:
    """A sidecar's bytes, read by the caller (``mmd check`` reads a student's without following
    links), as its record; ``path`` names it in errors (ValueError, yaml.YAMLError)."""
    return _record(_mapping(yaml.load(text, Loader=_Loader), path), path)


def _record(data: dict[str, Any], path: Path) -> Record:
    status = data.get("status")
    cls: type[TimingRecord] | type[ErrorRecord] | None = {"ok": TimingRecord, "error": ErrorRecord}.get(str(status))
    if cls is None:
        raise ValueError(f"{path}: status must be ok or error, got {status!r}")
    record: Record = from_dict(cls, data, path.name)
    return record


# -- the published schema and table ---------------------------------------------------


def _schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    tp, nullable = _strip_none(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}  # placeholder against recursion
            defs[name] = _object_schema(tp, defs)
        out: dict[str, Any] = {"$ref": f"#/$defs/{name}"}
    elif typing.get_origin(tp) is Literal:
        out = {"enum": list(typing.get_args(tp))}
    elif typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        out = {"type": "array", "items": _schema(item, defs)}
    elif typing.get_origin(tp) is dict or tp is dict:
        out = {"type": "object"}
    else:
        out = {"type": {str: "string", int: "integer", float: "number", bool: "boolean"}[tp]}
    if nullable:
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def _object_schema(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = _hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    extra = False
    for f in _fields(cls):
        if f.metadata.get("flatten"):
            inner = hints[f.name]
            if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                sub = _object_schema(inner, defs)
                props.update(sub["properties"])
                required.extend(sub["required"])
            else:
                extra = True
            continue
        entry = _schema(hints[f.name], defs)
        entry = {"description": f.metadata.get("doc", ""), **entry}
        props[f.name] = entry
        if not f.metadata.get("omit"):
            required.append(f.name)
    return {
        "type": "object",
        "description": (cls.__doc__ or "").strip(),
        "properties": props,
        "required": required,
        "additionalProperties": extra,
    }


def json_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) every sidecar follows: one of the two records."""
    defs: dict[str, Any] = {}
    one_of = [_schema(TimingRecord, defs), _schema(ErrorRecord, defs), _schema(HandInRecord, defs)]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://mmd.invalid/sidecar.schema.json",
        "title": "mmd sidecar",
        "description": (
            "A job's <stem>.timing.yaml (status ok) or <stem>.error.yaml (status error), or a hand-in's "
            "<NAME>.handin.yaml (status kept or refused)."
        ),
        "oneOf": one_of,
        "$defs": defs,
    }


def _type_name(tp: Any) -> str:
    tp, nullable = _strip_none(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        name = "map"
    elif typing.get_origin(tp) is Literal:
        name = " | ".join(repr(a) for a in typing.get_args(tp))
    elif typing.get_origin(tp) is list:
        name = f"list of {_type_name(typing.get_args(tp)[0])}"
    elif typing.get_origin(tp) is dict or tp is dict:
        name = "map"
    else:
        name = tp.__name__
    return name + (" or null" if nullable else "")


def _rows(cls: type, prefix: str, optional: bool) -> list[str]:
    hints = _hints(cls)
    rows = []
    for f in _fields(cls):
        tp = hints[f.name]
        inner, _ = _strip_none(tp)
        if f.metadata.get("flatten"):
            if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                rows += _rows(inner, prefix, optional)
            continue
        key = f"{prefix}{f.name}"
        when = "when set" if (optional or f.metadata.get("omit")) else "always"
        rows.append(f"| `{key}` | {_type_name(tp)} | {when} | {f.metadata.get('doc', '')} |")
        if dataclasses.is_dataclass(inner) and isinstance(inner, type):
            rows += _rows(inner, key + ".", optional or bool(f.metadata.get("omit")))
    return rows


def markdown() -> str:
    """docs/sidecar.md: every key of both records, from the definitions above."""
    lines = [
        "# The sidecar",
        "",
        "<!-- Generated by `python -m mmd.record` from mmd/record.py; edit that, not this. -->",
        "",
        "Each job leaves one YAML record beside its output: `<stem>.timing.yaml` when it produced the output",
        "(status `ok`), `<stem>.error.yaml` when it was refused (status `error`). The output is committed",
        "before its timing record, so a timing record means the output is complete. The JSON Schema",
        "`docs/sidecar.schema.json` validates both (`check-jsonschema --schemafile docs/sidecar.schema.json",
        "outbox/*.yaml`).",
        "",
        "Times are milliseconds; a phase a backend does not have is null (the cpu has no `h2d`).",
        "",
        "In class mode a kernel a student hands in (`NAME.cu` dropped in the inbox) is answered by",
        "`<NAME>.handin.yaml` in their outbox folder (status `kept` or `refused`): the schema validates it too.",
    ]
    for cls in (TimingRecord, ErrorRecord, HandInRecord):
        lines += ["", f"## {cls.__name__}: {(cls.__doc__ or '').strip().replace('``', '`')}", ""]
        lines += ["| key | type | present | meaning |", "| --- | --- | --- | --- |"]
        lines += _rows(cls, "", False)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write docs/sidecar.schema.json and docs/sidecar.md (run from the repository root)."""
    args = sys.argv[1:] if argv is None else argv
    docs = Path(args[0]) if args else Path("docs")
    (docs / "sidecar.schema.json").write_text(json.dumps(json_schema(), indent=2) + "\n", encoding="utf-8")
    (docs / "sidecar.md").write_text(markdown(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
