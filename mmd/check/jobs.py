"""Checking jobs: one output against its input or expected output, a folder's, a class's.

Each job is read (its output a student's file: never through a link, its header held against its
size before any memory is sized from it) and checked: the exact format, then the values, by the full
check (:mod:`.full`), the quick one (:mod:`.quick`) or two outputs compared (:mod:`.compare`); every
outcome is a :class:`~.results.Result`, nothing raises for a bad file. A folder is checked on a
thread pool: the C parsers and numpy's BLAS and ufuncs release the GIL, so threads use every core
without the start-up (about half a second here) and the pickling of matrices that worker processes
would cost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import stat
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from .. import accel, textcore
from ..cpus import block_rows, usable_cores, worker_rows
from ..errors import InputFormatError, NotRegularFile, UnreadableError
from . import compare, quick
from .pairing import class_jobs, pair_folder, read_sidecar
from .results import INPUT_SUFFIX, OUTPUT_SUFFIX, CheckRun, Options, Pairing, Result, Status

if TYPE_CHECKING:
    import numpy as np

# numpy and the modules built on it (mmd.textformat, mmd.check.full and its parts) are imported where a
# check needs them: --quick by the C accelerators does without, and one output's quick check then starts
# without paying for numpy's import (docs/grading.md, "Speed", times it). So are yaml and mmd.record (a
# folder's refusals).

# ---------------------------------------------------------------------------
# reading


@contextlib.contextmanager
def _opened(path: Path, follow: bool = True) -> Iterator[memoryview]:
    """The bytes of ``path``, mapped or read (``follow=False``: a student's file,
    :func:`mmd.textcore.read_bytes`)."""
    data = textcore.read_bytes(path, follow)
    view = memoryview(data)
    try:
        yield view
    finally:
        # an exception's traceback may still hold an array over the bytes: then the collector frees them
        with contextlib.suppress(BufferError):
            view.release()
            if isinstance(data, mmap.mmap):
                data.close()


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


def _input_values(path: Path, options: Options) -> _Input:
    """A and B of an input: in float64 for the full check (its product reads them so: no
    conversion, no float32 copy), in float32 for --quick; for --quick by the C accelerators, by the
    C parser into a plain buffer (no numpy); else by mmd.textformat into numpy's arrays (whose
    memory a folder's jobs reuse), which words a fault."""
    wide = not options.quick
    got = None
    with _opened(path) as data:
        if options.quick and _quick_by_c():
            with contextlib.suppress(InputFormatError):  # worded below
                got = textcore.input_values(data, wide)
        if got is None:
            import numpy as np

            from .. import textformat

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
    """Raise an output's first fault, worded (by mmd.textoutput: this imports numpy)."""
    from .. import textoutput

    textoutput.raise_output_fault(data)


def _check_output(data: memoryview) -> None:
    """Raise the output's InputFormatError, if it has one: by the C parser where it is on (no numpy,
    nothing kept), the fault worded by mmd.textoutput."""
    if accel.text() is None or not textcore.output_ok(data):
        from .. import textoutput

        textoutput.check_output(data)


def _output_blocks(data: memoryview, rows: int) -> Iterator[tuple[int, Any, int]]:
    """An output's values ``rows`` rows at a time: (first row, the rows' flat float64 values, rows),
    each block in a buffer that the next one reuses. By the C parser where it is on (no numpy), else
    by mmd.textformat; a fault raises the output's InputFormatError once its block is reached."""
    if accel.text() is not None:
        yield from textcore.output_rows(data, rows, lambda: _output_fault(data))
        return
    from .. import textoutput

    for r0, block in textoutput.output_blocks(data, rows):
        yield r0, block.reshape(-1), block.shape[0]


def _uniform_pass() -> compare.UniformPass:
    """The uniform rule's pass: mmd._fastcheck's over plain buffers where it is on (no numpy), else numpy's."""
    if accel.passes() is not None:
        return compare.c_uniform
    from . import full

    return full.uniform_pass


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


