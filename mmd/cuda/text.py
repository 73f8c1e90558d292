"""The GPU text path: upload an input's bytes, parse, multiply and format on the device, download text.

:meth:`GpuText.multiply_text` runs a whole job's middle on the parts of one
:class:`mmd.cuda.session.GpuSession` (every device call goes through them):

1. ``h2d``: the body bytes (after the header line) go to the device, padded
   with spaces to whole blocks, from page-locked memory (the pipeline reads
   the file straight into :meth:`~mmd.cuda.memory.Memory.host_empty` memory;
   other bytes are staged through a page-locked ring, copied while earlier
   pieces upload).
2. ``parse_gpu``: ``kernels/text_parse.cu`` finds the runs, classifies and
   counts them, scans the counts and converts the values into A and B.
   Runs only the exact host rule can convert (exponents, long mantissas,
   overlong runs) come back as (run, offset) pairs; the host converts them
   with textformat's own rule and sends the values back. Any error (a bad
   byte, a malformed number, too few or too many values, a value beyond
   float32) makes the host parser parse the file, so the message, line and
   value are exactly those of the host path.
3. ``kernel``: the caller's :class:`Multiply` step on the parsed buffers in place: the requested
   matmul kernel (the cuda backend's), or a kernel file's launch with its padding (its launch process's).
4. ``emit_gpu``: ``kernels/text_emit.cu`` writes the ``%6.2f`` text (lengths,
   a prefix sum, bytes). A product holding a value beyond the kernel's digit
   loop (10^16 or more, rare) is formatted by ``textformat`` on the host, as
   the host path formats it; one holding a value that is not finite is refused
   by ``textformat.check_product``, as on the host path.
5. ``d2h``: the text (and C, for callers that check it) into page-locked memory.

Every phase is timed with CUDA events on the session's stream; ``malloc``,
``h2d``, ``kernel``, ``d2h`` and ``free`` keep the course's names (here h2d and
d2h move text, not float32 matrices). Wall-clock stage times (``parse``,
``multiply``, ``emit``) are reported separately for the pipeline.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .. import textformat
from ..hostbuffers import C_SLOT, TEXT_SLOT, kept_buffers
from ..kernels import TEXT_KERNEL_FILES
from ..resources import kernels_dir
from ..textformat import Header
from .memory import DeviceMatrix, Memory
from .modules import Modules
from .stream import Stream

#: The text kernels' sources (not matmul kernels: the registry lists them apart).
PARSE_FILE, EMIT_FILE = TEXT_KERNEL_FILES

#: Threads per block in every text kernel.
THREADS = 256
#: Bytes one thread classifies in the run-start passes (one uint4 load).
BYTES_PER_THREAD = 16
BYTES_PER_BLOCK = THREADS * BYTES_PER_THREAD
#: int32 items one thread sums in the scan passes.
ITEMS_PER_THREAD = 8
ITEMS_PER_BLOCK = THREADS * ITEMS_PER_THREAD
#: Longest run one GPU thread walks; longer runs take the host's exact path.
MAX_RUN = 1024
#: Runs the host converts for one job at most; more: the host parses the file.
EXOTIC_CAP = 1 << 16
#: Bytes of one %6.2f field at most on the fast emit path (18 digits, '.', '-', a spare).
MAX_FIELD_BYTES = 21
#: Offsets are int32 on the device.
INT32_MAX = 2**31 - 1
#: Bytes per piece when staging non-page-locked input through the ring.
STAGE_CHUNK = 16 << 20
#: What the parse kernels' status slot STATUS_BAD holds when no run is bad.
NO_BAD = 2**64 - 1

#: The kernels' compile-time constants (prefixed: CUB's templates use the bare names).
DEFINES = {
    "TEXT_THREADS": THREADS,
    "TEXT_BYTES_PER_THREAD": BYTES_PER_THREAD,
    "TEXT_ITEMS_PER_THREAD": ITEMS_PER_THREAD,
    "TEXT_MAX_RUN": MAX_RUN,
}
#: Entry points and their pycuda argument signatures (P pointer, i int32).
PARSE_ENTRIES = {
    "run_starts_count": "PP",
    "run_starts_write": "PPP",
    "scan_block_sums": "Pi",
    "scan_count": "PiP",
    "scan_write": "PiPP",
    "runs_classify": "PiPiPPPi",
    "runs_convert": "PiPiPPPiPi",
    "set_counts": "PPiP",
    "scatter_values": "PPPiPPiPi",
}
EMIT_ENTRIES = {"emit_lengths": "PiiiPP", "emit_write": "PiiiPP"}
#: Each text source with its macros and entry points.
SOURCES: dict[str, tuple[dict[str, int], dict[str, str]]] = {
    PARSE_FILE: (DEFINES, PARSE_ENTRIES),
    EMIT_FILE: ({"TEXT_THREADS": THREADS}, EMIT_ENTRIES),
}

_SEP = re.compile(rb"[ \t\r\n]")


def fits(header: Header, nbytes: int) -> bool:
    """Whether a job is within the text kernels' int32 offsets (else the host path takes it)."""
    body = nbytes - header.body_offset
    out = header.m * header.n * MAX_FIELD_BYTES + header.m
    return 0 < body <= INT32_MAX - 2 * BYTES_PER_BLOCK and out <= INT32_MAX and header.m * header.n > 0


