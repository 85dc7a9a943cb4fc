#!/bin/bash
# Sourced by the Frontier batch scripts after their "edit this block": modules, the aws-ofi-rccl
# plugin, RCCL/CXI settings, a per-job MIOpen cache, the env:// rendezvous on the first node, and
# srun_per_gcd, which starts one task per GCD. Needs REPO, VENV, AWS_OFI_RCCL_DIR, PRGENV_MODULE,
# ROCM_MODULE and MASTER_PORT (the scripts' top blocks set them).
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
    echo "slurm: no python in VENV=$VENV; create it (docs/frontier.md) or set VENV" >&2
    exit 2
fi
if [ ! -d "$AWS_OFI_RCCL_DIR" ]; then
    echo "slurm: warning: AWS_OFI_RCCL_DIR=$AWS_OFI_RCCL_DIR not found;" \
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

# One task per GCD. --distribution=block puts ranks 8n..8n+7 on node n (node-major, as
# megatron_topo.topology expects); with 7 cores per task and --gpu-bind=closest, local ranks
# 2k and 2k+1 get the two GCDs of one MI250X (the GCD pair of the `topo` preset).
#   srun_per_gcd SCRIPT.py ARGS...   runs "$VENV/bin/python -u SCRIPT.py ARGS..." on every GCD
srun_per_gcd() {
    srun --nodes="$NODES" --ntasks="$NTASKS" --ntasks-per-node="$RANKS_PER_NODE" --cpus-per-task=7 \
         --gpus-per-task=1 --gpu-bind=closest --distribution=block --kill-on-bad-exit=1 \
         "$REPO/slurm/srun_task.sh" "$VENV/bin/python" -u "$@"
}
