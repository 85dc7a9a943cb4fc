"""tools/fsdp_baseline.py: the PyTorch FSDP2/HSDP baseline (:mod:`megatron_topo.commands.fsdp_train`
holds the program and its documentation; ``--help`` lists the options)."""

from __future__ import annotations


def main(argv=None) -> int:
    from megatron_topo.commands.fsdp_train import main as run

    return run(argv)
