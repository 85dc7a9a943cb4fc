#!/usr/bin/env python
"""Generate tokens from a zero_topo checkpoint (one process, CPU or one GPU).

Launcher for :mod:`megatron_topo.commands.generate` (``--help`` lists the options).
"""

from megatron_topo.commands.generate import main

if __name__ == "__main__":
    raise SystemExit(main())
