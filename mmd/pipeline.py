"""The one job pipeline: read → parse → multiply on a backend → emit → commit output and sidecar.

The CLI (`mmd run`), the daemon and the benchmark's ``--through-files`` mode
all call :func:`run_job`; none of them has its own copy of these steps. The
job boundary is here: every :class:`MmdError` becomes a refusal, written as
``<stem>.error.yaml`` beside the output path, and nothing is written to the
output path itself.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from . import __version__, sidecar, textformat
from .atomic import write_atomic
from .backends.base import CUDA_PHASES, Backend, MultiplyRequest, Product, TextBackend
from .config import Settings, physical_memory_bytes
from .errors import InputFormatError, LimitError, MmdError, OutputError
from .logs import get_logger

#: Bytes of working memory a job needs per element of C beyond the float32
#: matrices: the output text (``%6.2f`` and a little) while it is emitted.
_TEXT_BYTES_PER_OUTPUT = 8

#: How far past its size at open a file may grow while read, when no
#: max_file_bytes is set; beyond that the writer is still at work.
_GROWTH_SLACK = 1 << 20

#: Headers promising more values than the file can hold are refused before
#: parsing once their matrices would take more than this many bytes.
_EARLY_REFUSAL_BYTES = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Refuse jobs beyond these before allocating anything (None: no limit)."""

    max_memory_bytes: int | None = None
    max_file_bytes: int | None = None
    max_dim: int | None = None


@dataclass
class JobResult:
    """What a job did: ``record`` is exactly what its sidecar says."""

    ok: bool
    input: Path
    output: Path | None
    sidecar: Path
    record: dict[str, Any]
    error: MmdError | None = None
    product: Product | None = field(default=None, repr=False)


def request_for(settings: Settings, **overrides: Any) -> MultiplyRequest:
    """The multiply request ``settings`` describe, with per-job ``overrides`` (kernel, tile, memory)."""
    job = {"kernel": settings.kernel, "tile": settings.tile, "memory": settings.memory}
    job.update({k: v for k, v in overrides.items() if k in job and v is not None})
    return MultiplyRequest(**job, text_path=settings.text_path)


def limits_for(settings: Settings) -> Limits:
    """Job limits from ``settings``; memory defaults to what the machine holds."""
    memory = settings.max_memory_bytes if settings.max_memory_bytes is not None else physical_memory_bytes()
    return Limits(max_memory_bytes=memory, max_file_bytes=settings.max_file_bytes, max_dim=settings.max_dim)


class _Clock:
    """Stage timer on the monotonic clock (wall-clock jumps do not move it)."""

    def __init__(self, started: float | None) -> None:
        self.started = time.perf_counter() if started is None else started
        self.timings: dict[str, float] = {}

    def since_start(self) -> float:
        return (time.perf_counter() - self.started) * 1e3


