#!/usr/bin/env python
"""Plot loss, TFLOPS/GPU and tokens/s against step for one or more runs, side by side.

Launcher for :mod:`megatron_topo.commands.plot_metrics` (``--help`` lists the options).
"""

from megatron_topo.commands.plot_metrics import main

if __name__ == "__main__":
    raise SystemExit(main())