def _blocks(items: int, per_block: int) -> int:
    return (items + per_block - 1) // per_block


def header_line(m: int, n: int) -> bytes:
    """The output's first line (as textformat.emit writes it)."""
    return (b"%d\n" % n) if m == n else (b"%d %d\n" % (m, n))


@dataclass
class TextResult:
    """What :func:`multiply_text` made: the output's pieces, C, and timings (ms)."""

    chunks: list[Any]
    c: np.ndarray
    #: CUDA-event phases: malloc, h2d, parse_gpu, kernel, emit_gpu, d2h, free.
    phases_ms: dict[str, float]
    #: Wall-clock stages: parse (upload + parse), multiply, emit (format + download).
    stage_ms: dict[str, float]
    notes: list[str] = field(default_factory=list)
    #: Runs converted by the host's exact rule; whether the host parsed instead.
    exotic_runs: int = 0
    host_parse: bool = False


class Timer(Protocol):
    """Named CUDA-event phases (several of one name are summed; one that ``follows`` starts where the last
    ended); :class:`~mmd.cuda.stream.PhaseTimer` on a GPU."""

    def phase(self, name: str, *, follows: bool = False) -> AbstractContextManager[None]: ...
    def elapsed_ms(self) -> dict[str, float]: ...


class Multiply(Protocol):
    """The job's multiply on parsed A and B into C, on the session's stream; it times its own phases on
    ``timer`` (``kernel`` at least)."""

    def __call__(self, a: DeviceMatrix, b: DeviceMatrix, c: DeviceMatrix, timer: Timer) -> None: ...