def check_job(job: Pairing, options: Options) -> Result:
    """Check one job; every outcome is a :class:`Result` (nothing raises for a bad file)."""
    start = time.perf_counter()
    try:
        result = _check(job, options)
    except MemoryError:  # one job's, never the end of a folder's check and its reports
        result = _result(job, Status.ERROR, reason="not enough memory to check it")
    return _with_seconds(result, time.perf_counter() - start)


def _with_seconds(r: Result, seconds: float) -> Result:
    return dataclasses.replace(r, seconds=seconds)


def _result(job: Pairing, status: Status, **fields: Any) -> Result:
    return Result(
        name=job.name,
        status=status,
        output=job.output,
        reference=job.reference,
        refusal=job.refusal,
        student=job.student,
        arrival=job.arrival,
        kernel=job.kernel,
        **fields,
    )


def precision_of(kernel: str | None, declared: str | None = None) -> str:
    """The arithmetic a kernel's products carry (:data:`mmd.kernels.PRECISIONS`): what a kernel file's
    declaration says (``declared``, from the sidecar), else the registry's for ``kernel``; fp32 for a kernel it
    does not know, or none (an output without a sidecar)."""
    from .. import kernels

    if declared in kernels.PRECISIONS:
        return declared
    return kernels.get(kernel).precision if kernel in kernels.NAMES else "fp32"


def _check(job: Pairing, options: Options) -> Result:
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
        with _opened(job.output, follow=False) as data:
            m, n, start = textcore.output_header(data)  # a bad header fails now, the reference unread
            if not textcore.output_plausible(len(data), start, m, n):
                _output_fault(data)  # before any memory is sized from the header
            shape = (m, n)
            if options.against == "expected":
                return _against_expected(job, options, data, shape)
            with ThreadPoolExecutor(max_workers=1) as pool:
                return _against_input(job, options, data, shape, _Rows(pool, data))
    except NotRegularFile as exc:
        return _result(job, Status.NOT_A_FILE, reason=exc.reason)
    except UnreadableError as exc:  # the output's: the reference's are results of _against
        return _result(job, Status.ERROR, reason=exc.reason)
    except InputFormatError as exc:
        col = exc.details.get("column")
        return _result(job, Status.FORMAT, reason=exc.reason, line=exc.line, column=col)


class _Rows:
    """The output's rows, read on a second thread once :meth:`start` is called (the C parser releases the
    GIL)."""

    def __init__(self, pool: ThreadPoolExecutor, data: memoryview) -> None:
        self.pool, self.data = pool, data
        self.future: Future[np.ndarray] | None = None
        self.summing: Future[quick.OutputSums] | None = None

    def start(self) -> None:
        if self.future is None:
            from .. import textoutput

            self.future = self.pool.submit(textoutput.parse_output, self.data)

    def result(self) -> np.ndarray:
        """The values; raises the output's InputFormatError."""
        self.start()
        assert self.future is not None
        return self.future.result()

    def check(self) -> None:
        """Raise the output's InputFormatError, if it has one (its values are not kept)."""
        if self.summing is not None:
            self.summing.result()
        elif self.future is not None:
            self.future.result()
        else:
            _check_output(self.data)

    def sums(self, shape: tuple[int, int], seed: int) -> Future[quick.OutputSums]:
        """--quick's sums of the output (started by the first call), made on the second thread as its
        rows are read a block of rows at a time: the output is never held whole (faulting in a large
        output's fresh pages costs system time; docs/grading.md, "Speed", times ``--quick``).
        By the C parser and passes where they are on (no numpy), else by :func:`mmd.check.quickarrays.output_sums`."""
        if self.summing is None:
            self.summing = self._start_sums(shape, seed)
        return self.summing

    def _start_sums(self, shape: tuple[int, int], seed: int) -> Future[quick.OutputSums]:
        if _quick_by_c():
            return self.pool.submit(self._c_sums, shape, seed)
        from .. import textoutput
        from . import quickarrays

        blocks = textoutput.output_blocks(self.data, block_rows(shape[1]))
        return self.pool.submit(quickarrays.output_sums, blocks, shape, seed)

    def _c_sums(self, shape: tuple[int, int], seed: int) -> quick.OutputSums:
        sums = quick.OutputSums.start(shape, seed)
        for r0, block, rows in _output_blocks(self.data, block_rows(shape[1])):
            sums.add(r0, block, rows)
        return sums


