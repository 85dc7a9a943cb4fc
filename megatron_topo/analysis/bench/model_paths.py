"""The two paths tools/bench_model.py times: ours (our GPT-NeoX inside ZeroTopoEngine, ``ddp`` plan,
one process) and plain (a self-contained nanoGPT-style GPT-NeoX with ``torch.optim.AdamW``)."""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

from megatron_topo.config import ModelConfig, ZeroTopoConfig

# the plain loop's AdamW implementations (--plain-optimizer)
OPT_IMPL = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}


# ============================================================================ plain GPT-NeoX
class PlainBlock(nn.Module):
    """One GPT-NeoX layer, written nanoGPT style (parameters in the same order as ours)."""

    def __init__(self, h: int, n_head: int, eps: float, parallel: bool):
        super().__init__()
        self.n_head, self.hd, self.parallel = n_head, h // n_head, parallel
        self.ln_1 = nn.LayerNorm(h, eps=eps)
        self.ln_2 = nn.LayerNorm(h, eps=eps)
        self.c_attn = nn.Linear(h, 3 * h)  # packed per head: [q_i, k_i, v_i] for head i
        self.c_proj = nn.Linear(h, h)
        self.c_fc = nn.Linear(h, 4 * h)
        self.c_out = nn.Linear(4 * h, h)

    @staticmethod
    def rope(t, cos, sin):
        rd = cos.shape[-1]
        if rd == 0:
            return t
        r, keep = t[..., :rd], t[..., rd:]
        a, b = r[..., : rd // 2], r[..., rd // 2 :]
        c1, s1 = cos[..., : rd // 2], sin[..., : rd // 2]
        return torch.cat((a * c1 - b * s1, b * c1 + a * s1, keep), dim=-1)

    def attn(self, x, cos, sin):
        B, T, C = x.shape
        qkv = self.c_attn(x).view(B, T, self.n_head, 3 * self.hd).transpose(1, 2)
        q, k, v = qkv.split(self.hd, dim=-1)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    def mlp(self, x):
        return self.c_out(F.gelu(self.c_fc(x)))

    def forward(self, x, cos, sin):
        if self.parallel:
            return x + self.attn(self.ln_1(x), cos, sin) + self.mlp(self.ln_2(x))
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class PlainGPTNeoX(nn.Module):
    """GPT-NeoX from PlainBlocks: embedding, layers, final LayerNorm, untied head; rotary tables as buffers."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.wte = nn.Embedding(cfg.vocab_size, h)
        self.h = nn.ModuleList(
            PlainBlock(h, cfg.num_attention_heads, cfg.layernorm_epsilon, cfg.gpt_j_residual)
            for _ in range(cfg.num_layers)
        )
        self.ln_f = nn.LayerNorm(h, eps=cfg.layernorm_epsilon)
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False)
        self.recompute = cfg.checkpoint_activations
        hd = h // cfg.num_attention_heads
        rd = int(hd * cfg.rotary_pct)
        rd -= rd % 2
        inv = 1.0 / (cfg.rotary_emb_base ** (torch.arange(0, rd, 2).float() / max(rd, 1)))
        ang = torch.outer(torch.arange(cfg.seq_length).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.wte(idx)
        for blk in self.h:
            if self.recompute and self.training:
                x = torch.utils.checkpoint.checkpoint(blk, x, cos, sin, use_reentrant=False)
            else:
                x = blk(x, cos, sin)
        return self.lm_head(self.ln_f(x))


def loss_fn(logits, y):
    """Cross-entropy over every position, in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


# ============================================================================ the two paths
class Ours:
    """Our model inside ZeroTopoEngine with the ``ddp`` plan on one process."""

    name = "ours"

    def __init__(self, cfg: ModelConfig, args):
        from megatron_topo.model import build_model
        from megatron_topo.topology import Topology
        from megatron_topo.zero_topo.comm import Comm
        from megatron_topo.zero_topo.engine import ZeroTopoEngine
        from megatron_topo.zero_topo.sharding import resolve_plan

        topo = Topology(world_size=1, gcds_per_gpu=1, gpus_per_node=1)
        plan = resolve_plan(ZeroTopoConfig(preset="ddp"), topo)
        self.model = build_model(cfg, "cpu", seed=args.seed)
        self.init_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.engine = ZeroTopoEngine(
            self.model,
            self.model.shard_units(),
            plan,
            Comm(topo, 0, distributed=False),
            precision=args.precision,
            lr=args.lr,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=args.weight_decay,
            grad_clip=args.clip,
        )
        self.engine.train()
        self.lr = args.lr

    def step(self, x, y, times):
        t0 = time.perf_counter()
        loss = loss_fn(self.engine(x), y)
        t1 = time.perf_counter()
        self.engine.backward(loss, last_micro_batch=True)
        t2 = time.perf_counter()
        self.engine.step(self.lr)
        t3 = time.perf_counter()
        times.append((t1 - t0, t2 - t1, t3 - t2))
        return loss.item()


class Plain:
    """The plain model from our initial weights, with torch.optim.AdamW and clip_grad_norm_."""

    name = "plain"

    def __init__(self, cfg: ModelConfig, args, init_params: list[torch.Tensor]):
        self.model = PlainGPTNeoX(cfg)
        params = list(self.model.parameters())
        if len(params) != len(init_params):
            raise RuntimeError(f"plain model has {len(params)} parameter tensors, ours {len(init_params)}")
        with torch.no_grad():
            for p, q in zip(params, init_params):
                if p.shape != q.shape:
                    raise RuntimeError(f"plain/ours parameter shape mismatch {tuple(p.shape)} vs {tuple(q.shape)}")
                p.copy_(q)
        self.pure_bf16 = args.precision == "bf16" and args.plain_bf16 == "pure"
        if self.pure_bf16:
            self.model.to(torch.bfloat16)
        self.autocast = args.precision == "bf16" and not self.pure_bf16
        named = list(self.model.named_parameters())
        decay = [p for n, p in named if p.ndim >= 2 and "ln" not in n]
        no_decay = [p for n, p in named if not (p.ndim >= 2 and "ln" not in n)]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=args.lr,
            betas=(0.9, 0.95),
            eps=1e-8,
            **OPT_IMPL[args.plain_optimizer],
        )
        self.clip = args.clip
        self.model.train()

    def step(self, x, y, times):
        t0 = time.perf_counter()
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if self.autocast else nullcontext()
        with ctx:
            logits = self.model(x)
        loss = loss_fn(logits, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        times.append((t1 - t0, t2 - t1, t3 - t2))
        return loss.item()
