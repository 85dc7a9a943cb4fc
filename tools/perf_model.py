#!/usr/bin/env python
"""Predicted TFLOPS/GCD of sharding presets across scales (megatron_topo.perf_model).

    python tools/perf_model.py --model configs/20B.yml --system configs/frontier.yml \\
        --gcds 8,16,32,64,128,256,384 [--presets zero3,zeropp,topo] [--json] [--plot out.png]

Uses the model YAML's micro-batch, gradient accumulation and activation recompute and the
system YAML's rates (every constant is documented in megatron_topo/perf_model.py). Prints
TFLOPS/GCD per preset and GCD count, the ratios between zero3, zeropp and topo at the largest
count next to the ZeRO-topo paper's 20B numbers, and each preset's weak-scaling efficiency from
the smallest to the largest count. Bad input prints one line on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_topo import perf_model as pm  # noqa: E402
from megatron_topo.config import ConfigError, load_config  # noqa: E402

GB = 1e9


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model YAML (configs/20B.yml)")
    p.add_argument("--system", required=True, help="system YAML (configs/frontier.yml)")
    p.add_argument("--gcds", required=True, help="comma-separated GCD (rank) counts, e.g. 8,16,384")
    p.add_argument("--presets", default="zero3,zeropp,topo", help="comma-separated presets")
    p.add_argument("--nic-sharing", choices=pm.NIC_SHARING, default="rank",
                   help="how ranks share the node's NICs (see megatron_topo/perf_model.py)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. --set system.latency_inter_node_us=50")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--plot", metavar="FILE.png", help="also draw TFLOPS/GCD against GCDs")
    return p.parse_args(argv)


def _ints(text: str) -> list[int]:
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ConfigError(f"--gcds '{text}': expected comma-separated integers like 8,16,384") from None
    if not vals or vals[0] < 1:
        raise ConfigError(f"--gcds '{text}': expected positive integers")
    return vals


def run(args) -> dict:
    cfg = load_config([args.model, args.system], args.overrides)
    if cfg.system is None:
        raise ConfigError(f"{args.system}: no 'system:' block; use a system YAML such as configs/frontier.yml")
    gcds = _ints(args.gcds)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    est = pm.predict(cfg, presets, gcds, args.nic_sharing)
    lo, hi = gcds[0], gcds[-1]
    return {
        "model": args.model, "params": pm.Shape.from_config(cfg.model).params, "system": cfg.system.name,
        "nic_sharing": args.nic_sharing, "gcds": gcds, "presets": presets,
        "micro_batch": cfg.train.train_micro_batch_size_per_gpu,
        "grad_accum": cfg.train.gradient_accumulation_steps,
        "estimates": [e.as_dict() for e in est],
        "ratios": pm.ratios(est, hi), "ratios_at": hi,
        "paper_20B_384": pm.PAPER_20B_384, "paper_topo_scaling_efficiency": pm.PAPER_TOPO_SCALING_EFFICIENCY,
        "scaling_efficiency": {p: pm.scaling_efficiency(est, p, lo, hi) for p in presets},
        "scaling_from_to": [lo, hi],
    }


def render(r: dict) -> str:
    by = {(e["preset"], e["gcds"]): e for e in r["estimates"]}
    ps = r["presets"]
    lines = [f"model {r['model']} ({r['params'] / 1e9:.2f} B), {r['system']}, micro-batch {r['micro_batch']} x "
             f"{r['grad_accum']}, NIC sharing '{r['nic_sharing']}'", "",
             "predicted TFLOPS/GCD (step time s)",
             f"{'GCDs':>6} " + " ".join(f"{p:>18}" for p in ps)]
    for n in r["gcds"]:
        lines.append(f"{n:>6} " + " ".join(
            f"{by[(p, n)]['tflops_per_gcd']:>9.1f} ({by[(p, n)]['step_s']:>6.2f})" for p in ps))
    hi = r["ratios_at"]
    lines += ["", f"inter-node GB sent per rank per step at {hi} GCDs: " + ", ".join(
        f"{p} {by[(p, hi)]['bytes_per_level']['inter_node'] / GB:.1f}" for p in ps)]
    if r["ratios"]:
        lines += ["", f"ratios at {hi} GCDs        model   paper (20B, 384 GCDs)"]
        for k, v in r["ratios"].items():
            paper = r["paper_20B_384"].get(k)
            lines.append(f"  {k:<22} {v:>6.2f}   {paper if paper is not None else '-':>6}"
                         + (f"   ({(v / paper - 1) * 100:+.0f}%)" if paper else ""))
    lo, hi = r["scaling_from_to"]
    lines += ["", f"weak-scaling efficiency {lo} -> {hi} GCDs (paper: topo {r['paper_topo_scaling_efficiency']})"]
    lines += [f"  {p:<8} {v:.3f}" for p, v in r["scaling_efficiency"].items()]
    return "\n".join(lines)


def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in r["presets"]:
        pts = [(e["gcds"], e["tflops_per_gcd"]) for e in r["estimates"] if e["preset"] == p]
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GCDs")
    ax.set_ylabel("predicted TFLOPS / GCD")
    ax.set_title(f"{os.path.basename(r['model'])} on {r['system']}")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        r = run(args)
        if args.plot:
            plot(r, args.plot)
    except (ConfigError, ValueError, OSError) as e:
        print(f"perf_model.py: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r, indent=1) if args.json else render(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
