"""Mixed-precision AdamW on flat fp32 master shards (PyTorch's own AdamW does the math).

Weight decay is decoupled (AdamW) and applied only to the ranges of a shard that belong to
matrices (not biases or norms), exactly as two parameter groups would in an unsharded run.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn as nn


def _fused_ok(device: torch.device) -> bool:
    return device.type in ("cuda", "cpu")


class ShardedAdamW:
    def __init__(
        self,
        shards: list[torch.Tensor],
        decay_ranges: list[list[tuple[int, int]]],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> None:
        # the shards become the masters (no copy: the engine hands over fresh fp32 tensors, and a
        # copy would double the optimizer's largest state while both exist)
        self.params = [nn.Parameter(s.detach() if s.dtype == torch.float32 else s.detach().float()) for s in shards]
        self.decay_ranges = decay_ranges
        self.weight_decay = weight_decay
        dev = self.params[0].device
        self.fused = _fused_ok(dev)
        self.opt = torch.optim.AdamW(self.params, lr=lr, betas=betas, eps=eps, weight_decay=0.0, fused=self.fused)
        # allocate the moments now, as torch would lazily at the first step: memory is known up
        # front (no surprise out-of-memory at step 1) and checkpoints always have them
        for p in self.params:
            self.opt.state[p] = {
                "step": self._step_tensor(0.0, p.device),
                "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p),
            }

    def _step_tensor(self, value: float, device: torch.device) -> torch.Tensor:
        return torch.tensor(float(value), dtype=torch.float32, device=device if self.fused else "cpu")

    @property
    def lr(self) -> float:
        return self.opt.param_groups[0]["lr"]

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], lr: float | None = None) -> None:
        if lr is not None:
            for g in self.opt.param_groups:
                g["lr"] = lr
        lr_now = self.lr
        for p, g, ranges in zip(self.params, grads, self.decay_ranges):
            p.grad = g if g.dtype == torch.float32 else g.float()
            if self.weight_decay:
                factor = 1.0 - lr_now * self.weight_decay
                for a, b in ranges:
                    p[a:b].mul_(factor)
        if self.params[0].device.type != "meta":  # the dry run: a fused in-place update allocates nothing
            self.opt.step()
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        total = sum(p.untyped_storage().nbytes() for p in self.params)
        for st in self.opt.state.values():
            for v in st.values():
                if torch.is_tensor(v) and v.numel() > 1:
                    total += v.untyped_storage().nbytes()
        return total

    def shard_state(self, i: int) -> dict[str, Optional[torch.Tensor]]:
        st = self.opt.state.get(self.params[i], {})
        return {
            "master": self.params[i].detach(),
            "exp_avg": st.get("exp_avg"),
            "exp_avg_sq": st.get("exp_avg_sq"),
            "step": st.get("step"),
        }

    def load_shard_state(
        self,
        i: int,
        master: torch.Tensor,
        exp_avg: Optional[torch.Tensor],
        exp_avg_sq: Optional[torch.Tensor],
        step: Union[float, torch.Tensor, None],
    ) -> None:
        p = self.params[i]
        with torch.no_grad():
            p.copy_(master)
        if exp_avg is not None:
            self.opt.state[p] = {
                "step": self._step_tensor(float(step), p.device),
                "exp_avg": exp_avg.clone().to(p.device),
                "exp_avg_sq": exp_avg_sq.clone().to(p.device),
            }
