#!/usr/bin/env bash
# One GPU-machine call that validates mmd end to end and leaves its evidence under $OUT.
#
#   scripts/gpu_validate.sh STAGE...
#
# setup     install the carried wheels (.device-wheels/), build the C text accelerator (here and in every
#           earlier tree under .wholejob/), `mmd kernels`, `mmd kernels --build` (fills the kernel cache)
# tests     pytest -m gpu tests (every kernel x tile x shape against float64, memory modes, leaks, GPU text path)
# cli       `mmd run --backend cuda` for every GPU kernel x tile on awkward shapes and 1000x1000, each output
#           checked by `mmd check --input`; tile 64 must be refused; the daemon serves a few name-set jobs
# wholejob  benchmarks/bench_wholejob.py: this tree (and .wholejob/before) beside the machine's floors
# check     benchmarks/bench_check.py at 4096, with the float64 product on the CPU and on the GPU
#           (beside .wholejob/prev when it is there)
# small     benchmarks/bench_wholejob.py, 32x32 jobs only, beside .wholejob/prev when it is there
# daemon    benchmarks/bench_daemon.py on the cuda backend beside .wholejob/prev; workers per device 1/4/8;
#           the GPU memory an idle daemon holds with 1, 2, 4 and 8 workers (one CUDA context each)
# ladder    `mmd bench --plan ladder --accuracy --report` (fast, tc1, tc3, cuBLAS SGEMM and TF32, 1024..8192)
# students  students' kernels: a kernel file's one-shot beside the built-in (benchmarks/kernelfile_vs_builtin.py),
#           a class of 20 graded (benchmarks/grade_class.py), and a class graded beside the service while
#           students drop 32x32 jobs (tests/gpu/test_grade_service.py)
# tensor    the tensor-core kernels' TMA builds: benchmarks/tc_ladder.py --only $TENSOR_BUILDS (compile, check on
#           16 shapes x 3 layouts, 4096^3 and 8192^3 beside cuBLAS SGEMM and TF32, the accuracy sweep), then the
#           GPU tests that hold which build runs where and that tc3's TMA build gives the cp.async build's bits
# oneshot   one-shot `mmd run` of a 4096 job, wall clock, beside .wholejob/prev when it is there; then one run
#           traced (scripts/trace_oneshot.sh)
# first     benchmarks/bench_first_job.py: a fresh daemon's first 32x32 job, 1 and 8 workers, the kernel built
#           (beside .wholejob/prev when it is there)
#
# Each stage prints a compact summary last; full logs go to $OUT/<stage>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mmd-validate}
WORK=${WORK:-/tmp/mmd-work}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 MMD_LOG_FORMAT=json MMD_LOG_LEVEL=warning
export XDG_CACHE_HOME=/tmp/mmd-cache
MMD=(python3 -m mmd)
status=0

