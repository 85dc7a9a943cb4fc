#!/bin/bash
# Run by srun once per task: torch.distributed's env:// variables from Slurm's, then exec.
#   srun ... slurm/srun_task.sh python train.py CONFIG.yml ...
# megatron_topo.topology.launcher_env reads SLURM_* directly as well; exporting the torchrun
# names makes any torch.distributed code (and NCCL's env:// rendezvous) see the same values.
set -euo pipefail
export RANK="$SLURM_PROCID"
export WORLD_SIZE="$SLURM_NTASKS"
export LOCAL_RANK="$SLURM_LOCALID"
per_node="${SLURM_NTASKS_PER_NODE:-}"
per_node="${per_node%%(*}"                 # "8(x48)" -> "8"
per_node="${per_node%%,*}"
if [ -z "$per_node" ]; then
    per_node=$((SLURM_NTASKS / ${SLURM_NNODES:-1}))
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
