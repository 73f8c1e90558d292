"""A kernel a student hands in (class mode): ``NAME.cu`` dropped in the inbox, judged, kept, answered.

:func:`is_handin` tells a hand-in's name from a job's (the drop box's survey lists hand-ins apart);
:func:`receive` takes one from the inbox as its owner's: reads it (and its ``NAME.kernel.yaml`` beside it, where
the same student dropped one) without following a link, reads it as a kernel file (the include guard and the
declaration: :func:`mmd.kernelfile.reading.parse_kernel`), checks each course tile against the limits of every
CUDA GPU (:data:`mmd.kernels.COMMON_LIMITS`: no GPU is needed) and compiles it there with NVRTC (in a child
process under limits, :mod:`mmd.kernelfile.nvrtc`), keeps it in the store (:mod:`mmd.kernelfile.store`, counted
toward the student's quota in the ledger) and answers with ``outbox/<login>/NAME.handin.yaml``
(:class:`mmd.record.HandInRecord`): what mmd understood and the tiles it runs at, or why not (the compiler's
lines on the author's own file). A refused hand-in leaves the version kept before it, if any, current.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .. import kernels
from ..atomic import write_atomic
from ..errors import KernelFileError, MmdError, OutputError
from ..kernelchoice import FOLDER_NAME, SUFFIX
from ..kernelfile.nvrtc import compile_kernel
from ..kernelfile.reading import MAX_SOURCE_BYTES, SIDECAR_SUFFIX, KernelFile, parse_kernel
from ..kernelfile.store import KernelStore
from ..record import HANDIN_SUFFIX, HandInRecord, TileFacts, now_iso
from ..record.writer import dumps_handin
from ..submitters import login_of
from .ledger import Ledger, Usage, usage_of
from .names import archive_name

#: The architecture a hand-in is built for where no GPU is asked (the lab's H100s).
ARCH = "sm_90"
#: The largest declaration beside a kernel file mmd reads.
MAX_DECLARATION_BYTES = 64 << 10


def is_handin(name: str) -> bool:
    """Whether inbox entry ``name`` is a kernel handed in: ``NAME.cu`` with ``NAME`` a kernel's name."""
    return name.endswith(SUFFIX) and bool(FOLDER_NAME.fullmatch(name[: -len(SUFFIX)]))


def is_declaration(name: str) -> bool:
    """Whether inbox entry ``name`` is a hand-in's declaration (``NAME.kernel.yaml``), dropped before its
    ``NAME.cu``: never a job; it waits for its kernel, and one no kernel takes is removed as an upload is."""
    return name.endswith(SIDECAR_SUFFIX) and bool(FOLDER_NAME.fullmatch(name[: -len(SIDECAR_SUFFIX)]))


@dataclass(frozen=True)
class HandInSettings:
    """What a hand-in needs of the service's settings."""

    #: ``student_kernels``: whether students' own kernels may run on the service at all.
    allowed: bool
    #: Where compiled kernels are kept (None: no disk cache).
    kernel_cache: Path | None = None
    #: The tiles it is checked and built at.
    tiles: tuple[int, ...] = kernels.TILES
    #: ``max_submitter_bytes`` and ``max_submitter_files``: what one student may keep (None: no bound).
    max_bytes: int | None = None
    max_files: int | None = None