stage_setup() {
    [ -d /tmp/site/pycuda ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        .device-wheels/*.whl  # a warm machine keeps them
    # pyproject.toml's dependencies (and its cuda and test extras) this machine lacks: their wheels go in
    # .device-wheels/ (pip download NAME --python-version 3.12 --only-binary=:all: -d .device-wheels)
    python3 - <<'PY'
import importlib.metadata as md, re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
specs = [*project["dependencies"], *extras["cuda"], *extras["test"]]
missing = []
for spec in specs:
    name = re.split(r"[<>=!~ \[;]", spec)[0]
    try:
        md.version(name)
    except md.PackageNotFoundError:
        missing.append(name)
print("packages missing here:", ", ".join(missing) if missing else "none")
PY
    python3 setup.py -q build_ext --inplace >/dev/null 2>&1 && echo "C text accelerator built" \
        || echo "C text accelerator not built: numpy path"
    for t in .wholejob/*/; do  # earlier trees the benchmarks compare with (git archives, git-ignored)
        [ -d "$t" ] || continue  # none carried: the pattern itself
        (cd "$t" && python3 setup.py -q build_ext --inplace >/dev/null 2>&1) && echo "$t: built"
    done
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
    "${MMD[@]}" kernels
    time "${MMD[@]}" kernels --build || status=1
}

stage_tests() {
    python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -n 25
}

stage_cli() {
    local d="$WORK/cli"
    rm -rf "$d" && mkdir -p "$d"
    # every kernel at every tile and shape runs in the GPU tests; here each runs as a whole job through files
    for shape in "7 7 7" "37 53 29" "1000 1000 1000"; do
        "${MMD[@]}" gen --shape $shape --seed 3 -o "$d/s${shape// /x}.txt" >/dev/null
    done
    local kernels
    kernels=$(python3 -c "from mmd import kernels as k; print(' '.join(k.GPU_KERNELS))")
    printf '%-12s %-5s %-16s %-8s %s\n' kernel tile input result "kernel ms / reason"
    for k in $kernels; do
        local tiles="32" precision
        precision=$(python3 -c "from mmd import kernels as k; print(k.get('$k').precision)")
        python3 -c "from mmd import kernels as k; import sys; sys.exit(0 if k.get('$k').uses_tile else 1)" \
            && tiles="32 64"
        for t in $tiles; do
            for f in "$d"/s*.txt; do
                local base o
                [ "$t" = 64 ] && [[ "$f" != *s1000x1000x1000.txt ]] && continue
                base=$(basename "$f" .txt)
                o="$d/${base}_${k}_${t}.out"
                if "${MMD[@]}" run "$f" -o "$o" --backend cuda --kernel "$k" --tile "$t" >/dev/null 2>"$o.err"; then
                    if "${MMD[@]}" check "$o" --input "$f" >"$o.check"; then r=ok
                    elif [ "$precision" = tf32 ] && python3 -c "import re,sys; e=float(re.search(r'relative error ([0-9.e+-]+)', open(sys.argv[1]).read()).group(1)); sys.exit(0 if e < 2e-3 else 1)" "$o.check"; then
                        r=ok-tf32  # visibly less accurate by design: within TF32's bound, not fp32's
                    else r=WRONG; status=1; fi
                    ms=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['timings_ms']['kernel'])" "${o%.out}.timing.yaml")
                    printf '%-12s %-5s %-16s %-8s %s\n' "$k" "$t" "$base" "$r" "$ms"
                else
                    reason=$(head -c 160 "$o.err")
                    if [ "$t" = 64 ] && [[ "$reason" == *"threads per block"* ]]; then r=refused; else r=FAILED; status=1; fi
                    printf '%-12s %-5s %-16s %-8s %s\n' "$k" "$t" "$base" "$r" "$reason"
                fi
            done
        done
    done 2>&1 | tee "$OUT/cli-table.txt" | awk '$4 !~ /^ok/ || $3 == "s1000x1000x1000"'
    echo "cli: $(grep -c -E ' ok(-tf32)? ' "$OUT/cli-table.txt") ok, $(grep -c -E 'WRONG|FAILED' "$OUT/cli-table.txt") wrong or failed"
    # the daemon on the GPU: name settings, the text path, a refusal
    local s="$WORK/serve"
    rm -rf "$s" && mkdir -p "$s/inbox" "$s/outbox"
    cp "$d/s1000x1000x1000.txt" "$s/inbox/a@kernel=tc3.txt"
    cp "$d/s1000x1000x1000.txt" "$s/inbox/b@kernel=fast.txt"
    cp "$d/s37x53x29.txt" "$s/inbox/c@kernel=tiled,tile=64.txt"
    (cd "$s" && MMD_BACKEND=cuda "${MMD[@]}" serve --once) || status=1
    for x in a@kernel=tc3 b@kernel=fast; do
        "${MMD[@]}" check "$s/outbox/$x.out" --input "$s/inbox/.done/$x.txt" || status=1
    done
    python3 -c "import yaml; print(yaml.safe_load(open('$s/outbox/c@kernel=tiled,tile=64.error.yaml'))['error']['reason'])"
}

stage_wholejob() {
    local trees=()
    [ -d .wholejob/before ] && trees=(--tree before=.wholejob/before)
    python3 benchmarks/bench_wholejob.py "${trees[@]}" --site /tmp/site --sizes 1024 2048 4096 --repeat 5 \
        --small 1000 3000 --drops 200 --out "$OUT" --work "$WORK/wholejob" 2>&1 | tail -n 70
}

