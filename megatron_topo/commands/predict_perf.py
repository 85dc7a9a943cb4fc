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
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys

from megatron_topo.analysis import perf_model as pm
from megatron_topo.analysis import perf_sources as sources
from megatron_topo.analysis.emulation import predict as emu
from megatron_topo.cli import OneLineParser, fail
from megatron_topo.config import ConfigError, load_config
from megatron_topo.topology import Topology
from megatron_topo.zero_topo.sharding import PRESETS

GB = 1e9
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
EMULATED_STRATEGIES = ("zero3", "zeropp", "mics", "topo", "ddp")
NOMINAL_BPS = {"inter_node": 200e6, "intra_node": 400e6}  # the rates the YAML's payload rates were measured at
BENCH_KEYS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "seq_length",
    "max_position_embeddings",
    "vocab_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "checkpoint_activations",
    "precision",
)


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model YAML (configs/20B.yml)")
    p.add_argument("--system", help="system YAML (configs/frontier.yml; configs/emulated_cpu.yml with --emulated)")
    p.add_argument("--gcds", help="comma-separated GCD (rank) counts, e.g. 8,16,384")
    p.add_argument(
        "--emulated",
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
    p.add_argument("--plot", metavar="FILE.png", help="also draw TFLOPS/GCD against GCDs")
    return p.parse_args(argv)


MAX_GCDS = 1_000_000
MAX_RESULTS_BYTES = 256 << 20  # a bench_sharding results.json is kilobytes
PLOT_SOFTWARE = "megatron_topo predict_perf"  # the PNG's Software text: an earlier plot is replaced


def check_plot_path(path: str) -> None:
    """--plot writes a PNG: a new file, or one this tool drew before; never a user's file."""
    from megatron_topo.safe_outputs import check_output_file, head

    if not path.lower().endswith(".png"):
        raise ConfigError(f"--plot {path}: the plot is a PNG image; give a file name ending in .png")
    check_output_file(
        path,
        "--plot",
        ConfigError,
        ours=lambda p: PLOT_SOFTWARE.encode() in head(p, 1 << 12),
        kind=lambda p: None if head(p, 8) == b"\x89PNG\r\n\x1a\n" else "is not a PNG image",
    )


def _ints(text: str) -> list[int]:
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
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
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
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


def bench_rows(path: str) -> dict:
    """The main-series training rows of a bench_sharding results.json, by strategy."""
    from megatron_topo.safe_files import read_small_text

    text = read_small_text(path, MAX_RESULTS_BYTES, ConfigError)  # a FIFO or device is refused, not waited on
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(rows, list):
        raise ConfigError(f"{path}: expected a JSON list of bench_sharding rows")
    return {
        r["strategy"]: r
        for r in rows
        if isinstance(r, dict)
        and r.get("series", "main") == "main"
        and r.get("kind", "train") == "train"
        and r.get("step_time_s")
    }


def emulated(path: str, system_yaml: str, overlap: str, step_overlap: bool, overrides=()) -> dict:
    """Predicted against measured step times of a bench_sharding run (module docstring)."""
    by = bench_rows(path)
    ref = by.get("ddp")
    if ref is None or not ref.get("unshaped_step_time_s"):
        raise ConfigError(f"{path}: no ddp row with an unshaped step time (the CPU's compute rate comes from it)")
    sets = [f"{k}={v}" for k, v in re.findall(r"--set (\S+?)=(\S+)", ref.get("command", "")) if k in BENCH_KEYS]
    topo_sets = [f"topology.gpus_per_node={ref['gpus_per_node']}", f"topology.gcds_per_gpu={ref['gcds_per_gpu']}"]
    cfg = load_config([os.path.join(REPO, "configs", "tiny.yml"), system_yaml], sets + topo_sets + list(overrides))
    if cfg.system is None:
        raise ConfigError(f"{system_yaml}: no 'system:' block; use configs/emulated_cpu.yml")
    system = dataclasses.replace(
        cfg.system,
        bw_inter_node_gbs=cfg.system.bw_inter_node_gbs
        * ref.get("inter_node_rate_bps", 200e6)
        / NOMINAL_BPS["inter_node"],
        bw_intra_node_gbs=cfg.system.bw_intra_node_gbs
        * ref.get("intra_node_rate_bps", 400e6)
        / NOMINAL_BPS["intra_node"],
    )
    shape = pm.Shape.from_config(cfg.model)
    topo = Topology(ref["world_size"], ref["gcds_per_gpu"], ref["gpus_per_node"])
    t = cfg.train
    mb, ga, rc = t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps, cfg.model.checkpoint_activations
    quant = {p: by[p]["unshaped_step_time_s"] for p in ("topo", "zeropp") if by.get(p, {}).get("unshaped_step_time_s")}
    cpu = emu.calibrate_cpu(shape, topo, mb, ga, ref["unshaped_step_time_s"], quant, rc)
    out = []
    for s in [x for x in EMULATED_STRATEGIES if x in by] + sorted(set(by) - set(EMULATED_STRATEGIES)):
        if s not in PRESETS:
            continue  # FSDP2 and preset variants (topo_sec8, ...) are not plans of their own
        e = emu.estimate_emulated(shape, pm.preset_plan(s, topo), topo, system, mb, ga, cpu, rc, overlap, step_overlap)
        m = by[s]
        out.append(
            {
                "strategy": s,
                "predicted_s": e["step_s"],
                "measured_s": m["step_time_s"],
                "error": e["step_s"] / m["step_time_s"] - 1,
                "predicted_unshaped_s": e["unshaped_s"],
                "measured_unshaped_s": m.get("unshaped_step_time_s"),
                "net_s": e["net_s"],
                "cpu_s": e["cpu_s"],
            }
        )
    return {
        "results": path,
        "system": system.name,
        "overlap": overlap,
        "step_overlap": step_overlap,
        "params": shape.params,
        "micro_batch": mb,
        "grad_accum": ga,
        "world_size": topo.world_size,
        "cpu": dataclasses.asdict(cpu),
        "calibrated_on": {"compute": "ddp", "quantization": sorted(quant)},
        "rows": out,
    }


def render_emulated(r: dict) -> str:
    c = r["cpu"]
    lines = [
        f"emulated cluster: {r['results']} ({r['world_size']} ranks, {r['params'] / 1e6:.2f} M params, "
        f"micro-batch {r['micro_batch']} x {r['grad_accum']}), overlap '{r['overlap']}', "
        f"{'engine since 3af3320' if r['step_overlap'] else 'engine before 3af3320'}",
        f"CPU: {c['flops'] / 1e9:.2f} GFLOP/s per rank (from ddp's unshaped step), transport "
        f"{c['transport_gbs']:.2f} GB/s, {c['quant_s_per_element'] * 1e9:.2f} ns per quantized element "
        f"(from {', '.join(r['calibrated_on']['quantization']) or 'none'})",
        "",
        f"{'strategy':<10} {'predicted s':>11} {'measured s':>10} {'error':>7}   {'unshaped pred':>13} {'meas':>6}",
    ]
    for x in r["rows"]:
        mu = x["measured_unshaped_s"]
        lines.append(
            f"{x['strategy']:<10} {x['predicted_s']:>11.2f} {x['measured_s']:>10.2f} "
            f"{x['error'] * 100:>+6.0f}%"
            f"   {x['predicted_unshaped_s']:>13.2f} {mu if mu is None else format(mu, '.2f'):>6}"
        )
    return "\n".join(lines)


def render(r: dict) -> str:
    by = {(e["preset"], e["gcds"]): e for e in r["estimates"]}
    ps = r["presets"]
    lines = [
        f"model {r['model']} ({r['params'] / 1e9:.2f} B), {r['system']}, micro-batch {r['micro_batch']} x "
        f"{r['grad_accum']}, NIC sharing '{r['nic_sharing']}', stack '{r['stack']}'",
        "",
        "predicted TFLOPS/GCD (step time s)",
        f"{'GCDs':>6} " + " ".join(f"{p:>18}" for p in ps),
    ]
    for n in r["gcds"]:
        lines.append(
            f"{n:>6} " + " ".join(f"{by[(p, n)]['tflops_per_gcd']:>9.1f} ({by[(p, n)]['step_s']:>6.2f})" for p in ps)
        )
    hi = r["ratios_at"]
    lines += [
        "",
        f"inter-node GB sent per rank per step at {hi} GCDs: "
        + ", ".join(f"{p} {by[(p, hi)]['bytes_per_level']['inter_node'] / GB:.1f}" for p in ps),
    ]
    if r["ratios"]:
        lines += ["", f"ratios at {hi} GCDs        model   paper (20B, 384 GCDs)"]
        for k, v in r["ratios"].items():
            paper = r["paper_20B_384"].get(k)
            lines.append(
                f"  {k:<22} {v:>6.2f}   {paper if paper is not None else '-':>6}"
                + (f"   ({(v / paper - 1) * 100:+.0f}%)" if paper else "")
            )
    lo, hi = r["scaling_from_to"]
    lines += ["", f"weak-scaling efficiency {lo} -> {hi} GCDs (paper: topo {r['paper_topo_scaling_efficiency']})"]
    lines += [f"  {p:<8} {v:.3f}" for p, v in r["scaling_efficiency"].items()]
    return "\n".join(lines)


def render_sources(r: dict) -> str:
    if "derive_alpha" in r:
        d = r["derive_alpha"]
        return "\n".join(
            [
                f"RCCL flat ring on {r['system']} from seed 004 §6.3.1 (PCCL at link speed: lower bounds)",
                "  beta per GCD: " + ", ".join(f"{k} {v:.0f} GB/s" for k, v in d["beta_gbs"].items()),
            ]
            + [f"  alpha {k}: {v:.1f} us" for k, v in d["alpha_us"].items()]
            + [f"  median alpha: {d['alpha_us_median']:.1f} us"]
        )
    lines = [
        f"seed 003 Table 1(a), 384 V100s, on {r['system']}: stack '{r['stack']}', NIC sharing "
        f"'{r['nic_sharing']}'  (TFLOPS per GPU, measured / predicted)",
        "",
        f"{'model':>6} {'tokens':>6} {'IB':>3}   {'ZeRO-3':>13}   {'ZeRO++':>13}   {'speedup':>11}  {'error':>6}",
    ]
    for x in r["validate_zeropp"]:
        lines.append(
            f"{x['model']:>6} {x['tokens']:>6} {x['ib']:>3}   {x['zero3']:>6.1f} / {x['zero3_pred']:>4.1f}"
            f"   {x['zeropp']:>6.1f} / {x['zeropp_pred']:>4.1f}   "
            f"{x['speedup']:>4.2f} / {x['speedup_pred']:>4.2f}"
            f"  {x['speedup_error'] * 100:>+5.0f}%"
        )
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
    from megatron_topo.atomic import atomic_path

    d = os.path.dirname(os.path.abspath(path))
    try:
        with atomic_path(path, tmp=os.path.join(d, f".{os.path.basename(path)}.tmp.{os.getpid()}.png")) as tmp:
            fig.savefig(tmp, dpi=120, format="png", metadata={"Software": PLOT_SOFTWARE})
    finally:
        plt.close(fig)


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
