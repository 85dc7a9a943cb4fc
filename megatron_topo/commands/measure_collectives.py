"""The entry point of tools/measure_collectives.py (``megatron-topo-measure-collectives``): importing it imports no
torch, so a Ctrl-C at any moment is the one ``error: interrupted`` line (cli.interruptible); the tool
itself, with its heavy imports, is :mod:`megatron_topo.commands.measure_collectives_run`, imported inside :func:`main`.
"""

from __future__ import annotations

from megatron_topo.cli import held_interrupt, interruptible


@interruptible
def main(argv=None) -> int:
    with held_interrupt():  # a Ctrl-C during torch's import is raised after it
        from megatron_topo.commands.measure_collectives_run import main as run

    return run(argv)


def __getattr__(name: str):
    """The tool's other names (its helpers, for tests) are those of the implementation module; a
    dunder is not (the import system asks for ``__path__`` and others: they import nothing)."""
    import importlib

    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    return getattr(importlib.import_module("megatron_topo.commands.measure_collectives_run"), name)


if __name__ == "__main__":
    raise SystemExit(main())
