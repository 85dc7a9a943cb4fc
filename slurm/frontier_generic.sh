#!/bin/bash
# megatron_topo on OLCF Frontier: one rank per GCD, launched by srun (not torchrun).
#   sbatch slurm/frontier_generic.sh                       # run from the repository root
#   MODEL_CONFIG=configs/10B.yml PRESET_CONFIG=configs/zero3.yml sbatch --nodes=16 slurm/frontier_generic.sh
# slurm/frontier_20b.sh and slurm/frontier_10b.sh set their own #SBATCH lines and source this file.
# Setup, data and the ROCm PyTorch install: docs/frontier.md.
# ============================ edit this block ===================================================
#SBATCH --account=CHANGEME             # your OLCF project (e.g. abc123)
#SBATCH --partition=batch
#SBATCH --nodes=48                     # 48 nodes x 4 MI250X x 2 GCDs = 384 ranks (the paper's largest run)
#SBATCH --time=02:00:00
#SBATCH --ntasks-per-node=8            # one rank per GCD
#SBATCH --cpus-per-task=7              # 56 usable cores per node (low-noise mode) / 8 ranks
#SBATCH --gpus-per-node=8
#SBATCH -C nvme                        # node-local NVMe at /mnt/bb/$USER (MIOpen cache)
#SBATCH --job-name=megatron_topo
#SBATCH --output=%x-%j.out
: "${REPO:=${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}}"  # repository root
: "${VENV:=$REPO/.venv}"                          # venv with ROCm PyTorch (docs/frontier.md)
: "${AWS_OFI_RCCL_DIR:=$HOME/aws-ofi-rccl/lib}"   # lib/ of the aws-ofi-rccl plugin build
: "${PRGENV_MODULE:=PrgEnv-gnu}"
: "${ROCM_MODULE:=rocm/6.2.4}"                    # match the ROCm your torch wheel was built for
: "${MODEL_CONFIG:=configs/20B.yml}"
: "${PRESET_CONFIG:=configs/topo.yml}"
: "${SYSTEM_CONFIG:=configs/frontier.yml}"
: "${RUN_NAME:=$(basename "$MODEL_CONFIG" .yml)-$(basename "$PRESET_CONFIG" .yml)-${SLURM_NNODES:-1}n}"
: "${LOG_DIR:=runs/$RUN_NAME-${SLURM_JOB_ID:-local}}"  # metrics.jsonl + TensorBoard, one per job
: "${CKPT_DIR:=checkpoints/$RUN_NAME}"            # shared by resubmissions: they resume from it
: "${MASTER_PORT:=29500}"
: "${EXTRA_ARGS:=}"                               # more train.py arguments, e.g. "--set train_iters=20"
# ================================================================================================
source "$REPO/slurm/frontier_env.sh"
echo "megatron_topo: $NODES nodes x $RANKS_PER_NODE GCDs = $NTASKS ranks; master $MASTER_ADDR:$MASTER_PORT;" \
     "$MODEL_CONFIG $PRESET_CONFIG $SYSTEM_CONFIG; logs $LOG_DIR"

# shellcheck disable=SC2086  # EXTRA_ARGS is a list of words
srun_per_gcd train.py "$MODEL_CONFIG" "$PRESET_CONFIG" "$SYSTEM_CONFIG" \
     --set "log_dir=$LOG_DIR" --set "save=$CKPT_DIR" --set "load=$CKPT_DIR" $EXTRA_ARGS
