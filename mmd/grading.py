"""Grading: check outputs against their inputs or expected outputs, one file or a whole folder.

A job ``x`` pairs an input ``x.txt`` (or an expected output ``x.out``) in
the reference folder with an output in the outbox (:func:`pair`): the one
whose sidecar names the input's sha256, else ``x.out`` (or a version
``x.1.out`` whose sidecar says it wanted that name); of several, the newest
by its sidecar's finish time is checked and the others are *superseded*;
with a deadline (``Options.before``) those finished at or after it are
*late*. Every pair is checked (exact format, then values); an input without
an output is *missing*, or *refused* where the daemon left an error sidecar
instead (its reason is shown); an output or error sidecar without an input
is *extra* (listed, never a failure). A folder is checked on a thread pool: the C
parsers and numpy's BLAS and ufuncs release the GIL, so threads use every
core without the start-up (about half a second here) and the pickling of
matrices that worker processes would cost.

The results make a table, a one-line summary, JUnit XML (for grading and CI
systems) and JSON, and an exit status: 0 every check passed, 1 a check
failed, 2 a file could not be read (or a reference is not valid).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import mmap
import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from . import freivalds, tally, textcore
from .cpus import block_rows, usable_cores, worker_rows
from .errors import ExitStatus, InputFormatError, NotRegularFile, UnreadableError, UsageError
from .textcore import Values

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET

    import numpy as np

    from . import verify
    from .readahead import ReadAhead

# numpy and the modules built on it (mmd.textformat, mmd.verify) are imported where a check needs
# them: --quick by the C accelerators does without, and one output's quick check then starts without
# numpy's 0.2-0.5 s (docs/grading.md). So are yaml and mmd.record (a folder's refusals), and xml,
# json and mmd.atomic (the reports).

INPUT_SUFFIX = ".txt"
OUTPUT_SUFFIX = ".out"

#: Exit statuses of ``mmd check``.


class Status(str, Enum):
    """What became of one job."""

    OK = "ok"
    MISMATCH = "mismatch"  # values outside the tolerance
    FORMAT = "format"  # the output is not in the exact format
    MISSING = "missing"  # no output and no error sidecar
    REFUSED = "refused"  # an error sidecar instead of an output
    EXTRA = "extra"  # an output or error sidecar with no input or expected output
    SUPERSEDED = "superseded"  # an output or error sidecar for a test that a newer one answers
    LATE = "late"  # finished at or after the deadline (--before), or with no sidecar to say when
    NOT_A_FILE = "not-a-file"  # the output or error sidecar is a link, folder, FIFO or device: never opened
    ERROR = "error"  # could not be checked: a file cannot be read, or the reference is not valid


#: Statuses that fail a check (exit status 1).
FAILED = frozenset({Status.MISMATCH, Status.FORMAT, Status.MISSING, Status.REFUSED, Status.NOT_A_FILE})
#: Files listed but not checked: no job's answer (never a failure).
SET_ASIDE = (Status.EXTRA, Status.SUPERSEDED, Status.LATE)


@dataclass(frozen=True)
class Options:
    """How to check: against inputs (a float64 product) or expected outputs."""

    against: str = "inputs"  # "inputs" or "expected"
    tol: float | None = None
    quick: bool = False
    seed: int = field(default_factory=freivalds.fresh_seed)  # --quick's: fresh unless one is asked for
    gemm: verify.Gemm | None = None
    before: datetime | None = None  # a folder's deadline: only what its sidecars say finished before it


@dataclass(frozen=True)
class Aside:
    """A job decided by its pairing alone, never opened: superseded, late, or missing at a deadline."""

    status: Status
    reason: str


@dataclass(frozen=True)
class Job:
    """One pairing of an output with its reference, as found in the folders."""

    name: str
    output: Path | None  # None: no output
    reference: Path | None  # the input or expected output; None: an extra
    refusal: Path | None = None  # the error sidecar, where there is one
    aside: Aside | None = None  # decided by the pairing: nothing to check
    student: str | None = None  # whose folder it is in, checking a class (check_class)


@dataclass(frozen=True)
class Result:
    """The outcome of one job."""

    name: str
    status: Status
    output: Path | None
    reference: Path | None
    shape: tuple[int, int] | None = None
    max_error: float | None = None
    reason: str = ""  # one line, empty when ok
    detail: str = ""  # the value check's own summary line
    catches: float | None = None  # --quick: the rms a row or column must be off by to be caught surely
    line: int | None = None  # where the output's format fails
    column: int | None = None
    seconds: float = 0.0
    refusal: Path | None = None  # the error sidecar the job was paired with
    student: str | None = None  # whose, checking a class

    @property
    def file(self) -> str:
        """The output's file name (what it would be, for a missing one)."""
        if self.output is not None:
            return self.output.name
        if self.refusal is not None and self.status in (Status.SUPERSEDED, Status.LATE):
            return self.refusal.name  # the row is about that file, not the job's
        return self.name + OUTPUT_SUFFIX

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON (non-finite errors become null; names and reasons :func:`shown`)."""
        err = self.max_error if self.max_error is not None and math.isfinite(self.max_error) else None
        return {
            "name": shown(self.name),
            "file": shown(self.file),
            "status": self.status.value,
            "output": _shown_path(self.output),
            "reference": _shown_path(self.reference),
            "shape": None if self.shape is None else list(self.shape),
            "max_error": err,
            "reason": shown(self.reason),
            "detail": shown(self.detail),
            "catches": self.catches,
            "line": self.line,
            "column": self.column,
            "seconds": round(self.seconds, 6),
        }


@dataclass(frozen=True)
class Run:
    """Every result of one ``mmd check``."""

    outbox: Path
    reference: Path  # the folder (or file) checked against
    options: Options
    results: tuple[Result, ...]
    seconds: float
    started_at: str
    by_student: bool = False  # a class's folder (check_class): results grouped by student
    counts: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", _counts(self.results))

    @property
    def exit_status(self) -> int:
        """2 if anything could not be checked, else 1 if anything failed, else 0."""
        return _exit_status(self.counts)

    def summary(self) -> str:
        """One line: how many of each, and how long it took."""
        against = "expected outputs" if self.options.against == "expected" else "inputs"
        quick = f" (quick, seed {self.options.seed})" if self.options.quick else ""
        checked, tally = _tally_line(self.results, self.counts)
        figures = [r.catches for r in self.results if r.catches is not None]
        caught = f"; each {freivalds.caught_phrase(max(figures))}" if figures else ""
        return (
            f"{checked} jobs checked against the {against} in {self.reference}{quick}: {tally} ({self.seconds:.2f} s)"
            f"{caught}"
        )

    def students(self) -> dict[str, tuple[Result, ...]]:
        """Each student's results, in the table's order (a class's run; empty otherwise)."""
        groups: dict[str, list[Result]] = {}
        for r in self.results:
            if r.student is not None:
                groups.setdefault(r.student, []).append(r)
        return {login: tuple(results) for login, results in groups.items()}

    def student_summaries(self) -> list[str]:
        """A line per student, as :meth:`summary` counts them."""
        lines = []
        for login, results in self.students().items():
            checked, tally = _tally_line(results, _counts(results))
            lines.append(f"{shown(login)}: {checked} jobs checked: {tally}")
        return lines


def _counts(results: Iterable[Result]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for r in results:
        counts[r.status.value] += 1
    return counts


def _exit_status(counts: Mapping[str, int]) -> int:
    if counts[Status.ERROR.value]:
        return ExitStatus.USAGE
    return ExitStatus.FAILED if any(counts[s.value] for s in FAILED) else ExitStatus.OK


def _tally_line(results: Sequence[Result], c: Mapping[str, int]) -> tuple[int, str]:
    """(jobs checked, "4 ok, 1 mismatch; 1 extra; 0 could not be checked")."""
    checked = len(results) - sum(c[s.value] for s in SET_ASIDE)
    parts = [f"{c[s.value]} {s.value}" for s in (Status.OK, *sorted(FAILED, key=_ORDER.index)) if c[s.value]]
    # superseded and late only where there are any: most folders have neither
    aside = "".join(f"; {c[s.value]} {s.value}" for s in (Status.SUPERSEDED, Status.LATE) if c[s.value])
    return checked, f"{', '.join(parts) or 'none'}; {c['extra']} extra{aside}; {c['error']} could not be checked"


_ORDER = list(Status)


# ---------------------------------------------------------------------------
# reading


@contextlib.contextmanager
def _opened(path: Path, ahead: ReadAhead | None, follow: bool = True) -> Iterator[memoryview]:
    """The bytes of ``path``: as ``ahead`` mapped them, where it did (it unmaps them), else mapped
    or read here (``follow=False``: a student's file, :func:`mmd.textcore.read_bytes`)."""
    mapped = None if ahead is None else ahead.mapped(path)
    data = textcore.read_bytes(path, follow) if mapped is None else mapped
    view = memoryview(data)
    try:
        yield view
    finally:
        # an exception's traceback may still hold an array over the bytes: then the collector frees them
        with contextlib.suppress(BufferError):
            view.release()
            if mapped is None and isinstance(data, mmap.mmap):
                data.close()


def _output_array(values: Values) -> np.ndarray:
    """An output's values read by the C parser (:func:`mmd.textcore.output_values`), as an m×n
    float64 array over their buffer."""
    import numpy as np

    return np.frombuffer(values.buffer, np.float64).reshape(values.shape)


@dataclass(frozen=True)
class _Input:
    """An input's A (m×k) and B (k×n): flat views of their values in C order, float64 where ``wide``,
    else float32."""

    a: memoryview[float]
    b: memoryview[float]
    shape: tuple[int, int, int]
    wide: bool

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """A and B as arrays over the buffers."""
        import numpy as np

        m, k, n = self.shape
        dtype = np.float64 if self.wide else np.float32
        a = np.frombuffer(self.a.cast("B"), dtype).reshape(m, k)
        return a, np.frombuffer(self.b.cast("B"), dtype).reshape(k, n)

    @classmethod
    def of_arrays(cls, a: np.ndarray, b: np.ndarray, wide: bool) -> _Input:
        """Views of numpy's A and B (made C-ordered)."""
        import numpy as np

        def flat(x: np.ndarray) -> memoryview[float]:
            raw = np.ascontiguousarray(x).data.cast("B")
            return raw.cast("d") if wide else raw.cast("f")

        return cls(flat(a), flat(b), (a.shape[0], a.shape[1], b.shape[1]), wide)


def _input_values(path: Path, options: Options, ahead: ReadAhead | None) -> _Input:
    """A and B of an input: in float64 for the full check (its product reads them so: no
    conversion, no float32 copy), in float32 for --quick; as ``ahead`` read them, where it could;
    else, for --quick by the C accelerators, by the C parser into a plain buffer (no numpy); else
    by mmd.textformat into numpy's arrays (whose memory a folder's jobs reuse), which words a fault."""
    wide = not options.quick
    got = None if ahead is None else ahead.input_values(path, wide)
    if got is None:
        with _opened(path, ahead) as data:
            if options.quick and _quick_by_c():
                with contextlib.suppress(InputFormatError):  # worded below
                    got = textcore.input_values(data, wide)
            if got is None:
                import numpy as np

                from . import textformat

                try:
                    mats = textformat.parse(data, dtype=np.float64 if wide else np.float32)
                except InputFormatError as exc:
                    raise UnreadableError(f"input {path}: {exc.reason}") from None
                return _Input.of_arrays(mats.a, mats.b, wide)
    m, k, n = got.shape
    flat = got.view()
    return _Input(flat[: m * k], flat[m * k :], (m, k, n), wide)


def _expected_reason(path: Path, exc: InputFormatError) -> str:
    return f"expected output {path}: {exc.reason}"


class _ExpectedFault(Exception):
    """A fault of the expected output, met while both outputs are read a block at a time."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _output_fault(data: memoryview) -> NoReturn:
    """Raise an output's first fault, worded (by mmd.textformat: this imports numpy)."""
    from . import textformat

    textformat.raise_output_fault(data)


def _check_output(data: memoryview) -> None:
    """Raise the output's InputFormatError, if it has one: by the C parser where it is on (no numpy,
    nothing kept), the fault worded by mmd.textformat."""
    if textcore.c_text() is None or not textcore.output_ok(data):
        from . import textformat

        textformat.check_output(data)


def _output_blocks(data: memoryview, rows: int) -> Iterator[tuple[int, Any, int]]:
    """An output's values ``rows`` rows at a time: (first row, the rows' flat float64 values, rows),
    each block in a buffer that the next one reuses. By the C parser where it is on (no numpy), else
    by mmd.textformat; a fault raises the output's InputFormatError once its block is reached."""
    if textcore.c_text() is not None:
        yield from textcore.output_rows(data, rows, lambda: _output_fault(data))
        return
    from . import textformat

    for r0, block in textformat.output_blocks(data, rows):
        yield r0, block.reshape(-1), block.shape[0]


def _uniform_pass() -> tally.UniformPass:
    """The uniform rule's pass: mmd._fastcheck's over plain buffers where it is on (no numpy), else numpy's."""
    if textcore.c_passes() is not None:
        return tally.c_uniform
    from . import verify

    return verify.uniform_pass


def _paired_blocks(
    output: memoryview, expected: memoryview, path: Path, rows: int
) -> Iterator[tuple[int, Any, Any, int]]:
    """(first row, output rows, expected rows, rows), ``rows`` at a time (:func:`_output_blocks`); an
    expected output's fault is raised as :class:`_ExpectedFault` (the output's as its
    InputFormatError), each once reached."""
    theirs = _output_blocks(expected, rows)

    def next_expected() -> tuple[int, Any, int] | None:
        try:
            return next(theirs, None)
        except InputFormatError as exc:
            raise _ExpectedFault(_expected_reason(path, exc)) from None

    mine = _output_blocks(output, rows)
    # each block of the expected output is read on a second thread while the output's is read here
    # (the C parser releases the GIL), so the two share the cores as two whole reads did; past the
    # last block, the same calls read each file's end (a fault after its last row)
    with ThreadPoolExecutor(max_workers=1) as pool:
        while True:
            pending = pool.submit(next_expected)
            step = next(mine, None)
            got = pending.result()
            if step is None:
                return
            assert got is not None  # the shapes were compared first
            yield step[0], step[1], got[1], step[2]


# ---------------------------------------------------------------------------
# checking


def check_job(job: Job, options: Options, ahead: ReadAhead | None = None) -> Result:
    """Check one job; every outcome is a :class:`Result` (nothing raises for a bad file). ``ahead``:
    reads of its files already started (:mod:`mmd.readahead`), used where they succeeded."""
    start = time.perf_counter()
    try:
        result = _check(job, options, ahead)
    except MemoryError:  # one job's, never the end of a folder's check and its reports
        result = _result(job, Status.ERROR, reason="not enough memory to check it")
    return _with_seconds(result, time.perf_counter() - start)


def _with_seconds(r: Result, seconds: float) -> Result:
    return dataclasses.replace(r, seconds=seconds)


def _result(job: Job, status: Status, **fields: Any) -> Result:
    return Result(
        name=job.name,
        status=status,
        output=job.output,
        reference=job.reference,
        refusal=job.refusal,
        student=job.student,
        **fields,
    )


def _check(job: Job, options: Options, ahead: ReadAhead | None) -> Result:
    if job.aside is not None:
        return _result(job, job.aside.status, reason=job.aside.reason)
    if job.reference is None:
        what = job.output.name if job.output is not None else job.refusal.name if job.refusal else job.name
        return _result(job, Status.EXTRA, reason=f"{what}: no {job.name}{_ref_suffix(options)} to check it against")
    try:
        if job.output is None:
            if job.refusal is not None:
                return _result(job, Status.REFUSED, reason=_refusal_reason(job.refusal))
            return _result(job, Status.MISSING, reason="no output and no error sidecar")
        with _opened(job.output, ahead, follow=False) as data:
            m, n, start = textcore.output_header(data)  # a bad header fails now, the reference unread
            if not textcore.output_plausible(len(data), start, m, n):
                _output_fault(data)  # before any memory is sized from the header
            shape = (m, n)
            if options.against == "expected":
                return _against_expected(job, options, data, shape, ahead)
            ready = None if ahead is None else ahead.output_values(job.output)
            with ThreadPoolExecutor(max_workers=1) as pool:
                return _against_input(job, options, data, shape, _Rows(pool, data, ready), ahead)
    except NotRegularFile as exc:
        return _result(job, Status.NOT_A_FILE, reason=exc.reason)
    except UnreadableError as exc:  # the output's: the reference's are results of _against
        return _result(job, Status.ERROR, reason=exc.reason)
    except InputFormatError as exc:
        col = exc.details.get("column")
        return _result(job, Status.FORMAT, reason=exc.reason, line=exc.line, column=col)


class _Rows:
    """The output's rows, read on a second thread once :meth:`start` is called (the C parser releases the
    GIL), unless they are ``ready`` (read ahead)."""

    def __init__(self, pool: ThreadPoolExecutor, data: memoryview, ready: Values | None = None) -> None:
        self.pool, self.data, self.ready = pool, data, ready
        self.future: Future[np.ndarray] | None = None
        self.summing: Future[freivalds.OutputSums] | None = None

    def start(self) -> None:
        if self.future is None and self.ready is None:
            from . import textformat

            self.future = self.pool.submit(textformat.parse_output, self.data)

    def result(self) -> np.ndarray:
        """The values; raises the output's InputFormatError."""
        if self.ready is not None:
            return _output_array(self.ready)
        self.start()
        assert self.future is not None
        return self.future.result()

    def check(self) -> None:
        """Raise the output's InputFormatError, if it has one (its values are not kept)."""
        if self.summing is not None:
            self.summing.result()
        elif self.future is not None:
            self.future.result()
        elif self.ready is None:
            _check_output(self.data)

    def sums(self, shape: tuple[int, int], seed: int) -> Future[freivalds.OutputSums]:
        """--quick's sums of the output (started by the first call), made on the second thread as its
        rows are read a block of rows at a time: the output is never held whole (its 134 MB of fresh
        pages at 4096 cost the 2-core VM 0.3-0.9 s of system time in four runs of six, side by side).
        By the C parser and passes where they are on (no numpy), else by :func:`mmd.verify.output_sums`."""
        if self.summing is None:
            self.summing = self._start_sums(shape, seed)
        return self.summing

    def _start_sums(self, shape: tuple[int, int], seed: int) -> Future[freivalds.OutputSums]:
        if _quick_by_c():
            return self.pool.submit(self._c_sums, shape, seed)
        from . import textformat, verify

        if self.ready is not None:
            blocks: Iterable[tuple[int, np.ndarray]] = [(0, _output_array(self.ready))]
        else:
            blocks = textformat.output_blocks(self.data, block_rows(shape[1]))
        return self.pool.submit(verify.output_sums, blocks, shape, seed)

    def _c_sums(self, shape: tuple[int, int], seed: int) -> freivalds.OutputSums:
        sums = freivalds.OutputSums.start(shape, seed)
        if self.ready is not None:
            sums.add(0, self.ready.view(), shape[0])
            return sums
        for r0, block, rows in _output_blocks(self.data, block_rows(shape[1])):
            sums.add(r0, block, rows)
        return sums


def _shape_mismatch(job: Job, shape: tuple[int, int], want: tuple[int, int]) -> Result:
    reason = f"shape {shape[0]}x{shape[1]}, expected {want[0]}x{want[1]}"
    return _result(job, Status.MISMATCH, shape=shape, reason=reason)


def _against_expected(
    job: Job, options: Options, data: memoryview, shape: tuple[int, int], ahead: ReadAhead | None
) -> Result:
    """The output against an expected output, both read a block of rows at a time
    (:func:`mmd.cpus.block_rows`) and compared as they come: neither is held whole.

    The output's faults come first, as if it had been read first: before any fault of the
    expected output or of the shapes is reported, the rest of the output is checked
    (:func:`textformat.check_output`, which raises its InputFormatError). An expected output with
    the output's very bytes means the same values, all finite (the format has no NaN): right
    everywhere at any tolerance of 0 or more, with no values read (a grader comparing a run with
    an earlier one meets them often).
    """
    assert job.output is not None and job.reference is not None
    tol = 0.01 if options.tol is None else options.tol
    try:
        with _opened(job.reference, ahead) as expected:
            try:
                want = textcore.output_header(expected)[:2]
            except InputFormatError as exc:
                raise _ExpectedFault(_expected_reason(job.reference, exc)) from None
            if shape != want:  # the output's faults, then the expected output's, then the shapes
                _check_output(data)
                try:
                    _check_output(expected)
                except InputFormatError as exc:
                    return _result(job, Status.ERROR, shape=shape, reason=_expected_reason(job.reference, exc))
                return _shape_mismatch(job, shape, want)
            if tol >= 0:
                # read ahead, the bytes were compared and (where the same) the output checked
                same = None if ahead is None else ahead.same_output(job.output, job.reference)
                if same is None and textcore.same_bytes(data, expected):
                    _check_output(data)
                    same = True
                if same:
                    return _values_result(job, shape, tally.same_values(shape, tol))
            pair = None if ahead is None else ahead.expected_values(job.output, job.reference)
            if pair is not None:  # both read whole while numpy was imported: one block
                one = [(0, pair[0].view(), pair[1].view(), shape[0])]
                return _values_result(job, shape, tally.against_output_blocks(one, shape, tol, _uniform_pass()))
            blocks = _paired_blocks(data, expected, job.reference, block_rows(shape[1]))
            return _values_result(job, shape, tally.against_output_blocks(blocks, shape, tol, _uniform_pass()))
    except (UnreadableError, _ExpectedFault) as exc:
        _check_output(data)
        return _result(job, Status.ERROR, shape=shape, reason=exc.reason)


def _against_input(
    job: Job, options: Options, data: memoryview, shape: tuple[int, int], rows: _Rows, ahead: ReadAhead | None
) -> Result:
    """The output (its rows read on a second thread) against its input.

    For --quick the output's sums start at once, a block of rows at a time, beside the input's read
    and then its projections (sooner than after the input: docs/grading.md). Otherwise the input is parsed first,
    alone (the product needs all of it). Numpy's product is made a block of rows at a time, each
    block beside the same rows of the output, read then by the C parser (:meth:`verify.Product.pairs`,
    :class:`mmd.textcore.RowBlocks`): the output is never held whole. Beside a product another device makes
    (``options.gemm``), or without the C parser, the output is read whole on a second thread while
    the product is made. The output's faults come first, as if it had been read
    first: ``rows.check()`` raises its InputFormatError before any fault of the input or of the
    shapes is reported (a malformed output found beside a product costs that product).
    """
    assert job.reference is not None
    if options.quick and _input_shape(job.reference) == shape:  # else the output's sums wait for the input
        rows.sums(shape, options.seed)
    try:
        inputs = _input_values(job.reference, options, ahead)
    except UnreadableError as exc:
        rows.check()
        return _result(job, Status.ERROR, shape=shape, reason=exc.reason)
    m, _, n = inputs.shape
    if shape != (m, n):
        rows.check()
        return _shape_mismatch(job, shape, (m, n))
    if options.quick:
        sums = rows.sums(shape, options.seed)
        projections = _projections(inputs, options.seed)  # while the output's sums are made
        quick = freivalds.verdict(sums.result(), projections, tol=options.tol)
        status = Status.OK if quick.ok else Status.MISMATCH
        return _result(
            job, status, shape=shape, reason=quick.reason(), detail=quick.summary(), catches=quick.catches or None
        )
    from . import verify

    a, b = inputs.arrays()
    in_blocks = options.gemm is None and rows.ready is None and textcore.c_text() is not None and m * n > 0
    if not in_blocks:
        rows.start()
    product = verify.product(a, b, options.gemm)  # another device's product while the output's rows are read
    source: verify.Rows
    if in_blocks:
        source = textcore.RowBlocks(data, worker_rows(*shape), lambda: _output_fault(data))
    else:
        source = verify.WholeRows(rows.result())
    return _values_result(job, shape, verify.against_product(source, product, options.tol))


def _input_shape(path: Path) -> tuple[int, int] | None:
    """The product's (m, n) by the input's header line alone (its first bytes), None where that cannot
    be read: the full read that follows words the fault."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None
            head = os.pread(fd, textcore.HEADER_WINDOW + len(textcore.BOM), 0)
        finally:
            os.close(fd)
        h = textcore.parse_header(head, size=info.st_size)
    except (OSError, InputFormatError):
        return None
    return h.m, h.n


def _quick_by_c() -> bool:
    """Whether --quick reads and sums by the C accelerators, without numpy."""
    return freivalds.c_usable(freivalds.VECTORS) and textcore.c_text() is not None


def imports_numpy(against: str, quick: bool) -> bool:
    """Whether checks import numpy: all but those by the C accelerators alone, --quick and against
    expected outputs (which need numpy's module only to word a fault)."""
    if against == "expected":
        return textcore.c_text() is None or textcore.c_passes() is None
    return not (quick and _quick_by_c())


def prepare(against: str, quick: bool) -> None:
    """Import what checks need (numpy and mmd's modules built on it, :func:`imports_numpy`). ``mmd check``
    calls this while its reads run ahead (:mod:`mmd.readahead`), so that the import overlaps them
    rather than following them."""
    if imports_numpy(against, quick):
        from . import textformat, verify  # noqa: F401


def _projections(inputs: _Input, seed: int) -> freivalds.Projections:
    """--quick's side of A and B: by the C passes where they are on (no numpy), else by numpy's."""
    if _quick_by_c():
        return freivalds.project(inputs.a, inputs.b, inputs.shape, seed)
    from . import verify

    return verify.project(*inputs.arrays(), seed)


def _values_result(job: Job, shape: tuple[int, int], report: tally.CheckReport) -> Result:
    reason = ""
    if not report.ok:
        m, n = report.shape
        where = f", worst at row {report.worst[0] + 1} col {report.worst[1] + 1}" if report.worst else ""
        reason = f"{report.mismatches} of {m * n} values outside tolerance{where}"
    status = Status.OK if report.ok else Status.MISMATCH
    err = report.max_abs_error
    return _result(job, status, shape=shape, max_error=err, reason=reason, detail=report.summary())


def _ref_suffix(options: Options) -> str:
    return OUTPUT_SUFFIX if options.against == "expected" else INPUT_SUFFIX


def _refusal_reason(path: Path) -> str:
    """The reason an error sidecar gives (a student's file: raises NotRegularFile for a link, a FIFO ...)."""
    import yaml

    from . import record

    name = textcore.printable(path.name)
    try:
        refusal = record.parse(bytes(textcore.read_bytes(path, follow=False)), path)
    except NotRegularFile:
        raise
    except (UnreadableError, ValueError, yaml.YAMLError) as exc:
        return f"refused ({name} cannot be read: {type(exc).__name__})"
    reason = refusal.error.reason if isinstance(refusal, record.ErrorRecord) else None
    return f"refused: {textcore.printable(reason)} ({name})" if reason else f"refused ({name})"


# ---------------------------------------------------------------------------
# pairing a folder


#: The largest sidecar read for pairing: mmd's are about 2 KB; a student's file is not parsed beyond this.
SIDECAR_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Sidecar:
    """What pairing reads from an output's sidecar (or an error sidecar itself)."""

    input_sha256: str | None = None  # the input the job read
    finished_at: datetime | None = None  # when the job's files were committed
    wanted: str | None = None  # the output's name before it was versioned (x.out for x.1.out)


@dataclass(frozen=True)
class Found:
    """An output or error sidecar in a folder being graded, and its sidecar's facts (None: none read)."""

    path: Path
    sidecar: Sidecar | None = None

    @property
    def refusal(self) -> bool:
        from .record import ERROR_SUFFIX

        return self.path.name.endswith(ERROR_SUFFIX)

    @property
    def name(self) -> str:
        """The job its name gives: the file's, or the one the daemon wanted before it versioned it."""
        from .record import ERROR_SUFFIX

        wanted = self.sidecar.wanted if self.sidecar is not None else None
        name = wanted if wanted else self.path.name
        for suffix in (ERROR_SUFFIX, OUTPUT_SUFFIX):
            if name.endswith(suffix) and len(name) > len(suffix):
                return name[: -len(suffix)]
        return name

    @property
    def finished_at(self) -> datetime | None:
        return None if self.sidecar is None else self.sidecar.finished_at


def parse_time(text: str) -> datetime:
    """An ISO 8601 time (``--before``, a sidecar's ``finished_at``); one without an offset is local time.
    Raises ValueError."""
    when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    return when if when.tzinfo is not None else when.astimezone()


def shown_time(when: datetime) -> str:
    """A time as sidecars write it (to the millisecond, where it has a fraction)."""
    return when.isoformat(timespec="milliseconds" if when.microsecond else "seconds")


def _newest_first(found: Found) -> tuple[bool, float, bool, str]:
    """Sort key, newest first: one without a finish time is older than any with one; at one time an output
    comes before an error sidecar (the daemon never leaves both), then by name."""
    at = found.finished_at
    return (at is None, 0.0 if at is None else -at.timestamp(), found.refusal, found.path.name)


def pair(
    found: Iterable[Found],
    refs: Mapping[str, Path],
    ref_sha256: Mapping[str, str],
    before: datetime | None = None,
) -> list[Job]:
    """The jobs of a folder's outputs and error sidecars (``found``) against the references ``refs`` (job
    name -> input or expected output), sorted by name; pure.

    Each file answers the test whose input has the sha256 its sidecar names (``ref_sha256``, name -> sha256;
    the one of its own name where several tests have those bytes), else the test its name gives
    (:attr:`Found.name`), else none (extra). Of a test's answers, the newest by its sidecar's finish time is
    checked and the others are superseded; with ``before``, only those that finished before it are answers,
    and the rest are late (one with no finish time cannot be shown to be in time).
    """
    by_sha: dict[str, list[str]] = {}
    for name in sorted(ref_sha256):
        by_sha.setdefault(ref_sha256[name], []).append(name)
    answers: dict[str, list[Found]] = {}
    for f in found:
        sha = f.sidecar.input_sha256 if f.sidecar is not None else None
        same = by_sha.get(sha, []) if sha else []
        name = f.name if not same or f.name in same else same[0]
        answers.setdefault(name, []).append(f)
    jobs: list[Job] = []
    for name in sorted(set(refs) | set(answers)):
        ref = refs.get(name)
        mine = sorted(answers.get(name, []), key=_newest_first)
        if ref is None:  # no test: every file is an extra, as it always was
            jobs.extend(_job(name, f, None) for f in sorted(mine, key=lambda f: (f.refusal, f.path.name)))
            continue
        late = [f for f in mine if before is not None and (f.finished_at is None or f.finished_at >= before)]
        in_time = [f for f in mine if f not in late]
        if in_time:
            jobs.append(_job(name, in_time[0], ref))
        else:
            reason = None if before is None else f"no output and no error sidecar finished before {shown_time(before)}"
            jobs.append(Job(name, None, ref, aside=Aside(Status.MISSING, reason) if reason else None))
        why = f"superseded by {in_time[0].path.name}" if in_time else ""
        jobs.extend(_job(name, f, ref, Aside(Status.SUPERSEDED, why)) for f in in_time[1:])
        for f in late:
            at = f.finished_at
            assert before is not None
            why = (
                f"finished {shown_time(at)}, not before the deadline {shown_time(before)}"
                if at is not None
                else "no sidecar says when it finished: not shown to be before the deadline"
            )
            jobs.append(_job(name, f, ref, Aside(Status.LATE, why)))
    return jobs


def _job(name: str, found: Found, ref: Path | None, aside: Aside | None = None) -> Job:
    if found.refusal:
        return Job(name, None, ref, found.path, aside)
    return Job(name, found.path, ref, None, aside)


def pair_folder(outbox: Path, reference: Path, against: str, before: datetime | None = None) -> list[Job]:
    """The jobs of ``outbox`` against the folder ``reference`` (:func:`pair`), sorted by name. Raises
    UnreadableError."""
    from .record import ERROR_SUFFIX

    ref_suffix = OUTPUT_SUFFIX if against == "expected" else INPUT_SUFFIX
    refs = dict(_names(reference, ref_suffix))
    found = [
        Found(path, _read_sidecar(path))
        for suffix in (OUTPUT_SUFFIX, ERROR_SUFFIX)
        for _, path in _names(outbox, suffix)
    ]
    return pair(found, refs, _sha256s(refs, found, against), before)


def _sha256s(refs: Mapping[str, Path], found: Sequence[Found], against: str) -> dict[str, str]:
    """The inputs' sha256, where an answer's sidecar names one (an input's is what the daemon hashed)."""
    if against != "inputs" or not any(f.sidecar is not None and f.sidecar.input_sha256 for f in found):
        return {}
    sums = {}
    for name, path in refs.items():
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as fh:  # the grader's file: followed, as every reference is
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
        except OSError:
            continue  # its check says why
        sums[name] = digest.hexdigest()
    return sums


def _read_sidecar(path: Path) -> Sidecar | None:
    """The facts of an output's sidecar (or of the error sidecar ``path``), None where there is none that
    mmd could have written. A student's file: never through a link, never a big one."""
    import yaml

    from . import record

    sidecar = path if path.name.endswith(record.ERROR_SUFFIX) else record.timing_path(path)
    try:
        data = textcore.read_bytes(sidecar, follow=False)
        if len(data) > SIDECAR_MAX_BYTES:
            return None
        rec = record.parse(bytes(data), sidecar)
    except (UnreadableError, ValueError, yaml.YAMLError):  # NotRegularFile is an UnreadableError
        return None
    try:
        finished = parse_time(rec.finished_at) if rec.finished_at else None
    except ValueError:
        finished = None
    wanted = rec.context.collision.wanted if rec.context.collision is not None else None
    return Sidecar(rec.input.sha256, finished, wanted)


def _names(folder: Path, suffix: str) -> Iterable[tuple[str, Path]]:
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        raise UnreadableError(f"cannot read {folder}: {exc.strerror}") from None
    for e in entries:
        if e.name.startswith(".") or not e.name.endswith(suffix) or len(e.name) == len(suffix):
            continue  # hidden files: the daemon's claims and temporaries
        yield e.name[: -len(suffix)], Path(folder) / e.name


class Progress(Protocol):
    """Told of a folder's checks as they go (``mmd check`` draws a bar on a terminal)."""

    def start(self, total: int) -> None:
        """``total`` jobs are about to be checked."""

    def advance(self, result: Result) -> None:
        """One of them is done."""


def check_jobs(
    jobs: Sequence[Job], options: Options, workers: int | None = None, progress: Progress | None = None
) -> list[Result]:
    """Check ``jobs`` on ``workers`` threads (default: one per core); results in the jobs' order, each told to
    ``progress`` as it ends."""
    if progress is not None:
        progress.start(len(jobs))
    workers = max(1, min(len(jobs), workers or usable_cores()))
    if workers == 1:
        results = []
        for job in jobs:
            results.append(check_job(job, options))
            if progress is not None:
                progress.advance(results[-1])
        return results
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(check_job, job, options) for job in jobs]
        if progress is not None:
            for fut in as_completed(futures):
                progress.advance(fut.result())
        return [fut.result() for fut in futures]


def check_folder(
    outbox: Path, reference: Path, options: Options, workers: int | None = None, progress: Progress | None = None
) -> Run:
    """Pair and check a whole outbox against a folder of inputs or expected outputs."""
    started = _now()
    start = time.perf_counter()
    jobs = pair_folder(outbox, reference, options.against, options.before)
    results = check_jobs(jobs, options, workers, progress)
    return Run(outbox, reference, options, tuple(results), time.perf_counter() - start, started)


def check_class(
    folder: Path,
    reference: Path,
    options: Options,
    roster: Sequence[str] | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
) -> Run:
    """Check a class's ``folder``, a sub-folder per student (``handin/<login>/``, class mode's
    ``outbox/<login>/``), each against the same inputs or expected outputs: the jobs of every student
    (:func:`class_jobs`) in one pool."""
    started = _now()
    start = time.perf_counter()
    jobs = class_jobs(folder, reference, options.against, options.before, roster)
    results = check_jobs(jobs, options, workers, progress)
    return Run(folder, reference, options, tuple(results), time.perf_counter() - start, started, by_student=True)


def class_jobs(
    folder: Path, reference: Path, against: str, before: datetime | None = None, roster: Sequence[str] | None = None
) -> list[Job]:
    """Every student's jobs (:func:`pair`), by login. The students are ``folder``'s entries (each looked at
    with ``lstat``: a real folder is a student's; a link, FIFO or device named like one is reported as
    not-a-file and never followed) and the logins of ``roster`` (one with no folder has every test
    missing). Never a student: dot folders, mmd's own ``slurm/`` (unless the roster names it), and plain
    files. Raises UnreadableError."""
    from .record import ERROR_SUFFIX
    from .slurm import SCRIPTS_DIR

    named = set(roster or ())
    try:
        entries = {e.name: e.stat(follow_symlinks=False).st_mode for e in os.scandir(folder)}
    except OSError as exc:
        raise UnreadableError(f"cannot read {folder}: {exc.strerror}") from None
    # a plain file in a class's folder (a roster, notes) is no student's; anything else named like one is
    students = {
        name: mode
        for name, mode in entries.items()
        if not name.startswith(".") and not stat.S_ISREG(mode) and (name != SCRIPTS_DIR or name in named)
    }
    refs = dict(_names(reference, OUTPUT_SUFFIX if against == "expected" else INPUT_SUFFIX))
    found = {
        login: [
            Found(p, _read_sidecar(p))
            for suffix in (OUTPUT_SUFFIX, ERROR_SUFFIX)
            for _, p in _names(folder / login, suffix)
        ]
        for login, mode in students.items()
        if stat.S_ISDIR(mode)
    }
    sha256s = _sha256s(refs, [f for mine in found.values() for f in mine], against)
    jobs: list[Job] = []
    for login in sorted(set(students) | named):
        mode = students.get(login)
        if login in found:
            mine = pair(found[login], refs, sha256s, before)
        else:  # no folder: every test missing, after the entry that stands in its place
            if mode is not None:
                path = folder / login
                why = Aside(Status.NOT_A_FILE, textcore.not_regular(path, mode).reason)
                mine = [Job(login, path, None, aside=why)]
            else:
                mine = []
            why = Aside(Status.MISSING, f"no folder {login}")
            mine += [Job(name, None, ref, aside=why) for name, ref in sorted(refs.items())]
        jobs += [dataclasses.replace(job, student=login) for job in mine]
    return jobs


def read_roster(path: Path) -> list[str]:
    """A class's logins from ``path``, one a line (blank lines and ``#`` comments skipped). Raises
    UsageError for a line that is not a login (it names a folder: never ``..`` or a path)."""
    from .submitters import is_login

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"--roster {shown(str(path))}: cannot read it ({getattr(exc, 'strerror', None) or exc})"
        ) from None
    logins: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        login = line.split("#", 1)[0].strip()
        if not login:
            continue
        if not is_login(login):
            raise UsageError(f"--roster {shown(str(path))}: line {number}: {shown(repr(login))} is not a login")
        if login not in logins:
            logins.append(login)
    return logins


def check_file(output: Path, reference: Path, options: Options, ahead: ReadAhead | None = None) -> Run:
    """Check one output against one input or expected output (``ahead``: reads of them already started)."""
    started = _now()
    start = time.perf_counter()
    name = output.name[: -len(OUTPUT_SUFFIX)] if output.name.endswith(OUTPUT_SUFFIX) else output.stem
    result = check_job(Job(name or output.name, output, reference), options, ahead)
    return Run(output, reference, options, (result,), time.perf_counter() - start, started)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------
# reports

#: Every text a report shows (file names, which students choose; reasons, which quote their files):
#: escaped so that it can neither move a terminal's cursor nor break XML 1.0 or UTF-8.
shown = textcore.printable


def check_report_path(path: Path, flag: str) -> None:
    """Raise UsageError where a report cannot be written at ``path`` (its folder is missing or not
    writable, or it names a folder): ``mmd check`` asks before any check starts, not after them all."""
    where = f"{flag} {shown(str(path))}"
    if path.is_dir():
        raise UsageError(f"{where}: is a folder; give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"{where}: the folder {shown(str(folder))} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: cannot write in {shown(str(folder))}")


def _shown_path(path: Path | None) -> str | None:
    return None if path is None else shown(str(path))


def table(results: Sequence[Result]) -> str:
    """The results as a plain-text table: (student,) file, shape, status, max error, reason."""
    students = any(r.student is not None for r in results)
    rows = [(*(("student",) if students else ()), "file", "shape", "status", "max error", "reason")]
    for r in results:
        shape = "-" if r.shape is None else f"{r.shape[0]}x{r.shape[1]}"
        err = "-" if r.max_error is None else f"{r.max_error:.4g}"
        who = (shown(r.student or ""),) if students else ()
        rows.append((*who, shown(r.file), shape, r.status.value, err, shown(r.reason)))
    last = len(rows[0]) - 1  # the reason: not padded; the max error before it right-aligned
    widths = [max(len(row[i]) for row in rows) for i in range(last)]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if i == last - 1 else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row[:last], widths, strict=True))
        ]
        lines.append("  ".join([*cells, row[last]]).rstrip())
    return "\n".join(lines)


