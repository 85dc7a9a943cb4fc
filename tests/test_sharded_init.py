"""Sharded initialisation: the trainer builds the model on the meta device and the engine
materialises, initialises and shards one unit at a time. Initial values do not depend on the
world size or plan (equal, bit for bit, to ``build_model`` in one process), and the peak memory
of a rank during init is its model states plus about one unit, not the whole model."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from megatron_topo.config import ModelConfig, ZeroTopoConfig
from megatron_topo.model import build_model
from megatron_topo.topology import Topology
from megatron_topo.zero_topo.comm import Comm
from megatron_topo.zero_topo.engine import ZeroTopoEngine
from megatron_topo.zero_topo.sharding import resolve_plan

from .dist_utils import run_distributed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = dict(num_layers=3, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=64)


def _sharded(rank, world, preset):
    cfg = ModelConfig(**CFG)
    topo = Topology(world, 2, world // 2)
    model = build_model(cfg, device="meta")
    model.init_buffers("cpu")
    eng = ZeroTopoEngine(
        model,
        model.shard_units(),
        resolve_plan(ZeroTopoConfig(preset=preset), topo),
        Comm(topo, rank),
        precision="fp32",
        device="cpu",
        init=lambda unit: model.init_parameters(unit, 99),
    )
    return eng.full_parameters()


@pytest.mark.parametrize("world,preset", [(4, "topo"), (4, "zero3"), (2, "ddp"), (4, "zeropp")])
def test_initial_values_do_not_depend_on_world_or_plan(world, preset):
    got = run_distributed(_sharded, world, preset)[0]
    want = dict(build_model(ModelConfig(**CFG), seed=99).named_parameters())
    assert got.keys() == want.keys()
    for n, p in want.items():
        assert torch.equal(got[n], p.detach()), n


SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from megatron_topo.config import Config, ModelConfig
    from megatron_topo.topology import Topology
    from megatron_topo.training import Runtime, build_engine
    from megatron_topo.zero_topo.memory import padded_units
    torch.set_num_threads(1)
    W, R, legacy = 16, 5, sys.argv[1] == "legacy"
    dist.init_process_group("fake", store=FakeStore(), rank=R, world_size=W)
    cfg = Config()
    cfg.model = ModelConfig(num_layers=12, hidden_size=640, num_attention_heads=10, seq_length=64, vocab_size=8192)
    cfg.train.precision = "bf16"
    cfg.zero_topo.preset = "zero3"
    rt = Runtime(R, W, R % 8, Topology(W, 2, 4), torch.device("cpu"), True)
    def status(key):  # VmHWM / VmRSS in bytes (ru_maxrss would carry the parent's peak over exec)
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(key)
    warm = Config()  # first use of each op loads code and workspaces: not what is measured
    warm.model = ModelConfig(num_layers=1, hidden_size=16, num_attention_heads=2, seq_length=8, vocab_size=64)
    warm.train.precision, warm.zero_topo.preset = "bf16", "zero3"
    build_engine(warm, rt)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current RSS
    base = status("VmRSS")
    if legacy:  # what the trainer did before: the whole model, initialised, on every rank
        from megatron_topo.model import build_model
        model = build_model(cfg.model, device="cpu", seed=1)
        eng = build_engine(cfg, rt, model=model)
    else:
        eng = build_engine(cfg, rt)
    peak = status("VmHWM") - base
    st = eng.model_state_bytes()
    numels = [u.numel for u in eng.units]
    unit = max(padded_units(numels, eng.plan, W)) * 4
    print(json.dumps({"peak": peak, "states": st["total"], "unit": unit, "full": sum(numels) * 4}))
""")


def _measure(mode):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": REPO}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300, env=env, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_init_peak_is_states_plus_one_unit():
    m = _measure("sharded")
    assert m["full"] >= 3 * m["states"]  # the model's fp32 copy is several times a rank's states
    slack = 16 * 2**20  # allocator rounding, rotary buffers, Python objects
    assert m["peak"] <= m["states"] + m["unit"] + slack, m
    legacy = _measure("legacy")  # the old path: a whole fp32 model per rank first
    assert legacy["peak"] >= m["full"] > m["states"] + m["unit"] + slack, legacy
