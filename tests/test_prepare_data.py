"""tools/prepare_data.py: the index caches a run needs, built ahead of it by one process, are the
ones every rank then loads without building (is_builder=False), for the run's world size."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from megatron_topo.config import load_config
from megatron_topo.data import DataError, build_datasets
from megatron_topo.training import dataset_num_samples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "prepare_data.py")


def _sets(cache):
    return ["--set", f"data_cache_dir={cache}", "--set", "builtin_corpus_bytes=100000", "--set", "train_iters=7"]


def _load(cache, world):
    cfg = load_config(
        [os.path.join(ROOT, "configs", "tiny.yml")],
        [f"data_cache_dir={cache}", "builtin_corpus_bytes=100000", "train_iters=7"],
    )
    return build_datasets(
        cfg.data,
        seq_length=cfg.model.seq_length,
        seed=cfg.train.seed,
        num_samples=dataset_num_samples(cfg, world),
        vocab_size=cfg.model.vocab_size,
        is_builder=False,
    )


def test_prepared_caches_are_what_the_ranks_load(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match="missing after the barrier"):
        _load(cache, 4)  # nothing prepared: a non-builder rank cannot build
    r = subprocess.run(
        [sys.executable, TOOL, os.path.join(ROOT, "configs", "tiny.yml"), "--world-size", "4", *_sets(cache)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("data ready for 4 ranks") and str(cache) in r.stdout
    train, valid, _ = _load(cache, 4)  # every rank finds them
    assert (
        len(train)
        >= dataset_num_samples(load_config([os.path.join(ROOT, "configs", "tiny.yml")], ["train_iters=7"]), 4)[0]
    )
    with pytest.raises(DataError, match="index cache (missing|stale)"):
        _load(cache, 6)  # the sample index depends on the world size: prepared for 4, not 6


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--world-size", "0"], "--world-size 0"),
        ([], "--world-size"),
        (["--world-size", "2", "--set", "nope=1"], "unknown key"),
    ],
)
def test_bad_arguments_are_one_error_line(tmp_path, argv, msg):
    r = subprocess.run(
        [sys.executable, TOOL, os.path.join(ROOT, "configs", "tiny.yml"), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], r.stderr
