#!/usr/bin/env python
"""Convert a zero_topo checkpoint into a HuggingFace ``GPTNeoXForCausalLM`` directory.

Launcher for :mod:`megatron_topo.commands.convert_to_hf` (``--help`` lists the options).
"""

from megatron_topo.commands.convert_to_hf import main

if __name__ == "__main__":
    raise SystemExit(main())
