#!/usr/bin/env python
"""Memory and strategy planner: model-state memory of every preset, the largest model each fits,
and the fastest legal sharding plan under the device memory (modelled step time).

Launcher for :mod:`megatron_topo.commands.plan` (``--help`` lists the options).
"""

from megatron_topo.commands.plan import main

if __name__ == "__main__":
    raise SystemExit(main())
