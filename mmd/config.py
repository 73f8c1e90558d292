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
import shlex
import socket
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from . import kernels
from .errors import ConfigError, MmdError, UsageError
from .hooks import HOOK_VARIABLES

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

CHOICES: dict[str, tuple[str, ...]] = {
    "backend": BACKENDS,
    "memory": MEMORY_MODES,
    "text_path": TEXT_PATHS,
    "observer": ("auto", "inotify", "polling"),
    "log_format": ("auto", "json", "console"),
    "log_level": ("debug", "info", "warning", "error"),
}


@dataclass(frozen=True)
class Settings:
    """Everything mmd can be told. Field comments are the documentation."""

    # -- the job --
    backend: str = "auto"  # auto: cuda when it works, else cpu (and say so)
    kernel: str = "tiled"  # a name from `mmd kernels`
    tile: int = 32  # threads per block edge; 64 is refused on every current GPU
    memory: str = "device"  # device | pitched | managed
    device: int = 0  # CUDA device ordinal (after CUDA_VISIBLE_DEVICES) for `mmd run` and `mmd bench`
    #: `mmd serve`: one worker per device ordinal; None (`all`): every visible GPU (one worker on the cpu backend)
    devices: tuple[int, ...] | None = None
    #: `mmd serve` on a GPU: worker processes per device, each with its own CUDA context (what each holds of
    #: the GPU's memory: docs/daemon.md); the cpu backend runs one worker per usable core
    workers_per_device: int = 8
    #: `mmd serve` on a GPU: page-locked host memory (MiB) each worker sets aside once it is ready, so that the
    #: first big job runs as fast as the tenth: the buffers of the largest square job that fit (480: 4166×4166,
    #: above the course's 4096); 0: none until jobs come. Host memory only: no GPU memory is held (docs/daemon.md)
    warm_up_mib: int = 480
    kernel_cache: str | None = "auto"  # compiled kernels; auto: $XDG_CACHE_HOME/mmd/kernels (~/.cache/...); null: off
    text_path: str = "auto"  # auto: on the GPU when the backend can and the input is 256 KiB or more | host | gpu
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
    class_mode: bool = False
    graders_group: str | None = None  # class mode: the group that reads every student's outputs; null: none
    #: where `mmd status`, `mmd cancel` and `mmd rm` ask the daemon (an AF_UNIX socket any local user may
    #: reach; each is answered only about their own jobs); null: no socket
    control_socket: Path | None = None
    #: connections one user may hold open to control_socket at once; one more is refused at once, so a student
    #: holding idle ones holds up no one else (root and the service's own user: no cap)
    control_connections_per_user: int = 8
    #: requests a second one user's requests reach the daemon at: a burst of two seconds' worth at once, then
    #: each waits its turn (root and the service's own user: no cap)
    control_requests_per_s: float = 5.0
    # -- limits --
    max_memory_bytes: int | None = None  # None: the machine's physical memory
    max_file_bytes: int | None = None  # largest input file; None: the memory limit (it is read whole)
    #: an input may take at most this many bytes per value its header promises (a number and the blanks
    #: around it, on average) plus 1 MiB; larger is refused unread. None: no such bound
    max_bytes_per_value: int | None = 64
    max_dim: int | None = None  # largest M, K or N a job may have; None: no limit
    #: the largest output a job may make, judged from its header (6-byte fields: the least its shape makes)
    #: and refused unread; 1 GiB serves the course's largest, 8192 (about 470 MB). None: no limit
    max_output_bytes: int | None = 1 << 30
    #: class_mode: an output may be at most this many times its input, or output_ratio_floor_bytes, whichever
    #: is larger: every course size passes, a 66 KB `6000 1 6000` (216 MB out) does not. None: no such bound
    max_output_ratio: float | None = 16.0
    output_ratio_floor_bytes: int = 8 << 20  # class_mode: an output this small is never refused for its ratio
    #: class_mode: the most one student's outputs, sidecars and archived inputs may take (allocated blocks: a
    #: tiny file takes 4 KiB); a job that would pass it is refused, and `mmd rm` or retention makes room.
    #: null: no quota
    max_submitter_bytes: int | None = 2 << 30
    #: class_mode: the most files (outputs, sidecars, archived inputs: three a job) one student may keep; a job
    #: past it is refused as max_submitter_bytes's are. null: no such bound
    max_submitter_files: int | None = 30_000
    #: class_mode: a refused input is archived only up to this many of its first bytes (a note says so), and
    #: one refused unread (from its header) up to 64 KiB at most. null: refused inputs read are kept whole
    archive_refused_bytes: int | None = 1 << 20
    #: free space the daemon keeps on the outbox's disk for everyone: a job whose output would eat into it
    #: is refused (a class box's installer sets 1 GiB). null: none, a full disk holds jobs until it has room
    min_free_bytes: int | None = None
    #: free inodes the daemon keeps on the outbox's disk for everyone (where it counts them): a job is refused
    #: while fewer are free. null: none
    min_free_inodes: int | None = 10_000
    #: outputs, sidecars and archived inputs older than this are removed (hourly); null: kept for ever
    retention_days: float | None = None
    max_queue: int = 100_000  # jobs waiting in the daemon's queue
    #: the most files of one submitter the daemon's queue holds (waiting or in hand); the rest wait in the inbox,
    #: so that one student's flood leaves the queue room for everyone else's. null: only max_queue bounds them
    max_waiting_per_submitter: int | None = 10_000
    #: the most workers one submitter's big jobs (inputs over 256 KiB) may hold at once, so that a classmate's
    #: small job always finds a worker (a job in hand is never preempted). null: half the workers, rounded up,
    #: with class_mode; no cap without
    max_workers_per_submitter: int | None = None
    # -- the daemon --
    observer: str = "auto"  # auto | inotify | polling (network filesystems)
    rescan_seconds: float = 5.0  # full inbox rescan period; events are only hints
    quiet_seconds: float = 0.5  # size/mtime unchanged this long => file complete (if no write was seen)
    #: an upload (a regular file named *.part, *.tmp or *~) this long after the daemon first saw it is removed:
    #: it died, or its name was taken to block someone else's upload (never judged by its mtime)
    upload_max_age_s: float = 86400.0
    #: a folder under a job's name (`mkdir hw1.txt`), or a file still not completely written this long after the
    #: daemon first saw it, is set aside out of the name's way (into state_dir's .failed) and its owner gets an
    #: error sidecar saying why; judged by the daemon's clock, never the file's mtime. Longer than quiet_seconds
    drop_box_grace_s: float = 600.0
    poll_seconds: float = 1.0  # polling observer period
    shared_inbox: bool = False  # several hosts serve one inbox on a shared filesystem (docs/cluster.md)
    host_id: str | None = None  # this host's name in a shared inbox; None: the hostname
    # -- the service (docs/operations.md) --
    job_timeout_s: float = 3600.0  # a job running longer is stopped and failed (`timeout`); per job: NAME@timeout=600
    max_attempts: int = 3  # a job that killed the daemon this many times is failed, not started again
    #: the longest one launch of a kernel file may run: past it, its process (and CUDA context) is killed and the
    #: job refused; never more than the job's own time limit, job_timeout_s
    kernel_file_launch_timeout_s: float = 5.0
    #: folders of kernel files a job's name may pick: NAME@kernel=p1.txt runs p1.cu of the first folder holding one
    #: (never in place of one of mmd's own kernels), as `mmd run --kernel-file` does. Folders only the admin may
    #: write, outside the inbox and outbox. Empty (the default): names pick mmd's own kernels only
    kernel_folders: tuple[Path, ...] = ()
    #: class mode: students may hand in kernels of their own (NAME.cu dropped in the inbox, kept in state_dir/kernels)
    #: and their jobs run them (NAME@kernel=p1.txt: their own p1.cu, never a classmate's or in place of one of
    #: mmd's own kernels). Off (the default): a hand-in is refused with a sidecar saying so
    student_kernels: bool = False
    metrics_file: Path | None = None  # Prometheus text file (node_exporter's textfile collector); null: none
    metrics_seconds: float = 5.0  # the metrics file is rewritten this often, and after each job
    #: HOST:PORT where Prometheus scrapes the same metrics over HTTP (a dead daemon's scrape fails, so
    #: `up == 0` fires); the unit allows loopback only. null: no endpoint
    metrics_listen: str | None = None
    on_done: tuple[str, ...] | None = None  # a command (argv list, no shell) run after each job with an output
    on_error: tuple[str, ...] | None = None  # a command run after each refused job
    hook_timeout_s: float = 30.0  # a hook still running after this long is killed (the job is not affected)
    #: the least time limit a name may set: a job stopped at its limit costs its worker, ended and started
    #: again (a fresh process, on a GPU a fresh CUDA context: about a second), so smaller ones would let a
    #: name spend the box's time on restarts
    min_name_timeout_s: float = 1.0
    #: what a file name may set: a key alone (``tile``) lets it pick any value, ``key=value`` items only
    #: those values (``[kernel=tiled, kernel=fast, timeout]``); null: names set nothing. ``timeout`` may only
    #: lower job_timeout_s, whatever this says
    name_settings: tuple[str, ...] | None = tuple(NAME_KEYS)
    # -- durability --
    durable: bool = True  # fsync outputs and sidecars before they count as committed
    # -- logs --
    log_format: str = "auto"  # auto: console on a terminal, JSON otherwise
    log_level: str = "info"
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
        return _validated(dataclasses.replace(self, **clean, origins=origins), OVERRIDE)

    def with_values(self, values: Mapping[str, Any], origin: str) -> Settings:
        """A copy with ``values`` (setting → raw value, as a file or variable gives it) coerced, applied
        and validated; ``origin`` names where they came from in messages and in :attr:`sources`."""
        return _apply(self, values, origin)

    def origin(self, name: str) -> str:
        """Where setting ``name`` came from: a file's path, ENVIRONMENT, COMMAND_LINE, ..., or DEFAULT."""
        return self.origins.get(name, DEFAULT)


