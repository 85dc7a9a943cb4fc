"""Predicted TFLOPS/GCD of sharding presets across scales (megatron_topo.analysis.perf_model).

    python tools/predict_perf.py --model configs/20B.yml --system configs/frontier.yml \\
        --gcds 8,16,32,64,128,256,384 [--presets zero3,zeropp,topo] [--stack engine|deepspeed] [--json] [--plot out.png]

``--stack engine`` (default) predicts megatron_topo's engine; ``--stack deepspeed`` the software the
ZeRO-topo paper measured (no overlap, fp16 hpZ secondary), which is what its ratios compare with.
Uses the model YAML's micro-batch, gradient accumulation and activation recompute and the
system YAML's rates (every constant and its source: docs/design.md §7.3). Prints
TFLOPS/GCD per preset and GCD count, the ratios between zero3, zeropp and topo at the largest
count next to the ZeRO-topo paper's 20B numbers, and each preset's weak-scaling efficiency from
the smallest to the largest count. Bad input prints one line on stderr and exits 2.

    python tools/predict_perf.py --emulated runs/bench_sharding_overlap/results.json \\
        [--system configs/emulated_cpu.yml] [--overlap engine|store_forward|serial] [--no-step-overlap]

predicts the emulated cluster's step times for a tools/bench_sharding.py results.json and prints
them next to the measured ones with the error (docs/frontier.md §4.1): link rates from the system
YAML, scaled to the run's shaped rates; the CPU's FLOP rate from the run's unshaped ddp row and its
cost per quantized element from the unshaped topo and zeropp rows (megatron_topo.analysis.emulation.predict).

    python tools/predict_perf.py --validate-zeropp [--system configs/dgx2_v100.yml] [--stack ...] [--nic-sharing ...]

predicts ZeRO++'s own measurements (seed 003 Table 1(a), 384 V100s, 1 and 8 IB per node) and
prints them next to the measured TFLOPS; ``--derive-alpha`` prints RCCL's ring-step latency derived
from seed 004 (megatron_topo.analysis.perf_sources).

The ``--emulated`` comparison is in ``predict_perf_emulated``, the tables and the plot in
``predict_perf_render``; both are re-exported here.
"""

from __future__ import annotations

import json
import os
import sys

from megatron_topo.analysis import perf_model as pm
from megatron_topo.analysis import perf_sources as sources
from megatron_topo.analysis.emulation import predict as emu
from megatron_topo.cli import OneLineParser, ascii_number, comma_items, fail, interruptible, path_arg
from megatron_topo.commands.predict_perf_emulated import (
    BENCH_KEYS,
    EMULATED_STRATEGIES,
    MAX_RESULTS_BYTES,
    NOMINAL_BPS,
    REPO,
    bench_rows,
    emulated,
    render_emulated,
)
from megatron_topo.commands.predict_perf_render import GB, PLOT_SOFTWARE, check_plot_path, plot, render, render_sources
from megatron_topo.config import ConfigError, load_config
from megatron_topo.zero_topo.sharding import PRESETS

