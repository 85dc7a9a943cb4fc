#!/usr/bin/env python
"""Training throughput of our path (GPTNeoX inside ZeroTopoEngine, ``ddp`` plan, one process)
against a minimal plain-PyTorch GPT-NeoX loop, on the same batch, precision and CPU threads.

Launcher for :mod:`megatron_topo.commands.bench_model` (``--help`` lists the options).
"""

from megatron_topo.commands.bench_model import main

if __name__ == "__main__":
    raise SystemExit(main())