def _shape_mismatch(job: Pairing, shape: tuple[int, int], want: tuple[int, int]) -> Result:
    reason = f"shape {shape[0]}x{shape[1]}, expected {want[0]}x{want[1]}"
    return _result(job, Status.MISMATCH, shape=shape, reason=reason)


def _against_expected(job: Pairing, options: Options, data: memoryview, shape: tuple[int, int]) -> Result:
    """The output against an expected output, both read a block of rows at a time
    (:func:`mmd.cpus.block_rows`) and compared as they come: neither is held whole.

    The output's faults come first, as if it had been read first: before any fault of the
    expected output or of the shapes is reported, the rest of the output is checked
    (:func:`textoutput.check_output`, which raises its InputFormatError). An expected output with
    the output's very bytes means the same values, all finite (the format has no NaN): right
    everywhere at any tolerance of 0 or more, with no values read (a grader comparing a run with
    an earlier one meets them often).
    """
    assert job.output is not None and job.reference is not None
    tol = 0.01 if options.tol is None else options.tol
    try:
        with _opened(job.reference) as expected:
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
            if tol >= 0 and textcore.same_bytes(data, expected):
                _check_output(data)
                return _values_result(job, shape, compare.same_values(shape, tol))
            blocks = _paired_blocks(data, expected, job.reference, block_rows(shape[1]))
            return _values_result(job, shape, compare.against_output_blocks(blocks, shape, tol, _uniform_pass()))
    except (UnreadableError, _ExpectedFault) as exc:
        _check_output(data)
        return _result(job, Status.ERROR, shape=shape, reason=exc.reason)


