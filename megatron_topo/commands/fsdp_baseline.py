"""tools/fsdp_baseline.py: the PyTorch FSDP2/HSDP baseline (:mod:`megatron_topo.commands.fsdp_train`
holds the program and its documentation; ``--help`` lists the options).

This module imports no torch: OMP_NUM_THREADS is checked before torch loads the OpenMP runtime,
which prints its own ``libgomp: Invalid value for environment variable OMP_NUM_THREADS`` line for a
bad value as it loads (the error line is then the only line)."""

from __future__ import annotations

from megatron_topo.cli import held_interrupt, interruptible
from megatron_topo.commands.fsdp_env import check_before_torch


@interruptible
def main(argv=None) -> int:
    if check_before_torch():
        return 2
    with held_interrupt():  # a Ctrl-C during torch's import is raised after it (cli.interruptible's line)
        from megatron_topo.commands.fsdp_train import main as run

    return run(argv)