class GpuText:
    """``session.text``: the text kernels on one session's parts, built on first use."""

    def __init__(self, modules: Modules, memory: Memory, stream: Stream) -> None:
        self._modules = modules
        self._memory = memory
        self._stream = stream

    def functions(self) -> tuple[dict[str, Any], dict[str, Any], float | None]:
        """The parse and emit entry points, and the milliseconds spent loading them now (None: loaded before)."""
        folder = kernels_dir()
        parse, new1 = self._modules.module(folder / PARSE_FILE, *SOURCES[PARSE_FILE])
        emit, new2 = self._modules.module(folder / EMIT_FILE, *SOURCES[EMIT_FILE])
        built = [m.load_ms for m, new in ((parse, new1), (emit, new2)) if new]
        return parse.functions, emit.functions, (sum(built) if built else None)

    def prepare(self, n: int) -> None:
        """Load the text kernels, and allocate and keep the page-locked buffers an n×n product's text needs:
        its C and its text (:func:`~mmd.hostbuffers.text_bytes`; wider fields take a bigger buffer when they come)."""
        self.functions()
        for slot, nbytes in kept_buffers(n, n).items():
            self._memory.reserve_host(slot, nbytes)

    def multiply_text(self, data: bytes | memoryview, header: Header, multiply: Multiply) -> TextResult:
        """Parse ``data`` on the device, multiply by ``multiply``, format C; see the module doc.

        Raises InputFormatError exactly as ``textformat.parse``.
        """
        mem, run = self._memory, self._stream
        pf, ef, _ = self.functions()
        m, k, n = header.m, header.k, header.n
        na, nb, nc = m * k, k * n, m * n
        view = memoryview(data).cast("B")
        body = view[header.body_offset :]
        nbody = len(body)
        byte_blocks = _blocks(nbody, BYTES_PER_BLOCK)
        padded = byte_blocks * BYTES_PER_BLOCK + BYTES_PER_BLOCK
        timer = run.phase_timer()
        held: list[Any] = []
        result_notes: list[str] = []
        stage: dict[str, float] = {}

        def alloc(nbytes: int) -> int:
            handle = mem.mem_alloc(nbytes)
            held.append(handle)
            return int(handle)

        def scan(values: int, count: int, out: int, sums: int) -> None:
            """out = exclusive prefix sum of int32 values[0, count) (out may be values); total at sums[blocks]."""
            blocks = _blocks(count, ITEMS_PER_BLOCK)
            run.call(pf["scan_count"], blocks, THREADS, values, np.int32(count), sums)
            run.call(pf["scan_block_sums"], 1, THREADS, sums, np.int32(blocks))
            run.call(pf["scan_write"], blocks, THREADS, values, np.int32(count), sums, out)

        def read_int(ptr: int, dtype: Any = np.int32, count: int = 1) -> np.ndarray:
            host = mem.host_empty(count, dtype, slot="small")
            mem.copy_dtoh(host, ptr)
            run.synchronize()
            return host.copy()

        t0 = time.perf_counter()
        try:
            with timer.phase("malloc"):
                text = alloc(padded)
                sums = alloc(4 * (max(byte_blocks, _blocks(max(nc, 1), ITEMS_PER_BLOCK)) + 2))
                status = alloc(8 * 4)
                a = alloc(4 * na)
                b = alloc(4 * nb)
                c = alloc(4 * nc)
            with timer.phase("h2d"):
                self._upload(body, text)
            with timer.phase("parse_gpu"):
                mem.memset8(text + nbody, 0x20, padded - nbody)
                run.call(pf["run_starts_count"], byte_blocks, THREADS, text, sums)
                run.call(pf["scan_block_sums"], 1, THREADS, sums, np.int32(byte_blocks))
            nruns = int(read_int(sums + 4 * byte_blocks)[0])
            host_parse = nruns == 0
            exotic_count = 0
            if not host_parse:
                with timer.phase("malloc"):
                    starts = alloc(4 * nruns)
                    counts = alloc(4 * nruns)
                    first = alloc(4 * nruns)
                    exotic = alloc(8 * EXOTIC_CAP)
                    run_sums = alloc(4 * (_blocks(nruns, ITEMS_PER_BLOCK) + 2))
                with timer.phase("parse_gpu"):
                    mem.memset8(status, 0, 8 * 4)
                    mem.memset8(status, 0xFF, 8)  # STATUS_BAD: no bad run yet
                    run.call(pf["run_starts_write"], byte_blocks, THREADS, text, sums, starts)
                    run.call(pf["runs_classify"], _blocks(nruns, THREADS), THREADS, text, np.int32(nbody), starts,
                           np.int32(nruns), counts, status, exotic, np.int32(EXOTIC_CAP))  # fmt: skip
                st = read_int(status, np.uint64, 2)
                exotic_count = int(st[1])
                host_parse = int(st[0]) != NO_BAD or exotic_count > EXOTIC_CAP
            exotic_values: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
            if not host_parse and exotic_count:
                exotic_values = self._exotic(view, header, pf, exotic, exotic_count, counts, timer, alloc)
                host_parse = exotic_values is None
            if not host_parse:
                with timer.phase("parse_gpu"):
                    scan(counts, nruns, first, run_sums)
                total = int(read_int(run_sums + 4 * _blocks(nruns, ITEMS_PER_BLOCK))[0])
                host_parse = total != na + nb
            if not host_parse:
                with timer.phase("parse_gpu"):
                    run.call(pf["runs_convert"], _blocks(nruns, THREADS), THREADS, text, np.int32(nbody), starts,
                           np.int32(nruns), counts, first, a, np.int32(na), b, np.int32(nb))  # fmt: skip
                    if exotic_values is not None:
                        ex_runs, ex_j, ex_vals = exotic_values
                        ptrs = [alloc(arr.nbytes) for arr in (ex_runs, ex_j, ex_vals)]
                        for ptr, arr in zip(ptrs, (ex_runs, ex_j, ex_vals), strict=True):
                            mem.copy_htod(ptr, arr)  # pageable: copied before the call returns
                        run.call(pf["scatter_values"], _blocks(ex_vals.size, THREADS), THREADS, *ptrs,
                               np.int32(ex_vals.size), first, a, np.int32(na), b, np.int32(nb))  # fmt: skip
            else:
                # The host parser words the error (or, should it accept the file, supplies the values).
                matrices = textformat.parse(view, header)
                result_notes.append("the gpu parse handed this input to the host parser")
                with timer.phase("h2d"):
                    mem.copy_htod(a, np.ascontiguousarray(matrices.a))
                    mem.copy_htod(b, np.ascontiguousarray(matrices.b))
            run.synchronize()
            t1 = time.perf_counter()
            stage["parse"] = (t1 - t0) * 1e3

            multiply(
                DeviceMatrix("device", m, k, k, a), DeviceMatrix("device", k, n, n, b),
                DeviceMatrix("device", m, n, n, c), timer,
            )  # fmt: skip
            run.synchronize()
            t2 = time.perf_counter()
            stage["multiply"] = (t2 - t1) * 1e3

            with timer.phase("emit_gpu"):
                mem.memset8(status, 0, 8)
                lengths = alloc(4 * nc)
                run.call(ef["emit_lengths"], _blocks(nc, THREADS), THREADS, c, np.int32(m), np.int32(n), np.int32(n),
                       lengths, status)  # fmt: skip
                scan(lengths, nc, lengths, sums)
            unformatted = int(read_int(status, np.uint64)[0])
            size = int(read_int(sums + 4 * _blocks(nc, ITEMS_PER_BLOCK))[0])
            c_host = mem.host_empty((m, n), np.float32, slot=C_SLOT)
            chunks: list[Any]
            if unformatted:
                # Values the kernel does not format: the host refuses a product that is not finite, and
                # formats one with values of 10^16 or more (rare) itself, printf's bytes as on the host path.
                with timer.phase("d2h"):
                    mem.copy_dtoh(c_host, c)
                run.synchronize()
                textformat.check_product(c_host)
                chunks = list(textformat.emit_chunks(c_host))
                result_notes.append(
                    f"{unformatted} values beyond the gpu formatter's digits: the host formatted the output"
                )
            else:
                with timer.phase("malloc"):
                    out = alloc(size)
                with timer.phase("emit_gpu"):
                    run.call(ef["emit_write"], _blocks(nc, THREADS), THREADS, c, np.int32(m), np.int32(n),
                           np.int32(n), lengths, out)  # fmt: skip
                text_host = mem.host_empty(size, np.uint8, slot=TEXT_SLOT)
                with timer.phase("d2h"):
                    mem.copy_dtoh(text_host, out)
                    mem.copy_dtoh(c_host, c)
                run.synchronize()
                chunks = [header_line(m, n), text_host.data]
            with timer.phase("free"):
                while held:
                    mem.mem_free(held.pop())
            phases = timer.elapsed_ms()
            stage["emit"] = (time.perf_counter() - t2) * 1e3
            return TextResult(
                chunks=chunks,
                c=c_host,
                phases_ms=phases,
                stage_ms=stage,
                notes=result_notes,
                exotic_runs=exotic_count,
                host_parse=host_parse,
            )
        finally:
            while held:
                handle = held.pop()
                with contextlib.suppress(Exception):  # the job's own error is the one to report
                    mem.mem_free(handle)

    def _upload(self, body: memoryview, text: int) -> None:
        """Copy the body to the device: straight from page-locked memory, else through a staging ring."""
        mem, run = self._memory, self._stream
        host = np.frombuffer(body, dtype=np.uint8)
        if mem.is_pinned(host):
            mem.copy_htod(text, host)
            return
        ring = [mem.host_empty(STAGE_CHUNK, np.uint8, slot=f"stage{i}") for i in range(2)]
        done: list[Any] = [None, None]
        for i, lo in enumerate(range(0, host.size, STAGE_CHUNK)):
            piece = host[lo : lo + STAGE_CHUNK]
            slot = i % 2
            if done[slot] is not None:
                done[slot].synchronize()
            staged = ring[slot][: piece.size]
            np.copyto(staged, piece)
            mem.copy_htod(text + lo, staged)
            done[slot] = run.record_event()

    def _exotic(
        self,
        view: memoryview,
        header: Header,
        pf: dict[str, Any],
        exotic: int,
        count: int,
        counts: int,
        timer: Timer,
        alloc: Callable[[int], int],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Convert the listed runs with the host's exact rule: (run, index in run, value) arrays to scatter
        once the counts are scanned; None when one run is an error (the host parser then words it)."""
        mem, run = self._memory, self._stream
        pairs = mem.host_empty(2 * count, np.int32, slot="exotic")
        mem.copy_dtoh(pairs, exotic)
        run.synchronize()
        pairs = pairs.reshape(count, 2).copy()
        body = view[header.body_offset :]
        runs: list[int] = []
        nvals: list[int] = []
        js: list[int] = []
        values: list[float] = []
        for r, off in pairs.tolist():
            m = _SEP.search(body, off)
            end = len(body) if m is None else m.start()
            got = textformat.run_values(bytes(body[off:end]))  # the host parser's own rule
            if got is None:
                return None
            runs.append(r)
            nvals.append(len(got))
            js.extend(range(len(got)))
            values.extend(got)
        run_arr = np.array(runs, np.int32)
        cnt = np.array(nvals, np.int32)
        ptr_runs = alloc(run_arr.nbytes)
        ptr_cnt = alloc(cnt.nbytes)
        with timer.phase("parse_gpu"):
            mem.copy_htod(ptr_runs, run_arr)
            mem.copy_htod(ptr_cnt, cnt)
            run.call(pf["set_counts"], _blocks(count, THREADS), THREADS, ptr_runs, ptr_cnt, np.int32(count), counts)
        run.synchronize()
        return (
            np.repeat(run_arr, cnt).astype(np.int32),
            np.array(js, np.int32),
            np.array(values, np.float64).astype(np.float32),
        )
