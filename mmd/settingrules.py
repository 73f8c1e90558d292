"""How one setting's value is read and judged: the readers of each type, and the checks a field names.

:class:`mmd.config.Settings` gives each setting its checks on its field
(:func:`setting`) and its type in its annotation; :class:`Rule` holds both,
and :meth:`Rule.read` is the one way every layer's value becomes a setting's:
a config file's (YAML, typed), a variable's, a flag's and a file name's
``key=value`` (text). Nothing here knows any one setting.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Union

from .errors import ConfigError, MmdError


class Invalid(Exception):
    """A value its setting refuses, as a check or reader says it (:meth:`Rule.read` makes it a ConfigError):
    ``says`` follows the setting's name in the message (after ``sep``), so that a file, a variable and a file
    name each put their own name for the setting first."""

    def __init__(self, says: str, details: dict[str, Any] | None = None, *, sep: str = " ") -> None:
        super().__init__(says)
        self.says, self.details, self.sep = says, details or {}, sep


#: A check of one setting's value (never of a null): raises Invalid, or the registry's MmdError (kernels, tiles).
Check = Callable[[Any], object]
#: A rule between settings, on the field it is about: given all the settings, raises Invalid.
Relation = Callable[[Any], None]
_T = TypeVar("_T")


def setting(default: _T, *checks: Check, relation: Relation | None = None) -> _T:
    """A settings field with its checks: the one place a setting's rules are given."""
    return field(default=default, metadata={"checks": checks, "relation": relation})


@dataclass(frozen=True)
class OneOf:
    """A check: the value is one of ``choices``."""

    choices: tuple[str, ...]

    def __call__(self, value: Any) -> None:
        if value not in self.choices:
            raise Invalid(f"must be one of {', '.join(self.choices)}, got {value!r}", {"choices": list(self.choices)})


def _bound(holds: Callable[[Any], bool], says: str) -> Check:
    def check(value: Any) -> None:
        if not holds(value):  # written so that NaN fails too
            raise Invalid(f"{says}, got {value!r}")

    return check


positive = _bound(lambda v: v > 0, "must be positive")
seconds = _bound(lambda v: v > 0, "must be a positive number of seconds")
not_negative = _bound(lambda v: v >= 0, "must not be negative")
positive_or_null = _bound(lambda v: v > 0, "must be positive or null")
at_least_one = _bound(lambda v: v >= 1, "must be at least 1")


def between(low: int, high: int) -> Check:
    return _bound(lambda v: low <= v <= high, f"must be {low} to {high}")


# -- readers: a raw value (text, or YAML's own where ``typed``) → the setting's type ------------------
# ValueError or TypeError where it is not one (the message names the type), Invalid where a reader says more.

Reader = Callable[[Any, bool], Any]

_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def _bool(value: Any, typed: bool) -> bool:
    if isinstance(value, bool):
        return value
    if not typed and isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.strip().lower()]
    raise ValueError


def _int(value: Any, typed: bool) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and (typed or not value.is_integer())):
        raise ValueError
    if isinstance(value, str):
        if typed:  # YAML has numbers of its own: "16" is text
            raise ValueError
        return int(value.replace("_", ""))
    return int(value)


def _float(value: Any, typed: bool) -> float:
    if isinstance(value, bool) or (typed and isinstance(value, str)):
        raise ValueError
    number = float(value)
    if number != number:  # NaN: no limit compares with it, so no check could refuse it
        raise ValueError
    return number


def _str(value: Any, typed: bool) -> str:
    if not isinstance(value, str):
        raise ValueError
    return value


def _path(value: Any, typed: bool) -> Path:
    if not isinstance(value, (str, Path)) or str(value) == "":
        raise ValueError
    return Path(value)


def _ordinals(value: Any, typed: bool) -> tuple[int, ...] | None:
    """Device ordinals: a YAML list, or ``0,1`` / ``[0, 1]`` as text; all (or null): None."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().strip("[]").strip()
        if text.lower() in ("all", "auto"):
            return None
        value = [v for v in re.split(r"[,\s]+", text) if v]
    elif isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    says = f"must be a list of device ordinals or all, got {value!r}"
    if not isinstance(value, (list, tuple)) or not value:
        raise Invalid(says)
    out = []
    for item in value:
        if isinstance(item, bool) or not (isinstance(item, int) or (isinstance(item, str) and item.isdigit())):
            raise Invalid(says)
        out.append(int(item))
    if len(set(out)) != len(out):
        raise Invalid(f"names a device twice: {out}")
    if any(d < 0 for d in out):
        raise Invalid(f"must be device ordinals (0, 1, ...), got {out}")
    return tuple(out)


def _argv(value: Any, typed: bool) -> tuple[str, ...] | None:
    """A command as an argv list: a YAML list of strings, or a string split as a shell would (never run by one)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise Invalid(str(exc), sep=": ") from None
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
        raise Invalid(f"must be a command: a list of strings (program first), got {value!r}")
    return tuple(value)


def _folders(value: Any, typed: bool) -> tuple[Path, ...]:
    """Folders: a YAML list of paths, or text with one path per ``:`` (as PATH; an environment variable)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part for part in value.split(os.pathsep) if part]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, Path)) and str(v) for v in value):
        raise Invalid(f"must be a list of folders, got {value!r}")
    return tuple(Path(v) for v in value)


_READERS: dict[Any, Reader] = {bool: _bool, int: _int, float: _float, str: _str, Path: _path}
#: Tuples, by their items' type: each reader takes null as its setting means it.
_TUPLE_READERS: dict[Any, Reader] = {int: _ordinals, str: _argv, Path: _folders}


@dataclass(frozen=True)
class Rule:
    """One setting: how its value is read (by its annotation's type) and judged (by its field's checks)."""

    reader: Reader
    type_name: str  # as messages say it: int, float or null ...
    nullable: bool  # a null is the value None (a tuple's reader says itself what null means)
    checks: tuple[Check, ...]
    relation: Relation | None

    @classmethod
    def of(cls, annotation: Any, f: dataclasses.Field[Any]) -> Rule:
        """The rule of field ``f``, its annotation resolved (``typing.get_type_hints``)."""
        union = typing.get_origin(annotation) in (Union, types.UnionType)
        args = typing.get_args(annotation) if union else (annotation,)
        (base,) = [a for a in args if a is not type(None)]
        nullable = len(args) > 1
        if typing.get_origin(base) is tuple:
            reader, nullable = _TUPLE_READERS[typing.get_args(base)[0]], True
        else:
            reader = _READERS[base]
        type_name = base.__name__ + (" or null" if nullable else "")
        return cls(reader, type_name, nullable, f.metadata.get("checks", ()), f.metadata.get("relation"))

    def read(self, name: str, value: Any, label: str, typed: bool) -> Any:
        """``value`` (text, or YAML's where ``typed``) as setting ``name``'s, judged by its checks; ConfigError,
        its reason worded after ``label``."""
        try:
            if value is None and self.reader not in _TUPLE_READERS.values():
                if self.nullable:
                    return None
                raise Invalid("must not be empty")
            try:
                out = self.reader(value, typed)
            except (TypeError, ValueError):
                raise Invalid(f"must be {self.type_name}, got {value!r}") from None
            if out is not None:
                for check in self.checks:
                    check(out)
            return out
        except Invalid as exc:
            raise ConfigError(f"{label}{exc.sep}{exc.says}", {label: value, **exc.details}) from None
        except MmdError as exc:  # the registry's own words (kernels, tiles) name the setting already
            where = f"{label}: " if label != name else ""
            raise ConfigError(f"{where}{exc.reason}", dict(exc.details)) from None
