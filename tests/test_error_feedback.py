"""Error feedback (``zero_topo.error_feedback``): the residual of each low-bit gradient
quantization (the in-node INT4 reduction, the INT8 combine) is added to the next one. The
residuals are real state: they live in checkpoints, so a stop and resume on the same world and
plan continues bit for bit, and dropping them changes the run."""

import torch

from megatron_topo.topology import Topology
from megatron_topo.training import Runtime, Trainer

from .dist_utils import run_distributed
from .train_utils import datasets, small_config


def _run(rank, world, tmp, tag, until, load, drop_residuals=False):
    cfg = small_config(tmp, **{"train.train_iters": 4, "train.gradient_accumulation_steps": 2})
    z = cfg.zero_topo
    z.preset, z.combine_bits, z.publish_bits, z.error_feedback = "topo", 8, 8, True
    z.quant_block_size = z.grad_quant_block_size = 64
    cfg.logging.log_dir = str(tmp / tag)
    cfg.checkpoint.save, cfg.checkpoint.load = str(tmp / f"ck_{tag}"), load
    rt = Runtime(rank, world, rank, Topology(world, 2, 1), torch.device("cpu"), True)  # 2 nodes x 1 GPU x 2 GCDs
    tr = Trainer(cfg, rt, datasets=datasets(cfg))
    if drop_residuals:
        for u in tr.engine.units:
            u.reset_residuals()
    tr.train(until=until)
    res = [
        (None if u.ef_reduce is None else u.ef_reduce.clone(), None if u.ef_combine is None else u.ef_combine.clone())
        for u in tr.engine.units
    ]
    return tr.engine.full_parameters(), res


def test_residuals_are_kept_and_resume_is_exact(tmp_path):
    straight, res = run_distributed(_run, 4, tmp_path, "straight", None, None)[0]
    for r, c in res:  # every unit has both residuals, finite and not all zero
        assert r is not None and c is not None and torch.isfinite(r).all() and torch.isfinite(c).all()
        assert r.abs().sum() > 0 and c.abs().sum() > 0
    run_distributed(_run, 4, tmp_path, "first", 2, None)
    resumed, _ = run_distributed(_run, 4, tmp_path, "second", None, str(tmp_path / "ck_first"))[0]
    for n, p in straight.items():
        assert torch.equal(resumed[n], p), n
    dropped, _ = run_distributed(_run, 4, tmp_path, "dropped", None, str(tmp_path / "ck_first"), True)[0]
    assert any(not torch.equal(dropped[n], p) for n, p in straight.items())
