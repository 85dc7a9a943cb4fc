#!/usr/bin/env python
"""Build a run's dataset caches once, in one process, before the job starts its ranks.

Launcher for :mod:`megatron_topo.commands.prepare_data` (``--help`` lists the options).
"""

from megatron_topo.commands.prepare_data import main

if __name__ == "__main__":
    raise SystemExit(main())
