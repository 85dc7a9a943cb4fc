#!/bin/bash
# GPT-NeoX-20B with ZeRO-topo on 48 Frontier nodes (384 GCDs), the paper's largest run (seed 000 §VI).
#   sbatch slurm/frontier_20b.sh                                # from any folder; docs/frontier.md
#   sbatch slurm/frontier_20b.sh --set train_iters=50          # arguments go to train.py
#   sbatch slurm/frontier_20b.sh configs/zeropp.yml            # another preset: zero3.yml, zeropp.yml, ...
#   sbatch --nodes=16 slurm/frontier_20b.sh                     # other scales: >= 3 nodes (20B topo needs
#                                                               # more than two nodes' 16 GCDs with the memory reserve)
# Resubmitting the same command continues the run from its latest checkpoint, on any node count.
# ============================ edit this block ===================================================
#SBATCH --account=CHANGEME             # your OLCF project (e.g. abc123)
#SBATCH --partition=batch
#SBATCH --nodes=48                     # 384 GCDs
#SBATCH --time=02:00:00                # Frontier's limit for 1-91 nodes
#SBATCH --signal=B:USR1@600            # 10 min before the limit: finish the step, save, exit 0
#SBATCH --ntasks-per-node=8            # one rank per GCD
#SBATCH --cpus-per-task=7
#SBATCH --gpus-per-node=8
#SBATCH -C nvme                        # node-local NVMe at /mnt/bb/$USER (MIOpen cache, STAGE_VENV)
#SBATCH --network=disable_rdzv_get    # on the allocation, as OLCF puts it: for FI_CXI_RDZV_PROTO=alt_read
#SBATCH --job-name=neox20b-topo
#SBATCH --output=%x-%j.out
# Data, caches, runs and checkpoints go to WORK_DIR, by default Orion scratch of --account:
#   /lustre/orion/<account>/scratch/$USER/megatron_topo. Knobs (WORK_DIR, VENV, RESUBMIT, SITE, ...)
#   and their defaults: the "site settings" block of slurm/frontier_env.sh.
# ================================================================================================
# ---- the repository: sbatch runs a copy of this script, so look where the original lives
if [ -z "${REPO:-}" ]; then
    for REPO in "$(scontrol show job "${SLURM_JOB_ID:-none}" -o 2>/dev/null | sed -n 's/.* Command=\([^ ]*\).*/\1/p')" \
                "${SLURM_SUBMIT_DIR:-.}/slurm/x" "${BASH_SOURCE[0]}"; do
        REPO="$(cd "$(dirname "$REPO")/.." 2>/dev/null && pwd)" && [ -f "$REPO/slurm/frontier_env.sh" ] && break
    done
fi
if [ ! -f "$REPO/slurm/frontier_env.sh" ] || [ ! -f "$REPO/train.py" ]; then
    echo "slurm: error: REPO=$REPO is not the megatron_topo repository (no slurm/frontier_env.sh, train.py); set REPO=/path/to/megatron_topo" >&2
    exit 2
fi
source "$REPO/slurm/frontier_env.sh"
source "$REPO/slurm/frontier_train.sh"
run_training configs/20B.yml configs/topo.yml "$@"
