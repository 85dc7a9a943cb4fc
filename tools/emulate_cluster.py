#!/usr/bin/env python
"""Run a command as an emulated multi-node job: one network namespace per GPU package.

Launcher for :mod:`megatron_topo.commands.emulate_cluster` (``--help`` lists the options).
"""

from megatron_topo.commands.emulate_cluster import main

if __name__ == "__main__":
    raise SystemExit(main())