def _read_own(path: Path, owner: int, most: int) -> bytes:
    """``path``'s bytes, where it is a regular file of ``owner``'s (never through a link); KernelFileError
    otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise KernelFileError(f"{path.name}: cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner:
            raise KernelFileError(f"{path.name}: not a file of its dropper's own")
        data = f.read(most + 1)
    if len(data) > most:
        raise KernelFileError(f"{path.name}: more than {most} bytes")
    return data


def _declaration(inbox: Path, name: str, owner: int) -> tuple[Path, bytes | None]:
    """``NAME.kernel.yaml`` where its dropper left one beside ``NAME.cu`` (another's under that name is not theirs:
    left to the drop box's rules)."""
    path = inbox / (name + SIDECAR_SUFFIX)
    try:
        info = os.lstat(path)
    except OSError:
        return path, None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != owner:
        return path, None
    return path, _read_own(path, owner, MAX_DECLARATION_BYTES)


def _tiles(kf: KernelFile, settings: HandInSettings) -> tuple[list[TileFacts], list[str]]:
    """Each tile: whether it launches on every CUDA GPU and builds there (KernelFileError: the compiler's
    lines, where it does not build at a tile it launches at), and the compiler's warnings."""
    facts, warnings = [], []
    for tile in settings.tiles:
        try:
            kf.check_launch(tile, kernels.COMMON_LIMITS)
        except MmdError as exc:
            facts.append(TileFacts(tile, False, exc.reason))
            continue
        built = compile_kernel(kf, tile, ARCH, settings.kernel_cache)
        x, y, z = kf.declaration.block_dims(tile)
        facts.append(TileFacts(tile, True, f"block {x}x{y}x{z}; built for {ARCH}"))
        warnings += [w for w in built.warnings if w not in warnings]
    return facts, warnings


def _check_room(used: Usage, parts: list[bytes | None], settings: HandInSettings) -> None:
    """KernelFileError where keeping ``parts`` would take the student past their share (as a job is refused: the
    ledger's count, blocks of 4 KiB at least)."""
    kept = [part for part in parts if part is not None]
    more = Usage(sum(-(-max(len(part), 1) // 4096) * 4096 for part in kept), len(kept))
    if settings.max_bytes is not None and used.bytes + more.bytes > settings.max_bytes:
        raise KernelFileError(
            f"what mmd keeps for you (outputs, sidecars, inputs, kernels) takes {used.bytes} of your "
            f"{settings.max_bytes} bytes (max_submitter_bytes); remove some with mmd rm"
        )
    if settings.max_files is not None and used.files + more.files > settings.max_files:
        raise KernelFileError(
            f"you keep {used.files} files of your {settings.max_files} (outputs, sidecars, inputs, kernels; "
            "max_submitter_files); remove some with mmd rm"
        )


def receive(
    inbox: Path,
    name: str,
    owner: int,
    outbox_folder: Path,
    store: KernelStore,
    settings: HandInSettings,
    ledger: Ledger | None = None,
    *,
    failed: Path,
) -> HandInRecord:
    """Take hand-in ``name`` (``NAME.cu``, dropped by ``owner``) from ``inbox``, keep it where it is good, and
    answer in ``outbox_folder`` (``NAME.handin.yaml``). The inbox's files leave it either way: a kept one is
    removed (the store has mmd's copy), a refused one is archived in ``failed`` as a refused job's input is,
    so that nothing dropped is lost (a personal inbox's ``.cu``, which no setting lets run, among them). Raises
    OutputError where the answer cannot be written."""
    stem = name[: -len(SUFFIX)]
    login = login_of(owner)
    received = now_iso()
    source_path = inbox / name
    declaration_path = inbox / (stem + SIDECAR_SUFFIX)
    record: HandInRecord | None = None
    try:
        if not settings.allowed:
            raise KernelFileError(
                "this service runs no students' kernels (setting student_kernels): ask the admin; "
                "mmd's own kernels stay yours to pick (NAME@kernel=naive.txt)"
            )
        if stem in kernels.NAMES:
            raise KernelFileError(
                f"{name}: {stem} is one of mmd's own kernels, which NAME@kernel={stem}.txt always runs: "
                "give yours another name"
            )
        source = _read_own(source_path, owner, MAX_SOURCE_BYTES)
        declaration_path, declaration = _declaration(inbox, stem, owner)
        try:
            text = None if declaration is None else declaration.decode("utf-8")
        except UnicodeDecodeError:
            raise KernelFileError(f"{declaration_path.name}: cannot be read: not UTF-8 text") from None
        kf = parse_kernel(source, name, text, declaration_path.name)
        tiles, warnings = _tiles(kf, settings)
        if not any(t.runs for t in tiles):
            raise KernelFileError(f"{name}: it runs at none of the tiles {', '.join(map(str, settings.tiles))}")
        if ledger is not None:
            _check_room(ledger.usage(login), [source, declaration], settings)
        try:
            kept = store.keep(login, stem, source, declaration)
        except (OSError, OutputError) as exc:
            why = exc.reason if isinstance(exc, OutputError) else exc.strerror
            raise KernelFileError(f"{name}: mmd cannot keep it now ({why}); hand it in again later") from None
        if ledger is not None:
            used = Usage()
            for path in kept.written:
                used += _usage(path)
            ledger.add(login, used)
        params = [f"{p.name} {role}" for p, role in zip(kf.kernel.parameters, kf.roles, strict=True)]
        record = HandInRecord(
            handin=name,
            kernel=stem,
            received_at=received,
            submitter=login,
            sha256=kf.sha256,
            version=kept.version,
            entry=kf.kernel.name,
            signature=kf.signature,
            parameters=params,
            declared_in=kf.declared_in,
            precision=kf.declaration.precision,
            tiles=tiles,
            warnings=warnings or None,
        )
    except KernelFileError as exc:
        errors = exc.details.get("errors")
        record = HandInRecord(
            handin=name,
            kernel=stem,
            received_at=received,
            submitter=login,
            reason=exc.reason,
            errors=list(errors) if isinstance(errors, list) else None,
            status="refused",
        )
    finally:
        tag = os.urandom(6).hex()
        for path in (source_path, declaration_path):
            with contextlib.suppress(OSError):
                if os.lstat(path).st_uid != owner:
                    continue
                if record is None or record.status == "refused":  # refused, or an error on the way: kept
                    failed.mkdir(mode=0o700, exist_ok=True)
                    os.rename(path, failed / archive_name(path.name, tag))
                else:
                    os.unlink(path)
    assert record is not None  # set on every way that does not raise
    answer = outbox_folder / (stem + HANDIN_SUFFIX)
    before = _usage(answer)
    write_atomic(answer, [dumps_handin(record)])
    if ledger is not None:  # the answer replaces the one before it: counted as a job's sidecar is
        ledger.add(login, _usage(answer) + -before)
    return record


def _usage(path: Path) -> Usage:
    try:
        return usage_of(os.lstat(path))
    except OSError:
        return Usage()
