#!/usr/bin/env bash
# One GPU-machine call for tc1's TMA build (issue 33): check it through mmd, then time it beside the old build.
#
#   OLD=DIR scripts/tma_round.sh [LABELS]
#
# 1. The GPU tests of tc1 (tests/gpu/test_gpu.py -k tc1): every memory mode at awkward shapes, aligned and
#    unaligned views, through the session and the backend, each checking which build ran (the TMA build on
#    sm_90a where A and B have 16-byte aligned rows, the cp.async build elsewhere).
# 2. benchmarks/tc_ladder.py --only LABELS (default: tc1, the cp.async build, and tc1_tma_tf, the TMA build
#    mmd now launches on sm_90a): compile reports, a check on 16 shapes in three layouts, CUDA-event timings
#    at 4096^3 and 8192^3 beside cuBLAS SGEMM and cuBLAS TF32.
# 3. mmd bench --plan ladder (tc1, cublas_tf32, cublas at 4096 and 8192) from this tree and, where OLD names
#    another checkout of mmd (the tree before the TMA build), from that one, and mmd bench --compare of the two.
# Logs and results go to $OUT. PROFILE=LABELS adds an Nsight Compute report of one 4096^3 launch of each.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tma-round}
mkdir -p "$OUT"
wheels=.device-wheels
[ -d "$wheels" ] || wheels=../.device-wheels
[ -d /tmp/site/pycuda ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    "$wheels"/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/mmd-cache MMD_LOG_LEVEL=warning
labels=${1:-tc1,tc1_tma_tf}
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.used \
    --format=csv,noheader
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader

echo "== GPU tests of tc1"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu.py -k tc1 2>&1 \
    | tee "$OUT/gpu-tests.log" | tail -n 25 || status=1

echo "== tc_ladder.py --only $labels"
timeout 150 python3 benchmarks/tc_ladder.py --only "$labels" --out "$OUT" 2>&1 | tail -n 40 || status=1

echo "== mmd bench --plan ladder"
bench() {  # TREE NAME: a ladder run of tc1 and cuBLAS from TREE into $OUT/bench/NAME
    (cd "$1" && PYTHONPATH="/tmp/site:$PWD" timeout 90 python3 -m mmd bench --plan ladder --backend cuda \
        --kernels tc1 cublas_tf32 cublas --sizes 4096 8192 --out "$OUT/bench-$2" 2>&1 | tail -n 12)
}
bench . new || status=1
if [ -n "${OLD:-}" ]; then
    bench "$OLD" old || status=1
    python3 -m mmd bench --compare "$(ls -d "$OUT"/bench-old/*/ | tail -n 1)" "$(ls -d "$OUT"/bench-new/*/ | tail -n 1)"
fi

# PROFILE=tc1,tc1_tma_tf: one 4096^3 launch of each under Nsight Compute, after the run (its cubins)
if [ -n "${PROFILE:-}" ] && command -v ncu >/dev/null; then
    n=$(($(tr -cd , <<<"$PROFILE" | wc -c) + 1))
    timeout 200 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
        -k regex:mmd_tc -c "$n" python3 benchmarks/tc_ladder.py --profile "$PROFILE" >"$OUT/ncu.txt" 2>&1
    echo "ncu ($PROFILE, in that order): $OUT/ncu.txt"
    grep -E "Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|No Eligible|Grid Size" \
        "$OUT/ncu.txt"
fi
exit $status
