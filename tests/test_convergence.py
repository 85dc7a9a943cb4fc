"""300 steps of the tiny GPT on the built-in data: quantized topo (INT8 weights, INT4 gradients)
ends within 2% of unquantized topo. Slow (two 8-rank runs): `pytest -m slow tests/test_convergence.py`."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 300


def run(tmp, tag, *extra):
    log = tmp / tag
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "torchrun"),
        "--standalone",
        "--nproc_per_node",
        "8",
        "train.py",
        "configs/tiny.yml",
        "configs/topo.yml",
        "configs/local_cpu.yml",
        "--set",
        f"train_iters={STEPS}",
        "--set",
        f"log_dir={log}",
        "--set",
        "save=null",
        "--set",
        "eval_interval=0",
        "--set",
        "log_interval=10",
        "--set",
        "progress_bar=false",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=1800)
    return [json.loads(x) for x in open(log / "metrics.jsonl")]


@pytest.mark.slow
def test_quantized_topo_converges_like_unquantized(tmp_path):
    q = run(tmp_path, "quantized")
    f = run(
        tmp_path,
        "exact",
        "--set",
        "zero_topo.weight_bits=16",
        "--set",
        "zero_topo.secondary_bits=16",
        "--set",
        "zero_topo.grad_bits=16",
    )
    # average the last 3 logged windows (30 steps) to compare levels, not noise
    lq = sum(r["loss"] for r in q[-3:]) / 3
    lf = sum(r["loss"] for r in f[-3:]) / 3
    print(f"loss after {STEPS} steps: quantized {lq:.4f}, unquantized {lf:.4f}, ratio {lq / lf:.4f}")
    assert abs(lq - lf) / lf < 0.02
