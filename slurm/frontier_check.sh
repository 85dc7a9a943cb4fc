#!/bin/bash
# The ten-minute check on one node before the big job (docs/frontier.md §2, step 1): on the node's
# 8 GCDs, with the job's config files, tools/gpu_check.py checks the Triton kernels against the
# reference bit for bit and times them on a 20B layer, every communicator of the plan live at once
# with random per-rank delays, that RCCL's network plugin loads, one training step of 20B-sized
# layers with the job's plan (one collective order on every rank, replicated shards equal bit for
# bit) and the device memory used against the dry run's projection and the reserve. It prints one
# table; the job fails (exit 1) on any failed row. A hang is reported, not waited out.
#   sbatch slurm/frontier_check.sh                                   # 20B, topo: what frontier_20b.sh runs
#   sbatch slurm/frontier_check.sh configs/10B.yml configs/zeropp.yml
#   sbatch slurm/frontier_check.sh --layers 4 --timeout 120          # options of tools/gpu_check.py
# ============================ edit this block ===================================================
#SBATCH --account=CHANGEME             # your OLCF project (e.g. abc123)
#SBATCH --partition=batch
#SBATCH --nodes=1
#SBATCH --time=00:15:00
#SBATCH --ntasks-per-node=8            # one rank per GCD
#SBATCH --cpus-per-task=7
#SBATCH --gpus-per-node=8
#SBATCH -C nvme
#SBATCH --job-name=gpu-check
#SBATCH --output=%x-%j.out
# Knobs (WORK_DIR, VENV, SITE, ...): the "site settings" block of slurm/frontier_env.sh.
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
source "$REPO/slurm/frontier_train.sh"   # resolve_yml
model=configs/20B.yml
preset=configs/topo.yml
if [ $# -gt 0 ] && [[ "$1" == *.yml || "$1" == *.yaml ]]; then model="$1"; shift; fi
if [ $# -gt 0 ] && [[ "$1" == *.yml || "$1" == *.yaml ]]; then preset="$1"; shift; fi
system=configs/frontier.yml
extra=()
if [ "$SITE" = local_cpu ]; then  # CPU site profile: the tiny model, gloo, small layers
    model=configs/tiny.yml
    system=configs/local_cpu.yml
    extra+=(--small)
    if [ $((RANKS_PER_NODE % 2)) -eq 0 ]; then
        extra+=(--set topology.gcds_per_gpu=2 --set "topology.gpus_per_node=$((RANKS_PER_NODE / 2))")
    else
        extra+=(--set topology.gcds_per_gpu=1 --set "topology.gpus_per_node=$RANKS_PER_NODE")
    fi
fi
configs=()
for f in "$model" "$preset" "$system"; do configs+=("$(resolve_yml "$f")") || exit 2; done
echo "gpu_check: job ${SLURM_JOB_ID:-local}: $NODES node(s) x $RANKS_PER_NODE ranks; site $SITE; ${configs[*]}"
cd "$WORK_DIR"
srun_per_gcd "$REPO/tools/gpu_check.py" "${configs[@]}" "${extra[@]}" "$@" || true
exit "$LAUNCH_RC"
