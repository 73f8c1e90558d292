"""``mmd config``: the settings in effect and where each came from."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .options import add_job_options, job_flags, load_settings, options_later

if TYPE_CHECKING:
    from .. import config

#: Settings' lines are padded to this width before their origin (a longer one is not).
VALUE_WIDTH = 40


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config",
        help="show the settings in effect and where each came from",
        description="Print every setting as a config file would hold it, each with where it came from: the "
        "default, a config file, an MMD_* variable or a flag (the job flags here show what `mmd run` or "
        "`mmd serve` given them would use). Layers, lowest first: defaults, the config files, MMD_* "
        "variables, flags; each setting comes from the nearest layer that sets it. The files, lowest first: "
        "the service's /etc/mmd/mmd.yaml (for the commands that address the service only: --service), "
        "$XDG_CONFIG_HOME/mmd/mmd.yaml, config/mmd.yaml here; --config or $MMD_CONFIG names one file read "
        "instead. Exit status: 0 shown, 78 a file or variable is wrong.",
    )
    options_later(p, add_job_options)
    p.add_argument(
        "--service",
        action="store_true",
        help="the settings of the commands that address the service (mmd status, cancel, rm), which also "
        "read /etc/mmd/mmd.yaml",
    )
    p.add_argument("--json", action="store_true", help="print {files, settings: {NAME: {value, from}}} as JSON")
    p.set_defaults(func=run)


def plain(value: Any) -> Any:
    """A setting's value as YAML and JSON have it: paths as text, tuples as lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value


def origin_of(settings: config.Settings, name: str) -> str:
    """Where ``name`` came from, a variable by its name."""
    from .. import config

    origin = settings.origin(name)
    return f"{config.ENVIRONMENT}: MMD_{name.upper()}" if origin == config.ENVIRONMENT else origin


def files(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The config files looked at, lowest first, each with what became of it."""
    from .. import config

    read = config.config_files(args.config, os.environ, args.service)
    if args.config is not None:
        return [(str(args.config), "read: --config, the one file")]
    if os.environ.get("MMD_CONFIG"):
        return [(str(read[0]), "read: $MMD_CONFIG, the one file")]
    looked = [
        (str(path), "read" if path in read else "absent") for path in config.config_paths(os.environ, args.service)
    ]
    if not args.service and os.path.isfile(config.SYSTEM_CONFIG):
        looked.insert(0, (str(config.SYSTEM_CONFIG), "not read: the service's, for its commands (--service)"))
    return looked


def run(args: argparse.Namespace) -> int:
    import yaml

    from .. import config

    settings = load_settings(args, **job_flags(args))
    values = {name: plain(getattr(settings, name)) for name in config.NAMES}
    looked = files(args)
    if args.json:
        shown = {name: {"value": values[name], "from": origin_of(settings, name)} for name in config.NAMES}
        print(json.dumps({"files": [{"path": p, "state": s} for p, s in looked], "settings": shown}, indent=1))
        return 0
    which = "of the commands that address the service" if args.service else "here (the service's commands: --service)"
    print(f"# mmd's settings {which}, each from the nearest layer that")
    print("# sets it; lowest first: defaults, the files below, MMD_* variables, flags.")
    width = max(len(path) for path, _ in looked)
    for path, state in looked:
        print(f"#   {path:<{width}}  {state}")
    for name in config.NAMES:
        text = yaml.safe_dump(values[name], default_flow_style=True, width=1 << 20).removesuffix("...\n").strip()
        line = f"{name}: {text}"
        print(f"{line:<{VALUE_WIDTH}}  # {origin_of(settings, name)}")
    return 0
