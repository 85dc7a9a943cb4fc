#!/usr/bin/env python
"""Throughput of the block-quantization kernels vs a plain ``copy_`` of the same bytes.

Launcher for :mod:`megatron_topo.commands.bench_kernels` (``--help`` lists the options).
"""

from megatron_topo.commands.bench_kernels import main

if __name__ == "__main__":
    raise SystemExit(main())
