"""The analysis side: what a plan costs without running it, and the measurements that check it.

``perf_model`` (memory, bytes per link level, step time, plan search), ``formulas`` (exact bytes per
rank, unit padding included), ``perf_sources`` (published measurements the model is checked
against), ``emulation`` (the emulated cluster and its step model) and ``autoplan``
(``zero_topo.preset: auto``). It imports the plan, topology and model shape; the training loop
imports only ``autoplan`` from it.
"""
