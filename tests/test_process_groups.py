"""Process groups: the engine creates only the groups its plan sends over (each one it creates is
used in a training step, and every group a step uses exists), and each gets the run's
``distributed.collective_timeout_s`` (PyTorch's default otherwise: ``new_group`` without
``timeout=``). On 1d0c977 zero3 created the node and ZeRO++ peer groups it never used, and every
subgroup got the default timeout."""

import datetime

import pytest
import torch.distributed as dist

from megatron_topo.config import DistributedConfig, ZeroTopoConfig
from megatron_topo.model import build_model
from megatron_topo.zero_topo import trace as T
from megatron_topo.zero_topo.engine import ZeroTopoEngine
from megatron_topo.zero_topo.sharding import resolve_plan

from .dist_utils import run_distributed
from .engine_cases import batch, loss_fn, tiny_cfg
from .train_utils import local_runtime

WORLD = 8  # 2 nodes x 2 GPUs x 2 GCDs
TIMEOUT_S = 77.0


def _step(rank, world, zt, trace_dir):
    from megatron_topo.training.start import new_comm

    calls = []
    real = dist.new_group

    def new_group(ranks=None, timeout=None, **kw):
        calls.append((tuple(ranks), timeout))
        return real(ranks, timeout=timeout, **kw)

    dist.new_group = new_group
    rt = local_runtime(rank, world, gcds=2, gpus=2)
    comm = new_comm(rt, DistributedConfig(collective_timeout_s=TIMEOUT_S, trace_collectives=trace_dir))
    cfg = tiny_cfg()
    model = build_model(cfg, seed=7)
    eng = ZeroTopoEngine(model, model.shard_units(), resolve_plan(zt, rt.topo), comm, precision="fp32")
    for m in range(2):
        x, y = batch(0, rank, m, cfg=cfg)
        eng.backward(loss_fn(eng(x), y) / 2, last_micro_batch=m == 1)
    eng.step()
    for u in eng.units:
        u.wait_publish()
    comm.trace.close()
    return calls


@pytest.mark.parametrize("preset", ["topo", "zeropp", "zero3"])
def test_the_engine_creates_the_groups_its_plan_uses_and_no_other(preset, tmp_path):
    calls = run_distributed(_step, WORLD, ZeroTopoConfig(preset=preset), str(tmp_path))
    traces = T.load_traces(str(tmp_path))
    for rank, made in enumerate(calls):
        assert all(t == datetime.timedelta(seconds=TIMEOUT_S) for _, t in made), made  # the run's timeout
        created = {g for g, _ in made if rank in g}
        used = {tuple(r["group"]) for r in traces[rank]} - {tuple(range(WORLD))}  # the world is no new group
        assert created == used, (preset, rank, sorted(created - used), sorted(used - created))
    assert calls[0] == calls[-1]  # every rank created the same groups in the same order
