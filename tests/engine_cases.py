"""Shared pieces of the engine tests: a tiny model, data, and the single-process reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron_topo.config import ModelConfig, ZeroTopoConfig
from megatron_topo.model import build_model
from megatron_topo.topology import Topology
from megatron_topo.zero_topo.comm import Comm
from megatron_topo.zero_topo.engine import ZeroTopoEngine
from megatron_topo.zero_topo.sharding import resolve_plan

# the architecture stated explicitly (the defaults follow GPT-NeoX's since issue 15)
TINY = dict(
    num_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    seq_length=16,
    vocab_size=64,
    rotary_pct=0.25,
    gpt_j_residual=True,
    no_weight_tying=True,
    init_method="small_init",
    output_layer_init_method="wang_init",
)
# eps 1e-4: the key bias has an exactly-zero true gradient (softmax is shift invariant), so its
# computed gradient is summation-order noise that Adam with a tiny eps would blow up to +-lr.
LR, WD, CLIP, BETAS, EPS = 1e-2, 0.1, 1.0, (0.9, 0.95), 1e-4


def tiny_cfg(**kw) -> ModelConfig:
    return ModelConfig(**{**TINY, **kw})


def batch(step: int, rank: int, micro: int, mb: int = 2, cfg: ModelConfig | None = None):
    cfg = cfg or tiny_cfg()
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    ids = torch.randint(0, cfg.vocab_size, (mb, cfg.seq_length + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def loss_fn(logits, y):
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def make_engine(rank, world, zcfg: ZeroTopoConfig, precision="fp32", gcds=2, gpus=2, cfg=None, **kw):
    cfg = cfg or tiny_cfg()
    topo = Topology(world, gcds, gpus)
    plan = resolve_plan(zcfg, topo)
    model = build_model(cfg, seed=7)
    comm = Comm(topo, rank)
    eng = ZeroTopoEngine(
        model,
        model.shard_units(),
        plan,
        comm,
        precision=precision,
        lr=LR,
        betas=BETAS,
        eps=EPS,
        weight_decay=WD,
        grad_clip=CLIP,
        **kw,
    )
    return eng


def train_steps(eng, rank, steps=5, accum=2, overlap=True):
    """``overlap``: tell the engine which backward is the step's last, so the cross-replica
    combine overlaps it (what the trainer does); False exercises the combine-in-step path."""
    losses = []
    for step in range(steps):
        tot = 0.0
        for m in range(accum):
            x, y = batch(step, rank, m, cfg=eng.module.cfg)
            loss = loss_fn(eng(x), y) / accum
            eng.backward(loss, last_micro_batch=overlap and m == accum - 1)
            tot += loss.item()
        eng.step()
        losses.append(tot)
    return losses


def reference(world, steps=5, accum=2, cfg=None):
    """Unsharded single-process training on the union of every rank's micro-batches."""
    cfg = cfg or tiny_cfg()
    model = build_model(cfg, seed=7)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS
    )
    for step in range(steps):
        for r in range(world):
            for m in range(accum):
                x, y = batch(step, r, m, cfg=cfg)
                (loss_fn(model(x), y) / (accum * world)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}
