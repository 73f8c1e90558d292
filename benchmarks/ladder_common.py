"""What the two kernel ladders (sgemm_ladder.py, tc_ladder.py) share: a module they import, not a script.

Both compile kernels with nvcc -Xptxas -v and read the same ptxas figures and
SASS counts, check them on the same awkward shapes and memory layouts, launch
them with the same argument list, and log and describe the GPU the same way;
kept here once so that the two tables keep meaning the same thing.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

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


def parser(doc: str) -> argparse.ArgumentParser:
    """The options every ladder takes (--quick, --compile-only, --out), described by the script's docstring."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--compile-only", action="store_true", help="compile and report; no GPU needed")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(Path(__file__).resolve().parent.parent / "bench"))
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


def tool(name: str) -> str | None:
    """A CUDA tool on PATH or in /usr/local/cuda/bin; None without one."""
    for cand in (shutil.which(name), f"/usr/local/cuda/bin/{name}"):
        if cand and Path(cand).exists():
            return cand
    return None


def in_parallel(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    """fn over items in threads (each runs an nvcc process), in order."""
    with futures.ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        return list(pool.map(fn, items))


def compile_report(cmd: list[str], smem_key: str) -> dict:
    """Run nvcc (``cmd`` with -Xptxas -v): the command, whether it built, its log and ptxas's figures.

    ``smem_key`` names the static shared memory in the report (each ladder's results.json keeps its own name).
    """
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rep: dict = {"cmd": " ".join(cmd), "ok": proc.returncode == 0, "log": proc.stderr + proc.stdout}
    if proc.returncode == 0:
        log = rep["log"]
        m = re.search(r"Used (\d+) registers", log)
        rep["registers"] = int(m.group(1)) if m else None
        m = re.search(r"(\d+) bytes smem", log)
        rep[smem_key] = int(m.group(1)) if m else 0
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        rep["spill_stores"], rep["spill_loads"] = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        m = re.search(r"(\d+) bytes stack frame", log)
        rep["stack"] = int(m.group(1)) if m else None
    return rep


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


def sass_counts(cubin: Path, sass_path: Path, names: Iterable[str]) -> dict[str, int] | None:
    """The cubin's SASS written to ``sass_path`` and the count of each named instruction in it; None without
    cuobjdump."""
    objdump = tool("cuobjdump")
    if not objdump:
        return None
    sass = subprocess.run([objdump, "--dump-sass", str(cubin)], capture_output=True, text=True).stdout
    sass_path.write_text(sass)
    return {name: len(re.findall(SASS_PATTERNS[name], sass)) for name in names}


def kernel_args(a: Any, b: Any, c: Any, m: int, k: int, n: int, np: Any) -> tuple:
    """Every mmd kernel's arguments: A, B, C (each a Mat), M, K, N, lda, ldb, ldc."""
    return (
        a.ptr_view,
        b.ptr_view,
        c.ptr_view,
        np.int32(m),
        np.int32(k),
        np.int32(n),
        np.int32(a.ld),
        np.int32(b.ld),
        np.int32(c.ld),
    )


def gpu_facts(cp: Any) -> tuple[str, int, int, dict]:
    """(name, L2 bytes, multiprocessors, device properties) of CuPy's current device."""
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return gpu, dev.attributes["L2CacheSize"], dev.attributes["MultiProcessorCount"], props
