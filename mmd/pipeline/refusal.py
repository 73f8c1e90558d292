"""A refused job: the value that says why, and its error sidecar.

Every refusal takes this one shape, whether the input was bad, the name's
settings were, the backend could not run it, or the daemon could not read
the file it claimed (a link, a folder). The output path is never written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import record
from ..atomic import Staged
from ..errors import MmdError, OutputError
from ..fileops import OPS, FileOps
from ..logs import get_logger
from ..record import Context, ErrorFacts, ErrorRecord, FileFacts, Requested, Shape
from ..record.writer import dumps


@dataclass(frozen=True)
class Refusal:
    """Why a job is refused, and what is known of it so far."""

    error: MmdError
    job: str
    input: FileFacts
    #: Where the output would have gone; the error sidecar is its sibling.
    output: Path
    timings: Mapping[str, float] = field(default_factory=dict)
    shape: Shape | None = None
    backend: str | None = None
    requested: Requested | None = None
    context: Context = field(default_factory=Context)
    #: Milliseconds since the input arrived (the record's ``turnaround_ms``); None: not known.
    turnaround_ms: float | None = None

    def to_record(self) -> ErrorRecord:
        return ErrorRecord(
            job=self.job,
            input=self.input,
            output=FileFacts(self.output.name, written=False),
            error=ErrorFacts(self.error.kind, self.error.reason, dict(self.error.details)),
            shape=self.shape,
            backend=self.backend,
            requested=self.requested,
            timings_ms=record.timings(self.timings),
            turnaround_ms=self.turnaround_ms,
            context=self.context,
            finished_at=record.now_iso(),
        )


@dataclass(frozen=True)
class Committed:
    """An error sidecar's fate: its record and path, and why it could not be written (None: it was)."""

    record: ErrorRecord
    path: Path
    failed: str | None = None


def commit(
    refusal: Refusal,
    *,
    durable: bool = True,
    ops: FileOps = OPS,
    staged: Staged | None = None,
) -> Committed:
    """Write ``<stem>.error.yaml`` beside the output path (``ops``: as :func:`mmd.atomic.write_atomic`'s;
    ``staged``: only written there, published by the caller).

    A sidecar that cannot be written (disk full) is logged and said in the
    result, never raised: the caller keeps the input (the daemon holds the
    job until the outbox takes it).
    """
    rec = refusal.to_record()
    path = record.error_path(refusal.output)
    try:
        commit = staged if staged is not None else Staged(durable=durable, ops=ops)
        commit.write(path, [dumps(rec)])
        if staged is None:
            commit.publish()
    except (OutputError, yaml.YAMLError) as exc:
        reason = exc.reason if isinstance(exc, MmdError) else str(exc)
        get_logger(job=refusal.job).error("cannot write error sidecar", reason=reason)
        details: dict[str, Any] = {**rec.error.details, "sidecar_failed": reason}
        rec = dataclasses.replace(rec, error=dataclasses.replace(rec.error, details=details))
        return Committed(rec, path, reason)
    return Committed(rec, path)
