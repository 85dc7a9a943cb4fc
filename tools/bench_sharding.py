#!/usr/bin/env python
"""Sharding strategies head to head on an emulated multi-node cluster (needs root: namespaces).

Launcher for :mod:`megatron_topo.analysis.bench.cli` (``--help`` lists the options).
"""
from megatron_topo.analysis.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
