"""tools/measure_collectives.py and perf_sources.fit_ring: the measurement that feeds a cluster's
ring constants (alpha per step, beta per rank) to the performance model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megatron_topo.analysis.perf_sources import fit_ring
from tests.dist_utils import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(REPO, "tools", "measure_collectives.py")


def test_fit_ring_recovers_alpha_and_beta():
    pts = [(384, S, S * 383 / 384 / 50e9 + 383 * 85e-6) for S in (16e6, 64e6, 256e6, 1024e6)]
    f = fit_ring(pts)
    assert f["alpha_us"] == pytest.approx(85.0) and f["beta_gbs"] == pytest.approx(50.0)
    assert f["worst_rel_residual"] < 1e-9
    noisy = [(p, S, t * (1.05 if i % 2 else 0.95)) for i, (p, S, t) in enumerate(pts)]
    g = fit_ring(noisy)
    assert 0.04 < g["worst_rel_residual"] < 0.2 and g["alpha_us"] == pytest.approx(85.0, rel=0.3)
    with pytest.raises(ValueError, match="two different message sizes"):
        fit_ring(pts[:1])


def test_measures_and_fits_on_four_gloo_ranks(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "4",
        "--master-port",
        str(free_port()),
        TOOL,
        "--sizes-mb",
        "0.25,1",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--dtype",
        "fp32",
        "--out",
        str(tmp_path),
    ]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 ranks (1 node(s) x 4), gloo on cpu" in r.stdout and "alpha" in r.stdout
    assert "latency_inter_node_us" not in r.stdout  # one node: no inter-node constant to report
    data = json.loads((tmp_path / "collectives.json").read_text())
    assert data["world_size"] == 4 and data["backend"] == "gloo"
    assert [(x["op"], x["mb"]) for x in data["rows"]] == [
        ("all_gather", 0.25),
        ("all_gather", 1.0),
        ("reduce_scatter", 0.25),
        ("reduce_scatter", 1.0),
    ]
    for x in data["rows"]:
        assert x["bytes"] == int(x["mb"] * 2**20) and x["seconds"] > 0
        assert x["busbw_gbs"] == pytest.approx(x["algbw_gbs"] * 3 / 4)
    assert set(data["fit"]) == {"all_gather", "reduce_scatter"}
    assert not list(tmp_path.glob("*.tmp.*"))  # written atomically


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--sizes-mb", "16,x"], "--sizes-mb"),
        (["--sizes-mb", "0"], "positive"),
        (["--ops", "all_reduce"], "--ops"),
        (["--iters", "0"], "--iters"),
        ([], "one rank only"),
    ],
)
def test_bad_input_is_one_line(argv, msg):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID")}
    r = subprocess.run([sys.executable, TOOL, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, r.stderr
