#!/usr/bin/env python
"""Merge a sharded zero_topo checkpoint into one full-state file (any plan, any world size).

Launcher for :mod:`megatron_topo.commands.consolidate_checkpoint` (``--help`` lists the options).
"""

from megatron_topo.commands.consolidate_checkpoint import main

if __name__ == "__main__":
    raise SystemExit(main())
