"""Typed, validated settings.

Layers, lowest first, each setting taken from the nearest layer that sets it:
built-in defaults < the config files < ``MMD_*`` environment < command-line
flags. The config files, lowest first (:func:`config_files`): the service's
``/etc/mmd/mmd.yaml`` (read only by the commands that address the service:
``load(service=True)``), the user's ``$XDG_CONFIG_HOME/mmd/mmd.yaml``, this
project's ``config/mmd.yaml``; ``--config`` or ``$MMD_CONFIG`` names one file
read instead of them all. Each setting remembers the layer it came from
(:meth:`Settings.origin`, what ``mmd config`` shows). A file is read with
``yaml.safe_load`` and its values must have their YAML types (``tile: "16"``
is refused); the environment, a file's name and the flags are text, parsed.
An unknown key or a wrong type is a :class:`ConfigError` that names the key
(or the variable) and where it came from; an ``MMD_*`` variable that is not
a setting is ignored with an :class:`UnknownVariableWarning`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import socket
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from . import kernels
from .errors import ConfigError, UsageError
from .settingrules import (
    Invalid,
    OneOf,
    Rule,
    at_least_one,
    between,
    not_negative,
    positive,
    positive_or_null,
    seconds,
    setting,
)

#: The project's config, relative to the working directory: the nearest file layer.
LOCAL_CONFIG = Path("config/mmd.yaml")
#: The service's config (systemd/install.sh writes it, the unit names it in $MMD_CONFIG): the lowest file layer,
#: read only by the commands that address the service, never by a user's own `mmd serve` or `mmd run`.
SYSTEM_CONFIG = Path("/etc/mmd/mmd.yaml")


class UnknownVariableWarning(UserWarning):
    """An ``MMD_*`` variable that is no setting (a typo, an old name): ignored, so that one stray variable in a
    shell does not stop every command; the CLI shows it as one line."""


#: Settings a command line may give a single job (`mmd run`'s flags); the rest are the service's.
JOB_FLAGS: tuple[str, ...] = ("backend", "kernel", "tile", "memory", "device")
#: What the ``backend`` setting may say: auto (cuda when a GPU works, else cpu), cpu, cuda.
BACKENDS: tuple[str, ...] = ("auto", "cpu", "cuda")
#: Device memory modes a job may ask for.
MEMORY_MODES: tuple[str, ...] = ("device", "pitched", "managed")
#: Where a job's text is parsed and formatted: ``host`` (textformat on the CPU), ``gpu`` (the
#: backend's own text path), ``auto`` (gpu when the backend offers it for the job, else host).
TEXT_PATHS: tuple[str, ...] = ("auto", "host", "gpu")

#: What a file name may set (``NAME@kernel=fast,tile=16.txt``): its key there → the setting it sets.
NAME_KEYS: dict[str, str] = {
    "kernel": "kernel",
    "tile": "tile",
    "backend": "backend",
    "memory": "memory",
    "timeout": "job_timeout_s",
}


# -- the checks of mmd's own settings (Settings names each on its field) --------------------------

#: What a host id may hold: it becomes part of file names in the shared inbox.
HOST_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _host_id(value: str) -> None:
    if not HOST_ID_RE.fullmatch(value) or value in (".", ".."):
        raise Invalid(f"may hold letters, digits, '.', '_' and '-' (1 to 64), got {value!r}")


_LISTEN = "must be HOST:PORT (say 127.0.0.1:9817)"


def listen_address(value: str, where: str = "metrics_listen") -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets) → (host, port); ConfigError otherwise."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where} {_LISTEN}, got {value!r}")
    return host, int(port)


def _listening(value: str) -> None:
    try:
        listen_address(value)
    except ConfigError:
        raise Invalid(f"{_LISTEN}, got {value!r}") from None


def _cache_folder(value: str) -> None:
    if not value:
        raise Invalid("must be auto, a folder or null")


def _class_box(s: Settings) -> None:
    if s.class_mode and s.state_dir is None:
        raise Invalid(
            "needs state_dir: a folder only the service may write, on the inbox's filesystem, for its lock, state "
            "and claimed jobs (docs/operations.md)"
        )
    if s.class_mode and s.shared_inbox:
        raise Invalid("does not combine with shared_inbox yet: serve a class from one box")


def _handed_in(s: Settings) -> None:
    if s.student_kernels and not s.class_mode:
        raise Invalid("needs class_mode: students hand in kernels to a class box")


def _longer_than_quiet(s: Settings) -> None:
    if not s.drop_box_grace_s > s.quiet_seconds:
        raise Invalid(f"must be longer than quiet_seconds ({s.quiet_seconds})")


def _admins_alone(s: Settings) -> None:
    for folder in s.kernel_folders:
        # whoever may drop a file there could pick it by name and have the service compile and run it
        for name in ("inbox", "outbox", "state_dir"):
            other = getattr(s, name)
            if other is not None and _within(folder, other):
                raise Invalid(
                    f"{folder} is in the {name} ({other}): a kernel folder is the admin's alone, never a folder "
                    "others may write",
                    sep=": ",
                )


def _within(inner: Path, outer: Path) -> bool:
    """Whether ``inner`` is ``outer`` or in it, by their absolute paths (nothing is read from the filesystem)."""
    a, b = Path(os.path.abspath(inner)), Path(os.path.abspath(outer))
    return a == b or b in a.parents


def name_rule(items: tuple[str, ...] | None) -> dict[str, frozenset[Any] | None]:
    """``name_settings`` as a rule: name key → the values a name may pick (None: any); a key not in it may
    not be set. Each value is read and judged as the setting it sets (ConfigError naming the item)."""
    rule: dict[str, frozenset[Any] | None] = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        if key not in NAME_KEYS:
            raise ConfigError(f"unknown setting {key!r} ({_unknown(key, tuple(NAME_KEYS))})")
        picks = frozenset({read_value(NAME_KEYS[key], value, key)}) if eq else None
        known = rule.get(key, frozenset())
        rule[key] = None if picks is None or known is None else known | picks
    return rule


def _name_rule(items: tuple[str, ...]) -> None:
    try:
        name_rule(items)
    except ConfigError as exc:
        raise Invalid(exc.reason, dict(exc.details), sep=": ") from None


@dataclass(frozen=True)
class Settings:
    """Everything mmd can be told. Field comments are the documentation; each field's checks are on it
    (:func:`setting`), its type is read from its annotation."""

    # -- the job --
    backend: str = setting("auto", OneOf(BACKENDS))  # auto: cuda when it works, else cpu (and say so)
    kernel: str = setting("tiled", kernels.get)  # a name from `mmd kernels` (the registry judges it)
    tile: int = setting(32, kernels.check_tile)  # threads per block edge; 64 is refused on every current GPU
    memory: str = setting("device", OneOf(MEMORY_MODES))  # device | pitched | managed
    device: int = 0  # CUDA device ordinal (after CUDA_VISIBLE_DEVICES) for `mmd run` and `mmd bench`
    #: `mmd serve`: one worker per device ordinal; None (`all`): every visible GPU (one worker on the cpu backend)
    devices: tuple[int, ...] | None = None
    #: `mmd serve` on a GPU: worker processes per device, each with its own CUDA context (what each holds of
    #: the GPU's memory: docs/daemon.md); the cpu backend runs one worker per usable core
    workers_per_device: int = setting(8, between(1, 64))
    #: `mmd serve` on a GPU: page-locked host memory (MiB) each worker sets aside once it is ready, so that the
    #: first big job runs as fast as the tenth: the buffers of the largest square job that fit (480: 4166×4166,
    #: above the course's 4096); 0: none until jobs come. Host memory only: no GPU memory is held (docs/daemon.md)
    warm_up_mib: int = setting(480, not_negative)
    #: compiled kernels; auto: $XDG_CACHE_HOME/mmd/kernels (~/.cache/...); null: off
    kernel_cache: str | None = setting("auto", _cache_folder)
    #: auto: on the GPU when the backend can and the input is 256 KiB or more | host | gpu
    text_path: str = setting("auto", OneOf(TEXT_PATHS))
    # -- the spool (relative paths are taken from the working directory) --
    inbox: Path = Path("inbox")
    outbox: Path = Path("outbox")
    create_folders: bool = False  # `mmd serve` makes a missing inbox or outbox (--create); else it refuses to start
    #: the daemon's private folder: its lock, its state file and the claimed, done and failed jobs. null: the
    #: inbox itself, under dot names (a personal inbox). Where others write the inbox (a class): a folder on the
    #: inbox's filesystem (a claim is a rename) that only the service may write and no student may enter; made
    #: 0700 when missing, checked at start (docs/operations.md, "A class on one box")
    state_dir: Path | None = None
    #: a class shares the box: state_dir is required, an input its group or others could change is refused,
    #: and each student's outputs go to outbox/<login>, readable by that student and graders_group only (ACLs)
    class_mode: bool = setting(False, relation=_class_box)
    graders_group: str | None = None  # class mode: the group that reads every student's outputs; null: none
    #: where `mmd status`, `mmd cancel` and `mmd rm` ask the daemon (an AF_UNIX socket any local user may
    #: reach; each is answered only about their own jobs); null: no socket
    control_socket: Path | None = None
    #: connections one user may hold open to control_socket at once; one more is refused at once, so a student
    #: holding idle ones holds up no one else (root and the service's own user: no cap)
    control_connections_per_user: int = setting(8, positive)
    #: requests a second one user's requests reach the daemon at: a burst of two seconds' worth at once, then
    #: each waits its turn (root and the service's own user: no cap)
    control_requests_per_s: float = setting(5.0, positive)
    #: the longest a grader's timed window (`mmd grade --service`) keeps new jobs off a device's workers: it ends
    #: at its release or after this many seconds, whichever comes first; a job dropped meanwhile waits it out
    grade_window_max_s: float = setting(2.0, seconds)
    # -- limits --
    max_memory_bytes: int | None = setting(None, positive_or_null)  # None: the machine's physical memory
    #: largest input file; None: the memory limit (it is read whole)
    max_file_bytes: int | None = setting(None, positive_or_null)
    #: an input may take at most this many bytes per value its header promises (a number and the blanks
    #: around it, on average) plus 1 MiB; larger is refused unread. None: no such bound
    max_bytes_per_value: int | None = setting(64, positive_or_null)
    max_dim: int | None = setting(None, positive_or_null)  # largest M, K or N a job may have; None: no limit
    #: the largest output a job may make, judged from its header (6-byte fields: the least its shape makes)
    #: and refused unread; 1 GiB serves the course's largest, 8192 (about 470 MB). None: no limit
    max_output_bytes: int | None = setting(1 << 30, positive_or_null)
    #: class_mode: an output may be at most this many times its input, or output_ratio_floor_bytes, whichever
    #: is larger: every course size passes, a 66 KB `6000 1 6000` (216 MB out) does not. None: no such bound
    max_output_ratio: float | None = setting(16.0, positive_or_null)
    #: class_mode: an output this small is never refused for its ratio
    output_ratio_floor_bytes: int = setting(8 << 20, not_negative)
    #: class_mode: the most one student's outputs, sidecars and archived inputs may take (allocated blocks: a
    #: tiny file takes 4 KiB); a job that would pass it is refused, and `mmd rm` or retention makes room.
    #: null: no quota
    max_submitter_bytes: int | None = setting(2 << 30, positive_or_null)
    #: class_mode: the most files (outputs, sidecars, archived inputs: three a job) one student may keep; a job
    #: past it is refused as max_submitter_bytes's are. null: no such bound
    max_submitter_files: int | None = setting(30_000, positive_or_null)
    #: class_mode: a refused input is archived only up to this many of its first bytes (a note says so), and
    #: one refused unread (from its header) up to 64 KiB at most. null: refused inputs read are kept whole
    archive_refused_bytes: int | None = setting(1 << 20, not_negative)
    #: free space the daemon keeps on the outbox's disk for everyone: a job whose output would eat into it
    #: is refused (a class box's installer sets 1 GiB). null: none, a full disk holds jobs until it has room
    min_free_bytes: int | None = setting(None, not_negative)
    #: free inodes the daemon keeps on the outbox's disk for everyone (where it counts them): a job is refused
    #: while fewer are free. null: none
    min_free_inodes: int | None = setting(10_000, not_negative)
    #: outputs, sidecars and archived inputs older than this are removed (hourly); null: kept for ever
    retention_days: float | None = setting(None, positive_or_null)
    max_queue: int = setting(100_000, positive)  # jobs waiting in the daemon's queue
    #: the most files of one submitter the daemon's queue holds (waiting or in hand); the rest wait in the inbox,
    #: so that one student's flood leaves the queue room for everyone else's. null: only max_queue bounds them
    max_waiting_per_submitter: int | None = setting(10_000, positive_or_null)
    #: the most workers one submitter's big jobs (inputs over 256 KiB) may hold at once, so that a classmate's
    #: small job always finds a worker (a job in hand is never preempted). null: half the workers, rounded up,
    #: with class_mode; no cap without
    max_workers_per_submitter: int | None = setting(None, positive_or_null)
    # -- the daemon --
    #: auto | inotify | polling (network filesystems)
    observer: str = setting("auto", OneOf(("auto", "inotify", "polling")))
    rescan_seconds: float = setting(5.0, seconds)  # full inbox rescan period; events are only hints
    #: size/mtime unchanged this long => file complete (if no write was seen)
    quiet_seconds: float = setting(0.5, seconds)
    #: an upload (a regular file named *.part, *.tmp or *~) this long after the daemon first saw it is removed:
    #: it died, or its name was taken to block someone else's upload (never judged by its mtime)
    upload_max_age_s: float = setting(86400.0, seconds)
    #: a folder under a job's name (`mkdir hw1.txt`), or a file still not completely written this long after the
    #: daemon first saw it, is set aside out of the name's way (into state_dir's .failed) and its owner gets an
    #: error sidecar saying why; judged by the daemon's clock, never the file's mtime. Longer than quiet_seconds
    drop_box_grace_s: float = setting(600.0, relation=_longer_than_quiet)
    poll_seconds: float = setting(1.0, seconds)  # polling observer period
    shared_inbox: bool = False  # several hosts serve one inbox on a shared filesystem (docs/cluster.md)
    host_id: str | None = setting(None, _host_id)  # this host's name in a shared inbox; None: the hostname
    # -- the service (docs/operations.md) --
    #: a job running longer is stopped and failed (`timeout`); per job: NAME@timeout=600
    job_timeout_s: float = setting(3600.0, seconds)
    #: a job that killed the daemon this many times is failed, not started again
    max_attempts: int = setting(3, at_least_one)
    #: the longest one launch of a kernel file may run: past it, its process (and CUDA context) is killed and the
    #: job refused; never more than the job's own time limit, job_timeout_s
    kernel_file_launch_timeout_s: float = setting(5.0, seconds)
    #: folders of kernel files a job's name may pick: NAME@kernel=p1.txt runs p1.cu of the first folder holding one
    #: (never in place of one of mmd's own kernels), as `mmd run --kernel-file` does. Folders only the admin may
    #: write, outside the inbox and outbox. Empty (the default): names pick mmd's own kernels only
    kernel_folders: tuple[Path, ...] = setting((), relation=_admins_alone)
    #: class mode: students may hand in kernels of their own (NAME.cu dropped in the inbox, kept in state_dir/kernels)
    #: and their jobs run them (NAME@kernel=p1.txt: their own p1.cu, never a classmate's or in place of one of
    #: mmd's own kernels). Off (the default): a hand-in is refused with a sidecar saying so
    student_kernels: bool = setting(False, relation=_handed_in)
    #: class mode: the GPU time (seconds) each student's own kernels may use on the service, every launch counted
    #: from its start to its end, its fault or its kill; a job of theirs that would run one past it is refused
    #: (`limit`), and one running may overrun it by one launch's time limit. null (the default): no bound
    student_kernel_gpu_s: float | None = setting(None, positive_or_null)
    metrics_file: Path | None = None  # Prometheus text file (node_exporter's textfile collector); null: none
    metrics_seconds: float = setting(5.0, seconds)  # the metrics file is rewritten this often, and after each job
    #: HOST:PORT where Prometheus scrapes the same metrics over HTTP (a dead daemon's scrape fails, so
    #: `up == 0` fires); the unit allows loopback only. null: no endpoint
    metrics_listen: str | None = setting(None, _listening)
    on_done: tuple[str, ...] | None = None  # a command (argv list, no shell) run after each job with an output
    on_error: tuple[str, ...] | None = None  # a command run after each refused job
    #: a hook still running after this long is killed (the job is not affected)
    hook_timeout_s: float = setting(30.0, seconds)
    #: the least time limit a name may set: a job stopped at its limit costs its worker, ended and started
    #: again (a fresh process, on a GPU a fresh CUDA context: about a second), so smaller ones would let a
    #: name spend the box's time on restarts
    min_name_timeout_s: float = setting(1.0, seconds)
    #: what a file name may set: a key alone (``tile``) lets it pick any value, ``key=value`` items only
    #: those values (``[kernel=tiled, kernel=fast, timeout]``); null: names set nothing. ``timeout`` may only
    #: lower job_timeout_s, whatever this says
    name_settings: tuple[str, ...] | None = setting(tuple(NAME_KEYS), _name_rule)
    # -- durability --
    durable: bool = True  # fsync outputs and sidecars before they count as committed
    # -- logs --
    log_format: str = setting("auto", OneOf(("auto", "json", "console")))  # auto: console on a terminal, JSON otherwise
    log_level: str = setting("info", OneOf(("debug", "info", "warning", "error")))
    #: Where the settings came from, for messages (not a setting): the layers applied, lowest first.
    sources: tuple[str, ...] = field(default=("defaults",), compare=False)
    #: Setting → the layer that set it (a file's path, ENVIRONMENT, COMMAND_LINE...); absent: the default.
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def private_dir(self) -> Path:
        """Where the daemon's lock, state file and claimed, done and failed jobs are: state_dir, else the inbox."""
        return self.state_dir if self.state_dir is not None else self.inbox

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated (None values are ignored)."""
        clean = {k: v for k, v in changes.items() if v is not None}
        origins = {**self.origins, **dict.fromkeys(clean, OVERRIDE)}
        return _related(dataclasses.replace(self, **_read(clean, OVERRIDE, True), origins=origins), OVERRIDE)

    def with_values(self, values: Mapping[str, Any], origin: str) -> Settings:
        """A copy with ``values`` (setting → raw value, as a file or variable gives it) read, applied
        and validated; ``origin`` names where they came from in messages and in :attr:`sources`."""
        return _apply(self, values, origin)

    def origin(self, name: str) -> str:
        """Where setting ``name`` came from: a file's path, ENVIRONMENT, COMMAND_LINE, ..., or DEFAULT."""
        return self.origins.get(name, DEFAULT)


