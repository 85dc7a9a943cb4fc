#!/usr/bin/env bash
# A real Slurm on this machine for the test suite (tests/test_slurm_real.py) and for trying the
# slurm/ scripts locally: one slurmctld and two slurmd "nodes" (n1, n2) on localhost, with a
# private munged, all in one state folder. Debian's slurm-wlm (22.05) and munge are installed
# with apt-get when missing (needs root).
#
#   bash scripts/local_slurm.sh install          # apt-get install slurm-wlm munge (if missing)
#   bash scripts/local_slurm.sh start DIR        # write DIR/slurm.conf, start the daemons, wait for idle nodes
#   export SLURM_CONF=DIR/slurm.conf             # then sbatch/squeue/scontrol talk to it
#   bash scripts/local_slurm.sh stop DIR         # stop every daemon started in DIR, by its PID
#
# The nodes advertise Frontier's shape (64 CPUs, Gres=gpu:8 without devices, Feature=nvme,
# partition "batch") so the #SBATCH headers of slurm/ are accepted unchanged; nothing is bound.
# Ports: SLURM_LOCAL_PORT (default 16817) for slurmctld, the next two for the slurmd's.
set -euo pipefail

die() { echo "local_slurm: $*" >&2; exit 2; }

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
            && command -v sbatch >/dev/null; then
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "slurm-wlm/munge are not installed and installing them needs root"
    command -v apt-get >/dev/null || die "slurm-wlm/munge are not installed and there is no apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed (no package registry?)"
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null \
        || die "apt-get install slurm-wlm munge failed"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    local dir="$1" port="${SLURM_LOCAL_PORT:-16817}" host
    install
    host="$(hostname -s)"
    mkdir -p "$dir"
    chmod 700 "$dir"
    dir="$(cd "$dir" && pwd)"
    for d in ctld n1 n2; do mkdir -p "$dir/$d"; done
    if [ ! -f "$dir/munge.key" ]; then
        head -c 1024 /dev/urandom > "$dir/munge.key"
        chmod 400 "$dir/munge.key"
    fi
    cat > "$dir/slurm.conf" <<EOF
# written by scripts/local_slurm.sh: one controller and two slurmd "nodes" on this machine
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
GresTypes=gpu
KillWait=10
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 1)) CPUs=64 Sockets=1 CoresPerSocket=64 ThreadsPerCore=1 RealMemory=4000 Gres=gpu:8 Feature=nvme State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 2)) CPUs=64 Sockets=1 CoresPerSocket=64 ThreadsPerCore=1 RealMemory=4000 Gres=gpu:8 Feature=nvme State=UNKNOWN
PartitionName=batch Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
    mkdir -p "$dir/dev"  # stand-in device files: Slurm counts GPUs by their files
    for i in 0 1 2 3 4 5 6 7; do [ -e "$dir/dev/gpu$i" ] || mknod "$dir/dev/gpu$i" c 1 3 2>/dev/null || : > "$dir/dev/gpu$i"; done
    printf 'NodeName=n1,n2 Name=gpu File=%s/dev/gpu[0-7]\n' "$dir" > "$dir/gres.conf"
    export SLURM_CONF="$dir/slurm.conf"  # the daemons find gres.conf beside it
    pid_alive "$dir/munged.pid" || munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" \
        --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge.seed" \
        || die "munged did not start (see $dir/munged.log)"
    pid_alive "$dir/slurmctld.pid" || slurmctld -f "$dir/slurm.conf" -i \
        || die "slurmctld did not start (see $dir/slurmctld.log)"
    for n in n1 n2; do
        pid_alive "$dir/slurmd-$n.pid" || slurmd -f "$dir/slurm.conf" -N "$n" \
            || die "slurmd $n did not start (see $dir/slurmd-$n.log)"
    done
    local i state
    for i in $(seq 1 60); do
        state="$(SLURM_CONF="$dir/slurm.conf" sinfo -h -N -o '%N %T' 2>/dev/null | sort | tr '\n' ' ')"
        if [ "$state" = "n1 idle n2 idle " ]; then
            echo "local_slurm: up in $dir (nodes n1, n2 idle); export SLURM_CONF=$dir/slurm.conf"
            return 0
        fi
        sleep 0.5
    done
    die "nodes not idle after 30 s: ${state:-no answer from slurmctld} (logs in $dir)"
}

stop() {
    local dir="$1" f pid i
    for f in "$dir"/slurmd-n1.pid "$dir"/slurmd-n2.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
        [ -f "$f" ] || continue
        pid="$(cat "$f")"
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
        fi
        rm -f "$f"
    done
}

case "${1:-}" in
    install) install ;;
    start) [ -n "${2:-}" ] || die "usage: $0 start DIR"; start "$2" ;;
    stop) [ -n "${2:-}" ] || die "usage: $0 stop DIR"; stop "$2" ;;
    *) die "usage: $0 install | start DIR | stop DIR" ;;
esac