def junit_xml(run: Run) -> ET.Element:
    """The run as JUnit XML: one testcase per job (failures; errors; extra, superseded and late files as
    skipped) in one testsuite, or in a class's run one testsuite per student."""
    import xml.etree.ElementTree as ET

    # the schema pytest's junit_family=xunit2 targets (Jenkins' junit-10.xsd, tests/data): testsuites
    # has no skipped count; a timestamp without an offset (UTC) is what every JUnit reader takes
    totals = _junit_totals(run.results, run.seconds)
    root = ET.Element("testsuites", {"name": "mmd check", **{k: v for k, v in totals.items() if k != "skipped"}})
    if run.by_student:
        for login, results in run.students().items():
            seconds = sum(r.seconds for r in results)
            _junit_suite(root, run, f"mmd check {shown(login)}", results, seconds, [("student", shown(login))])
    else:
        _junit_suite(root, run, f"mmd check {shown(str(run.outbox))}", run.results, run.seconds, [])
    ET.indent(root)
    return root


def _junit_totals(results: Sequence[Result], seconds: float) -> dict[str, str]:
    c = _counts(results)
    return {
        "tests": str(len(results)),
        "failures": str(sum(c[s.value] for s in FAILED)),
        "errors": str(c["error"]),
        "skipped": str(sum(c[s.value] for s in SET_ASIDE)),
        "time": f"{seconds:.3f}",
    }


