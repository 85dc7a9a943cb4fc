#!/usr/bin/env python
"""Dry-run every GPT-NeoX config file under a folder, unchanged, and print which pass and why not.

Launcher for :mod:`megatron_topo.commands.check_neox_configs` (``--help`` lists the options).
"""

from megatron_topo.commands.check_neox_configs import main

if __name__ == "__main__":
    raise SystemExit(main())
