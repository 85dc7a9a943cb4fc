#!/bin/bash
# RCCL's all-gather and reduce-scatter on Frontier, timed at the sizes ZeRO moves, fitted to the
# performance model's ring constants (alpha per step, beta per GCD). The one measurement that
# settles the model's paper comparison (docs/frontier.md §4): run it on the paper's 48 nodes and
# pass the printed --set system.latency_inter_node_us=... to tools/predict_perf.py.
#   sbatch slurm/frontier_collectives.sh                   # from any folder
#   sbatch --nodes=4 slurm/frontier_collectives.sh         # any other scale
#   sbatch slurm/frontier_collectives.sh --sizes-mb 1,2 --iters 5   # arguments replace the defaults below
# ============================ edit this block ===================================================
#SBATCH --account=CHANGEME             # your OLCF project (e.g. abc123)
#SBATCH --partition=batch
#SBATCH --nodes=48                     # 384 GCDs, the paper's largest run
#SBATCH --time=00:20:00
#SBATCH --ntasks-per-node=8            # one rank per GCD
#SBATCH --cpus-per-task=7
#SBATCH --gpus-per-node=8
#SBATCH -C nvme
#SBATCH --network=disable_rdzv_get    # on the allocation, as OLCF puts it: for FI_CXI_RDZV_PROTO=alt_read
#SBATCH --job-name=collectives
#SBATCH --output=%x-%j.out
# Results go to WORK_DIR/runs/collectives-<N>n-<job> (WORK_DIR: Orion scratch of --account by
# default; knobs: the "site settings" block of slurm/frontier_env.sh).
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
out="$WORK_DIR/runs/collectives-${NODES}n-${SLURM_JOB_ID:-local}"
if [ $# -eq 0 ]; then set -- --sizes-mb 16,64,128,256,512,1024 --iters 10; fi
echo "collectives: $NODES nodes x $RANKS_PER_NODE GCDs = $NTASKS ranks; results $out"
cd "$WORK_DIR"
srun_per_gcd "$REPO/tools/measure_collectives.py" "$@" --out "$out" || true
exit "$LAUNCH_RC"
