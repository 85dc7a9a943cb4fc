#!/bin/bash
# GPT-NeoX-20B with ZeRO-topo on 48 Frontier nodes (384 GCDs), the paper's largest run (seed 000 §VI).
#   sbatch slurm/frontier_20b.sh            # from the repository root; see docs/frontier.md
# Compare strategies: PRESET_CONFIG=configs/zero3.yml sbatch slurm/frontier_20b.sh (or zeropp.yml);
# scale: sbatch --nodes=1 slurm/frontier_20b.sh (8 GCDs) ... --nodes=48.
# ============================ edit this block ===================================================
#SBATCH --account=CHANGEME             # your OLCF project
#SBATCH --partition=batch
#SBATCH --nodes=48                     # 384 GCDs
#SBATCH --time=02:00:00
#SBATCH --ntasks-per-node=8            # one rank per GCD
#SBATCH --cpus-per-task=7
#SBATCH --gpus-per-node=8
#SBATCH -C nvme
#SBATCH --job-name=neox20b-topo
#SBATCH --output=%x-%j.out
export REPO="${REPO:-${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}}"
export VENV="${VENV:-$REPO/.venv}"
export AWS_OFI_RCCL_DIR="${AWS_OFI_RCCL_DIR:-$HOME/aws-ofi-rccl/lib}"
export ROCM_MODULE="${ROCM_MODULE:-rocm/6.2.4}"
export MODEL_CONFIG="${MODEL_CONFIG:-configs/20B.yml}"
export PRESET_CONFIG="${PRESET_CONFIG:-configs/topo.yml}"
export EXTRA_ARGS="${EXTRA_ARGS:-}"
# ================================================================================================
source "$REPO/slurm/frontier_generic.sh"
