"""Reading ``mmd check``'s files while Python imports numpy.

``mmd check`` on one output spends its first moments importing numpy and
mmd's checking modules, on one core (docs/grading.md, "Speed", says how long).
mmd's C parsers need no numpy: they fill plain buffers. So the command starts
the reads its check will need (:func:`start`) on threads of their own, before
it imports anything else, and :mod:`mmd.check.jobs` then takes the values as
arrays over those buffers (no copy). It does so where the check imports numpy
(one core for a while, beside which the parsers' threads run), and where the
cores can run both files' parsers at once (:func:`useful`).

Only a read that succeeds is used. Where a file cannot be read, is not
plausible, or holds a fault, the value here is None, and grading reads the
file itself and words its fault as always: the first fault, in the order
grading reports them, whatever was read ahead. A file is mapped once, here,
and grading checks the very bytes the values came from.

The reads are the calls :mod:`mmd.textformat` makes (the same parser, the same
settings from :mod:`mmd.textcore`), so the values are the same bits
(``tests/test_readahead.py``).
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from . import textcore
from .cpus import block_rows, usable_cores
from .errors import MmdError
from .textcore import Values

_Result = Values | bool | None


class _Read:
    """Reads of ``paths`` one after another on a thread of their own, each a (key, function) step whose
    result lands in ``results`` under its key (none: the step did not succeed); :meth:`join` waits
    for them."""

    def __init__(
        self, steps: Sequence[tuple[str, Callable[[], _Result]]], results: dict[str, _Result], *paths: Path
    ) -> None:
        self.keys, self.paths = [key for key, _ in steps], paths
        self._thread = threading.Thread(target=self._run, args=(steps, results), name="mmd-readahead", daemon=True)
        self._thread.start()

    @staticmethod
    def _run(steps: Sequence[tuple[str, Callable[[], _Result]]], results: dict[str, _Result]) -> None:
        for key, fn in steps:
            # anything that goes wrong here is grading's to find and word again: never raised from here
            with contextlib.suppress(MmdError, OSError, ValueError, MemoryError, BufferError):
                results[key] = fn()

    def join(self) -> None:
        self._thread.join()


class ReadAhead:
    """The reads :func:`start` began for one output and its reference; a context manager that waits
    for them and unmaps what they mapped."""

    def __init__(self, output: Path, reference: Path, against: str, wide: bool, device: bool = False) -> None:
        self.output, self.reference, self.against, self.wide, self.device = output, reference, against, wide, device
        self._maps: dict[Path, bytes | mmap.mmap] = {}
        self._lock = threading.Lock()
        self._reads: list[_Read] = []
        self._results: dict[str, _Result] = {}  # each step's, by key, as the reads finish them

    def begin(self) -> None:
        """Start the reads, each on a thread of its own."""
        if self.against != "inputs":
            steps = [
                ("same", self._same_output),
                ("output", lambda: self._values_if_different(self.output)),
                ("expected", lambda: self._values_if_different(self.reference)),
            ]
            self._reads.append(_Read(steps, self._results, self.output, self.reference))
        elif self.wide and not self.device:  # the output read a block at a time beside numpy's product's blocks
            self._reads.append(_Read([("input", self._input_values)], self._results, self.reference))
        elif usable_cores() >= 2 * textcore.WORKERS:  # cores for both parsers' threads at once
            self._reads.append(_Read([("input", self._input_values)], self._results, self.reference))
            self._reads.append(_Read([("output", self._output_values)], self._results, self.output))
        else:  # the input first, as grading needs them
            steps = [("input", self._input_values), ("output", self._output_values)]
            self._reads.append(_Read(steps, self._results, self.reference, self.output))

    def _map(self, path: Path) -> bytes | mmap.mmap:
        with self._lock:
            if path not in self._maps:
                # the output is a student's file: never through a link (as grading reads it)
                self._maps[path] = textcore.read_bytes(path, follow=path != self.output)
            return self._maps[path]

    def _output_values(self) -> Values | None:
        with memoryview(self._map(self.output)) as data:
            return textcore.output_values(data)

    def _input_values(self) -> Values | None:
        with memoryview(self._map(self.reference)) as data:
            return textcore.input_values(data, self.wide)

    def _same_output(self) -> bool | None:
        """False where the output's bytes differ from the expected output's; True where they are the
        same and the output is well formed; None where they are the same and it is not (the check then
        reads it again, to word its fault)."""
        if textcore.c_text() is None:
            return None
        with memoryview(self._map(self.output)) as data, memoryview(self._map(self.reference)) as expected:
            if not textcore.same_bytes(data, expected):
                return False
            return True if textcore.output_ok(data) else None

    def _values_if_different(self, path: Path) -> Values | None:
        """An output's values where the pair's bytes differ and the check would read each output
        whole anyway (:func:`mmd.cpus.block_rows`: all its rows at once), else None."""
        if self._results.get("same") is not False:  # the step before this one, on this thread
            return None
        with memoryview(self._map(path)) as data:
            m, n, _ = textcore.output_header(data)
            return textcore.output_values(data) if block_rows(n) >= m else None

    def _wait(self, key: str) -> _Result:
        for read in self._reads:
            if key in read.keys:
                read.join()
        return self._results.get(key)

    def mapped(self, path: Path) -> bytes | mmap.mmap | None:
        """The bytes of ``path`` as the reads mapped them (None: not mapped here), once the reads of it are done."""
        for read in self._reads:
            if path in read.paths:
                read.join()
        with self._lock:
            return self._maps.get(path)

    def output_values(self, path: Path) -> Values | None:
        """The output's values, where ``path`` is the output read ahead and its read succeeded."""
        got = self._wait("output") if path == self.output else None
        return got if isinstance(got, Values) else None

    def input_values(self, path: Path, wide: bool) -> Values | None:
        """The input's A and B (float64 where ``wide``), where ``path`` is the input read ahead so."""
        got = self._wait("input") if path == self.reference and wide == self.wide else None
        return got if isinstance(got, Values) else None

    def same_output(self, output: Path, expected: Path) -> bool | None:
        """Where ``output`` and ``expected`` are the pair read ahead: True if they have the same bytes
        and the output is well formed, False if their bytes differ; else None (not known here)."""
        if (output, expected) != (self.output, self.reference):
            return None
        got = self._wait("same")
        return got if isinstance(got, bool) else None

    def expected_values(self, output: Path, expected: Path) -> tuple[Values, Values] | None:
        """Where ``output`` and ``expected`` are the pair read ahead, their bytes differ, and both were
        read whole and well formed: the two outputs' values."""
        if (output, expected) != (self.output, self.reference):
            return None
        got = self._wait("output"), self._wait("expected")
        return (got[0], got[1]) if isinstance(got[0], Values) and isinstance(got[1], Values) else None

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Wait for the reads, then unmap the files (an array over a mapping still in use keeps it)."""
        for read in self._reads:
            read.join()
        for data in self._maps.values():
            if isinstance(data, mmap.mmap):
                with contextlib.suppress(BufferError):
                    data.close()
        self._maps.clear()


def useful(imports_numpy: bool) -> bool:
    """Whether reading ahead can help: the C parsers are built and switched on, and either the check
    imports numpy (``imports_numpy``: one core for a while, which the parsers' threads share the
    cores with) or the cores can run both files' parsers at once. Without numpy's import and with
    fewer cores (2: 2 parser threads) there is nothing to overlap, and the threads only slow the
    check down (docs/grading.md, "Reading while numpy is imported")."""
    return textcore.USE_FASTTEXT and (imports_numpy or usable_cores() > textcore.WORKERS)


def start(output: Path, reference: Path, against: str, wide: bool, device: bool = False) -> ReadAhead:
    """Start reading what checking ``output`` against ``reference`` will need: against an input
    (``against`` "inputs"), the input's values (float64 where ``wide``, the full check's; float32
    for --quick) and, each on its own thread, the output's, unless the full check reads them a
    block at a time beside numpy's product (where no other ``device`` may make it, as
    ``--reference gpu`` or ``auto`` asks); against an expected output, whether the
    two have the same bytes, then whether the output is well formed where they do, or else both
    outputs' values where the check would read them whole."""
    ahead = ReadAhead(output, reference, against, wide, device)
    ahead.begin()
    return ahead