#: The origin of a setting no layer set.
DEFAULT = "default"
#: The origin of a setting the program changed (:meth:`Settings.replace`).
OVERRIDE = "override"
#: The origin of settings from ``MMD_*`` variables; their messages name the variable.
ENVIRONMENT = "environment"
#: The origin of settings given as flags: their errors are usage errors.
COMMAND_LINE = "command line"


_HINTS = typing.get_type_hints(Settings)
_RULES = {f.name: Rule.of(_HINTS[f.name], f) for f in fields(Settings) if f.name not in ("sources", "origins")}
#: Every setting's name, in the order Settings declares them.
NAMES: tuple[str, ...] = tuple(_RULES)
#: The settings that take one of a few words, and the words (the CLI's choices).
CHOICES: dict[str, tuple[str, ...]] = {
    name: check.choices for name, rule in _RULES.items() for check in rule.checks if isinstance(check, OneOf)
}


def read_value(name: str, value: Any, label: str | None = None, *, typed: bool = False) -> Any:
    """Setting ``name``'s value as one layer gives it, read as the setting's type and judged by its checks
    (those between settings aside): what a config file's, a variable's, a flag's and a file name's
    ``key=value`` all go through. ``typed``: ``value`` is YAML's (with numbers and booleans of its own, so
    text is not read as one); else it is text. ConfigError, worded after ``label`` (default: ``name``)."""
    return _RULES[name].read(name, value, label or name, typed)


