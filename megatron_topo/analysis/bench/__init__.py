"""The sharding benchmark behind ``tools/bench_sharding.py`` and the engine-overhead benchmark behind
``tools/bench_model.py``.

runs     what a run is: strategies, the train.py / fsdp_baseline.py command, the formula bytes
measure  one emulated run, one measured row (shaped, formula check, unshaped), rounds merged
report   results.json / results.md / plots
accum    the accumulation series and its CPU calibration
cli      bench_sharding's options, main() and --pool
model    bench_model: our engine against a plain PyTorch loop (model_paths: the two paths)
"""