# the emulated comparison and the output side are re-exported: callers import them from here
__all__ = [
    "BENCH_KEYS",
    "EMULATED_STRATEGIES",
    "GB",
    "MAX_GCDS",
    "MAX_RESULTS_BYTES",
    "NOMINAL_BPS",
    "PLOT_SOFTWARE",
    "REPO",
    "bench_rows",
    "check_plot_path",
    "emulated",
    "main",
    "parse_args",
    "plot",
    "render",
    "render_emulated",
    "render_sources",
    "run",
]


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=path_arg, help="model YAML (configs/20B.yml)")
    p.add_argument(
        "--system", type=path_arg, help="system YAML (configs/frontier.yml; configs/emulated_cpu.yml with --emulated)"
    )
    p.add_argument("--gcds", help="comma-separated GCD (rank) counts, e.g. 8,16,384")
    p.add_argument(
        "--emulated",
        type=path_arg,
        metavar="RESULTS_JSON",
        help="predict a tools/bench_sharding.py run on the emulated cluster and compare",
    )
    p.add_argument(
        "--overlap",
        choices=emu.EMULATED_OVERLAP,
        default="engine",
        help="--emulated: how CPU work and shaped transfers overlap "
        "(megatron_topo.analysis.emulation.predict.estimate_emulated)",
    )
    p.add_argument(
        "--no-step-overlap",
        dest="no_step_overlap",
        action="store_true",
        help="--emulated: the run's engine ran the cross-node combine and the post-step gather "
        "blocking inside step() (the engine before commit 3af3320)",
    )
    p.add_argument("--presets", default="zero3,zeropp,topo", help="comma-separated presets")
    p.add_argument(
        "--nic-sharing",
        choices=pm.NIC_SHARING,
        default="ring",
        help="how ranks share the node's NICs (docs/design.md §7.1)",
    )
    p.add_argument(
        "--stack",
        choices=pm.STACKS,
        default="engine",
        help="engine: megatron_topo's overlap; deepspeed: what the ZeRO-topo paper measured",
    )
    p.add_argument(
        "--validate-zeropp",
        action="store_true",
        help="predict seed 003 Table 1 (ZeRO-3 vs ZeRO++ on 384 V100s) and compare",
    )
    p.add_argument(
        "--derive-alpha",
        action="store_true",
        help="print RCCL's flat-ring step latency derived from seed 004 §6.3.1 (--system)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, e.g. --set system.latency_inter_node_us=50",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--plot", type=path_arg, metavar="FILE.png", help="also draw TFLOPS/GCD against GCDs")
    return p.parse_args(argv)


MAX_GCDS = 1_000_000


def _ints(text: str) -> list[int]:
    expect = "comma-separated positive integers like 8,16,384"
    items = comma_items(text, "--gcds", expect, error=ConfigError)  # 8,,16: the empty item named
    try:
        if not all(ascii_number(x) for x in items):
            raise ValueError
        vals = sorted({int(x) for x in items})
    except ValueError:
        raise ConfigError(f"--gcds '{text}': expected comma-separated integers like 8,16,384") from None
    if not vals or vals[0] < 1:
        raise ConfigError(f"--gcds '{text}': expected positive integers")
    if vals[-1] > MAX_GCDS:  # the plan search walks the divisors of the world size
        raise ConfigError(f"--gcds '{text}': {vals[-1]:,} is more than any machine; use at most {MAX_GCDS:,}")
    return vals


def run(args) -> dict:
    if args.emulated:
        return emulated(
            args.emulated,
            args.system or os.path.join(REPO, "configs", "emulated_cpu.yml"),
            args.overlap,
            not args.no_step_overlap,
            args.overrides,
        )
    if args.validate_zeropp:
        cfg = load_config(
            [args.system or os.path.join(REPO, "configs", "dgx2_v100.yml")], args.overrides, require=False
        )
        rows = sources.validate_zeropp_table1(cfg.system, args.stack, args.nic_sharing)
        return {
            "validate_zeropp": rows,
            "system": cfg.system.name,
            "stack": args.stack,
            "nic_sharing": args.nic_sharing,
        }
    if args.derive_alpha:
        cfg = load_config([args.system or os.path.join(REPO, "configs", "frontier.yml")], args.overrides, require=False)
        return {
            "derive_alpha": sources.derive_rccl_ring(
                cfg.system, cfg.topology.gcds_per_gpu * (cfg.topology.gpus_per_node or 4)
            ),
            "system": cfg.system.name,
        }
    if not (args.model and args.system and args.gcds):
        raise ConfigError("--model, --system and --gcds are needed (or --emulated RESULTS_JSON)")
    cfg = load_config([args.model, args.system], args.overrides)
    if cfg.system is None:
        raise ConfigError(f"{args.system}: no 'system:' block; use a system YAML such as configs/frontier.yml")
    gcds = _ints(args.gcds)
    presets = comma_items(args.presets, "--presets", f"preset names from {', '.join(PRESETS)}", error=ConfigError)
    est = pm.predict(cfg, presets, gcds, args.nic_sharing, stack=args.stack)
    lo, hi = gcds[0], gcds[-1]
    return {
        "model": args.model,
        "params": pm.Shape.from_config(cfg.model).params,
        "system": cfg.system.name,
        "nic_sharing": args.nic_sharing,
        "stack": args.stack,
        "gcds": gcds,
        "presets": presets,
        "micro_batch": cfg.train.train_micro_batch_size_per_gpu,
        "grad_accum": cfg.train.gradient_accumulation_steps,
        "estimates": [e.as_dict() for e in est],
        "ratios": pm.ratios(est, hi),
        "ratios_at": hi,
        "paper_20B_384": pm.PAPER_20B_384,
        "paper_topo_scaling_efficiency": pm.PAPER_TOPO_SCALING_EFFICIENCY,
        "scaling_efficiency": {p: pm.scaling_efficiency(est, p, lo, hi) for p in presets},
        "scaling_from_to": [lo, hi],
    }


@interruptible
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.plot:
            check_plot_path(args.plot)
        r = run(args)
        if args.plot and "estimates" in r:
            plot(r, args.plot)
    except (ConfigError, ValueError, OSError, KeyError) as e:
        return fail(e)  # one error: line per problem
    text = render_emulated(r) if args.emulated else render(r) if "estimates" in r else render_sources(r)
    print(json.dumps(r, indent=1) if args.json else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
