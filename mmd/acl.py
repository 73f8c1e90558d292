"""POSIX ACLs on a folder: who besides mmd may read it and what is made in it.

In class mode each student's outputs are in a folder of their own that
only they (and the graders) may read. mmd runs with no capabilities, so it
cannot give the student the files (``chown``); an ACL grants them read
instead, and the folder's default ACL gives every file made in it the same,
whatever umask mmd runs with.

Written by hand, as the kernel's extended attributes
(``system.posix_acl_access``, ``system.posix_acl_default``): the format is
the kernel's stable ABI (``linux/posix_acl_xattr.h``: a version word, then
8-byte entries sorted by tag and id), a dozen lines with ``os.setxattr``,
while pylibacl comes only as a source package that needs libacl's headers
and the ``acl`` tools are not installed everywhere mmd runs.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Sequence
from pathlib import Path

from .errors import SpoolError

_ACCESS, _DEFAULT = "system.posix_acl_access", "system.posix_acl_default"
_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF
_R, _W, _X = 4, 2, 1


def _blob(entries: list[tuple[int, int, int]]) -> bytes:
    return struct.pack("<I", _VERSION) + b"".join(struct.pack("<HHI", *e) for e in sorted(entries))


def _acl(owner: int, readers: int, users: Sequence[int], groups: Sequence[int]) -> bytes:
    """Owner ``owner``; each user and group ``readers``; the folder's own group and others nothing."""
    entries = [(_USER_OBJ, owner, _UNDEFINED), (_GROUP_OBJ, 0, _UNDEFINED), (_OTHER, 0, _UNDEFINED)]
    entries += [(_USER, readers, uid) for uid in sorted(set(users))]
    entries += [(_GROUP, readers, gid) for gid in sorted(set(groups))]
    entries.append((_MASK, readers, _UNDEFINED))
    return _blob(entries)


def share_folder(folder: Path, users: Sequence[int], groups: Sequence[int] = ()) -> None:
    """Let ``users`` and ``groups`` list and read ``folder`` and every file made in it later, and no one else
    but its owner (its own group and others get nothing). Raises OSError (ENOTSUP where the filesystem has
    no ACLs)."""
    os.setxattr(folder, _ACCESS, _acl(_R | _W | _X, _R | _X, users, groups), follow_symlinks=False)
    os.setxattr(folder, _DEFAULT, _acl(_R | _W, _R, users, groups), follow_symlinks=False)


def private_drops(folder: Path, reader: int) -> None:
    """Make every file created in ``folder`` from now on readable by its creator and ``reader`` only (a
    default ACL; the folder's own permissions stay as they are), whatever the creator's umask. Raises
    OSError (EPERM where this process does not own the folder, ENOTSUP where there are no ACLs)."""
    os.setxattr(folder, _DEFAULT, _acl(_R | _W, _R, [reader], []), follow_symlinks=False)


def check_supported(folder: Path) -> None:
    """Raise SpoolError when ``folder``'s filesystem keeps no POSIX ACLs (class mode needs them)."""
    try:
        os.getxattr(folder, _ACCESS)
    except OSError as exc:
        if exc.errno == errno.ENODATA:
            return  # supported, none set
        raise SpoolError(
            f"class_mode needs POSIX ACLs on the spool's filesystem ({folder}: {exc.strerror}): each student's "
            "files are shared with the service or that student by one; mount it with acl"
        ) from None


def readers(path: Path) -> tuple[set[int], set[int]]:
    """The users and groups ``path``'s ACL names (empty sets: no ACL)."""
    try:
        blob = os.getxattr(path, _ACCESS, follow_symlinks=False)
    except OSError:
        return set(), set()
    users, groups = set(), set()
    for tag, _perm, ident in struct.iter_unpack("<HHI", blob[4:]):
        if tag == _USER:
            users.add(ident)
        elif tag == _GROUP:
            groups.add(ident)
    return users, groups
