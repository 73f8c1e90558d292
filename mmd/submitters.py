"""Who submitted a job: the owner of the file they dropped, by login.

The inbox of a class is written by many users; the file's owner is the one
fact about a job that no name, header or content can forge (a student can
give away nothing: ``chown`` needs a capability). Its login is what the
sidecar, the logs and the hooks say, and what class mode names a student's
outputs by.
"""

from __future__ import annotations

import functools
import pwd
import re

#: A login as mmd uses it (in folder names too): anything else is shown as the uid.
_LOGIN_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")


def is_login(name: str) -> bool:
    """Whether ``name`` is a login as mmd uses it (a roster's line, a class's folder name)."""
    return bool(_LOGIN_RE.fullmatch(name))


@functools.lru_cache(maxsize=1024)
def login_of(uid: int) -> str:
    """The login of ``uid``, or the uid in digits where it has none (or one unfit for a folder name)."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
    return name if _LOGIN_RE.fullmatch(name) else str(uid)
