#!/usr/bin/env python
"""PyTorch FSDP2 baseline: the same GPT-NeoX, data, batch, optimizer and schedule as train.py,
sharded by ``torch.distributed.fsdp.fully_shard`` instead of the zero_topo engine.

Launcher for :mod:`megatron_topo.commands.fsdp_baseline` (``--help`` lists the options).
"""

from megatron_topo.commands.fsdp_env import check_before_torch


def main(argv=None) -> int:
    from megatron_topo.commands.fsdp_baseline import main as run

    return run(argv)


if __name__ == "__main__":
    # OMP_NUM_THREADS before torch loads OpenMP (libgomp prints its own complaint about a bad value)
    if check_before_torch():
        raise SystemExit(2)
    raise SystemExit(main())