#: The origin of a setting no layer set.
DEFAULT = "default"
#: The origin of a setting the program changed (:meth:`Settings.replace`).
OVERRIDE = "override"

_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}

_FIELDS = {f.name: f for f in fields(Settings) if f.name not in ("sources", "origins")}
#: Every setting's name, in the order Settings declares them.
NAMES: tuple[str, ...] = tuple(_FIELDS)


def _unknown(name: str, known: Sequence[str], label: Callable[[str], str] = str) -> str:
    """What to say of an unknown name: the known ones it is close to, else them all (each as ``label`` has it)."""
    close = difflib.get_close_matches(name, known, n=3)
    return f"did you mean {' or '.join(map(label, close))}?" if close else f"known: {', '.join(map(label, known))}"


#: What a host id may hold: it becomes part of file names in the shared inbox.
HOST_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _devices(value: Any, where: str) -> tuple[int, ...] | None:
    """``devices``: a list of ordinals (YAML list, or ``0,1`` / ``[0, 1]`` from the environment); all/null: None."""
    if isinstance(value, str):
        text = value.strip().strip("[]").strip()
        if text.lower() in ("all", "auto"):
            return None
        value = [v for v in re.split(r"[,\s]+", text) if v]
    elif isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{where} must be a list of device ordinals or all, got {value!r}")
    out = []
    for item in value:
        if isinstance(item, bool) or not (isinstance(item, int) or (isinstance(item, str) and item.isdigit())):
            raise ConfigError(f"{where} must be a list of device ordinals or all, got {value!r}")
        out.append(int(item))
    if len(set(out)) != len(out):
        raise ConfigError(f"{where} names a device twice: {out}")
    return tuple(out)