stage_check() {
    local trees=()
    [ -d .wholejob/prev ] && trees=(--tree prev=.wholejob/prev)
    python3 benchmarks/bench_check.py "${trees[@]}" --size 4096 --folder 50 512 --repeat 5 2>&1 | tail -n 40
}

stage_small() {
    # 32x32 jobs through the daemon, this tree beside .wholejob/prev (an earlier one), same rounds
    local trees=()
    [ -d .wholejob/prev ] && trees=(--tree prev=.wholejob/prev)
    python3 benchmarks/bench_wholejob.py "${trees[@]}" --site /tmp/site --sizes 256 --repeat 2 \
        --small 1000 --bursts 3 --drops 200 --out "$OUT/small" --work "$WORK/small" 2>&1 | tail -n 40
}

stage_daemon() {
    # the daemon's shape on the GPU (cuda backend, kernel fast): this tree beside .wholejob/prev, then the
    # workers per device, and what each worker's CUDA context holds of the GPU's memory
    local trees=()
    [ -d .wholejob/prev ] && trees=(--tree "prev=$PWD/.wholejob/prev")
    timeout 240 python3 benchmarks/bench_daemon.py "${trees[@]}" --site /tmp/site --backend cuda \
        --cases burst drops big --burst 2000 --rounds 3 --drops 200 --big 4096 --repeat 7 --wait 120 \
        --out "$OUT/daemon" --work "$WORK/daemon" 2>&1 | tee "$OUT/daemon-bench.log" | tail -n 16
    # stopped jobs (the tree before keeps a stopped job's thread: on the GPU it may take the daemon down)
    timeout 150 python3 benchmarks/bench_daemon.py --site /tmp/site --backend cuda --cases timeout \
        --timeouts 10 --wait 120 --out "$OUT/daemon-timeout" --work "$WORK/daemon-timeout" 2>&1 | tail -n 14
    timeout 200 python3 benchmarks/bench_daemon.py --no-now --tree "w1=$PWD" --tree "w4=$PWD" --tree "w8=$PWD" \
        --set w1:WORKERS_PER_DEVICE=1 --set w4:WORKERS_PER_DEVICE=4 --set w8:WORKERS_PER_DEVICE=8 \
        --site /tmp/site --backend cuda --cases burst drops --burst 2000 --rounds 2 --drops 100 --wait 120 \
        --out "$OUT/daemon-workers" --work "$WORK/daemon-workers" 2>&1 | tail -n 10
    local s="$WORK/contexts"
    for n in 1 2 4 8; do
        rm -rf "$s" && mkdir -p "$s/inbox" "$s/outbox"
        (cd "$s" && MMD_BACKEND=cuda MMD_WORKERS_PER_DEVICE=$n exec "${MMD[@]}" serve >serve.log 2>&1) &
        local pid=$! i=0
        until grep -q '"serving"' "$s/serve.log" 2>/dev/null || [ $i -gt 600 ]; do sleep 0.1; i=$((i + 1)); done
        echo "workers_per_device $n: GPU memory used $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
        kill -TERM $pid; wait $pid
    done
    echo "no daemon: GPU memory used $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
}

