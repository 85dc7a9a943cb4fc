#!/usr/bin/env python
"""Error of the engine's fp16 gradient path against an fp32 one (docs/design.md §4.6, "fp16").

Launcher for :mod:`megatron_topo.commands.fp16_gradient_error` (``--help`` lists the options).
"""

from megatron_topo.commands.fp16_gradient_error import main

if __name__ == "__main__":
    raise SystemExit(main())
