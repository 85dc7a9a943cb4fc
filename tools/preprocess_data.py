#!/usr/bin/env python
"""Tokenize a corpus into GPT-NeoX/Megatron mmap datasets: {PREFIX}_{key}_document.bin/.idx.

Launcher for :mod:`megatron_topo.commands.preprocess_data` (``--help`` lists the options).
"""

from megatron_topo.commands.preprocess_data import main

if __name__ == "__main__":
    raise SystemExit(main())
