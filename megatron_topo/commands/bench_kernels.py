"""The entry point of tools/bench_kernels.py (``megatron-topo-bench-kernels``): importing it imports no
torch, so a Ctrl-C at any moment is the one ``error: interrupted`` line (cli.interruptible); the tool
itself, with its heavy imports, is :mod:`megatron_topo.commands.bench_kernels_run`, imported inside :func:`main`.
"""

from __future__ import annotations

from megatron_topo.cli import light_entry

main, __getattr__ = light_entry("megatron_topo.commands.bench_kernels_run")

if __name__ == "__main__":
    raise SystemExit(main())
