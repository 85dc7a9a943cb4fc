"""Accepted GPT-NeoX / DeepSpeed keys that change nothing here are never silent: a non-default
value is named in one note line at start (train.py and --dry-run)."""

import os
import subprocess
import sys

from megatron_topo.config import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_non_default_accepted_values_are_listed(tmp_path):
    f = tmp_path / "neox.yml"
    f.write_text(
        "num_workers: 2\nbias_gelu_fusion: true\n"
        "zero_optimization: {stage: 3, reduce_bucket_size: 2e8, allgather_bucket_size: 5e8}\n"
    )
    cfg = load_config([os.path.join(REPO, "configs/tiny.yml"), str(f)])
    # allgather_bucket_size 5e8 is DeepSpeed's default: nothing to say about it
    assert cfg.no_effect == ["bias_gelu_fusion=True", "num_workers=2", "zero_optimization.reduce_bucket_size=200000000"]
    assert load_config([os.path.join(REPO, "configs/tiny.yml")]).no_effect == []
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "train.py"),
            os.path.join(REPO, "configs/tiny.yml"),
            str(f),
            "--dry-run",
            "--world-size",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-1500:]
    notes = [x for x in out.stdout.splitlines() if x.startswith("note:")]
    assert notes == [
        "note: set but without effect in megatron_topo (docs/neox_compat.md): bias_gelu_fusion=True, "
        "num_workers=2, zero_optimization.reduce_bucket_size=200000000",
        "note: warmup 0.05 of train_iters 150 = 7.5 steps: 7 steps warm up (GPT-NeoX rounds down the same way; "
        "warmup_iters gives steps)",
    ]
