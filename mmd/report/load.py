"""The report's input: a bench run's results (CSV or YAML, with its accuracy sweep) or a folder of job
sidecars pooled into rows of the same type (:class:`mmd.bench.BenchRow`)."""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..bench.rows import AccuracyRow, BenchRow, RowType, from_cells
from ..bench.stats import gflops, phase_quartiles, phase_stats
from ..errors import UnreadableError
from ..record import ERROR_SUFFIX, TIMING_SUFFIX, ErrorRecord, TimingRecord
from ..record.reader import read


class ReportError(UnreadableError):
    """The report's input cannot be read (no results, no sidecars, a malformed file): the command line names
    the wrong thing (exit status 2)."""

    kind = "report"


@dataclass
class Results:
    """Rows, where they came from, and the environment when known."""

    rows: list[BenchRow]
    source: Path
    environment: dict[str, Any] = field(default_factory=dict)
    kind: str = "bench"  # bench | sidecars
    #: The accuracy sweep's rows (accuracy.yaml or accuracy.csv beside the results).
    accuracy: list[AccuracyRow] = field(default_factory=list)


def _rows(cls: RowType, cells: list[Any], path: Path) -> list[Any]:
    """Each entry of ``cells`` (a CSV's or a YAML's rows) as a row of ``cls``; ReportError naming the line."""
    rows = []
    for i, entry in enumerate(cells, start=1):
        if not isinstance(entry, dict):
            raise ReportError(f"{path}: row {i} is not a mapping of columns")
        try:
            rows.append(from_cells(cls, entry, f"{path}: row {i}"))
        except ValueError as exc:
            raise ReportError(f"malformed row: {exc}") from None
    return rows


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path} is not a mapping")
    return data


def _read_csv_cells(path: Path, required: tuple[str, ...], what: str) -> list[Any]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                raise ReportError(f"{path} has no {', '.join(missing)} columns: not {what} from mmd bench")
            return list(reader)
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None


def read_csv(path: Path) -> Results:
    """Rows of a results.csv (and the environment of its results.yaml, if beside it)."""
    rows = _rows(BenchRow, _read_csv_cells(path, ("kernel", "m", "k", "n"), "a results.csv"), path)
    env: dict[str, Any] = {}
    beside = path.with_name("results.yaml")
    if beside.is_file():
        env = _load_yaml(beside).get("environment") or {}
    return Results(rows, path, env)


def read_yaml(path: Path) -> Results:
    """Rows and environment of a results.yaml."""
    data = _load_yaml(path)
    if not isinstance(data.get("rows"), list):
        raise ReportError(f"{path} has no rows: not a results.yaml from mmd bench")
    return Results(_rows(BenchRow, data["rows"], path), path, data.get("environment") or {})


def _read_record(path: Path) -> TimingRecord | ErrorRecord:
    try:
        return read(path)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None


def read_sidecars(folder: Path) -> Results:
    """Pool a folder's timing sidecars by case (jobs run through files, no warm-up: ``repeats`` counts the
    jobs); one ``refused`` row per kind of refusal."""
    timing = sorted(folder.glob("*" + TIMING_SUFFIX))
    errors = sorted(folder.glob("*" + ERROR_SUFFIX))
    if not timing and not errors:
        raise ReportError(f"{folder} holds no results.csv, results.yaml or job sidecars (*{TIMING_SUFFIX})")
    groups: dict[tuple[Any, ...], list[TimingRecord]] = {}
    for path in timing:
        rec = _read_record(path)
        if isinstance(rec, TimingRecord):
            sha = rec.kernel_file.sha256 if rec.kernel_file is not None else None  # a kernel file's versions apart
            case = (rec.kernel, rec.tile, rec.shape, rec.memory, rec.backend, rec.device, sha)
            groups.setdefault(case, []).append(rec)
    rows: list[BenchRow] = []
    devices: list[str] = []
    for (kernel, tile, shape, memory, backend, device, sha), recs in groups.items():
        samples = [{p: v for p, v in dataclasses.asdict(r.timings_ms).items() if v is not None} for r in recs]
        phases = phase_stats(samples)
        kernel_ms = phases["kernel"].median if "kernel" in phases else None
        quartiles = phase_quartiles(samples)
        rows.append(
            BenchRow(
                kernel=kernel, backend=backend, tile=tile, m=shape.m, k=shape.k, n=shape.n, memory=memory,
                mode="files", repeats=len(recs), device=device, phases=phases,
                gflops=gflops(shape.m, shape.k, shape.n, kernel_ms), quartiles=quartiles,
                kernel_file=kernel if sha is not None else None, kernel_sha256=sha,
            )
        )  # fmt: skip
        if device:
            devices.append(device)
    refusals: dict[tuple[Any, ...], list[ErrorRecord]] = {}
    for path in errors:
        err = _read_record(path)
        if not isinstance(err, ErrorRecord):
            continue
        req = err.requested
        key = (
            req.kernel if req else None,
            req.tile if req else None,
            err.shape,
            req.memory if req else None,
            err.backend,
            err.error.reason,
        )
        refusals.setdefault(key, []).append(err)
    for (kernel, tile, shape, memory, backend, reason), errs in refusals.items():
        rows.append(
            BenchRow(
                kernel=kernel, backend=backend, tile=tile, m=shape.m if shape else None,
                k=shape.k if shape else None, n=shape.n if shape else None, memory=memory, mode="files",
                status="refused", reason=reason, repeats=len(errs),
            )
        )  # fmt: skip
    env = {"device": max(set(devices), key=devices.count)} if devices else {}
    return Results(rows, folder, env, kind="sidecars")


def load(source: Path) -> Results:
    """Results from a results.csv/yaml, the folder holding one, or a folder of sidecars (with the accuracy
    sweep's rows where an accuracy.yaml or accuracy.csv lies beside the results)."""
    source = Path(source)
    if source.is_dir():
        for name, reader in (("results.yaml", read_yaml), ("results.csv", read_csv)):
            if (source / name).is_file():
                return _with_accuracy(reader(source / name))
        return read_sidecars(source)
    if not source.exists():
        raise ReportError(f"{source}: no such file or folder")
    if source.suffix == ".csv":
        return _with_accuracy(read_csv(source))
    if source.suffix in (".yaml", ".yml"):
        return _with_accuracy(read_yaml(source))
    raise ReportError(f"{source}: give a results.csv, a results.yaml or a folder")


def read_accuracy(folder: Path) -> list[AccuracyRow]:
    """The rows of the accuracy.yaml (else accuracy.csv) in ``folder``; none without either."""
    path = folder / "accuracy.yaml"
    if path.is_file():
        rows = _load_yaml(path).get("rows")
        if not isinstance(rows, list):
            raise ReportError(f"{path} has no rows: not an accuracy.yaml from mmd bench")
        return _rows(AccuracyRow, rows, path)
    path = folder / "accuracy.csv"
    if path.is_file():
        return _rows(AccuracyRow, _read_csv_cells(path, ("kernel", "k"), "an accuracy.csv"), path)
    return []


def _with_accuracy(results: Results) -> Results:
    results.accuracy = read_accuracy(results.source.parent)
    return results
