#!/usr/bin/env python
"""Convergence with quantized communication, like ZeRO++'s accuracy table: the tiny GPT on the
built-in corpus, 8 local ranks (2 nodes x 2 GPUs x 2 GCDs), one run per variant, same data/seed.

Launcher for :mod:`megatron_topo.commands.bench_convergence` (``--help`` lists the options).
"""

from megatron_topo.commands.bench_convergence import main

if __name__ == "__main__":
    raise SystemExit(main())
