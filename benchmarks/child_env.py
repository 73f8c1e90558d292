"""The one environment every benchmark runs mmd in: the caller's, without its ``MMD_*`` variables, reading
no config file of the host's, with the benchmark's own settings on top.

A benchmark measures a checkout as shipped, whatever box it runs on: a shell's ``MMD_*`` variables and the
host's config files (a class box's ``/etc/mmd/mmd.yaml``, with a state_dir and class_mode a benchmark's
daemon cannot use; the caller's ``~/.config/mmd/mmd.yaml``; a ``config/mmd.yaml`` where it runs) would
change what is measured or stop its daemons. ``$MMD_CONFIG`` naming an empty file is the one file read,
by this tree's mmd and by an older one's (``--tree before=PATH``), whatever its rule for finding files.
"""

from __future__ import annotations

import os


def child_env(**settings: str) -> dict[str, str]:
    """The environment for a benchmark's mmd processes: ``settings`` (``MMD_BACKEND="cpu"``, ``PYTHONPATH``...)
    over the caller's environment less its ``MMD_*`` variables, with ``MMD_CONFIG`` an empty config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMD_")}
    env["MMD_CONFIG"] = os.devnull
    env.update(settings)
    return env