def _label(origin: str) -> Callable[[str], str]:
    """How messages name setting ``name`` given from ``origin``: the variable for the environment."""
    if origin == ENVIRONMENT:
        return lambda name: f"MMD_{name.upper()}"
    return lambda name: name


def _read(values: Mapping[str, Any], origin: str, typed: bool = False) -> dict[str, Any]:
    """``values`` from one layer, each read as its setting's (ConfigError naming the origin)."""
    at = _label(origin)
    out = {}
    for key, value in values.items():
        if key not in _RULES:
            raise ConfigError(f"{origin}: unknown setting {key!r} ({_unknown(key, NAMES)})")
        try:
            out[key] = read_value(key, value, at(key), typed=typed)
        except ConfigError as exc:
            raise ConfigError(f"{origin}: {exc.reason}", dict(exc.details)) from None
    return out


def _related(s: Settings, origin: str) -> Settings:
    """``s``, once the rules between settings hold (ConfigError naming the origin)."""
    for name, rule in _RULES.items():
        if rule.relation is not None:
            try:
                rule.relation(s)
            except Invalid as exc:
                raise ConfigError(f"{origin}: {_label(origin)(name)}{exc.sep}{exc.says}") from None
    return s


def _apply(base: Settings, values: Mapping[str, Any], origin: str, typed: bool = False) -> Settings:
    try:
        changes = _read(values, origin, typed)
        origins = {**base.origins, **dict.fromkeys(changes, origin)}
        merged = dataclasses.replace(base, **changes, sources=(*base.sources, origin), origins=origins)
        return _related(merged, origin)
    except ConfigError as exc:
        if origin == COMMAND_LINE and not isinstance(exc, UsageError):
            raise UsageError(exc.reason, dict(exc.details)) from None
        raise


