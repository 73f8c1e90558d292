#!/usr/bin/env bash
# One GPU-machine call for fast (issue 33): build, check and time every fast set beside cuBLAS SGEMM
# (sgemm_ladder.py, which also writes the autotune), Nsight Compute on the best set at 4096^3 and on cuBLAS's
# kernel, the GPU tests of fast, and when `mmd check --reference gpu` pays (reference_gpu.py).
#
#   benchmarks/fast_round.sh [STAGE...]     stages: ladder ncu tests reference (default: all four)
#
# Needs the carried wheels in .device-wheels/ (../shared/device/stage). Everything lands flat in $OUT
# (the device tool brings back at most 8 files): ladder.log results.json fast.tune.yaml sgemm.ncu-rep
# ncu_raw.csv ncu.log tests.log reference.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fast-round}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUPY_TF32=0
wheels=.device-wheels
[ -d $wheels ] || wheels=../.device-wheels # run from a copy of the tree inside the checkout (.fast/)
[ -d /tmp/site/pycuda ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    $wheels/*.whl
export PYTHONPATH="/tmp/site:$PWD"
python3 setup.py -q build_ext --inplace >/dev/null 2>&1 || echo "C text accelerator not built: numpy path"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(ladder ncu tests reference)
for stage in "${stages[@]}"; do
    start=$SECONDS
    echo "== $stage"
    case $stage in
    ladder)
        timeout 150 python3 benchmarks/sgemm_ladder.py --out "$OUT" 2>&1 | grep -v "^check .* PASS" | tail -n 75
        ;;
    ncu)
        for n in 4096; do
            timeout 90 ncu --clock-control none --set full -k regex:'mmd_fast|gemm' -f -o "$OUT/sgemm" \
                python3 benchmarks/sgemm_ncu.py --results "$OUT/results.json" --size $n --launches 2 \
                >"$OUT/ncu.log" 2>&1
            tail -n 4 "$OUT/ncu.log"
            ncu --import "$OUT/sgemm.ncu-rep" --page raw --csv >"$OUT/ncu_raw.csv" 2>>"$OUT/ncu.log"
            ncu --import "$OUT/sgemm.ncu-rep" --page details --print-summary none 2>&1 \
                | grep -E "^  [a-z_0-9]+|SM Frequency|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Issued Ipc Active|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Bank Conflicts|One or More Eligible|No Eligible|Executed Ipc A" \
                | tee -a "$OUT/ncu.log" | head -n 60
        done
        ;;
    tests)
        timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu -k fast >"$OUT/tests.log" 2>&1
        tail -n 4 "$OUT/tests.log"
        ;;
    reference)
        timeout 180 python3 benchmarks/reference_gpu.py --sizes 1024 2048 4096 8192 --repeat 3 2>&1 \
            | tee "$OUT/reference.log"
        ;;
    *) echo "unknown stage $stage" ;;
    esac
    echo "== $stage took $((SECONDS - start)) s"
done
