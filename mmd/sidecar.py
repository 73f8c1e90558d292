"""The YAML sidecars written beside each output: ``<stem>.timing.yaml`` or ``<stem>.error.yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TIMING_SUFFIX = ".timing.yaml"
ERROR_SUFFIX = ".error.yaml"

#: Every timing key a sidecar carries, in order; a phase a backend lacks is null.
TIMING_KEYS: tuple[str, ...] = (
    "read",
    "parse",
    "compile",
    "malloc",
    "h2d",
    "kernel",
    "d2h",
    "free",
    "cuda",
    "emit",
    "write",
    "overall",
)


def timing_path(output: Path) -> Path:
    """``outbox/m.out`` → ``outbox/m.timing.yaml``."""
    return output.with_name(output.stem + TIMING_SUFFIX)


def error_path(output: Path) -> Path:
    """``outbox/m.out`` → ``outbox/m.error.yaml``."""
    return output.with_name(output.stem + ERROR_SUFFIX)


def timings_block(timings: dict[str, float]) -> dict[str, float | None]:
    """All :data:`TIMING_KEYS` in order (missing ones null), rounded to µs."""
    return {key: (round(timings[key], 3) if timings.get(key) is not None else None) for key in TIMING_KEYS}


#: libyaml's dumper when PyYAML was built with it: the same bytes, five times faster,
#: and the sidecar is the largest fixed cost of a small job.
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def dumps(record: dict[str, Any]) -> bytes:
    """The sidecar's bytes: block-style YAML in the record's own key order."""
    text = yaml.dump(record, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return text.encode("utf-8")


def load(path: Path) -> dict[str, Any]:
    """Read a sidecar back (for reports and the daemon's recovery)."""
    with open(path, encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=_Loader)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a sidecar mapping")
    return data