def _argv(value: Any, where: str) -> tuple[str, ...]:
    """A command as an argv list: a YAML list of strings, or a string split as a shell would (never run by one)."""
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where} must be a command: a list of strings (program first), got {value!r}")
    return tuple(value)


def _folders(value: Any, where: str) -> tuple[Path, ...]:
    """Folders: a YAML list of paths, or text with one path per ``:`` (as PATH; an environment variable)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part for part in value.split(os.pathsep) if part]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, Path)) and str(v) for v in value):
        raise ConfigError(f"{where} must be a list of folders, got {value!r}")
    return tuple(Path(v) for v in value)


def listen_address(value: str, where: str = "metrics_listen") -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets) → (host, port); ConfigError otherwise."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where} must be HOST:PORT (say 127.0.0.1:9817), got {value!r}")
    return host, int(port)


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


#: The origin of settings from ``MMD_*`` variables; their messages name the variable.
ENVIRONMENT = "environment"


def _label(origin: str) -> Callable[[str], str]:
    """How messages name setting ``name`` given from ``origin``: the variable for the environment."""
    if origin == ENVIRONMENT:
        return lambda name: f"MMD_{name.upper()}"
    return lambda name: name


def _coerce(name: str, value: Any, origin: str, typed: bool = False) -> Any:
    """Convert ``value`` to the type of setting ``name`` or raise ConfigError.

    ``typed``: ``value`` comes from YAML, which has numbers and booleans of its own, so text is not
    parsed as one (else it comes from text: the environment, a file name, a flag).
    """
    ftype = str(_FIELDS[name].type)
    where = f"{origin}: {_label(origin)(name)}"
    if name == "devices":
        return None if value is None else _devices(value, where)
    if ftype.startswith("tuple[str"):
        return None if value is None else _argv(value, where)
    if ftype.startswith("tuple[Path"):
        return _folders(value, where)
    if value is None:
        if "None" in ftype:
            return None
        raise ConfigError(f"{where} must not be empty")
    try:
        if typed and isinstance(value, str) and not ftype.startswith(("str", "Path")):
            raise ValueError
        if ftype == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
                return _BOOL_WORDS[value.strip().lower()]
            raise ValueError
        if ftype.startswith("int"):
            if isinstance(value, bool) or (isinstance(value, float) and (typed or not value.is_integer())):
                raise ValueError
            return int(str(value).replace("_", "")) if isinstance(value, str) else int(value)
        if ftype.startswith("float"):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if ftype.startswith("Path"):
            if not isinstance(value, (str, Path)) or str(value) == "":
                raise ValueError
            return Path(value)
        if ftype.startswith("str"):
            if not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be {ftype.replace(' | None', ' or null')}, got {value!r}") from None
    raise AssertionError(f"unhandled setting type {ftype}")


def _validated(s: Settings, origin: str) -> Settings:
    at = _label(origin)
    for name, allowed in CHOICES.items():
        value = getattr(s, name)
        if value not in allowed:
            raise ConfigError(f"{origin}: {at(name)} must be one of {', '.join(allowed)}, got {value!r}")
    for name, check in (("kernel", lambda: kernels.get(s.kernel)), ("tile", lambda: kernels.check_tile(s.tile))):
        try:  # the registry is the one judge of kernel names and tiles
            check()
        except MmdError as exc:
            where = f"{at(name)}: " if origin == ENVIRONMENT else ""
            raise ConfigError(f"{origin}: {where}{exc.reason}", dict(exc.details)) from None
    for name in (
        "rescan_seconds",
        "quiet_seconds",
        "poll_seconds",
        "job_timeout_s",
        "metrics_seconds",
        "hook_timeout_s",
        "upload_max_age_s",
        "min_name_timeout_s",
        "control_connections_per_user",
        "control_requests_per_s",
    ):
        if getattr(s, name) <= 0:
            raise ConfigError(f"{origin}: {at(name)} must be positive")
    if s.kernel_file_launch_timeout_s <= 0:
        raise ConfigError(f"{origin}: {at('kernel_file_launch_timeout_s')} must be positive")
    if s.drop_box_grace_s <= s.quiet_seconds:
        raise ConfigError(f"{origin}: {at('drop_box_grace_s')} must be longer than quiet_seconds ({s.quiet_seconds})")
    if s.max_attempts < 1:
        raise ConfigError(f"{origin}: {at('max_attempts')} must be at least 1")
    for name in ("max_memory_bytes", "max_file_bytes", "max_bytes_per_value", "max_dim", "max_output_bytes",
                 "max_submitter_bytes", "max_submitter_files", "retention_days", "max_waiting_per_submitter",
                 "max_workers_per_submitter"):  # fmt: skip
        value = getattr(s, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{origin}: {at(name)} must be positive or null")
    if s.max_output_ratio is not None and s.max_output_ratio <= 0:
        raise ConfigError(f"{origin}: {at('max_output_ratio')} must be positive or null")
    for name in ("min_free_bytes", "min_free_inodes", "archive_refused_bytes"):
        value = getattr(s, name)
        if value is not None and value < 0:
            raise ConfigError(f"{origin}: {at(name)} must not be negative")
    if s.output_ratio_floor_bytes < 0:
        raise ConfigError(f"{origin}: {at('output_ratio_floor_bytes')} must not be negative")
    if s.max_queue <= 0:
        raise ConfigError(f"{origin}: {at('max_queue')} must be positive")
    if s.warm_up_mib < 0:
        raise ConfigError(f"{origin}: {at('warm_up_mib')} must not be negative, got {s.warm_up_mib}")
    if not 1 <= s.workers_per_device <= 64:
        raise ConfigError(f"{origin}: {at('workers_per_device')} must be 1 to 64, got {s.workers_per_device}")
    if s.devices is not None and (not s.devices or any(d < 0 for d in s.devices)):
        raise ConfigError(f"{origin}: {at('devices')} must be device ordinals (0, 1, ...), got {list(s.devices)}")
    if s.host_id is not None and (not HOST_ID_RE.fullmatch(s.host_id) or s.host_id in (".", "..")):
        raise ConfigError(
            f"{origin}: {at('host_id')} may hold letters, digits, '.', '_' and '-' (1 to 64), got {s.host_id!r}"
        )
    if s.metrics_listen is not None:
        listen_address(s.metrics_listen, f"{origin}: {at('metrics_listen')}")
    if s.class_mode and s.state_dir is None:
        raise ConfigError(
            f"{origin}: {at('class_mode')} needs state_dir: a folder only the service may write, on the inbox's "
            "filesystem, for its lock, state and claimed jobs (docs/operations.md)"
        )
    if s.class_mode and s.shared_inbox:
        raise ConfigError(
            f"{origin}: {at('class_mode')} does not combine with shared_inbox yet: serve a class from one box"
        )
    if s.student_kernels and not s.class_mode:
        raise ConfigError(
            f"{origin}: {at('student_kernels')} needs class_mode: students hand in kernels to a class box"
        )
    name_rule(s.name_settings, origin)
    if s.kernel_cache is not None and not s.kernel_cache:
        raise ConfigError(f"{origin}: {at('kernel_cache')} must be auto, a folder or null")
    for folder in s.kernel_folders:
        # whoever may drop a file there could pick it by name and have the service compile and run it
        for name in ("inbox", "outbox", "state_dir"):
            other = getattr(s, name)
            if other is not None and _within(folder, other):
                raise ConfigError(
                    f"{origin}: {at('kernel_folders')}: {folder} is in the {name} ({other}): a kernel folder is the "
                    "admin's alone, never a folder others may write"
                )
    return s


def _within(inner: Path, outer: Path) -> bool:
    """Whether ``inner`` is ``outer`` or in it, by their absolute paths (nothing is read from the filesystem)."""
    a, b = Path(os.path.abspath(inner)), Path(os.path.abspath(outer))
    return a == b or b in a.parents


def name_rule(items: tuple[str, ...] | None, origin: str = "name_settings") -> dict[str, frozenset[Any] | None]:
    """``name_settings`` as a rule: name key → the values a name may pick (None: any); a key not in it may
    not be set. Each value is judged as the setting it sets is (ConfigError naming the item)."""
    rule: dict[str, frozenset[Any] | None] = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        where = f"{origin}: name_settings"
        if key not in NAME_KEYS:
            raise ConfigError(f"{where}: unknown setting {key!r} ({_unknown(key, tuple(NAME_KEYS))})")
        picks: frozenset[Any] | None = None
        if eq:
            setting = NAME_KEYS[key]
            one = _validated(dataclasses.replace(Settings(), **{setting: _coerce(setting, value, where)}), where)
            picks = frozenset({getattr(one, setting)})
        known = rule.get(key, frozenset())
        rule[key] = None if picks is None or known is None else known | picks
    return rule


#: The origin of settings given as flags: their errors are usage errors.
COMMAND_LINE = "command line"


def _apply(base: Settings, values: Mapping[str, Any], origin: str, typed: bool = False) -> Settings:
    try:
        changes = {}
        for key, value in values.items():
            if key not in _FIELDS:
                raise ConfigError(f"{origin}: unknown setting {key!r} ({_unknown(key, NAMES)})")
            changes[key] = _coerce(key, value, origin, typed)
        origins = {**base.origins, **dict.fromkeys(changes, origin)}
        merged = dataclasses.replace(base, **changes, sources=(*base.sources, origin), origins=origins)
        return _validated(merged, origin)
    except ConfigError as exc:
        if origin == COMMAND_LINE and not isinstance(exc, UsageError):
            raise UsageError(exc.reason, dict(exc.details)) from None
        raise


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


def env_values(environ: Mapping[str, str]) -> dict[str, str | None]:
    """Settings given as ``MMD_<NAME>`` variables (see :data:`NOT_SETTINGS` for the others); any other
    ``MMD_*`` variable is ignored with an :class:`UnknownVariableWarning`."""
    out: dict[str, str | None] = {}
    for key, value in environ.items():
        # A hook's own variables are not settings either, so a hook may run mmd itself.
        if key.startswith("MMD_") and key not in NOT_SETTINGS and key not in HOOK_VARIABLES:
            name = key[4:].lower()
            if name not in _FIELDS:
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
