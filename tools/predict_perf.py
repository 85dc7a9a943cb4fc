#!/usr/bin/env python
"""Predicted TFLOPS/GCD of sharding presets across scales (megatron_topo.analysis.perf_model).

Launcher for :mod:`megatron_topo.commands.predict_perf` (``--help`` lists the options).
"""

from megatron_topo.commands.predict_perf import main

if __name__ == "__main__":
    raise SystemExit(main())