def _against_input(job: Pairing, options: Options, data: memoryview, shape: tuple[int, int], rows: _Rows) -> Result:
    """The output (its rows read on a second thread) against its input.

    For --quick the output's sums start at once, a block of rows at a time, beside the input's read
    and then its projections (sooner than after the input: docs/grading.md). Otherwise the input is parsed first,
    alone (the product needs all of it). Numpy's product is made a block of rows at a time, each
    block beside the same rows of the output, read then by the C parser (:meth:`mmd.check.product.Float64Product.pairs`,
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
        inputs = _input_values(job.reference, options)
    except UnreadableError as exc:
        rows.check()
        return _result(job, Status.ERROR, shape=shape, reason=exc.reason)
    m, _, n = inputs.shape
    if shape != (m, n):
        rows.check()
        return _shape_mismatch(job, shape, (m, n))
    # --tol: one allowance for all
    precision = precision_of(job.kernel, job.precision) if options.tol is None else "fp32"
    if options.quick:
        sums = rows.sums(shape, options.seed)
        projections = _projections(inputs, options.seed)  # while the output's sums are made
        verdict = quick.verdict(sums.result(), projections, tol=options.tol, precision=precision)
        status = Status.OK if verdict.ok else Status.MISMATCH
        reason = _held_to(job, precision, verdict.reason())
        detail = verdict.summary()
        return _result(
            job,
            status,
            shape=shape,
            reason=reason,
            detail=detail,
            catches=verdict.catches or None,
            precision=precision,
        )
    from . import full, product

    a, b = inputs.arrays()
    in_blocks = options.gemm is None and accel.text() is not None and m * n > 0
    if not in_blocks:
        rows.start()
    prod = product.product(a, b, options.gemm)  # another device's product while the output's rows are read
    source: product.Rows
    if in_blocks:
        source = textcore.RowBlocks(data, worker_rows(*shape), lambda: _output_fault(data))
    else:
        source = product.WholeRows(rows.result())
    return _values_result(job, shape, full.against_product(source, prod, options.tol, precision), precision)


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
    return quick.c_usable(quick.VECTORS) and accel.text() is not None


def _projections(inputs: _Input, seed: int) -> quick.Projections:
    """--quick's side of A and B: by the C passes where they are on (no numpy), else by numpy's."""
    if _quick_by_c():
        return quick.project(inputs.a, inputs.b, inputs.shape, seed)
    from . import quickarrays

    return quickarrays.project(*inputs.arrays(), seed)


def _values_result(
    job: Pairing, shape: tuple[int, int], report: compare.CheckReport, precision: str = "fp32"
) -> Result:
    reason = ""
    if not report.ok:
        m, n = report.shape
        where = f", worst at row {report.worst[0] + 1} col {report.worst[1] + 1}" if report.worst else ""
        reason = f"{report.mismatches} of {m * n} values outside tolerance{where}"
    status = Status.OK if report.ok else Status.MISMATCH
    err = report.max_abs_error
    reason = _held_to(job, precision, reason)
    return _result(job, status, shape=shape, max_error=err, reason=reason, detail=report.summary(), precision=precision)


def _held_to(job: Pairing, precision: str, reason: str) -> str:
    """``reason``, with the tolerance a TF32 kernel's output was held to: a grader must see that it was
    wider, and why."""
    if precision != "tf32":
        return reason
    said = f"kernel {job.kernel} is TF32: held to TF32's tolerance"
    return f"{reason}; {said}" if reason else said


def _ref_suffix(options: Options) -> str:
    return OUTPUT_SUFFIX if options.against == "expected" else INPUT_SUFFIX


def _refusal_reason(path: Path) -> str:
    """The reason an error sidecar gives (a student's file: raises NotRegularFile for a link, a FIFO ...)."""
    import yaml

    from .. import record
    from ..record.reader import parse

    name = textcore.printable(path.name)
    try:
        refusal = parse(bytes(textcore.read_bytes(path, follow=False)), path)
    except NotRegularFile:
        raise
    except (UnreadableError, ValueError, yaml.YAMLError) as exc:
        return f"refused ({name} cannot be read: {type(exc).__name__})"
    reason = refusal.error.reason if isinstance(refusal, record.ErrorRecord) else None
    return f"refused: {textcore.printable(reason)} ({name})" if reason else f"refused ({name})"


class CheckProgress(Protocol):
    """Told of a folder's checks as they go (``mmd check`` draws a bar on a terminal)."""

    def start(self, total: int) -> None:
        """``total`` jobs are about to be checked."""

    def advance(self, result: Result) -> None:
        """One of them is done."""


def check_jobs(
    jobs: Sequence[Pairing], options: Options, workers: int | None = None, progress: CheckProgress | None = None
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
    outbox: Path, reference: Path, options: Options, workers: int | None = None, progress: CheckProgress | None = None
) -> CheckRun:
    """Pair and check a whole outbox against a folder of inputs or expected outputs."""
    started = _now()
    start = time.perf_counter()
    jobs = pair_folder(outbox, reference, options.against, options.before)
    results = check_jobs(jobs, options, workers, progress)
    return CheckRun(outbox, reference, options, tuple(results), time.perf_counter() - start, started)


def check_class(
    folder: Path,
    reference: Path,
    options: Options,
    roster: Sequence[str] | None = None,
    workers: int | None = None,
    progress: CheckProgress | None = None,
) -> CheckRun:
    """Check a class's ``folder``, a sub-folder per student (``handin/<login>/``, class mode's
    ``outbox/<login>/``), each against the same inputs or expected outputs: the jobs of every student
    (:func:`class_jobs`) in one pool."""
    started = _now()
    start = time.perf_counter()
    jobs = class_jobs(folder, reference, options.against, options.before, roster)
    results = check_jobs(jobs, options, workers, progress)
    return CheckRun(folder, reference, options, tuple(results), time.perf_counter() - start, started, by_student=True)


def check_file(output: Path, reference: Path, options: Options) -> CheckRun:
    """Check one output against one input or expected output."""
    started = _now()
    start = time.perf_counter()
    name = output.name[: -len(OUTPUT_SUFFIX)] if output.name.endswith(OUTPUT_SUFFIX) else output.stem
    kernel = precision = None
    if options.against == "inputs" and options.tol is None:
        # the kernel that made it, where it has a sidecar: the full and the quick check's models read it
        sidecar = read_sidecar(output)
        kernel = None if sidecar is None else sidecar.kernel
        precision = None if sidecar is None else sidecar.precision
    result = check_job(Pairing(name or output.name, output, reference, kernel=kernel, precision=precision), options)
    return CheckRun(output, reference, options, (result,), time.perf_counter() - start, started)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
