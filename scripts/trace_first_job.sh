#!/usr/bin/env bash
# A fresh daemon's first 32x32 job, traced: each process's start, imports and steps to its first job, as ms from
# the daemon's start (benchmarks/trace). Usage: scripts/trace_first_job.sh WORKERS_PER_DEVICE [OUT_LOG]
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-8}
log=${2:-/tmp/mmd-first-trace-$n.log}
d=$(mktemp -d /tmp/mmd-first-trace.XXXXXX)
mkdir -p "$d/inbox" "$d/outbox"
python3 -m mmd gen 32 --seed 1 -o "$d/inbox/a.txt" -q
rm -f "$log"
export MMDBENCH_TRACE_FILE=$log PYTHONPATH="$PWD/benchmarks/trace:${PYTHONPATH:-$PWD}"
export MMDBENCH_TRACE_POINTS="mmd.backends:worker_devices,BackendPool.get;mmd.cuda.driver:device_count;mmd.daemon.pool:WorkerPool.start,WorkerHandle.start;mmd.daemon.worker:serve;mmd.daemon.server:Daemon._await_workers,Daemon._say_serving;mmd.cuda.session:GpuSession.__init__"
start=$(date +%s.%N)
(cd "$d" && MMD_BACKEND=cuda MMD_WORKERS_PER_DEVICE=$n exec python3 -m mmd serve >serve.log 2>&1) &
pid=$!
i=0
until [ -e "$d/outbox/a.timing.yaml" ] || [ $i -gt 600 ]; do sleep 0.01; i=$((i + 1)); done
end=$(date +%s.%N)
sleep 1
kill -TERM $pid; wait $pid
python3 - "$log" "$start" "$end" <<'PY'
import sys
log, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
print(f"first job's sidecar at {1e3 * (end - start):.0f} ms")
for line in open(log):
    pid, at, event = line.split(" ", 2)
    ms = 1e3 * (float(at) - start)
    if ms < 1e3 * (end - start) + 50:
        print(f"{ms:8.1f} {pid:>7} {event.strip()}")
PY
rm -rf "$d"