def _junit_suite(
    root: ET.Element, run: Run, name: str, results: Sequence[Result], seconds: float, extra: list[tuple[str, str]]
) -> None:
    import socket
    import xml.etree.ElementTree as ET

    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": name,
            **_junit_totals(results, seconds),
            "timestamp": run.started_at.removesuffix("+00:00"),
            "hostname": shown(socket.gethostname()),
        },
    )
    props = ET.SubElement(suite, "properties")
    o = run.options
    for key, value in (
        *extra,
        ("outbox", shown(str(run.outbox))),
        ("against", o.against),
        ("reference", shown(str(run.reference))),
        ("quick", "true" if o.quick else "false"),
        ("seed", str(o.seed)),
        ("tol", "model" if o.tol is None else f"{o.tol:g}"),
        *([("before", shown_time(o.before))] if o.before is not None else []),
    ):
        ET.SubElement(props, "property", {"name": key, "value": value})
    for r in results:
        # a test's superseded and late files are cases of their own: named by their file too
        case_name = shown(r.name) if r.status not in (Status.SUPERSEDED, Status.LATE) else shown(f"{r.name} ({r.file})")
        case = ET.SubElement(
            suite, "testcase", {"classname": "mmd.check", "name": case_name, "time": f"{r.seconds:.3f}"}
        )
        reason = shown(r.reason)
        if r.status in FAILED:
            node = ET.SubElement(case, "failure", {"type": r.status.value, "message": reason})
            node.text = shown(r.detail) or reason
        elif r.status is Status.ERROR:
            ET.SubElement(case, "error", {"type": r.status.value, "message": reason})
        elif r.status in SET_ASIDE:
            ET.SubElement(case, "skipped", {"type": r.status.value, "message": reason})
        # the files checked (testcase has no attribute for them), then the check's own summary line
        paths = [
            f"{what}: {shown(str(path))}" for what, path in (("output", r.output), ("reference", r.reference)) if path
        ]
        ET.SubElement(case, "system-out").text = "\n".join([*paths, shown(r.detail)]).rstrip("\n")


