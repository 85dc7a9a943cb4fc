#!/usr/bin/env python
"""Sharding strategies head to head on an emulated multi-node cluster (needs root: namespaces).

Launcher for :mod:`megatron_topo.commands.bench_sharding` (``--help`` lists the options).
"""

from megatron_topo.commands.bench_sharding import main

if __name__ == "__main__":
    raise SystemExit(main())
