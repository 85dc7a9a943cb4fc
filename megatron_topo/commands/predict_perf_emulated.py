"""``predict_perf --emulated``: the emulated cluster's predicted step times for a
tools/bench_sharding.py results.json, next to the measured ones (docs/frontier.md §4.1)."""

from __future__ import annotations

import dataclasses
import os
import re

from megatron_topo.analysis import perf_model as pm
from megatron_topo.analysis.emulation import predict as emu
from megatron_topo.config import ConfigError, load_config
from megatron_topo.topology import Topology
from megatron_topo.zero_topo.sharding import PRESETS

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
MAX_RESULTS_BYTES = 256 << 20  # a bench_sharding results.json is kilobytes


def bench_rows(path: str) -> dict:
    """The main-series training rows of a bench_sharding results.json, by strategy."""
    from megatron_topo.safe_files import read_json

    # a FIFO or device is refused, not waited on; nesting too deep or a 5,000-digit integer is one line
    rows = read_json(path, MAX_RESULTS_BYTES, ConfigError)
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
