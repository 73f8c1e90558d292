"""Probe: folder check of 50 x 512, this tree vs .wholejob/prev, in-process and as a process, alternating."""
import os, statistics, subprocess, sys, tempfile, time
from pathlib import Path
import numpy as np
root = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(root))
from mmd import textformat
from mmd.generate import input_chunks, random_matrix
work = Path(tempfile.mkdtemp())
(work / "tests").mkdir(); (work / "outbox").mkdir()
for i in range(50):
    rng = np.random.default_rng(i)
    a, b = random_matrix(rng, 512, 512), random_matrix(rng, 512, 512)
    (work / "tests" / f"j{i}.txt").write_bytes(b"".join(input_chunks(a, b, square=True)))
    (work / "outbox" / f"j{i}.out").write_bytes(textformat.emit(a @ b))
trees = {"now": str(root), "prev": str(root / ".wholejob" / "prev")}
INPROC = r"""
import sys, time, pathlib
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
from mmd import grading
from mmd.grading import Options
if hasattr(grading, "prepare"): grading.prepare(False)
t1 = time.perf_counter()
w = pathlib.Path(sys.argv[2]); ts = []
for i in range(3):
    t = time.perf_counter(); r = grading.check_folder(w / "outbox", w / "tests", Options()); ts.append(time.perf_counter() - t)
print(round(t1 - t0, 3), *[round(x, 3) for x in ts])
"""
res = {(k, w): [] for k in trees for w in ("proc", "import", "in1", "in2", "in3")}
for rnd in range(7):
    for name, path in (trees.items() if rnd % 2 == 0 else reversed(list(trees.items()))):
        env = dict(os.environ, PYTHONPATH=f"{path}:/tmp/site")
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "mmd", "check", str(work / "outbox"), "--inputs", str(work / "tests")], env=env, capture_output=True, cwd=path)
        res[(name, "proc")].append(time.perf_counter() - t)
        out = subprocess.run([sys.executable, "-c", INPROC, path, str(work)], env=env, capture_output=True, text=True).stdout.split()
        for key, v in zip(("import", "in1", "in2", "in3"), out):
            res[(name, key)].append(float(v))
for key, vals in res.items():
    print(f"{key[0]:5} {key[1]:7} median {statistics.median(vals):.3f} min {min(vals):.3f}  {' '.join(f'{v:.3f}' for v in vals)}")