def write_junit(run: Run, path: Path) -> None:
    """Write :func:`junit_xml` to ``path`` (atomically)."""
    import xml.etree.ElementTree as ET

    from .atomic import write_atomic

    body = ET.tostring(junit_xml(run), encoding="unicode")
    write_atomic(path, [b"<?xml version='1.0' encoding='utf-8'?>\n", body.encode("utf-8"), b"\n"], durable=False)


def run_dict(run: Run) -> dict[str, Any]:
    """The run as plain data (what ``--json`` writes)."""
    o = run.options
    return {
        "outbox": shown(str(run.outbox)),
        "against": o.against,
        "reference": shown(str(run.reference)),
        "quick": o.quick,
        "seed": o.seed,
        "tol": o.tol,
        "before": None if o.before is None else shown_time(o.before),
        "started_at": run.started_at,
        "seconds": round(run.seconds, 6),
        "exit_status": run.exit_status,
        "counts": dict(run.counts),
        **(
            {"students": [_student_dict(login, results) for login, results in run.students().items()]}
            if run.by_student
            else {"results": [r.as_dict() for r in run.results]}
        ),
    }


def _student_dict(login: str, results: Sequence[Result]) -> dict[str, Any]:
    counts = _counts(results)
    return {
        "student": shown(login),
        "exit_status": _exit_status(counts),
        "counts": counts,
        "results": [r.as_dict() for r in results],
    }


def write_json(run: Run, path: Path) -> None:
    """Write :func:`run_dict` to ``path`` as JSON (atomically)."""
    import json

    from .atomic import write_atomic

    text = json.dumps(run_dict(run), indent=2, allow_nan=False) + "\n"
    write_atomic(path, [text.encode("utf-8")], durable=False)
