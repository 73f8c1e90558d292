#!/bin/sh
# Stop the one-node Slurm that scripts/slurm_up.sh started in DIR: exactly the pids it
# recorded (slurmd, slurmctld, then munged), TERM first, KILL after 10 s.
#   sh scripts/slurm_down.sh DIR
set -u
dir=${1:?usage: slurm_down.sh DIR (the folder slurm_up.sh printed)}
for name in slurmd slurmctld munged; do
    pidfile=$dir/$name.run.pid
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill "$pid" 2>/dev/null; then
        i=0
        while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
done
echo "slurm_down: stopped the cluster in $dir" >&2