def read_input(
    path: Path, limits: Limits, into: Callable[[int], np.ndarray] | None = None
) -> bytes | memoryview:
    """Read a job's bytes without following a symlink; refuse non-files and oversize files.

    With ``into``, a function giving a writable uint8 array of at least the
    size asked for (a backend's page-locked memory), the file is read into
    that and a memoryview of it returned.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputFormatError(f"cannot open {path.name}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFormatError(f"{path.name} is not a regular file")
        if limits.max_file_bytes is not None and info.st_size > limits.max_file_bytes:
            raise LimitError(
                f"file is {info.st_size} bytes; the limit is {limits.max_file_bytes}",
                {"bytes": info.st_size, "max_file_bytes": limits.max_file_bytes},
            )
        # A file still growing must not make mmd read without bound.
        cap = limits.max_file_bytes if limits.max_file_bytes is not None else info.st_size + _GROWTH_SLACK
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = _read_into(fh, info.st_size, into, cap) if into is not None and info.st_size else fh.read(cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise LimitError(
            f"{path.name} grew past {cap} bytes while being read (it was {info.st_size} bytes when opened)",
            {"bytes_at_open": info.st_size},
        )
    return data


def _read_into(fh: Any, size: int, into: Callable[[int], np.ndarray], cap: int) -> bytes | memoryview:
    """``size`` bytes read straight into ``into(size)``; a file that grew meanwhile is read up to ``cap + 1``."""
    view = memoryview(into(size)).cast("B")[:size]
    got = 0
    while got < size:
        done = fh.readinto(view[got:])
        if not done:
            return view[:got]
        got += done
    rest = fh.read(max(cap + 1 - size, 0))
    return bytes(view) + rest if rest else view


def text_path_for(backend: Backend, request: MultiplyRequest) -> str:
    """``gpu`` when the request allows it and the backend can take text, else ``host``."""
    want = getattr(request, "text_path", "auto")
    if want == "host" or not isinstance(backend, TextBackend):
        return "host"
    return "gpu"


def check_header(header: textformat.Header, data_len: int, limits: Limits) -> None:
    """Refuse a header the file cannot hold or the memory limit cannot take, before allocating."""
    m, k, n = header.m, header.k, header.n
    if limits.max_dim is not None and max(m, k, n) > limits.max_dim:
        raise LimitError(
            f"line {header.line}: a {m}x{k}x{n} product exceeds the largest size allowed, {limits.max_dim}",
            {"line": header.line, "max_dim": limits.max_dim},
        )
    values = m * k + k * n
    # Each value takes at least one byte plus one separator (the last needs none).
    # Small shortfalls are left to the parser, whose message names the last line;
    # this check only stops a header from making the parser allocate for nothing.
    room = (data_len - header.body_offset + 1) // 2
    if values > room and 4 * values > _EARLY_REFUSAL_BYTES:
        raise InputFormatError(
            f"line {header.line}: header promises {values} values ({m}x{k} and {k}x{n}) "
            f"but the file's {data_len} bytes can hold at most {room}",
            line=header.line,
        )
    need = 4 * (m * k + k * n + m * n) + _TEXT_BYTES_PER_OUTPUT * m * n
    if limits.max_memory_bytes is not None and need > limits.max_memory_bytes:
        raise LimitError(
            f"line {header.line}: a {m}x{k}x{n} product needs about {need} bytes of memory; "
            f"the limit is {limits.max_memory_bytes}",
            {"line": header.line, "need_bytes": need, "max_memory_bytes": limits.max_memory_bytes},
        )


class _Hasher(threading.Thread):
    """sha256 of the input in the background: hashlib drops the GIL, so it overlaps the parse."""

    def __init__(self, data: bytes) -> None:
        super().__init__(name="mmd-sha256", daemon=True)
        self._data = data
        self.hexdigest = ""

    def run(self) -> None:
        self.hexdigest = hashlib.sha256(self._data).hexdigest()

    def result(self) -> str:
        self.join()
        return self.hexdigest


def _timed_chunks(chunks: Iterator[bytes], clock: _Clock) -> Iterator[bytes]:
    """Yield ``chunks`` and charge the time spent producing them to ``emit``."""
    spent = 0.0
    while True:
        t0 = time.perf_counter()
        try:
            chunk = next(chunks)
        except StopIteration:
            break
        finally:
            spent += time.perf_counter() - t0
        yield chunk
    clock.timings["emit"] = spent * 1e3


def run_job(
    input_path: Path,
    output_path: Path,
    request: MultiplyRequest,
    backend: Backend,
    *,
    limits: Limits = Limits(),
    started: float | None = None,
    job_id: str | None = None,
    extra: dict[str, Any] | None = None,
    durable: bool = True,
) -> JobResult:
    """Run one job end to end and commit its output and sidecar; never raises MmdError.

    ``started`` is a ``time.perf_counter()`` reading of when the job was
    claimed (the daemon's claim), so ``overall`` covers claim to committed
    output; by default the job starts now. ``extra`` entries are added to the
    sidecar (the daemon's name settings, collisions ...).
    """
    clock = _Clock(started)
    job_id = job_id or uuid.uuid4().hex[:12]
    log = get_logger().bind(job=job_id, file=input_path.name)
    record: dict[str, Any] = {"status": "ok", "job": job_id}
    input_info: dict[str, Any] = {"name": input_path.name}
    hasher: _Hasher | None = None
    shape: dict[str, int] | None = None
    try:
        path_kind = text_path_for(backend, request)
        t0 = time.perf_counter()
        data = read_input(input_path, limits, into=backend.host_bytes if path_kind == "gpu" else None)  # type: ignore[attr-defined]
        clock.timings["read"] = (time.perf_counter() - t0) * 1e3
        input_info["bytes"] = len(data)
        hasher = _Hasher(data)
        hasher.start()

        t0 = time.perf_counter()
        header = textformat.parse_header(data)
        shape = {"m": header.m, "k": header.k, "n": header.n}
        check_header(header, len(data), limits)
        if path_kind == "gpu" and not backend.accepts_text(header, len(data), request):  # type: ignore[attr-defined]
            path_kind = "host"
        if path_kind == "gpu":
            # The text path: the backend parses, multiplies and formats (mmd.gputext).
            header_ms = (time.perf_counter() - t0) * 1e3
            product = backend.multiply_text(data, header, request)  # type: ignore[attr-defined]
            del data
            clock.timings["parse"] = header_ms + product.stage_ms.get("parse", 0.0)
            clock.timings["emit"] = product.stage_ms.get("emit", 0.0)
            chunks: Iterator[bytes] = iter(product.chunks)
            text_info = {"path": "gpu", **product.text}
        else:
            pinned = getattr(backend, "host_empty", None)
            out = pinned(header.m * header.k + header.k * header.n) if pinned is not None else None
            matrices = textformat.parse(data, header, out=out)
            clock.timings["parse"] = (time.perf_counter() - t0) * 1e3
            del data  # the text is no longer needed; keep peak memory near one copy
            product = backend.multiply(matrices.a, matrices.b, request)
            del matrices
            chunks = _timed_chunks(textformat.emit_chunks(product.c), clock)
            text_info = {"path": "host"}
        clock.timings.update(product.timings_ms)
        if all(p in product.timings_ms for p in CUDA_PHASES):
            clock.timings["cuda"] = sum(product.timings_ms[p] for p in CUDA_PHASES)

        t0 = time.perf_counter()
        written = write_atomic(output_path, chunks, durable=durable)
        clock.timings["write"] = (time.perf_counter() - t0) * 1e3
        if path_kind == "host":
            clock.timings["write"] -= clock.timings.get("emit", 0.0)
        input_info["sha256"] = hasher.result()
        m, k, n = header.m, header.k, header.n
        kernel_ms = product.timings_ms.get("kernel")
        record.update(
            input=input_info,
            output={"name": output_path.name, "bytes": written.bytes, "sha256": written.sha256},
            shape=shape,
            backend=backend.name,
            kernel=product.kernel,
            tile=product.tile,
            memory=product.memory,
            device=product.device,
            requested={"kernel": request.kernel, "tile": request.tile, "memory": request.memory},
        )
        clock.timings["overall"] = clock.since_start()
        record["timings_ms"] = sidecar.timings_block(clock.timings)
        # The text phases' GPU parts (not in the course's timing keys).
        record["text"] = text_info
        record["gflops"] = round(2.0 * m * k * n / (kernel_ms * 1e6), 3) if kernel_ms else None
        if product.notes:
            record["notes"] = list(product.notes)
        _finish(record, extra)
        path = sidecar.timing_path(output_path)
        # The sidecar is committed last: its presence means the job is complete.
        write_atomic(path, [sidecar.dumps(record)], durable=durable)
        log.info(
            "job done",
            status="ok",
            shape=f"{m}x{k}x{n}",
            kernel=product.kernel,
            tile=product.tile,
            **{f"{k}_ms": v for k, v in record["timings_ms"].items() if v is not None},
        )
        return JobResult(True, input_path, output_path, path, record, product=product)
    except MmdError as exc:
        return _refuse(exc, input_path, output_path, request, backend, clock, record, input_info,
                       hasher, extra, durable, log, shape)


def _refuse(
    exc: MmdError,
    input_path: Path,
    output_path: Path,
    request: MultiplyRequest,
    backend: Backend,
    clock: _Clock,
    record: dict[str, Any],
    input_info: dict[str, Any],
    hasher: _Hasher | None,
    extra: dict[str, Any] | None,
    durable: bool,
    log: Any,
    shape: dict[str, int] | None,
) -> JobResult:
    """Write the error sidecar for a refused job; the output path is left untouched."""
    if hasher is not None:
        input_info["sha256"] = hasher.result()
    clock.timings["overall"] = clock.since_start()
    details = {
        **({"shape": shape} if shape is not None else {}),
        "backend": backend.name,
        "requested": {"kernel": request.kernel, "tile": request.tile, "memory": request.memory},
    }
    log.warning("job refused", status="error", kind=exc.kind, reason=exc.reason)
    error_record, path = commit_refusal(
        exc,
        job_id=record["job"],
        input_info=input_info,
        output_path=output_path,
        timings=clock.timings,
        details=details,
        extra=extra,
        durable=durable,
        log=log,
    )
    return JobResult(False, input_path, None, path, error_record, error=exc)


def commit_refusal(
    exc: MmdError,
    *,
    job_id: str,
    input_info: dict[str, Any],
    output_path: Path,
    timings: dict[str, float],
    details: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    durable: bool = True,
    log: Any = None,
) -> tuple[dict[str, Any], Path]:
    """Write ``<stem>.error.yaml`` beside ``output_path`` and return its record and path.

    The one shape of every refusal, whether the pipeline or the daemon (a bad
    name, a link, a file it could not claim) refused the job. A sidecar that
    cannot be written (disk full) is noted in the record and logged, never
    raised: the caller keeps the input.
    """
    record: dict[str, Any] = {
        "status": "error",
        "job": job_id,
        "input": input_info,
        "output": {"name": output_path.name, "written": False},
        "error": exc.as_dict(),
        **(details or {}),
        "timings_ms": {k: round(v, 3) for k, v in timings.items()},
    }
    _finish(record, extra)
    path = sidecar.error_path(output_path)
    try:
        write_atomic(path, [sidecar.dumps(record)], durable=durable)
    except (OutputError, yaml.YAMLError) as write_exc:
        reason = getattr(write_exc, "reason", None) or str(write_exc)
        (log or get_logger(job=job_id)).error("cannot write error sidecar", reason=reason)
        record["error"]["sidecar_failed"] = reason
    return record, path


def _finish(record: dict[str, Any], extra: dict[str, Any] | None) -> None:
    if extra:
        record.update(extra)
    record["mmd_version"] = __version__
    record["finished_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def reference_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The float64 product that results are checked against."""
    return np.matmul(a.astype(np.float64), b.astype(np.float64))
