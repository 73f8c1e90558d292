"""The parsers' class, options shared by several sub-commands, turning them into settings, and the exit statuses.

Every ``mmd`` command builds every sub-command's parser before it runs one,
so nothing here, and no sub-command's module, imports more than argparse
and mmd.errors when it is imported: a sub-command whose options need the
config, the kernel registry or the benchmark adds them through
:func:`options_later`, and its module imports what it runs in ``run``
(tests/test_imports.py checks what ``mmd check --help`` imports).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, overload

from ..errors import ExitStatus

#: A namespace of the caller's own class (argparse's overloads).
_N = TypeVar("_N")

if TYPE_CHECKING:
    from .. import config

#: The exit statuses, by their meaning (mmd.errors.ExitStatus).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONFIG = ExitStatus.OK, ExitStatus.FAILED, ExitStatus.USAGE, ExitStatus.CONFIG

#: Adds a parser's options.
AddOptions = Callable[[argparse.ArgumentParser], None]


class Parser(argparse.ArgumentParser):
    """mmd's parsers: errors in one line, options added when the parser is first used (:func:`options_later`)."""

    #: The sub-commands' parsers by name (on the top parser).
    commands: Mapping[str, argparse.ArgumentParser] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.later: list[AddOptions] = []

    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def add_later_options(self) -> None:
        """Add the options :func:`options_later` put off (once)."""
        while self.later:
            self.later.pop(0)(self)

    # argparse's own overloads, so that this override has its shape
    @overload
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...
    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        self.add_later_options()  # a sub-command's parser is parsed with this call too
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self.add_later_options()
        return super().format_usage()

    def format_help(self) -> str:
        self.add_later_options()
        return super().format_help()


def options_later(parser: argparse.ArgumentParser, add: AddOptions) -> None:
    """Have ``add(parser)`` add ``parser``'s options when it first parses or shows its usage or help.

    For options whose choices or defaults come from heavy modules (the config
    and its kernel registry, the benchmark): ``add`` imports them, and only
    the command that is run pays for them. A plain ArgumentParser gets them now.
    """
    if isinstance(parser, Parser):
        parser.later.append(add)
    else:
        add(parser)


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """--config, --backend, --kernel, --tile, --memory, --device, -v."""
    from ..config import BACKENDS, MEMORY_MODES

    add_config_option(parser)
    parser.add_argument("--backend", choices=BACKENDS, help="where to multiply (default: auto)")
    parser.add_argument("--kernel", help="kernel name (see `mmd kernels`)")
    parser.add_argument("--tile", type=int, help="tile size T: T×T threads per block")
    parser.add_argument("--memory", choices=MEMORY_MODES, help="device memory mode")
    parser.add_argument("--device", type=int, help="CUDA device ordinal")
    add_verbose(parser)


def add_config_option(parser: argparse.ArgumentParser, *, service: bool = False) -> None:
    """--config, and whether the command addresses the service (its daemon, its control socket): only such a
    command reads the service's /etc/mmd/mmd.yaml (:func:`load_settings`)."""
    parser.set_defaults(service=service)
    machine = "/etc/mmd/mmd.yaml, " if service else ""
    parser.add_argument(
        "--config",
        type=Path,
        help=f"the one config file to read (default: $MMD_CONFIG, else the layers {machine}"
        "$XDG_CONFIG_HOME/mmd/mmd.yaml, config/mmd.yaml, the nearest winning; `mmd config` shows them)",
    )


def add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="log each job's progress on stderr")


def job_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The job settings given as flags (None: not given)."""
    from ..config import JOB_FLAGS

    return {name: getattr(args, name, None) for name in JOB_FLAGS}


def load_settings(args: argparse.Namespace, **flags: Any) -> config.Settings:
    """The command's settings: defaults < config files < environment < ``flags`` (None: not given). The one
    place that reads whether the command addresses the service (``args.service``, from
    :func:`add_config_option`), so that a user's own daemon or job never takes the service's settings."""
    from .. import config

    return config.load(args.config, flags, service=args.service)


def settings_from(args: argparse.Namespace, quiet: bool = False, **extra: Any) -> config.Settings:
    """:func:`load_settings` with the job flags and ``extra``, and the logs configured.

    One-shot commands (``quiet``) log errors only unless ``-v`` is given:
    their result, or their one-line refusal, is what they print, not a log.
    """
    settings = load_settings(args, **job_flags(args), **extra)
    configure_logs(settings, quiet and not getattr(args, "verbose", False))
    return settings


def configure_logs(settings: config.Settings, quiet: bool) -> None:
    from .. import logs  # structlog: once a command runs

    logs.configure(settings.log_format, "error" if quiet else settings.log_level)


class NotServing(Exception):
    """No daemon answers on the control socket (exit status 3)."""


def ask_daemon(settings: config.Settings, request: dict[str, Any]) -> dict[str, Any]:
    """The daemon's answer to ``request`` on its control socket (mmd.daemon.local); ConfigError where no
    ``control_socket`` is set, NotServing where no daemon answers on it."""
    from ..daemon.local import ask  # the socket's protocol: only for the commands that ask
    from ..errors import ConfigError

    if settings.control_socket is None:
        raise ConfigError(
            'no control_socket is set: this command asks the daemon over it (docs/operations.md, "A class on one box")'
        )
    try:
        return ask(settings.control_socket, request)
    except (OSError, ValueError) as exc:
        raise NotServing(f"no daemon answers on {settings.control_socket} ({exc})") from None
