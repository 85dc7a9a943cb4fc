#!/usr/bin/env bash
# Set up, then train the tiny GPT with ZeRO-topo on 8 local CPU processes emulating
# 2 nodes x 2 GPUs x 2 GCDs, then plot the loss. Extra arguments go to train.py (e.g. --set train_iters=20).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
RUN=runs/tiny
# megatron_topo.launch is torchrun that exits with the failed rank's status instead of printing
# torchrun's ChildFailedError traceback (the rank printed its own error line, once)
.venv/bin/python -m megatron_topo.launch --standalone --nproc_per_node 8 train.py \
    configs/tiny.yml configs/topo.yml configs/local_cpu.yml --set log_dir=$RUN --set save=$RUN/checkpoints \
    --set auto_resume=true "$@"   # a second run continues this one (train_iters reached: nothing to do)
.venv/bin/python tools/plot_metrics.py "$RUN" --out "$RUN/loss.png"
echo "plot:        $RUN/loss.png"
