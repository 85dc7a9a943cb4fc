#!/usr/bin/env python
"""PyTorch FSDP2 baseline: the same GPT-NeoX, data, batch, optimizer and schedule as train.py,
sharded by ``torch.distributed.fsdp.fully_shard`` instead of the zero_topo engine.

Launcher for :mod:`megatron_topo.commands.fsdp_baseline` (``--help`` lists the options).
"""

from megatron_topo.commands.fsdp_baseline import main

if __name__ == "__main__":
    raise SystemExit(main())
