#!/usr/bin/env bash
# A one-node Slurm on this machine, for mmd's Slurm tests and docs/cluster.md: munged,
# slurmctld and slurmd started in the foreground (-F/-D) and backgrounded here, so that
# their pids are known and scripts/slurm_down.sh stops exactly them.
#
#   eval "$(sh scripts/slurm_up.sh [DIR])"   # prints: export SLURM_CONF=DIR/slurm.conf
#   sh scripts/slurm_down.sh DIR
#
# Needs root (the daemons run as root, as on a lab box without systemd) and, where the
# packages are missing, apt-get. Everything lives in DIR (default: a fresh folder under
# /tmp): config, munge key and socket, state, logs, pids. A fresh state folder each time
# matters: a node Slurm once drained stays drained across restarts.
#
# The node has two fake GPUs (gres "gpu", character devices like /dev/null) so that
# --gres=gpu:1 and --gpus=1 are accepted and scheduled as on a GPU cluster; jobs see
# CUDA_VISIBLE_DEVICES but no real GPU, so tests run mmd with --backend cpu.
# MaxArraySize is small (8: task ids 0..7) so that `mmd submit` splitting a folder into
# several arrays is exercised by a handful of files.
set -euo pipefail

dir=${1:-$(mktemp -d /tmp/mmd-slurm.XXXXXX)}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# Two free ports unless given: another cluster on this machine (a second CI run) must not collide.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ctld_port=${MMD_SLURMCTLD_PORT:-$(free_port)}
slurmd_port=${MMD_SLURMD_PORT:-$(free_port)}
log() { echo "slurm_up: $*" >&2; }

need=()
for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if ((${#need[@]})); then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${need[@]}" >"$dir/apt.log" 2>&1 || {
        apt-get update -q >>"$dir/apt.log" 2>&1
        apt-get install -y -q --no-install-recommends "${need[@]}" >>"$dir/apt.log" 2>&1
    } || { log "apt-get install ${need[*]} failed; see $dir/apt.log"; exit 1; }
fi
export PATH=$PATH:/usr/sbin

# munged refuses a socket folder others cannot enter, and a key others can read.
mkdir -p "$dir/munge/run" "$dir/munge/key" "$dir/state/ctld" "$dir/state/d" "$dir/dev" "$dir/log"
chmod 0755 "$dir/munge/run"
chmod 0700 "$dir/munge/key"
[ -e "$dir/munge/key/munge.key" ] || mungekey -c -k "$dir/munge/key/munge.key"
socket=$dir/munge/run/munge.socket.2

# Two fake GPUs: Slurm needs one device file per GPU, and more than one must be character devices.
for i in 0 1; do
    [ -e "$dir/dev/gpu$i" ] || mknod "$dir/dev/gpu$i" c 1 3
done

node=$(hostname -s)
cat >"$dir/slurm.conf" <<CONF
# Written by mmd's scripts/slurm_up.sh: a one-node cluster on 127.0.0.1 (no DNS, no cgroups).
ClusterName=mmdtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$dir/state/ctld
SlurmdSpoolDir=$dir/state/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The default scheduler round is every 3 s; 0 starts a batch job as soon as it is submitted.
SchedulerParameters=batch_sched_delay=0
MaxArraySize=8
KillWait=5
ReturnToService=2
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
GresTypes=gpu
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
cat >"$dir/gres.conf" <<CONF
AutoDetect=off
Name=gpu File=$dir/dev/gpu[0-1]
CONF
export SLURM_CONF=$dir/slurm.conf

start() { # NAME COMMAND...: start in the background, remember its pid
    local name=$1
    shift
    "$@" >"$dir/log/$name.out" 2>&1 &
    echo $! >"$dir/$name.run.pid"
}
start munged munged -F -f --socket="$socket" --key-file="$dir/munge/key/munge.key" \
    --log-file="$dir/log/munged.log" --pid-file="$dir/munged.pid" --seed-file="$dir/munge/seed"
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.05; done
start slurmctld slurmctld -D -i
start slurmd slurmd -D

for _ in $(seq 300); do
    if scontrol ping 2>/dev/null | grep -q ' is UP' && [ "$(sinfo -h -n "$node" -o %t 2>/dev/null)" = idle ]; then
        log "up in $dir (node $node idle)"
        echo "export SLURM_CONF=$dir/slurm.conf"
        exit 0
    fi
    sleep 0.1
done
log "not up after 30 s; logs in $dir/log:"
tail -n 5 "$dir"/log/*.log "$dir"/log/*.out >&2 || true
sh "$(dirname "$0")/slurm_down.sh" "$dir" || true
exit 1
