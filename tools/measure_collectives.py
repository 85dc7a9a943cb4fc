#!/usr/bin/env python
"""Time all-gather and reduce-scatter over every rank and fit the performance model's ring constants.

Launcher for :mod:`megatron_topo.commands.measure_collectives` (``--help`` lists the options).
"""

from megatron_topo.commands.measure_collectives import main

if __name__ == "__main__":
    raise SystemExit(main())
