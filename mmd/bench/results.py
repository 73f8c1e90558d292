"""A run's results folder: ``results.csv`` and ``results.yaml`` (and ``accuracy.csv``/``.yaml``), rewritten
atomically after every case so that an interrupted run keeps what it measured."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from ..atomic import write_atomic
from .plan import Plan
from .rows import FAILING, STATUSES, AccuracyRow, BenchRow, Row, RowType, columns, to_cells, to_csv


@dataclass
class BenchRun:
    """A finished (or interrupted) run: its folder, rows and environment."""

    folder: Path
    plan: Plan
    environment: dict[str, Any]
    rows: list[BenchRow] = field(default_factory=list)
    complete: bool = False
    #: The accuracy sweep's rows (``plan.accuracy``).
    accuracy: list[AccuracyRow] = field(default_factory=list)

    @property
    def csv_path(self) -> Path:
        return self.folder / "results.csv"

    @property
    def yaml_path(self) -> Path:
        return self.folder / "results.yaml"

    @property
    def accuracy_csv_path(self) -> Path:
        return self.folder / "accuracy.csv"

    @property
    def accuracy_yaml_path(self) -> Path:
        return self.folder / "accuracy.yaml"

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for r in self.rows if r.status == s) for s in STATUSES}

    @property
    def failures(self) -> list[BenchRow]:
        """Rows that fail the run (wrong results, errors)."""
        return [r for r in self.rows if r.status in FAILING]

    @property
    def ok(self) -> bool:
        return self.complete and not self.failures


def _write_table(run: BenchRun, csv_path: Path, yaml_path: Path, cls: RowType, rows: Sequence[Row]) -> None:
    write_atomic(csv_path, [to_csv(cls, rows).encode()], durable=False)
    document = {
        "complete": run.complete,
        "environment": run.environment,
        "plan": plan_document(run.plan),
        "columns": list(columns(cls)),
        "rows": [to_cells(row) for row in rows],
    }
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True)
    write_atomic(yaml_path, [text.encode()], durable=False)


def plan_document(plan: Plan) -> dict[str, Any]:
    """The plan as results.yaml has it: each field (tuples as lists), ``kernels`` by name, and each kernel file's
    path and sha256 under ``kernel_files``."""
    document: dict[str, Any] = {}
    for f in fields(plan):
        value = getattr(plan, f.name)
        document[f.name] = list(value) if isinstance(value, tuple) else value
    document["kernels"] = [c.name for c in plan.choices]
    document["kernel_files"] = [{"name": c.name, "path": str(c.path), "sha256": c.sha256} for c in plan.kernel_files]
    return document


def write_results(run: BenchRun) -> None:
    """(Re)write results.csv and results.yaml atomically, and accuracy.csv/yaml once the sweep has rows."""
    _write_table(run, run.csv_path, run.yaml_path, BenchRow, run.rows)
    if run.accuracy:
        _write_table(run, run.accuracy_csv_path, run.accuracy_yaml_path, AccuracyRow, run.accuracy)


def new_folder(root: Path, now: _dt.datetime | None = None) -> Path:
    """``root/<YYYYmmdd-HHMMSS>`` (with ``-2``, ``-3`` ... when taken), created."""
    stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, 1000):
        folder = root / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"no free results folder for {stamp} in {root}")