def _unknown(name: str, known: Sequence[str], label: Callable[[str], str] = str) -> str:
    """What to say of an unknown name: the known ones it is close to, else them all (each as ``label`` has it)."""
    close = difflib.get_close_matches(name, known, n=3)
    return f"did you mean {' or '.join(map(label, close))}?" if close else f"known: {', '.join(map(label, known))}"


def graders_gids(settings: Settings) -> tuple[int, ...]:
    """The gid of ``graders_group`` (none when unset); ConfigError when there is no such group."""
    if settings.graders_group is None:
        return ()
    import grp

    try:
        return (grp.getgrnam(settings.graders_group).gr_gid,)
    except KeyError:
        raise ConfigError(f"graders_group: there is no group {settings.graders_group!r} on this machine") from None


def host_id_of(settings: Settings) -> str:
    """This daemon's host id: the setting, else the hostname (characters outside ``A-Za-z0-9._-`` → ``_``)."""
    if settings.host_id is not None:
        return settings.host_id
    name = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64].strip(".") or "localhost"
    return name


def kernel_cache_dir(settings: Settings, environ: Mapping[str, str] | None = None) -> Path | None:
    """Where compiled kernels are kept (None: no disk cache).

    ``auto``: ``$CACHE_DIRECTORY/kernels`` under systemd's ``CacheDirectory=``
    (the first folder when it lists several), else ``$XDG_CACHE_HOME/mmd/kernels``,
    else ``~/.cache/mmd/kernels``.
    """
    value = settings.kernel_cache
    if value is None:
        return None
    if value != "auto":
        return Path(value).expanduser()
    environ = os.environ if environ is None else environ
    if environ.get("CACHE_DIRECTORY"):
        return Path(environ["CACHE_DIRECTORY"].split(":")[0]) / "kernels"
    base = environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "mmd" / "kernels"


