"""Per-job settings in file names: ``NAME@kernel=aplus,tile=16.txt``.

The part of the stem after the first ``@`` is a comma-separated list of
``key=value`` settings that override the configured ones for that one job.
The output keeps the whole stem (``NAME@kernel=aplus,tile=16.out``), so a
student can drop the same matrix under several names and compare.

Keys come from a fixed set (:data:`mmd.config.NAME_KEYS`) and each value is
read by the code that reads the config file's values
(:func:`mmd.config.read_value`: its setting's type and checks): anything else
is a :class:`~mmd.errors.JobNameError`, refused like bad input (with an error
sidecar). Pure functions: nothing here touches the
filesystem, but for a kernel name looked up in the kernel folders a service
allows (``kernel_folders``; :func:`mmd.kernelchoice.in_folders`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from . import kernels
from .config import NAME_KEYS, Settings, name_rule, read_value
from .errors import ConfigError, JobNameError, KernelError, MmdError
from .kernelchoice import FOLDER_NAME, SUFFIX, in_folders

#: What can be set in a name, in the order they are reported.
KEYS: tuple[str, ...] = tuple(NAME_KEYS)

#: Separators: NAME ``@`` key ``=`` value ``,`` key ``=`` value.
SETTINGS_MARK, ITEM_SEP, VALUE_SEP = "@", ",", "="


@dataclass(frozen=True)
class JobName:
    """A dropped file's name, split: ``stem`` names the outputs, ``overrides`` the settings."""

    name: str
    stem: str
    overrides: dict[str, Any] = field(default_factory=dict)
    #: The kernel file ``kernel=NAME`` picked in the kernel folders (None: the kernel, if any, is mmd's own).
    kernel_file: Path | None = None


def stem_of(name: str) -> str:
    """The output stem of a dropped file: its name without the last suffix (never raises)."""
    if "/" in name:
        return PurePath(name).stem or name
    dot = name.rfind(".")  # PurePath's stem, without making a path (a claim's and a job's name take it)
    return name[:dot] if 0 < dot < len(name) - 1 else name


def _kernel(value: str) -> str:
    if value.endswith(".cu"):  # a name is anyone's to choose: it never names a file to compile
        raise JobNameError(f"kernel {value!r}: a file name cannot name a kernel file; give it to mmd run --kernel-file")
    return str(read_value("kernel", value))


#: A student's own handed-in kernels: NAME -> the path of its current version (None: they handed in none).
OwnKernels = Callable[[str], Path | None]


def _kernel_in(value: str, folders: Sequence[Path], own: OwnKernels | None = None) -> Path | None:
    """The kernel file ``kernel=value`` picks: the student's ``own`` first, then ``folders``; None where it
    names one of mmd's own kernels (an MmdError where it names none of them)."""
    if own is not None and value not in kernels.NAMES and (found := own(value)) is not None:
        return found  # never in place of one of mmd's own kernels: those names are not looked up
    found = in_folders(value, folders)
    if found is not None:
        return found
    try:
        _kernel(value)
    except ConfigError as exc:
        if own is not None and FOLDER_NAME.fullmatch(value):
            raise KernelError(
                f"{exc.reason}, or a kernel of yours: you have handed in no {value}{SUFFIX}"
                + (" and no kernel folder (kernel_folders) holds one" if folders else ""),
                dict(exc.details),
            ) from None
        if folders and FOLDER_NAME.fullmatch(value):
            raise KernelError(
                f"{exc.reason}, or a kernel folder's file: no kernel folder (kernel_folders) holds {value}{SUFFIX}",
                dict(exc.details),
            ) from None
        raise
    return None


def settings_of(overrides: dict[str, Any]) -> dict[str, Any]:
    """A name's settings under the names of the settings they set (``timeout`` → ``job_timeout_s``)."""
    return {NAME_KEYS[key]: value for key, value in overrides.items()}


def _either(values: list[str]) -> str:
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def check_allowed(overrides: dict[str, Any], base: Settings) -> None:
    """Refuse what a name sets that the admin's ``base`` settings do not let names set (name_settings),
    and a time limit above theirs (job_timeout_s: a name may only lower it) or below min_name_timeout_s."""
    allowed = base.name_settings
    rule = name_rule(allowed)
    for key, value in overrides.items():
        details = {"key": key, "value": value, "allowed": list(allowed or ())}
        where = "(setting name_settings)"
        if key not in rule:
            may = f"a name may set {_either(list(rule))}" if rule else "names may set nothing"
            raise JobNameError(f"in the file name: {key} is not allowed here; {may} {where}", details)
        picks = rule[key]
        if picks is not None and value not in picks:
            shown = _either([str(v) for v in sorted(picks)])
            raise JobNameError(
                f"in the file name: {key} {value} is not allowed here; a name may pick {key} {shown} {where}", details
            )
    timeout = overrides.get("timeout")
    if timeout is not None and timeout > base.job_timeout_s:
        raise JobNameError(
            f"in the file name: timeout {timeout:.15g} s is above this service's limit, {base.job_timeout_s:.15g} s "
            "(job_timeout_s); a name may only lower it",
            {"timeout": timeout, "job_timeout_s": base.job_timeout_s},
        )
    if timeout is not None and timeout < base.min_name_timeout_s:
        raise JobNameError(
            f"in the file name: timeout {timeout:.15g} s is below the least a name may set, "
            f"{base.min_name_timeout_s:.15g} s (min_name_timeout_s)",
            {"timeout": timeout, "min_name_timeout_s": base.min_name_timeout_s},
        )


def parse(name: str, kernel_folders: Sequence[Path] = (), own: OwnKernels | None = None) -> JobName:
    """Split ``name`` into its output stem and its per-job settings.

    ``m.txt`` → (``m``, {}); ``m@kernel=aplus,tile=16.txt`` → (``m@kernel=aplus,tile=16``,
    {kernel: aplus, tile: 16}). Raises JobNameError for an unknown key, a value outside
    its allowed set, a repeated key or a malformed list; the message names the fix.
    ``kernel=NAME`` that is none of mmd's own kernels picks ``NAME.cu`` of ``kernel_folders``
    (:attr:`JobName.kernel_file`; the overrides keep ``kernel: NAME``); a student's ``own`` handed-in kernel
    of that name goes first (its current version's path: :meth:`mmd.kernelfile.store.KernelStore.pick`).
    """
    stem = stem_of(name)
    _name, mark, spec = stem.partition(SETTINGS_MARK)
    if not mark:
        return JobName(name, stem)
    overrides: dict[str, Any] = {}
    kernel_file: Path | None = None
    hint = f"'@' starts per-job settings: NAME@key=value,... with keys {', '.join(KEYS)}"
    for item in spec.split(ITEM_SEP):
        key, eq, value = item.partition(VALUE_SEP)
        if not eq or not key or not value:
            raise JobNameError(f"{item!r} in the file name is not key=value ({hint})", {"item": item})
        if key not in NAME_KEYS:
            raise JobNameError(f"unknown setting {key!r} in the file name ({hint})", {"key": key})
        if key in overrides:
            raise JobNameError(f"setting {key!r} is given twice in the file name", {"key": key})
        try:
            if key == "kernel":  # one of mmd's kernels, or a kernel file's name (then the job carries the file)
                kernel_file = _kernel_in(value, kernel_folders, own)
                overrides[key] = value
            else:
                overrides[key] = read_value(NAME_KEYS[key], value, key)
        except MmdError as exc:
            raise JobNameError(f"in the file name: {exc.reason}", dict(exc.details)) from None
    return JobName(name, stem, {k: overrides[k] for k in KEYS if k in overrides}, kernel_file)
