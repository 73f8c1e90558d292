#!/usr/bin/env bash
# One `mmd run` of an N x N job on the cuda backend, traced: its imports, the context warmer's work and the
# pipeline's steps, as ms from its start (benchmarks/trace). Usage: scripts/trace_oneshot.sh [N] [OUT_LOG]
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-4096}
log=${2:-/tmp/mmd-oneshot-trace-$n.log}
d=$(mktemp -d /tmp/mmd-oneshot-trace.XXXXXX)
python3 -m mmd gen "$n" --seed 7 -o "$d/in.txt" -q
python3 -m mmd run "$d/in.txt" --backend cuda -f -o "$d/warm.txt" -q >/dev/null  # the page cache, the kernels built
rm -f "$log"
export MMDBENCH_TRACE_FILE=$log PYTHONPATH="$PWD/benchmarks/trace:${PYTHONPATH:-$PWD}"
export MMDBENCH_TRACE_POINTS="mmd.oneshot:OneShot.__init__,OneShot.describe,OneShot.run,OneShot._backend;mmd.cuda.libcuda:ContextWarmer.take_host_memory;mmd.pipeline.reading:read_input;mmd.pipeline.textpaths:DeviceTextPath.compute,HostTextPath.compute;mmd.cuda.text:GpuText.multiply_text;mmd.atomic:publish"
start=$(date +%s.%N)
python3 -m mmd run "$d/in.txt" --backend cuda -f -o "$d/out.txt" -q >/dev/null
end=$(date +%s.%N)
env -u MMDBENCH_TRACE_FILE python3 - "$log" "$start" "$end" "$d/out.timing.yaml" <<'PY'
import sys
log, start, end, sidecar = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(f"mmd run's process ended at {1e3 * (end - start):.0f} ms")
for line in open(log):
    pid, at, event = line.split(" ", 2)
    print(f"{1e3 * (float(at) - start):8.1f} {pid:>7} {event.strip()}")
print(open(sidecar).read())
PY
rm -rf "$d"