def read_file(path: Path) -> dict[str, Any]:
    """Read a YAML config file into a mapping (empty file: no settings)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of settings, got {type(data).__name__}")
    return data


#: ``MMD_*`` variables that are not settings: the config file, where libcublas is, and the
#: switch that turns the C text accelerator off (read where each is used).
NOT_SETTINGS = frozenset({"MMD_CONFIG", "MMD_CUBLAS", "MMD_NO_C"})
#: The variables a hook is told a job's facts in (:mod:`mmd.hooks`): not settings either, so a hook may run
#: mmd itself.
HOOK_VARIABLES: tuple[str, ...] = (
    "MMD_JOB_ID",
    "MMD_JOB_STATUS",
    "MMD_JOB_INPUT",
    "MMD_JOB_OUTPUT",
    "MMD_JOB_SIDECAR",
    "MMD_JOB_REASON",
    "MMD_JOB_KERNEL",
    "MMD_JOB_SUBMITTER",
)


def env_values(environ: Mapping[str, str]) -> dict[str, str | None]:
    """Settings given as ``MMD_<NAME>`` variables (see :data:`NOT_SETTINGS` for the others); any other
    ``MMD_*`` variable is ignored with an :class:`UnknownVariableWarning`."""
    out: dict[str, str | None] = {}
    for key, value in environ.items():
        if key.startswith("MMD_") and key not in NOT_SETTINGS and key not in HOOK_VARIABLES:
            name = key[4:].lower()
            if name not in _RULES:
                hint = _unknown(name, NAMES, _label(ENVIRONMENT))
                warnings.warn(f"{key} is not an mmd setting; ignored ({hint})", UnknownVariableWarning, stacklevel=2)
                continue
            out[name] = None if value.strip().lower() in ("", "null", "none") else value
    return out


def config_paths(environ: Mapping[str, str], service: bool = False) -> tuple[Path, ...]:
    """Where config files are looked for without --config or $MMD_CONFIG, lowest layer first: the service's
    ``/etc/mmd/mmd.yaml`` (``service``: for a command that addresses the service), the user's
    ``$XDG_CONFIG_HOME/mmd/mmd.yaml`` (``~/.config`` where it is unset, as the XDG spec says), this project's
    ``config/mmd.yaml``."""
    user = environ.get("XDG_CONFIG_HOME") or (str(Path(environ["HOME"]) / ".config") if environ.get("HOME") else "")
    found = [SYSTEM_CONFIG] if service else []
    if user and os.path.isabs(user):  # the spec: a relative one is invalid, ignored
        found.append(Path(user) / "mmd" / "mmd.yaml")
    return (*found, LOCAL_CONFIG)


def config_files(explicit: Path | None, environ: Mapping[str, str], service: bool = False) -> tuple[Path, ...]:
    """The config files read, lowest layer first: --config alone, else $MMD_CONFIG alone (the whole file
    configuration: the unit names the service's this way), else those of :func:`config_paths` that exist."""
    if explicit is not None:
        return (explicit,)
    if environ.get("MMD_CONFIG"):
        return (Path(environ["MMD_CONFIG"]),)
    # os.path.isfile is False where the path cannot even be looked at: /etc/mmd is the spool group's
    # alone, and another user's config is no concern of a student's command
    return tuple(path for path in config_paths(environ, service) if os.path.isfile(path))


def load(
    config: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    service: bool = False,
) -> Settings:
    """Settings from defaults, the config files, the environment and ``overrides`` (flags), each setting from
    the nearest layer that sets it. ``service``: the command addresses the service (its daemon, its control
    socket), so the service's own file is the lowest file layer.

    ``overrides`` entries that are None (flags not given) are ignored.
    """
    environ = os.environ if environ is None else environ
    settings = Settings()
    for path in config_files(config, environ, service):
        settings = _apply(settings, read_file(path), str(path), typed=True)
    settings = _apply(settings, env_values(environ), ENVIRONMENT)
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    if flags:
        settings = _apply(settings, flags, COMMAND_LINE)
    return settings


def physical_memory_bytes() -> int | None:
    """The machine's physical memory, or None where the OS will not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