stage_ladder() {
    # the top of the ladder with timing rigor (L2 flushed, repeats until the median's noise is under 2%,
    # the SM clock), and the accuracy sweep; results and the report come back under $OUT/ladder
    timeout 420 "${MMD[@]}" bench --backend cuda --plan ladder --accuracy --report --out "$OUT/ladder" \
        >"$OUT/ladder.log" 2>&1 || status=1
    tail -n 40 "$OUT/ladder.log"
    for f in "$OUT"/ladder/*/report/summary.md; do [ -f "$f" ] && cat "$f"; done
}

stage_students() {
    timeout 90 python3 benchmarks/kernelfile_vs_builtin.py --size 4096 --tile 32 --repeat 3 --timeline \
        >"$OUT/kernelfile.log" 2>&1 || status=1
    grep -A16 "^4096x4096x4096 at tile" "$OUT/kernelfile.log"
    timeout 330 python3 benchmarks/grade_class.py --students 20 >"$OUT/grade_class.log" 2>&1 || status=1
    tail -n 16 "$OUT/grade_class.log"
    timeout 120 python3 -m pytest -q -p no:randomly -m gpu -o timeout=0 -s tests/gpu/test_grade_service.py \
        >"$OUT/grade_service.log" 2>&1 || status=1
    grep -E "passed|failed|^E  |drop -> sidecar|windows, held|run again" "$OUT/grade_service.log" | tail -n 8
}

stage_tensor() {
    local labels=${TENSOR_BUILDS:-tc3,tc3_tma,tc1_tma_tf}
    timeout 300 python3 benchmarks/tc_ladder.py --only "$labels" --out "$OUT/tensor" >"$OUT/tc_ladder.log" 2>&1 \
        || status=1
    grep -vE "^\s*$" "$OUT/tc_ladder.log" | tail -n 60
    timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu.py \
        -k "tensor_core or tc3s or tc1s" >"$OUT/tensor-tests.log" 2>&1 || status=1
    grep -E "passed|failed|^E  " "$OUT/tensor-tests.log" | tail -n 12
    # PROFILE=LABELS: one 4096^3 launch of each under Nsight Compute (the cubins of the run above)
    if [ -n "${PROFILE:-}" ] && command -v ncu >/dev/null; then
        local n=$(($(tr -cd , <<<"$PROFILE" | wc -c) + 1))
        timeout 240 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
            --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
            -k regex:mmd_tc -c "$n" python3 benchmarks/tc_ladder.py --profile "$PROFILE" >"$OUT/ncu.txt" 2>&1
        grep -E "^  mmd_tc|Duration|Compute \(SM\) Throughput|Memory Throughput|No Eligible|Issued Warp|Executed Ipc A" \
            "$OUT/ncu.txt" | head -n 60
    fi
}

stage_oneshot() {
    # one-shot `mmd run` of a 4096 job, wall clock, this tree and .wholejob/prev in turn (5 rounds, medians)
    local d="$WORK/oneshot"
    rm -rf "$d" && mkdir -p "$d"
    "${MMD[@]}" gen 4096 --seed 7 -o "$d/in.txt" -q
    python3 - "$d" <<'PY'
import os, statistics, subprocess, sys, time
d = sys.argv[1]
trees = {"now": os.getcwd()}
if os.path.isdir(".wholejob/prev"):
    trees["prev"] = os.path.abspath(".wholejob/prev")
walls = {name: [] for name in trees}
for _ in range(5):
    for name, tree in trees.items():
        env = {**os.environ, "PYTHONPATH": f"/tmp/site:{tree}"}
        out = f"{d}/out-{name}.txt"
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mmd", "run", f"{d}/in.txt", "--backend", "cuda", "-f", "-o", out],
                       cwd=tree, env=env, check=True, capture_output=True)
        walls[name].append(time.perf_counter() - t)
for name, w in walls.items():
    print(f"mmd run 4096 ({name}): median {statistics.median(w):.3f} s, min {min(w):.3f}, max {max(w):.3f}")
PY
    # and one run of this tree traced: its imports, the warmer's work and the pipeline's steps
    timeout 60 bash scripts/trace_oneshot.sh 4096 "$OUT/oneshot-trace.log" >"$OUT/oneshot-trace.txt" 2>&1 || status=1
    grep -E "ended at|OneShot|ContextWarmer|read_input|multiply_text|publish|os._exit" "$OUT/oneshot-trace.txt"
}

stage_first() {
    local trees=()
    [ -d .wholejob/prev ] && trees=(--tree "prev=$PWD/.wholejob/prev")
    timeout 300 python3 benchmarks/bench_first_job.py "${trees[@]}" --site /tmp/site --backend cuda \
        --workers 1 8 --caches built --rounds 2 --out "$OUT/first" >"$OUT/first_job.log" 2>&1 || status=1
    tail -n 14 "$OUT/first_job.log"
}

for stage in "$@"; do
    echo "=== $stage"
    "stage_$stage" > >(tee "$OUT/$stage.log") 2>&1
done
exit $status
