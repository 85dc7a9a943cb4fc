"""The entry point of tools/fp16_gradient_error.py (``megatron-topo-fp16-gradient-error``): importing it imports no
torch, so a Ctrl-C at any moment is the one ``error: interrupted`` line (cli.interruptible); the tool
itself, with its heavy imports, is :mod:`megatron_topo.commands.fp16_gradient_error_run`, imported inside :func:`main`.
"""

from __future__ import annotations

from megatron_topo.cli import light_entry

main, __getattr__ = light_entry("megatron_topo.commands.fp16_gradient_error_run")

if __name__ == "__main__":
    raise SystemExit(main())
