"""What the scripts under benchmarks/ share: a module they import, not a script.

Importing it puts this checkout first on ``sys.path``, so a script measures the mmd beside it. Its parts:

* trees: ``--tree NAME=PATH`` (another checkout measured in the same run, old beside new), each tree's
  environment, and a daemon of a tree on a spool of its own (:class:`Served`);
* inputs: matrices and input files as ``mmd gen`` makes them (:mod:`mmd.generate`);
* host timing: medians, percentiles, repeated calls;
* tables: columns declared once, for the header and every row (:class:`Table`);
* the kernel ladders (sgemm_ladder.py, tc_ladder.py, sgemm_ncu.py) on CuPy: the awkward shapes and memory
  layouts, one compiled build (nvcc ``-Xptxas -v``: ptxas's figures and SASS counts), one matrix in a flat
  buffer, launches timed with CUDA events while :mod:`mmd.bench.clock` reads the SM clock, and the errors
  against float64; kept here once so that the two ladders' tables keep meaning the same thing.
"""

from __future__ import annotations

import argparse
import compileall
import concurrent.futures as futures
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from child_env import child_env

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mmd import kernels as registry  # noqa: E402  (this checkout's, from the line above)
from mmd.generate import input_chunks, random_matrix  # noqa: E402

#: Where a script writes what it measured unless told (--out): $OUT, else bench/ (ignored by git).
OUT = Path(os.environ.get("OUT") or ROOT / "bench")


# -- trees: old beside new -------------------------------------------------------------


def tree_spec(text: str) -> tuple[str, Path]:
    """``--tree NAME=PATH``: PATH a checkout of mmd (an argparse ``type``)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not (Path(path) / "mmd" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"give NAME=PATH, PATH a checkout of mmd: {text!r}")
    return name, Path(path).resolve()


def add_tree_options(ap: argparse.ArgumentParser, help: str, no_now: bool = True) -> None:
    """``--tree NAME=PATH`` (repeatable) and, with ``no_now``, ``--no-now`` (leave out this checkout)."""
    ap.add_argument("--tree", action="append", default=[], type=tree_spec, metavar="NAME=PATH", help=help)
    if no_now:
        ap.add_argument("--no-now", action="store_true", help="leave out the tree this file is in")


def trees(ap: argparse.ArgumentParser, given: list[tuple[str, Path]], now: bool = True) -> list[tuple[str, Path]]:
    """The trees a run measures: those given, then this checkout as ``now`` (unless ``now`` is False); a usage
    error where none is left or two share a name."""
    chosen = [*given, *([("now", ROOT)] if now else [])]
    names = [name for name, _ in chosen]
    if not chosen or len(set(names)) != len(names):
        ap.error(f"the trees need distinct names, at least one: {names}")
    return chosen


#: Put on a tree's PYTHONPATH (:func:`isolating_site`): the tree imports mmd only from its own folder. The
#: venv's editable install of mmd adds a finder that answers for ``mmd.X`` where the tree has no ``mmd/X``:
#: an older tree without its compiled ``_fasttext`` would run the venv tree's instead.
ISOLATE = """import sys

sys.meta_path[:] = [
    f for f in sys.meta_path if not (getattr(f, "__module__", "").startswith("__editable__") and "mmd" in f.__module__)
]
"""


def isolating_site(folder: Path, extra: str = "") -> Path:
    """``folder`` with a sitecustomize.py of :data:`ISOLATE` and ``extra`` after it (made here)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(ISOLATE + extra)
    return folder


