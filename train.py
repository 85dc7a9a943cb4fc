#!/usr/bin/env python
"""Train a GPT-NeoX model with the zero_topo engine.

    python train.py CONFIG.yml [MORE.yml ...] [--set dotted.key=value ...]
    python train.py --list-keys        # every config key: type, default, valid values, doc

Launched directly (one process), by torchrun, or by srun (see slurm/). The program is
:mod:`megatron_topo.commands.train`.
"""

from megatron_topo.commands.train import main

if __name__ == "__main__":
    raise SystemExit(main())
