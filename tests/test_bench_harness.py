"""benchmarks/harness.py, the module the benchmark scripts share: its tables, trees, inputs and event timing.

The scripts themselves run in tests/test_benchmarks.py (each in a tiny mode); the GPU paths of the ladders run
in tests/gpu/test_ladders.py. Here are the parts that need no GPU, on fakes where CuPy would be.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmd import textformat

from .conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    """The module as a script imports it, with its folder first on the path."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("harness")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_a_tables_header_and_rows_share_its_columns(harness):
    table = harness.Table(
        (harness.Column("name", 6, "<"), harness.Column("ms", 8, spec=".3f"), harness.Column("note", 5))
    )
    assert table.header() == "name         ms  note"
    assert table.row("fast", 1.5, None) == "fast      1.500     -"
    assert table.row("a", None, "x") == "a             -     x"
    with pytest.raises(ValueError):
        table.row("too", "few")


def test_tree_names_a_checkout_of_mmd(harness, tmp_path):
    assert harness.tree_spec(f"old={ROOT}") == ("old", ROOT)
    for bad in (str(ROOT), f"={ROOT}", f"old={tmp_path}"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=PATH"):
            harness.tree_spec(bad)


def test_the_trees_of_a_run_are_those_given_then_this_checkout(harness, capsys):
    ap = argparse.ArgumentParser()
    harness.add_tree_options(ap, "another checkout")
    args = ap.parse_args(["--tree", f"old={ROOT}"])
    assert harness.trees(ap, args.tree, now=not args.no_now) == [("old", ROOT), ("now", ROOT)]
    args = ap.parse_args(["--tree", f"old={ROOT}", "--no-now"])
    assert harness.trees(ap, args.tree, now=not args.no_now) == [("old", ROOT)]
    for argv in (["--no-now"], ["--tree", f"now={ROOT}"]):
        args = ap.parse_args(argv)
        with pytest.raises(SystemExit) as exit_:
            harness.trees(ap, args.tree, now=not args.no_now)
        assert exit_.value.code == 2
        assert "distinct names, at least one" in capsys.readouterr().err


@given(m=st.integers(1, 9), k=st.integers(1, 9), n=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))
def test_an_input_file_holds_the_pair_it_was_drawn_from(harness, m, k, n, seed):
    a, b = harness.input_pair(m, k, n, seed)
    parsed = textformat.parse(harness.input_bytes(m, k, n, seed))
    assert np.array_equal(parsed.a, a) and np.array_equal(parsed.b, b)
    assert np.all(a != 0) and np.all(b != 0)


def fake_cupy(durations: list[float], log: list[str]) -> SimpleNamespace:
    """What time_events calls of CuPy: events (each elapsed time the next of ``durations``) and a sync."""
    elapsed = iter(durations)

    class Event:
        def record(self) -> None:
            log.append("event")

        def synchronize(self) -> None:
            pass

    runtime = SimpleNamespace(deviceSynchronize=lambda: log.append("sync"))
    return SimpleNamespace(
        cuda=SimpleNamespace(Event=Event, runtime=runtime, get_elapsed_time=lambda s, e: next(elapsed))
    )


def launches(log: list[str], *names: str) -> list[Callable[[], None]]:
    return [lambda name=name: log.append(name) for name in names]


def test_event_timing_stops_once_the_median_is_steady(harness):
    log: list[str] = []
    cp = fake_cupy([2.0] * 100, log)
    got = harness.time_events(cp, launches(log, "a", "b"), flush=lambda: log.append("flush"), warmup=3)
    assert got.row() == {"ms": 2.0, "min": 2.0, "iqr_rel": 0.0, "reps": 10}
    # the warm-up takes the sets in turn, each launch after a flush; then each timed one alone between its events
    assert log[:7] == ["flush", "a", "flush", "b", "flush", "a", "sync"]
    assert log[7:15] == ["flush", "event", "a", "event", "flush", "event", "b", "event"]


def test_event_timing_goes_on_while_the_spread_is_wide_up_to_its_cap(harness):
    log: list[str] = []
    got = harness.time_events(fake_cupy([1.0, 2.0] * 50, log), launches(log, "a"), max_reps=40)
    assert got.row()["reps"] == 40 and got.ms == 1.5
    assert log.count("a") == 3 + 40


def test_event_timing_of_a_fixed_count(harness):
    """The sgemm ladder's and sgemm_ncu's way: exactly ``reps`` launches in one batch, whatever the spread."""
    log: list[str] = []
    got = harness.time_events(
        fake_cupy([1.0, 3.0, 2.0], log), launches(log, "a"), warmup=0, batch=3, min_reps=3, max_reps=3
    )
    assert got.row() == {"ms": 2.0, "min": 1.0, "iqr_rel": pytest.approx(1.0), "reps": 3}
