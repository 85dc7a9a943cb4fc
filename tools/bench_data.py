#!/usr/bin/env python
"""Preprocessing throughput: MB/s of input text and tokens/s with 1 and 2 workers.

Launcher for :mod:`megatron_topo.commands.bench_data` (``--help`` lists the options).
"""

from megatron_topo.commands.bench_data import main

if __name__ == "__main__":
    raise SystemExit(main())
