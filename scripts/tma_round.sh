#!/usr/bin/env bash
# One GPU-machine call for tc1's TMA builds (issue 33): build, check, time, beside tc1 and cuBLAS.
#
#   scripts/tma_round.sh [LABELS]
#
# Compiles the tc1 builds named in LABELS (default: today's tc1 and the TMA builds; see
# benchmarks/tc_ladder.py's builds()), prints ptxas's registers and spills, checks each against a
# float64 reference on the awkward shapes (1, 7, 31, 33, 127, 1000, 4095, rectangular; three memory
# layouts, everything outside the matrices NaN; the TMA builds skip the layout whose rows are not
# 16-byte aligned, which mmd gives to the cp.async build), then times them with CUDA events at 4096^3
# and 8192^3 beside cuBLAS SGEMM and cuBLAS TF32 (L2 flushed before every launch, medians). The
# ladder's log and results.json go to $OUT; the tables are printed last. PROFILE=LABELS adds an Nsight
# Compute report of one 4096^3 launch of each (ncu.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tma-round}
mkdir -p "$OUT"
wheels=.device-wheels
[ -d "$wheels" ] || wheels=../.device-wheels
[ -d /tmp/site/pycuda ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    "$wheels"/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
labels=${1:-tc1,tc1_tma,tc1_tma_tf,tc1_tma2,tc1_tma2_tf,tc1_tma2_s3}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.used \
    --format=csv,noheader
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
timeout 250 python3 benchmarks/tc_ladder.py --only "$labels" --out "$OUT" 2>&1
status=$?
# PROFILE=tc1,tc1_tma,...: one 4096^3 launch of each under Nsight Compute, after the run (its cubins)
if [ -n "${PROFILE:-}" ] && command -v ncu >/dev/null; then
    n=$(($(tr -cd , <<<"$PROFILE" | wc -c) + 1))
    timeout 200 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
        -k regex:mmd_tc1 -c "$n" python3 benchmarks/tc_ladder.py --profile "$PROFILE" >"$OUT/ncu.txt" 2>&1
    echo "ncu ($PROFILE, in that order): $OUT/ncu.txt"
    grep -E "Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|No Eligible|Issued Warp|Cluster Size|Grid Size" \
        "$OUT/ncu.txt"
fi
exit $status
