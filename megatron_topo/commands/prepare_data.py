"""Build a run's dataset caches once, in one process, before the job starts its ranks.

    python tools/prepare_data.py CONFIG.yml [MORE.yml ...] --world-size N [--set KEY=VALUE ...]

Takes train.py's configs and overrides plus the number of ranks the run will have, and builds
what rank 0 would otherwise build while every other rank waits in a barrier: the built-in corpus
(``data_path: builtin``), the token-id range scan of each dataset, and the document / sample /
shuffle indices for the run's sample counts (which depend on the world size). Everything lands in
``data_cache_dir`` (default ``data_cache/`` of the working directory), where the trainer then
finds it. Run it on a login node or as the first step of the batch job (slurm/ does the latter:
a no-op when the caches are there).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from megatron_topo.cli import OneLineParser, fail, interruptible, number, path_arg
from megatron_topo.error_lines import clean


@interruptible(preload=("numpy",))
def main(argv=None) -> int:
    ap = OneLineParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage_line="python tools/prepare_data.py CONFIG.yml [MORE.yml ...] --world-size N [--set KEY=VALUE ...]",
    )
    ap.add_argument("configs", type=path_arg, nargs="+", help="YAML files merged in order (as for train.py)")
    ap.add_argument("--world-size", type=number(int), required=True, help="ranks of the run the caches are for")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    from megatron_topo.topology import MAX_WORLD_SIZE

    if not 1 <= args.world_size <= MAX_WORLD_SIZE:
        print(
            f"error: --world-size {args.world_size}: expected the run's number of ranks, 1..{MAX_WORLD_SIZE:,} (2**20)",
            file=sys.stderr,
        )
        return 2

    from megatron_topo.config import ConfigError, load_config
    from megatron_topo.config.output import check_cache_dir
    from megatron_topo.data import DataError, build_datasets
    from megatron_topo.training import dataset_num_samples

    try:
        cfg = load_config(args.configs, args.overrides)
        check_cache_dir(
            cfg, own_folders=(None, None)
        )  # a folder; no checkpoint, HF export or run's folder; no linked index/
        n = dataset_num_samples(cfg, args.world_size)
        t0 = time.perf_counter()
        splits = build_datasets(
            cfg.data,
            seq_length=cfg.model.seq_length,
            seed=cfg.train.seed,
            num_samples=n,
            vocab_size=cfg.model.vocab_size,
            is_builder=True,
            barrier=None,
        )
    except (ConfigError, DataError) as e:
        return fail(e)
    except OSError as e:
        print(clean(f"error: {e.filename or ''}: {e.strerror or e}"), file=sys.stderr)
        return 2
    sizes = ", ".join(
        f"{name} {len(ds) if ds is not None else 0}" for name, ds in zip(("train", "valid", "test"), splits)
    )
    cache = cfg.data.data_cache_dir or "data_cache"
    print(
        f"data ready for {args.world_size} ranks in {time.perf_counter() - t0:.1f} s: {sizes} samples "
        f"(caches in {os.path.abspath(cache)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
