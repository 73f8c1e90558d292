"""Whole-job benchmark: file in to file out, for numpy.loadtxt/savetxt, the CPU path and the GPU text path.

    python benchmarks/bench_wholejob.py [--sizes 1024 4096] [--repeat 3] [--dir /tmp/mmd-wholejob]

For each size, one random pair (``%.2f`` values, as ``mmd gen`` writes them)
is written once; then, page cache warm:

* ``numpy``: ``open().read()``, ``numpy.loadtxt``, ``numpy.matmul``,
  ``numpy.savetxt(fmt="%6.2f", delimiter="")`` into memory, the write.
* ``cpu``: :func:`mmd.pipeline.run_job` on the cpu backend (textformat).
* ``gpu-host``: run_job on the cuda backend with ``text_path: host``.
* ``gpu``: run_job on the cuda backend with ``text_path: gpu`` (kernels built
  by a warm-up job first), the ``tiled`` kernel at tile 32.

Each phase is the median of ``--repeat`` runs (ms, from the sidecars), with
parse and emit throughput in GB/s of text; a compact table is printed last.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mmd.backends import CpuBackend
from mmd.backends.base import MultiplyRequest
from mmd.generate import input_chunks
from mmd.pipeline import run_job

PHASES = ("read", "parse", "kernel", "cuda", "emit", "write", "overall")


def make_input(folder: Path, n: int) -> Path:
    path = folder / f"in-{n}.txt"
    if not path.exists():
        rng = np.random.default_rng(n)
        a = rng.uniform(-10, 10, (n, n)).astype(np.float32)
        b = rng.uniform(-10, 10, (n, n)).astype(np.float32)
        with open(path, "wb") as fh:
            for chunk in input_chunks(a, b, square=True):
                fh.write(chunk)
    path.read_bytes()  # page cache warm
    return path


def numpy_job(path: Path, out: Path) -> dict[str, float]:
    t = {}
    t0 = time.perf_counter()
    data = path.read_bytes()
    t1 = time.perf_counter()
    n = int(data.split(b"\n", 1)[0])
    vals = np.loadtxt(io.BytesIO(data), skiprows=1, dtype=np.float32, ndmin=2).reshape(-1)
    a = vals[: n * n].reshape(n, n)
    b = vals[n * n :].reshape(n, n)
    t2 = time.perf_counter()
    c = a @ b
    t3 = time.perf_counter()
    buf = io.BytesIO()
    buf.write(b"%d\n" % n)
    np.savetxt(buf, c, fmt="%6.2f", delimiter="")
    text = buf.getvalue()
    t4 = time.perf_counter()
    out.write_bytes(text)
    t5 = time.perf_counter()
    t.update(read=t1 - t0, parse=t2 - t1, kernel=t3 - t2, emit=t4 - t3, write=t5 - t4, overall=t5 - t0)
    t = {k: v * 1e3 for k, v in t.items()}
    t["in_bytes"], t["out_bytes"] = len(data), len(text)
    return t


def mmd_job(backend, request, path: Path, out: Path) -> dict[str, float]:
    result = run_job(path, out, request, backend, durable=False)
    if not result.ok:
        raise SystemExit(f"job failed: {result.record['error']}")
    t = {k: v for k, v in result.record["timings_ms"].items() if v is not None}
    t["in_bytes"] = result.record["input"]["bytes"]
    t["out_bytes"] = result.record["output"]["bytes"]
    text = result.record.get("text", {})
    for key in ("parse_gpu", "emit_gpu"):
        if key in text:
            t[key] = text[key]
    return t


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = set().union(*runs)
    return {k: statistics.median(r[k] for r in runs if k in r) for k in keys}


def fmt(row: dict[str, float], key: str) -> str:
    v = row.get(key)
    return f"{v:9.1f}" if v is not None else f"{'-':>9}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--no-numpy-4096", action="store_true", help="skip numpy.loadtxt/savetxt above 2048")
    args = ap.parse_args()
    folder = args.dir or Path(tempfile.mkdtemp(prefix="mmd-wholejob-"))
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "out.txt"

    paths: dict[str, object] = {"numpy": None, "cpu": CpuBackend()}
    cuda = None
    try:
        from mmd.backends.cuda import CudaBackend

        cuda = CudaBackend(0)
        print("device:", cuda.device_name(), flush=True)
    except Exception as exc:  # no GPU here: the CPU columns only
        print(f"no GPU ({exc}); cpu rows only", flush=True)
    tiled = dict(kernel="tiled", tile=32, memory="device")
    rows = []
    for n in args.sizes:
        path = make_input(folder, n)
        size_mb = path.stat().st_size / 1e6
        print(f"\n== {n}x{n}: input {size_mb:.1f} MB", flush=True)
        plans = []
        if not (args.no_numpy_4096 and n > 2048):
            plans.append(("numpy", lambda p=path: numpy_job(p, out)))
        plans.append(("cpu", lambda p=path: mmd_job(paths["cpu"], MultiplyRequest(kernel="cpu"), p, out)))
        if cuda is not None:
            host_req = MultiplyRequest(**tiled, text_path="host")
            gpu_req = MultiplyRequest(**tiled, text_path="gpu")
            mmd_job(cuda, host_req, path, out)  # warm-up: kernels built, buffers allocated
            mmd_job(cuda, gpu_req, path, out)
            plans.append(("gpu-host", lambda p=path, r=host_req: mmd_job(cuda, r, p, out)))
            plans.append(("gpu", lambda p=path, r=gpu_req: mmd_job(cuda, r, p, out)))
        for name, fn in plans:
            reps = 1 if name == "numpy" and n > 2048 else args.repeat
            runs = [fn() for _ in range(reps)]
            row = median(runs)
            row["size"], row["path"] = n, name
            row["parse_gbs"] = row["in_bytes"] / row["parse"] / 1e6
            row["emit_gbs"] = row["out_bytes"] / row["emit"] / 1e6 if row.get("emit") else float("nan")
            rows.append(row)
            print(f"{name:9s} " + " ".join(f"{k}={row[k]:.1f}" for k in PHASES if k in row)
                  + f" parse {row['parse_gbs']:.2f} GB/s emit {row['emit_gbs']:.2f} GB/s"
                  + (f" parse_gpu={row['parse_gpu']:.2f} emit_gpu={row['emit_gpu']:.2f}" if "parse_gpu" in row else ""),
                  flush=True)  # fmt: skip
    if cuda is not None:
        cuda.close()
    os.environ.get("MMD_KEEP") or [p.unlink() for p in folder.glob("*.txt")]

    print("\nsize  path        read     parse    kernel      cuda      emit     write   overall  parse GB/s  emit GB/s"
          "  vs numpy")  # fmt: skip
    base = {r["size"]: r for r in rows if r["path"] == "numpy"}
    for r in rows:
        ref = base.get(r["size"])
        speed = f"{ref['overall'] / r['overall']:7.1f}x" if ref else "       -"
        print(f"{r['size']:4d}  {r['path']:8s} " + " ".join(fmt(r, k) for k in PHASES)
              + f"  {r['parse_gbs']:9.2f}  {r['emit_gbs']:9.2f}  {speed}")  # fmt: skip
    print("(ms, median; GB/s = text bytes / wall time of the phase; on the gpu path parse includes h2d)")


if __name__ == "__main__":
    main()
