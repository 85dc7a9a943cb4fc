#!/usr/bin/env python
"""The one-node check before a big job: kernels bit for bit, every communicator live at once,
one collective order on every rank, one training step with the job's plan, replicated shards
equal, device memory against the dry run; one table, exit 1 on any failure.

Launcher for :mod:`megatron_topo.commands.gpu_check` (``--help`` lists the options).
"""

from megatron_topo.commands.gpu_check import main

if __name__ == "__main__":
    raise SystemExit(main())
