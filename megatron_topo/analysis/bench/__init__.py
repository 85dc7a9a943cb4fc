"""The sharding benchmark behind ``tools/bench_sharding.py`` and the engine-overhead benchmark behind
``tools/bench_model.py`` (their command lines: ``megatron_topo.commands.bench_sharding`` and
``megatron_topo.commands.bench_model``).

runs     what a run is: strategies, the train.py / fsdp_baseline.py command, the formula bytes
measure  one emulated run, one measured row (shaped, formula check, unshaped), rounds merged
report   results.json / results.md / plots
accum    the accumulation series and its CPU calibration
model_paths  bench_model's two paths: our engine and a plain PyTorch loop
"""
