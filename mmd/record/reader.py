"""Reading a sidecar back into its record (:mod:`mmd.record`): the report, the daemon's recovery, ``mmd check``."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from . import ErrorRecord, Record, TimingRecord, field_types, strip_none

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _build(tp: Any, data: Any, where: str) -> Any:
    tp, nullable = strip_none(tp)
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
    hints = field_types(cls)
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