@dataclass
class Tree:
    """One checkout of mmd, driven through its command line with ``env``."""

    name: str
    path: Path
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "mmd", *args]

    def run(self, *args: str, cwd: Path, timeout: float = 600) -> tuple[float, subprocess.CompletedProcess]:
        """``mmd ARGS`` as a process: (seconds it took, the finished process)."""
        t0 = time.perf_counter()
        done = subprocess.run(self.argv(*args), cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        return time.perf_counter() - t0, done


def tree_env(tree: Path, work: Path, name: str, backend: str, kernel: str | None, extra_path: str) -> dict[str, str]:
    """A served tree's environment: its mmd first on the path, then ``extra_path``; its own kernel cache;
    ``kernel`` as MMD_KERNEL (None: unset, the tree's own default)."""
    env = child_env(
        PYTHONPATH=os.pathsep.join(p for p in (str(tree), extra_path) if p),
        MMD_BACKEND=backend,
        MMD_LOG_FORMAT="json",
        MMD_LOG_LEVEL="warning",
        MMD_QUIET_SECONDS="0.05",
        MMD_RESCAN_SECONDS="1",
        XDG_CACHE_HOME=str(work / f"cache-{name}"),
    )
    return env if kernel is None else {**env, "MMD_KERNEL": kernel}


def add_served_options(ap: argparse.ArgumentParser, wait: float, work: str) -> None:
    """The options of a script that serves trees side by side: --backend, --kernel, --site, --wait, --work
    (``work``: what goes there), --keep."""
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--kernel", default=None, help="MMD_KERNEL (default: unset on cpu, fast on cuda)")
    ap.add_argument("--site", default="", help="extra PYTHONPATH entry (the device machine's wheels)")
    ap.add_argument("--wait", type=float, default=wait, help="the longest any one wait may take, s")
    ap.add_argument("--work", type=Path, default=None, help=f"{work} (default: a new /tmp folder)")
    ap.add_argument("--keep", action="store_true", help="keep what was made under --work")


def served_kernel(backend: str, given: str | None) -> str | None:
    """The kernel a served tree runs: the one given, else fast on cuda, else none named (the tree's default)."""
    return given if given is not None else ("fast" if backend == "cuda" else None)


def served_trees(
    chosen: list[tuple[str, Path]], work: Path, backend: str, kernel: str | None, site: str,
    settings: dict[str, dict[str, str]] | None = None,
) -> list[Tree]:  # fmt: skip
    """Each chosen tree with its :func:`tree_env` and its own ``settings`` (by tree name) on top, its modules
    compiled first: a tree whose bytecode is never written (a fresh archive under PYTHONDONTWRITEBYTECODE)
    would compile them at every daemon's start, and lose to one whose bytecode is there for that alone."""
    for _, path in chosen:
        compileall.compile_dir(path / "mmd", quiet=1)
    return [
        Tree(name, path, {**tree_env(path, work, name, backend, kernel, site), **(settings or {}).get(name, {})})
        for name, path in chosen
    ]


class Served:
    """One `mmd serve` of a tree on a fresh spool (``root``: default ``work/spool-NAME``).

    ``start=False`` makes the spool only (a backlog can be put in its inbox
    first); :meth:`start` starts the daemon.
    """

    def __init__(self, tree: Tree, work: Path, root: Path | None = None, start: bool = True) -> None:
        self.name = tree.name
        self.tree = tree
        self.root = root or work / f"spool-{tree.name}"
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "inbox").mkdir(parents=True)
        (self.root / "outbox").mkdir()
        (self.root / "src").mkdir()
        self.log: Any = None
        self.proc: subprocess.Popen | None = None
        self.count = 0
        if start:
            self.start()

    def start(self, env: dict[str, str] | None = None) -> subprocess.Popen:
        self.log = open(self.root / "daemon.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.tree.argv("serve"), cwd=self.root, env={**self.tree.env, **(env or {})},
                                     stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        return self.proc

    def start_ready(self, timeout: float = 120) -> float:
        """Start the daemon as systemd would (NOTIFY_SOCKET) and wait for its READY=1; returns that moment."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path = self.root / "notify.sock"
        path.unlink(missing_ok=True)
        sock.bind(str(path))
        sock.settimeout(timeout)
        try:
            self.start({"NOTIFY_SOCKET": str(path)})
            while True:
                if b"READY=1" in sock.recv(4096).split(b"\n"):
                    return time.perf_counter()
        finally:
            sock.close()

    def drop(self, data: bytes, stem: str | None = None) -> tuple[float, Path]:
        """Rename one complete file into the inbox; returns (time of the rename, its timing sidecar)."""
        self.count += 1
        stem = stem or f"j{self.count:06d}"
        src = self.root / "src" / f"{stem}.txt"
        src.write_bytes(data)
        t0 = time.perf_counter()
        os.rename(src, self.root / "inbox" / f"{stem}.txt")
        return t0, self.root / "outbox" / f"{stem}.timing.yaml"

    @staticmethod
    def wait(sidecar: Path, timeout: float = 300) -> float:
        end = time.perf_counter() + timeout
        while not sidecar.exists():
            if time.perf_counter() > end:
                raise SystemExit(f"no {sidecar.name} after {timeout} s")
            time.sleep(0.0002)
        return time.perf_counter()

    def stop(self) -> None:
        """SIGTERM (the job in hand finishes), then SIGKILL after 30 s; safe to call twice."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        if self.log is not None:
            self.log.close()


# -- inputs ------------------------------------------------------------------------------


def input_pair(m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A (M×K) and B (K×N) as ``mmd gen`` draws them: two decimals in [-10, 10], never zero."""
    rng = np.random.default_rng(seed)
    return random_matrix(rng, m, k), random_matrix(rng, k, n)


def input_bytes(m: int, k: int, n: int, seed: int) -> bytes:
    """The input file of :func:`input_pair`."""
    a, b = input_pair(m, k, n, seed)
    return b"".join(input_chunks(a, b, square=m == k == n))


def write_input(path: Path, m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Write the input file of :func:`input_pair` to ``path``; returns A and B."""
    a, b = input_pair(m, k, n, seed)
    with open(path, "wb") as out:
        for chunk in input_chunks(a, b, square=m == k == n):
            out.write(chunk)
    return a, b


def square_input(path: Path, n: int, seed: int) -> Path:
    """An N×N input at ``path``, made once: a file already there is kept."""
    if not path.exists():
        write_input(path, n, n, n, seed)
    return path


#: A 32×32 job, as the small-job cases drop it.
SMALL = input_bytes(32, 32, 32, 7)


# -- host timing -------------------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    """The median; NaN for none."""
    values = list(values)
    return statistics.median(values) if values else float("nan")


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile; NaN for none."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def seconds(fn: Callable[[], object], repeat: int, warmup: int = 0) -> list[float]:
    """Seconds of ``repeat`` calls of ``fn``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


# -- tables ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One column: its title, width, alignment (``>``, ``<``) and the format spec of its values."""

    title: str
    width: int
    align: str = ">"
    spec: str = ""

    def cell(self, value: object) -> str:
        text = "-" if value is None else format(value, self.spec) if self.spec else str(value)
        return f"{text:{self.align}{self.width}}"


@dataclass(frozen=True)
class Table:
    """Columns declared once: the header and each row are laid out from the same widths."""

    columns: tuple[Column, ...]

    def header(self) -> str:
        return " ".join(f"{c.title:{c.align}{c.width}}" for c in self.columns).rstrip()

    def row(self, *values: object) -> str:
        return " ".join(c.cell(v) for c, v in zip(self.columns, values, strict=True)).rstrip()


# -- the kernel ladders: shapes, layouts, options ----------------------------------------------

#: Awkward shapes (M, K, N) both ladders check first: a single element, sizes
#: prime to every tile, and a row by a column.
EDGE_SHAPES = [
    (1, 1, 1),
    (7, 7, 7),
    (33, 33, 33),
    (127, 127, 127),
    (1000, 1000, 1000),
    (1, 1000, 7),
]
#: Layouts: (name, how ld is made (see ld_for), base offset in floats). "odd" makes ld = cols + 1
#: (not a multiple of 4 for most shapes) and the base misaligned: the kernels' scalar paths.
LAYOUTS = [("packed", None, 0), ("pitch4", 4, 0), ("odd", 1, 1)]


def ld_for(cols: int, how: int | None) -> int:
    """The row stride of a layout: packed (None), a multiple of 4 with 4 to spare (4), or cols + how."""
    if how is None:
        return cols
    if how == 4:
        return -(-cols // 4) * 4 + 4
    return cols + how


def ladder_parser(doc: str) -> argparse.ArgumentParser:
    """The options every ladder takes (--quick, --compile-only, --out), described by the script's docstring."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--compile-only", action="store_true", help="compile and report; no GPU needed")
    ap.add_argument("--out", default=str(OUT))
    return ap


def logger(path: Path) -> Callable[..., None]:
    """say(*parts): a line to stdout and to ``path`` at once, so a run cut short keeps its log."""
    log = open(path, "w")  # noqa: SIM115 (open for the whole run)

    def say(*parts: object) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    return say


# -- the kernel ladders: compiling -------------------------------------------------------------

SM90 = "-arch=sm_90"
SM90A = "-gencode=arch=compute_90a,code=sm_90a"

#: SASS instructions a ladder may count, by the name its table gives them.
SASS_PATTERNS = {
    "HGMMA": r"\bHGMMA\.",
    "HMMA": r"\bHMMA\.",
    "LDG.128": r"LDG\.E\.128",
    "LDGSTS.128": r"LDGSTS\.E[.A-Z]*\.128",
    "LDS.128": r"LDS\.128",
    "STS.128": r"STS\.128",
    "STG.128": r"STG\.E\.128",
    "FFMA": r"\bFFMA\b",
    "LDL/STL": r"\b(?:LDL|STL)\b",
}


def tool(name: str) -> str | None:
    """A CUDA tool on PATH or in /usr/local/cuda/bin; None without one."""
    for cand in (shutil.which(name), f"/usr/local/cuda/bin/{name}"):
        if cand and Path(cand).exists():
            return cand
    return None


def nvcc_version() -> str:
    """nvcc's last version line ("?" without nvcc)."""
    text = subprocess.run([tool("nvcc") or "nvcc", "--version"], capture_output=True, text=True).stdout.strip()
    return text.splitlines()[-1] if text else "?"


@dataclass
class Build:
    """One kernel of the registry built for a ladder: its spec (macros and launch geometry, mmd/kernels.py)
    at a tile, an nvcc target, and, once compiled, its cubin, nvcc's report and the loaded function."""

    spec: registry.KernelSpec
    label: str
    tile: int = 0
    arch: str = SM90
    cubin: Path | None = None
    report: dict = field(default_factory=dict)
    function: Any = None

    @property
    def kernel(self) -> str:
        return self.spec.name

    @property
    def name(self) -> str:
        return self.label

    @property
    def stem(self) -> str:
        """The name of its cubin and SASS files in a build folder."""
        return f"{self.kernel}_{self.label}"

    @property
    def macros(self) -> dict[str, int]:
        """Every ``-D`` macro (the registry spells out each, so a build means the same whatever the file's
        defaults)."""
        return self.spec.defines(self.tile)

    def block(self) -> tuple[int, int, int]:
        return self.spec.block(self.tile)

    def block_shape(self) -> tuple[int, int]:
        """(rows, cols) of C per block."""
        return self.spec.block_shape(self.tile)

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return self.spec.grid(m, n, self.tile)

    def dynamic_shared(self) -> int:
        return self.spec.dynamic_shared_bytes


def compile_build(b: Build, build_dir: Path, sass: Iterable[str]) -> Build:
    """nvcc -cubin -Xptxas -v of ``b`` into ``build_dir``: ``b.report`` gets the command, whether it built, its
    log, ptxas's figures (registers, static shared memory, spills, stack), warnings and the ``sass`` counts."""
    src = registry.kernels_dir() / f"{b.kernel}.cu"
    b.cubin = build_dir / f"{b.stem}.cubin"
    cmd = [tool("nvcc") or "nvcc", "-cubin", "-O3", "-Xptxas", "-v", *b.arch.split(),
           *[f"-D{k}={v}" for k, v in b.macros.items()], "-o", str(b.cubin), str(src)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rep: dict = {"cmd": " ".join(cmd), "ok": proc.returncode == 0, "log": proc.stderr + proc.stdout}
    if rep["ok"]:
        log = rep["log"]
        m = re.search(r"Used (\d+) registers", log)
        rep["registers"] = int(m.group(1)) if m else None
        m = re.search(r"(\d+) bytes smem", log)
        rep["static_smem"] = int(m.group(1)) if m else 0
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        rep["spill_stores"], rep["spill_loads"] = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        m = re.search(r"(\d+) bytes stack frame", log)
        rep["stack"] = int(m.group(1)) if m else None
        rep["warnings"] = [ln for ln in log.splitlines() if "warning" in ln.lower()]
        counts = sass_counts(b.cubin, build_dir / f"{b.stem}.sass", sass)
        if counts is not None:
            rep["sass"] = counts
    b.report = rep
    return b


def compile_all(builds: list[Build], build_dir: Path, sass: Iterable[str]) -> list[Build]:
    """Every build compiled, in threads (each runs an nvcc process), in order."""
    build_dir.mkdir(parents=True, exist_ok=True)
    names = tuple(sass)
    with futures.ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        return list(pool.map(lambda b: compile_build(b, build_dir, names), builds))


def sass_counts(cubin: Path, sass_path: Path, names: Iterable[str]) -> dict[str, int] | None:
    """The cubin's SASS written to ``sass_path`` and the count of each named instruction in it; None without
    cuobjdump."""
    objdump = tool("cuobjdump")
    if not objdump:
        return None
    sass = subprocess.run([objdump, "--dump-sass", str(cubin)], capture_output=True, text=True).stdout
    sass_path.write_text(sass)
    return {name: len(re.findall(SASS_PATTERNS[name], sass)) for name in names}


def load(cp: Any, b: Build) -> Any:
    """The build's function from its cubin, its dynamic shared memory limit raised where it needs more than 48 KiB."""
    assert b.cubin is not None
    fn = cp.RawModule(path=str(b.cubin)).get_function(b.spec.entry)
    dyn = b.dynamic_shared()
    if dyn > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = dyn
    return fn


# -- the kernel ladders: matrices, launches, errors ----------------------------------------------


class Mat:
    """A rows x cols float32 matrix inside a flat buffer, at `offset` floats, row stride ld.

    Everything outside the matrix is NaN, inputs too: a kernel that reads past an edge (and lets it into a
    product) gives NaN, and one that writes past an edge of C overwrites NaN that must stay. ``fill``:
    "rand" (uniform in [-1, 1]) or "nan".
    """

    def __init__(self, cp: Any, rows: int, cols: int, ld: int, offset: int, fill: str) -> None:
        self.rows, self.cols, self.ld, self.offset = rows, cols, ld, offset
        self.buf = cp.full(offset + rows * ld + 8, cp.nan, dtype=cp.float32)
        self.ptr_view = self.buf[offset:]  # the kernel's pointer
        self.view = self.buf[offset : offset + rows * ld].reshape(rows, ld)[:, :cols]
        if fill != "nan":
            self.view[...] = cp.random.uniform(-1.0, 1.0, (rows, cols), dtype=cp.float64).astype(cp.float32)

    @classmethod
    def packed(cls, cp: Any, rows: int, cols: int, fill: str) -> Mat:
        return cls(cp, rows, cols, cols, 0, fill)

    @classmethod
    def laid_out(cls, cp: Any, rows: int, cols: int, layout: tuple[str, int | None, int], fill: str) -> Mat:
        """A matrix in one of :data:`LAYOUTS`."""
        _, how, offset = layout
        return cls(cp, rows, cols, ld_for(cols, how), offset, fill)

    def padding_untouched(self, cp: Any) -> bool:
        mask = cp.ones(self.buf.shape, dtype=bool)
        inner = mask[self.offset : self.offset + self.rows * self.ld].reshape(self.rows, self.ld)
        inner[:, : self.cols] = False
        return bool(cp.isnan(self.buf[mask]).all())


def kernel_args(a: Mat, b: Mat, c: Mat, m: int, k: int, n: int) -> tuple:
    """Every mmd kernel's arguments: A, B, C, M, K, N, lda, ldb, ldc."""
    return (a.ptr_view, b.ptr_view, c.ptr_view, *(np.int32(x) for x in (m, k, n, a.ld, b.ld, c.ld)))


def launch(b: Build, a: Mat, bm: Mat, c: Mat, m: int, k: int, n: int) -> None:
    """One launch of a loaded build on the current stream."""
    b.function(b.grid(m, n), b.block(), kernel_args(a, bm, c, m, k, n), shared_mem=b.dynamic_shared())


def errors(cp: Any, got: Any, ref: Any) -> dict:
    """max rel (max|C - ref| / max|ref|), rms rel (Frobenius) of got vs ref (float64 arrays); inf where got has
    a non-finite element."""
    if not bool(cp.isfinite(got).all()):
        return {"max": math.inf, "rms": math.inf, "finite": False}
    diff = got - ref
    return {
        "max": float(cp.abs(diff).max() / max(float(cp.abs(ref).max()), 1e-300)),
        "rms": float(cp.linalg.norm(diff) / max(float(cp.linalg.norm(ref)), 1e-300)),
        "finite": True,
    }


def gpu_facts(cp: Any) -> tuple[str, int, int, dict]:
    """(name, L2 bytes, multiprocessors, device properties) of CuPy's current device."""
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return gpu, dev.attributes["L2CacheSize"], dev.attributes["MultiProcessorCount"], props


# -- the kernel ladders: timing ------------------------------------------------------------------


def l2_flush(cp: Any, l2: int) -> Callable[[], None]:
    """A call that evicts the L2: it writes a buffer of several times its size."""
    buf = cp.empty(max(8 * l2, 256 << 20) // 4, dtype=cp.float32)
    return lambda: buf.fill(1.0)


@dataclass
class EventTimes:
    """Milliseconds of launches, each between two CUDA events."""

    times: list[float]

    @property
    def ms(self) -> float:
        return statistics.median(self.times)

    @property
    def iqr_rel(self) -> float:
        if len(self.times) < 2:
            return 0.0
        q = statistics.quantiles(self.times, n=4)
        return (q[2] - q[0]) / self.ms

    def row(self) -> dict[str, float]:
        """The results' figures: median ms, min, interquartile range over the median, launches."""
        return {"ms": self.ms, "min": min(self.times), "iqr_rel": self.iqr_rel, "reps": len(self.times)}


def time_events(
    cp: Any,
    launches: Sequence[Callable[[], object]],
    flush: Callable[[], None] | None = None,
    warmup: int = 3,
    batch: int = 10,
    min_reps: int = 10,
    max_reps: int = 60,
    spread: float = 0.02,
) -> EventTimes:
    """Each launch timed alone by CUDA events, taking ``launches`` in turn (input sets rotated), after
    ``flush`` where given; ``warmup`` first, then batches of ``batch`` until the interquartile range is under
    ``spread`` of the median once ``min_reps`` are in, or ``max_reps`` are."""
    for i in range(warmup):
        if flush:
            flush()
        launches[i % len(launches)]()
    cp.cuda.runtime.deviceSynchronize()
    times: list[float] = []
    while True:
        events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(batch)]
        for i, (start, end) in enumerate(events):
            if flush:
                flush()
            start.record()
            launches[(len(times) + i) % len(launches)]()
            end.record()
        events[-1][1].synchronize()
        times += [cp.cuda.get_elapsed_time(s, e) for s, e in events]
        got = EventTimes(times)
        if len(times) >= max_reps or (len(times) >= min_reps and got.iqr_rel < spread):
            return got


@cache
def _nvml(ordinal: int, pci_bus_id: str) -> Any:
    from mmd.bench.clock import Nvml

    return Nvml.find(ordinal, pci_bus_id)


def clock(cp: Any, own_processes: int = 1) -> Any:
    """A fresh :class:`mmd.bench.clock.ClockSampler` of CuPy's current GPU (NVML, found by PCI bus id): ``with``
    it around a timing, then its ``summary()`` (``sm_clock_mhz``, ``throttled``, ``throttle_reasons``, the
    load and the GPU's processes, ``busy`` beyond ``own_processes``). One sampler times one case."""
    from mmd.bench.clock import ClockSampler

    dev = cp.cuda.Device()
    return ClockSampler(_nvml(dev.id, dev.pci_bus_id), own_processes=own_processes)


def clock_now(cp: Any) -> tuple[float | None, float | None]:
    """(SM clock, its maximum) in MHz now; None where NVML cannot say."""
    dev = cp.cuda.Device()
    reader = _nvml(dev.id, dev.pci_bus_id)
    sample = reader.read() if reader is not None else None
    return (sample.sm_mhz, sample.max_sm_mhz) if sample is not None else (None, None)
