"""``mmd hand-in NAME.cu``: check a kernel file here, then drop it in the service's inbox by the upload recipe."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
from pathlib import Path

from ..errors import KernelFileError, SpoolError, UnreadableError, UsageError
from .options import add_config_option, load_settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hand-in",
        help="hand a kernel file in to the class's service",
        description="Hand in a kernel: NAME.cu is read here as mmd reads it (the include guard, its declaration; "
        "no compile), then dropped in the service's inbox under a hidden name with mode 0640 and given its name "
        "only where nothing holds it (docs/operations.md, 'Students upload'); its declaration, where it has one, "
        "lands first as NAME.kernel.yaml. mmd answers in outbox/<login>/NAME.handin.yaml. Exit status: 0 handed "
        "in, 1 refused here (the kernel, or its name held in the inbox: a hand-in of that name still waiting), "
        "2 bad usage, a file not NAME.cu or one (or an inbox) that cannot be used, 78 bad configuration.",
    )
    add_config_option(p, service=True)
    p.add_argument("file", type=Path, metavar="NAME.cu", help="the kernel file")
    p.add_argument(
        "--declaration",
        type=Path,
        metavar="FILE.kernel.yaml",
        help="its declaration (default: NAME.kernel.yaml beside it, where there is one)",
    )
    p.add_argument("--inbox", type=Path, help="the service's inbox (default: from the config, else inbox)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..kernelchoice import SUFFIX
    from ..kernelfile.reading import SIDECAR_SUFFIX, parse_kernel
    from ..kernels import NAMES
    from ..record import HANDIN_SUFFIX
    from ..spool.handins import MAX_DECLARATION_BYTES, is_handin
    from ..submitters import login_of
    from . import paths

    settings = load_settings(args, inbox=args.inbox)
    inbox = paths.folder(settings.inbox, "the inbox")
    name = args.file.name
    if not is_handin(name):
        raise UsageError(f"{name}: a hand-in is NAME{SUFFIX}, NAME letters, digits, _ and - (64 at most)")
    stem = name[: -len(SUFFIX)]
    if stem in NAMES:
        raise UsageError(f"{name}: {stem} is one of mmd's own kernels: give yours another name")
    source = _read(args.file, "kernel file")
    declared = args.declaration
    if declared is None and (beside := args.file.with_name(stem + SIDECAR_SUFFIX)).exists():
        declared = beside
    declaration = None if declared is None else _read(declared, "declaration")
    if declaration is not None and len(declaration) > MAX_DECLARATION_BYTES:
        raise KernelFileError(f"{declared}: more than {MAX_DECLARATION_BYTES} bytes")
    try:
        text = None if declaration is None else declaration.decode("utf-8")
    except UnicodeDecodeError:
        raise KernelFileError(f"{declared}: cannot be read: not UTF-8 text") from None
    # the inbox's name for the declaration: what mmd reads and a refusal names
    parse_kernel(source, name, text, stem + SIDECAR_SUFFIX)
    drops = [(stem + SIDECAR_SUFFIX, declaration)] if declaration is not None else []
    landed: list[tuple[Path, int]] = []
    try:
        for final, data in [*drops, (name, source)]:
            landed.append(_drop(inbox, final, data))
    except BaseException:
        # a declaration that landed without its kernel would wait for another's NAME.cu: taken back
        for path, inode in landed:
            with contextlib.suppress(OSError):
                if os.lstat(path).st_ino == inode:
                    os.unlink(path)
        raise
    login = login_of(os.getuid())
    outbox = settings.outbox / login if settings.class_mode else settings.outbox
    print(f"handed in {inbox / name}; mmd's answer will be in {outbox / (stem + HANDIN_SUFFIX)}")
    return 0


def _read(path: Path, what: str) -> bytes:
    """The bytes of a file the user named (a refusal: UnreadableError, exit status 2)."""
    from . import paths

    try:
        return paths.input_file(path).read_bytes()
    except UnreadableError as exc:
        raise UnreadableError(f"{what} {exc.reason}") from None
    except OSError as exc:
        raise UnreadableError(f"{what} {path}: cannot be read: {exc.strerror}") from None


def _drop(inbox: Path, final: str, data: bytes) -> tuple[Path, int]:
    """``data`` written in ``inbox`` under a hidden ``.FINAL.<random>.part`` (0640: the service reads it, no
    classmate does), then given the name ``final`` only where nothing is there: a hard link never replaces what
    holds a name (a classmate's folder there would receive a renamed file). Returns the path and its inode."""
    from ..fileops import OPS, write_all

    target = inbox / final
    part = inbox / f".{final}.{secrets.token_hex(4)}.part"
    try:
        fd = OPS.open_exclusive(part, 0o640)
    except OSError as exc:
        raise SpoolError(f"cannot write in the inbox {inbox}: {exc.strerror}") from None
    try:
        try:
            os.fchmod(fd, 0o640)  # the mode asked at open is cut by the umask
            write_all(OPS, fd, data)
            OPS.fsync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        OPS.link(part, target)
    except FileExistsError:
        raise SpoolError(
            f"{final}: that name is held in the inbox (a hand-in of that name still waiting for mmd, or another's "
            "file or folder): hand it in again once mmd has answered"
        ) from None
    except OSError as exc:
        raise SpoolError(f"cannot put {final} in the inbox {inbox}: {exc.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            OPS.unlink(part)
    return target, inode
