"""Error of the engine's fp16 gradient path against an fp32 one (docs/design.md §4.6, "fp16").

    python tools/fp16_gradient_error.py [--worlds 8 64 384] [--micro-batch 4]

The tiny GPT (configs/tiny.yml), one random micro-batch per rank; every rank's parameter gradient
is taken in fp16 at the loss scale the dynamic scaler settles at (the largest power of two
without overflow). Against the fp64 mean of those same fp16 gradients it prints the relative L2
error and the share of nonzero values flushed to zero of:

- the engine's reduction: each rank divides by W in fp16, the ring sums in fp16 (one rounding per
  hop, what NCCL/RCCL and gloo do for a 16-bit buffer);
- the division after the reduction instead (fp16 sums of undivided gradients): how many values
  overflow at that loss scale;
- an fp32 wire (divide and sum in fp32);
- the bf16 path (no loss scale), the default precision's, for scale;
- the cross-replica combine: r fp32 gradient shards summed over a 16-bit vs an fp32 wire.
"""

from __future__ import annotations

import math
import os
import sys

import torch

from megatron_topo.cli import OneLineParser, bounded, interruptible

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root


def ring_sum(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What a ring sums when each rank sends its row in ``dtype``: every row rounded to ``dtype``,
    then added one hop at a time, rounding to ``dtype`` after every add."""
    x = x.to(dtype)
    acc = x[0]
    for r in range(1, x.shape[0]):
        acc = (acc.float() + x[r].float()).to(dtype)
    return acc


def error(got: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    got = got.double()
    nz = truth != 0
    rel = ((got - truth).norm() / truth.norm()).item()
    return rel, ((got == 0) & nz).sum().item() / max(1, nz.sum().item())


def gradients(n: int, micro_batch: int) -> torch.Tensor:
    from megatron_topo.config import load_config
    from megatron_topo.model import build_model

    cfg = load_config([os.path.join(ROOT, "configs/tiny.yml")])
    model = build_model(cfg.model, seed=1)
    V, S = cfg.model.vocab_size, cfg.model.seq_length
    out = []
    for i in range(n):
        ids = torch.randint(0, V, (micro_batch, S + 1), generator=torch.Generator().manual_seed(i))
        model.zero_grad()
        logits = model(ids[:, :-1]).float()
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
        out.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return torch.stack(out)


MAX_WORLD = 1024  # the largest reduction simulated: its gradients alone take 1,024 x 4 MiB
MAX_MICRO_BATCH = 64


@interruptible
def main(argv=None) -> int:
    ap = OneLineParser(prog="fp16_gradient_error.py", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--worlds",
        type=bounded(int, 2, MAX_WORLD, why="one tiny-model gradient of ~1 M values is held per rank"),
        nargs="+",
        default=[8, 64, 384],
        help=f"ranks of each reduction, 2..{MAX_WORLD:,}",
    )
    ap.add_argument(
        "--micro-batch", type=bounded(int, 1, MAX_MICRO_BATCH), default=4, help="sequences per rank's gradient"
    )
    a = ap.parse_args(argv)
    G = gradients(max(a.worlds), a.micro_batch)
    scale = 2.0 ** math.floor(math.log2(65504 / G.abs().max().item()))
    G16 = (G * scale).half()
    print(f"{G.shape[1]:,} parameters; fp16 loss scale 2^{int(math.log2(scale))}")
    print(
        f"{'W':>4} | {'fp16: /W, fp16 sums':>20} {'flushed':>8} | {'fp16 sums, /W after':>20} | "
        f"{'fp32 wire':>10} | {'bf16 path':>10}"
    )
    for W in a.worlds:
        x = G16[:W]
        truth = x.double().sum(0) / W
        today, flushed = error(ring_sum(x.float() * (1.0 / W), torch.float16), truth)
        after = ring_sum(x, torch.float16)
        overflow = (~torch.isfinite(after)).sum().item()
        fp32, _ = error((x.float() / W).sum(0), truth)
        b = G[:W].bfloat16()
        bf16, _ = error(ring_sum(b.float() * (1.0 / W), torch.bfloat16), b.double().sum(0) / W)
        print(f"{W:>4} | {today:>20.2e} {flushed:>8.2%} | {overflow:>10,} overflow | {fp32:>10.2e} | {bf16:>10.2e}")
    print("combine (r replicas of an fp32 gradient shard):")
    for W in a.worlds:
        r = max(2, W // 8)  # one replica per node of 8 ranks
        parts = torch.stack([(G16[:W].float() / W)[i::r].sum(0) for i in range(r)])
        truth = parts.double().sum(0)
        h, _ = error(ring_sum(parts, torch.float16), truth)
        f, _ = error(parts.sum(0), truth)
        print(f"  W {W:>4}, r {r:>3}: fp16 wire {h:.2e}, fp32 wire {f:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
