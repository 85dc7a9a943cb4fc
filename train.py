#!/usr/bin/env python
"""Train a GPT-NeoX model with the zero_topo engine.

    python train.py CONFIG.yml [MORE.yml ...] [--set dotted.key=value ...]

Launched directly (one process), by torchrun, or by srun (see slurm/).
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", help="YAML files merged in order")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key, e.g. --set train_iters=10 --set zero_topo.preset=zero3")
    args = ap.parse_args(argv)

    from megatron_topo.config import ConfigError, load_config
    from megatron_topo.data import DataError
    from megatron_topo.training import Trainer, TrainingError, setup_runtime
    from megatron_topo.zero_topo.checkpoint import CheckpointError

    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    try:
        cfg = load_config(args.configs, args.overrides)
        rt = setup_runtime(cfg)
        trainer = Trainer(cfg, rt)
        last = trainer.train()
    except (ConfigError, DataError, CheckpointError, TrainingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if not isinstance(e, TrainingError) else 1
    if rank == 0:
        lg = cfg.logging
        print(f"done: step {trainer.state.step}, loss {last.get('loss', float('nan')):.4f}")
        print(f"metrics:     {os.path.join(lg.log_dir, 'metrics.jsonl')}")
        print(f"tensorboard: {lg.tensorboard_dir or os.path.join(lg.log_dir, 'tensorboard')}")
        if last.get("checkpoint"):
            print(f"checkpoint:  {last['checkpoint']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
