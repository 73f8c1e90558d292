"""A record's sidecar bytes: block-style YAML in the record's own key order, as PyYAML writes it.

Most sidecars are written by mmd's own writer, straight from the record's
fields; anything it does not know to write one way only goes to PyYAML.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import yaml

from . import HandInRecord, Record, Requested, Shape, TextFacts, as_dict, layout

#: libyaml's dumper when PyYAML was built with it: the same bytes, faster.
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dumps(record: Record) -> bytes:
    """The sidecar's bytes: block-style YAML in the record's own key order."""
    text = _lines(_items(record), "")
    if text is None:
        data = as_dict(record)
        text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return text.encode("utf-8")


# Why mmd writes YAML itself: PyYAML, even with libyaml's emitter, builds and resolves every node in Python,
# which costs a small job enough CPU that the daemon's burst on the 2-core machine falls to its target
# (1,000 jobs/s) or below it (the measurement, beside mmd's own writer: docs/results/sidecar-writer/).
# Nearly every sidecar holds only mappings, lists of scalars, numbers and short strings of safe characters,
# which YAML writes one way only, so mmd writes those itself, straight from the record's fields, and leaves
# anything else (a long or unusual string, an empty container) to PyYAML. Tests hold the two to the same
# bytes (tests/test_record.py).

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
    for name, omit, flatten in layout(cls):
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


def dumps_handin(record: HandInRecord) -> bytes:
    """A hand-in's sidecar: block-style YAML in the record's own key order."""
    text = yaml.dump(as_dict(record), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return text.encode("utf-8")
