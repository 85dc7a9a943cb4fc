#!/bin/bash
# RCCL's all-gather and reduce-scatter on Frontier, timed at the sizes ZeRO moves, fitted to the
# performance model's ring constants (alpha per step, beta per GCD). The one measurement that
# settles the model's paper comparison (docs/frontier.md §4): run it on the paper's 48 nodes and
# pass the printed --set system.latency_inter_node_us=... to tools/perf_model.py.
#   sbatch slurm/frontier_collectives.sh                   # from the repository root
#   sbatch --nodes=4 slurm/frontier_collectives.sh         # any other scale
# ============================ edit this block ===================================================
#SBATCH --account=CHANGEME             # your OLCF project (e.g. abc123)
#SBATCH --partition=batch
#SBATCH --nodes=48                     # 384 GCDs, the paper's largest run
#SBATCH --time=00:20:00
#SBATCH --ntasks-per-node=8            # one rank per GCD
#SBATCH --cpus-per-task=7
#SBATCH --gpus-per-node=8
#SBATCH -C nvme
#SBATCH --job-name=collectives
#SBATCH --output=%x-%j.out
: "${REPO:=${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}}"  # repository root
: "${VENV:=$REPO/.venv}"                          # venv with ROCm PyTorch (docs/frontier.md)
: "${AWS_OFI_RCCL_DIR:=$HOME/aws-ofi-rccl/lib}"   # lib/ of the aws-ofi-rccl plugin build
: "${PRGENV_MODULE:=PrgEnv-gnu}"
: "${ROCM_MODULE:=rocm/6.2.4}"
: "${MASTER_PORT:=29500}"
: "${SIZES_MB:=16,64,128,256,512,1024}"           # per GCD: all-gather output / reduce-scatter input
: "${ITERS:=10}"
: "${OUT_DIR:=runs/collectives-${SLURM_NNODES:-1}n-${SLURM_JOB_ID:-local}}"
# ================================================================================================
source "$REPO/slurm/frontier_env.sh"
echo "collectives: $NODES nodes x $RANKS_PER_NODE GCDs = $NTASKS ranks; sizes $SIZES_MB MB; results $OUT_DIR"
srun_per_gcd tools/measure_collectives.py --sizes-mb "$SIZES_MB" --iters "$ITERS" --out "$OUT_DIR"
