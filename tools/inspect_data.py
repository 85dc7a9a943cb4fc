#!/usr/bin/env python
"""Look inside a GPT-NeoX/Megatron mmap dataset (PREFIX.bin + PREFIX.idx).

Launcher for :mod:`megatron_topo.commands.inspect_data` (``--help`` lists the options).
"""

from megatron_topo.commands.inspect_data import main

if __name__ == "__main__":
    raise SystemExit(main())
