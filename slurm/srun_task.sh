#!/bin/bash
# Run by srun once per task: torch.distributed's env:// variables from Slurm's, then exec.
#   srun ... slurm/srun_task.sh python train.py CONFIG.yml ...
# megatron_topo.topology.launcher_env reads SLURM_* directly as well; exporting the torchrun
# names makes any torch.distributed code (and NCCL's env:// rendezvous) see the same values.
set -euo pipefail
# Slurm's variables, checked before any use (bash arithmetic would evaluate a name or an expression
# in them): ASCII digits, or one line naming the variable. A job-wide one (the same on every task)
# is reported by task 0 only; the other tasks exit with the same status.
fail() {  # fail JOB_WIDE MESSAGE
    case "${SLURM_PROCID:-}" in ''|*[!0-9]*|0) ;; *) [ "$1" = 1 ] && exit 2;; esac
    printf 'slurm: error: %s\n' "$2" >&2
    exit 2
}
count() {  # count NAME JOB_WIDE MIN WHAT: the variable's value, a number >= MIN in ASCII digits
    local name="$1" v
    if [ -z "${!name+x}" ]; then
        fail "$2" "$name is not set: srun_task.sh runs once per task under srun (srun ... slurm/srun_task.sh python train.py ...)"
    fi
    v="${!name}"
    local shown="${v:0:40}"
    shown="${shown//[![:print:]]/?}"              # a newline or escape in it stays inside the one line
    case "$v" in
        ''|*[!0-9]*|0?*) fail "$2" "$name='$shown' is not $4 (ASCII digits 0-9, no leading zero; srun sets it)";;
    esac
    if [ "${#v}" -gt 9 ] || [ "$v" -lt "$3" ]; then
        fail "$2" "$name=$shown is not $4 (at least $3, below 10**9)"
    fi
    printf '%s' "$v"
}
ntasks="$(count SLURM_NTASKS 1 1 'a number of tasks')" || exit $?
procid="$(count SLURM_PROCID 0 0 'a task rank')" || exit $?
localid="$(count SLURM_LOCALID 0 0 'a local task rank')" || exit $?
if [ "$procid" -ge "$ntasks" ]; then
    fail 0 "SLURM_PROCID=$procid is outside SLURM_NTASKS=$ntasks tasks (valid 0..$((ntasks - 1)))"
fi
export RANK="$procid"
export WORLD_SIZE="$ntasks"
export LOCAL_RANK="$localid"
per_node="${SLURM_NTASKS_PER_NODE:-}"
per_node="${per_node%%(*}"                 # "8(x48)" -> "8"
per_node="${per_node%%,*}"
if [ -n "$per_node" ]; then
    per_node="$(SLURM_NTASKS_PER_NODE="$per_node" count SLURM_NTASKS_PER_NODE 1 1 'a number of tasks per node')" || exit $?
else
    nnodes=1
    if [ -n "${SLURM_NNODES+x}" ]; then
        nnodes="$(count SLURM_NNODES 1 1 'a number of nodes')" || exit $?
    fi
    per_node=$((ntasks / nnodes))
fi
export LOCAL_WORLD_SIZE="$per_node"
if [ -n "${MIOPEN_USER_DB_PATH:-}" ]; then
    mkdir -p "$MIOPEN_USER_DB_PATH"
fi
# Slurm's walltime warning (SIGUSR1) and the stop signal (SIGUSR2), forwarded by the batch script,
# must not kill a rank that has not yet installed its handlers (train.py does when it starts):
# ignore them until then (the batch shell repeats them every 10 s).
trap '' USR1 USR2
exec "$@"
