"""Every tensor the trainer, the engine, the checkpoint code and the metrics hand to a collective
lives on the runtime device.

Harness: PyTorch's fake process group bound to the GPU device type only ("cuda:fake"), as an
NCCL/RCCL group is: it refuses a host tensor with "No backend type associated with device type
cpu". The runtime device is the meta device (no GPU here); the fake group accepts meta tensors,
so everything placed on the runtime device passes and anything left on the host fails. Data
reads of meta tensors (``.item()``, ``.tolist()``, ``.cpu()``) return zeros, standing in for a
GPU's values. The real trainer paths run: steps with accumulation, eval, logging, periodic and
final saves, resume, and the overflow path (a step whose agreed flag says non-finite)."""

import json

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from megatron_topo.topology import Topology
from megatron_topo.training import Runtime, Trainer

from .train_utils import datasets, small_config

WORLD, RANK = 8, 0


@pytest.fixture
def gpu_like_group(monkeypatch):
    def zeros_like_host(t):
        return torch.zeros(t.shape, dtype=t.dtype)

    for name, read in (
        ("item", lambda t: zeros_like_host(t).item()),
        ("tolist", lambda t: zeros_like_host(t).tolist()),
        ("cpu", lambda t, *a, **k: zeros_like_host(t)),
    ):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            (lambda real, read: lambda self, *a, **k: read(self, *a, **k) if self.is_meta else real(self, *a, **k))(
                real, read
            ),
        )
    dist.init_process_group("cuda:fake", store=FakeStore(), rank=RANK, world_size=WORLD)
    try:
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(torch.zeros(1))  # the harness really refuses host tensors
        yield
    finally:
        dist.destroy_process_group()


def _cfg(tmp_path, **kw):
    cfg = small_config(tmp_path, **{"train.gradient_accumulation_steps": 2, "train.train_iters": 4, **kw})
    cfg.zero_topo.preset = "topo"
    cfg.zero_topo.quant_block_size = cfg.zero_topo.grad_quant_block_size = 64
    cfg.topology.gcds_per_gpu, cfg.topology.gpus_per_node = 2, 2
    cfg.logging.eval_interval, cfg.logging.eval_iters = 2, 1
    cfg.checkpoint.save, cfg.checkpoint.checkpoint_factor = str(tmp_path / "ck"), 2
    return cfg


def _runtime():
    return Runtime(RANK, WORLD, RANK % 4, Topology(WORLD, 2, 2), torch.device("meta"), True)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_trainer_paths_hand_collectives_only_device_tensors(tmp_path, gpu_like_group, precision):
    cfg = _cfg(tmp_path, **{"train.precision": precision})
    tr = Trainer(cfg, _runtime(), datasets=datasets(cfg))
    first = tr.train()
    assert tr.state.step == 4 and first["checkpoint"].endswith("global_step4")
    lines = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in lines] == [1, 2, 3, 4] and "eval_loss" in lines[1]
    # resume from the checkpoint, then a step whose agreed overflow flag is set
    cfg2 = _cfg(tmp_path, **{"train.precision": precision, "train.train_iters": 6})
    cfg2.checkpoint.load = str(tmp_path / "ck")
    tr2 = Trainer(cfg2, _runtime(), datasets=datasets(cfg2))
    assert tr2.state.step == 4
    comm, real_host = tr2.engine.comm, tr2.engine.comm.to_host
    calls = {"n": 0}

    def overflow_once(t):  # the step's first host read is (norm^2, non-finite flag)
        out = real_host(t)
        if t.numel() == 2 and calls["n"] == 0:
            calls["n"] += 1
            out = torch.tensor([0.0, 1.0], dtype=out.dtype)
        return out

    comm.to_host = overflow_once
    stats = tr2.train_step()
    assert stats["skipped"] and calls["n"] == 1
    comm.to_host = real_host
    tr2.train()
    assert tr2.state.step == 6
