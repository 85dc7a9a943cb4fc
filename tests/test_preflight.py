"""Preflight: before allocating, a run compares one rank's memory estimate (model states exactly
as the engine allocates them + activations + gathered units) with the device memory and stops
with one line naming both numbers and what would fit."""
import os
import subprocess
import sys

import pytest
import torch

from megatron_topo import preflight
from megatron_topo.config import ConfigError, load_config
from megatron_topo.topology import Topology
from megatron_topo.zero_topo.sharding import resolve_plan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = [os.path.join(REPO, f"configs/{f}.yml") for f in ("20B", "topo", "frontier")]


def test_20b_topo_on_one_node_is_refused_naming_the_numbers_and_what_fits():
    cfg = load_config(CFG)
    topo = Topology(8, 2, 4)
    with pytest.raises(ConfigError) as e:
        preflight.check(cfg, resolve_plan(cfg.zero_topo, topo), topo, torch.device("cpu"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("20.6B parameters under topo on 8 ranks need 67.0 GiB of model states per rank")
    assert "64.0 GiB available: use >= 16 ranks or preset zero3" in msg
    two = Topology(16, 2, 4)
    est = preflight.check(cfg, resolve_plan(cfg.zero_topo, two), two, torch.device("cpu"))
    assert est["model_states"] / 2**30 == pytest.approx(52.66, abs=0.01) and est["total"] <= 64 * 2**30


def test_no_system_block_on_cpu_skips_the_check():
    cfg = load_config(CFG[:2])
    assert preflight.device_memory_bytes(cfg, torch.device("cpu")) is None


def test_train_py_stops_before_allocating(tmp_path):
    log = tmp_path / "run"
    out = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), os.path.join(REPO, "configs/tiny.yml"),
                          "--set", "system.device_memory_gib=0.001", "--set", f"log_dir={log}",
                          "--set", f"save={tmp_path / 'ck'}"],
                         capture_output=True, text=True, timeout=300, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 2, out.stderr[-1500:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: 0.9M parameters under ddp on 1 ranks need"), lines
    assert "0.0 GiB available" in lines[0]
    assert not log.exists() and not (tmp_path / "ck").exists()  # nothing written
