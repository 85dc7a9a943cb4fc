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
set -euo pipefail
cd "$REPO"

# ---- software environment
if ! type module >/dev/null 2>&1 && [ -f /usr/share/lmod/lmod/init/bash ]; then
    source /usr/share/lmod/lmod/init/bash
fi
module load "$PRGENV_MODULE"
module load "$ROCM_MODULE"
module load craype-accel-amd-gfx90a
if [ ! -x "$VENV/bin/python" ]; then
    echo "frontier_generic.sh: no python in VENV=$VENV; create it (docs/frontier.md) or set VENV" >&2
    exit 2
fi
if [ ! -d "$AWS_OFI_RCCL_DIR" ]; then
    echo "frontier_generic.sh: warning: AWS_OFI_RCCL_DIR=$AWS_OFI_RCCL_DIR not found;" \
         "RCCL falls back to TCP sockets over hsn0 (slow)" >&2
fi
export LD_LIBRARY_PATH="$AWS_OFI_RCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # librccl-net.so

# ---- RCCL / libfabric (CXI) settings. [S004] = seed 004 (Singh, Ch. 6 §6.1.1, tuned RCCL and
# Cray MPICH on Frontier); [OLCF] = OLCF user guide, PyTorch on Frontier (cited there as well).
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-hsn0}"     # [OLCF] bootstrap over Slingshot, not mgmt eth
export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-hsn0}"
export NCCL_NET_GDR_LEVEL="${NCCL_NET_GDR_LEVEL:-3}"        # [S004] = PHB: GPU-direct RDMA GCD<->NIC on a NUMA node
export NCCL_CROSS_NIC="${NCCL_CROSS_NIC:-1}"                # [OLCF] rings may use any of the 4 NICs
export FI_CXI_ATS="${FI_CXI_ATS:-0}"                        # [OLCF] required by aws-ofi-rccl on Frontier
export FI_CXI_DISABLE_CQ_HUGETLB="${FI_CXI_DISABLE_CQ_HUGETLB:-1}"  # [OLCF] avoid CQ hugepage failures
export FI_CXI_DEFAULT_CQ_SIZE="${FI_CXI_DEFAULT_CQ_SIZE:-131072}"   # [OLCF] large jobs overflow the default
export FI_MR_CACHE_MONITOR="${FI_MR_CACHE_MONITOR:-userfaultfd}"    # [OLCF] memory-registration cache
export FI_CXI_RDZV_THRESHOLD="${FI_CXI_RDZV_THRESHOLD:-0}"  # [S004] no eager messages: faster
export FI_CXI_RDZV_GET_MIN="${FI_CXI_RDZV_GET_MIN:-0}"      #   large-payload collectives
export FI_CXI_RDZV_EAGER_SIZE="${FI_CXI_RDZV_EAGER_SIZE:-0}"
export HSA_ENABLE_SDMA="${HSA_ENABLE_SDMA:-0}"              # [S004] copies by GPU kernels, not SDMA engines
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-7}"

# ---- per-job MIOpen kernel database on node-local storage (a shared $HOME DB locks and corrupts)
USER_NAME="${USER:-$(id -un)}"
if [ -d "/mnt/bb/$USER_NAME" ]; then
    export MIOPEN_USER_DB_PATH="/mnt/bb/$USER_NAME/miopen-${SLURM_JOB_ID:-local}"
else
    export MIOPEN_USER_DB_PATH="/tmp/$USER_NAME-miopen-${SLURM_JOB_ID:-local}"
fi
export MIOPEN_CUSTOM_CACHE_DIR="$MIOPEN_USER_DB_PATH"       # created on every node by srun_task.sh

# ---- rendezvous: torch.distributed env:// on the first node of the allocation
# (no `| head -n 1`: under pipefail a SIGPIPE in scontrol would abort the job)
HOSTS="$(scontrol show hostnames "${SLURM_NODELIST:?submit with sbatch (or run inside salloc)}")"
MASTER_ADDR="${HOSTS%%$'\n'*}"
export MASTER_ADDR MASTER_PORT

NODES="${SLURM_NNODES:-${SLURM_JOB_NUM_NODES:-1}}"
RANKS_PER_NODE=8                                            # 4 MI250X x 2 GCDs
NTASKS=$((NODES * RANKS_PER_NODE))
echo "megatron_topo: $NODES nodes x $RANKS_PER_NODE GCDs = $NTASKS ranks; master $MASTER_ADDR:$MASTER_PORT;" \
     "$MODEL_CONFIG $PRESET_CONFIG $SYSTEM_CONFIG; logs $LOG_DIR"

# One task per GCD. --distribution=block puts ranks 8n..8n+7 on node n (node-major, as
# megatron_topo.topology expects); with 7 cores per task and --gpu-bind=closest, local ranks
# 2k and 2k+1 get the two GCDs of one MI250X (the GCD pair of the `topo` preset).
# shellcheck disable=SC2086  # EXTRA_ARGS is a list of words
srun --nodes="$NODES" --ntasks="$NTASKS" --ntasks-per-node="$RANKS_PER_NODE" --cpus-per-task=7 \
     --gpus-per-task=1 --gpu-bind=closest --distribution=block --kill-on-bad-exit=1 \
     "$REPO/slurm/srun_task.sh" "$VENV/bin/python" -u train.py \
     "$MODEL_CONFIG" "$PRESET_CONFIG" "$SYSTEM_CONFIG" \
     --set "log_dir=$LOG_DIR" --set "save=$CKPT_DIR" --set "load=$CKPT_DIR" $EXTRA_ARGS
