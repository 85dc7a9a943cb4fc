#!/usr/bin/env python
"""Sharding strategies head to head on an emulated multi-node cluster (needs root: namespaces).

    tools/bench_sharding.py [--nodes 2] [--gpus-per-node 2] [--gcds-per-gpu 2] [--model configs/tiny.yml]
        [--steps 8] [--warmup 2] [--out runs/bench_sharding] [--strategies ddp zero3 ... fsdp2_hsdp]
        [--inter-node 200mbit] [--intra-node 400mbit] [--no-unshaped] [--series main scaling accum]
        [--scaling-nodes 1 2 4] [--scaling-gpus-per-node 1] [--scaling-gcds-per-gpu 2]
        [--accumulation 1 2 4 8] [--accum-strategies ...] [--clusters frontier nvlink]

Every strategy trains the same GPT-NeoX (``--model`` plus the ``--model-set`` overrides: 4 layers,
hidden 256, seq 128, micro-batch 2, 4 micro-batches per step, bf16), on the same data, for
``--steps`` steps on a fresh emulated cluster (tools/emulate_cluster.py: one namespace per GPU
package, tc-shaped links). Strategies: our presets through train.py (``ddp zero3 zeropp mics topo
topo_sec8 paro_iig``; ``topo`` has secondary degree = GCDs per GPU, ``topo_sec8`` secondary degree
= ranks per node, the paper's 8 on Frontier) and PyTorch FSDP2 through tools/fsdp_baseline.py
(``fsdp2_full``: fully_shard over the world, ``fsdp2_hsdp``: replicate x shard mesh).

Per strategy: median step time over the steps after ``--warmup``, tokens/s, bytes per link level
per step from our counters (sum over ranks) next to the DESIGN §4 formula (OK/MISMATCH) and next
to the bytes measured on the wire (tc classes on the veths, loopback for the GCD pair), peak RSS
per rank (wait4), and bounds: each strategy is run a second time with shaping off (its
"compute" time t0), and t0 + max over link levels (busiest link's bytes / its rate) is the
no-overlap bound printed beside the measurement (max(t0, comm) is the perfect-overlap one).
"quant s" is the time per step a rank spends inside the quantization kernels (kernels.timer, each
rank's whole-run total over the steps, mean over ranks), so CPU cost is told apart from network.

The accumulation series (``--series accum``) runs every ``--accum-strategies`` entry (default: ddp,
topo, topo_q = topo with INT8 combine + publish, zeropp, mics, zero3, FSDP2 full/HSDP, and ``auto``
= ``zero_topo.preset: auto``) at each ``--accumulation`` count on each ``--clusters`` link profile
(frontier: the rates above; nvlink: links inside a node unshaped). It first runs every strategy
unshaped at every count and fits the emulated-cluster model's CPU constants over those runs
(megatron_topo.analysis.emulation.predict.fit_cpu); the auto runs get them as their system block, so
``auto`` chooses with this machine's constants. Report: megatron_topo.analysis.emulation.accum_report.

Writes DIR/results.json (a list of row objects), DIR/results.md (tables with ratios against
zero3 and zeropp), DIR/results.png, DIR/meta.json and, with the scaling series, DIR/scaling.png.
Rank output goes to DIR/runs/<row>/launch.log. The CPU is shared: numbers are as noisy as the
machine is busy (meta.json records the load average before and after).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from megatron_topo.cli import OneLineParser

from megatron_topo.analysis.emulation import (
    Cluster, ClusterSpec, EmulationError, Interrupted, check_privileges, format_rate, launch, parse_rate,
    summarize,
)
from megatron_topo.analysis import formulas
from megatron_topo.analysis.emulation import rates as R
from megatron_topo.analysis.emulation.launch import install_signal_handlers, restore_signal_handlers

LEVELS = ("intra_gpu", "intra_node", "inter_node")
ALL_STRATEGIES = ("ddp", "zero3", "zeropp", "mics", "topo", "topo_sec8", "paro_iig", "fsdp2_full", "fsdp2_hsdp")
EXTRA_STRATEGIES = ("topo_rs", "topo_w16",  # on demand: DESIGN §4 step 4's reduce-scatter; 16-bit pair gathers
                    "topo_q", "topo_q_ef", "auto")  # INT8 combine + publish (+ error feedback); preset: auto
ACCUM_STRATEGIES = ("ddp", "topo", "topo_q", "zeropp", "mics", "zero3", "fsdp2_full", "fsdp2_hsdp", "auto")
SCALING_STRATEGIES = ("ddp", "zero3", "zeropp", "mics", "topo", "fsdp2_full", "fsdp2_hsdp")
MODEL_SET = ("num_layers=4", "hidden_size=256", "num_attention_heads=4", "seq_length=128",
             "max_position_embeddings=128", "train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=4",
             "precision=bf16")
LOG_DIR = "{LOG_DIR}"  # replaced by each run's own directory
PRESET_FILE = {"ddp": "ddp", "zero3": "zero3", "zeropp": "zeropp", "mics": "mics", "topo": "topo",
               "topo_sec8": "topo", "paro_iig": "paro_iig", "topo_rs": "topo", "topo_w16": "topo", "topo_q": "topo",
               "topo_q_ef": "topo"}
QUANTIZED_ONCE = ["zero_topo.combine_bits=8", "zero_topo.publish_bits=8"]


@dataclass
class RunDef:
    strategy: str
    kind: str  # train | fsdp
    argv: list  # after the python executable
    configs: list
    sets: list
    nodes: int
    gpus_per_node: int
    gcds_per_gpu: int
    notes: str = ""
    extra: dict = field(default_factory=dict)


def run_def(strategy: str, a, nodes: int, gpus: int, gcds: int, log_dir: str, accum: Optional[int] = None) -> RunDef:
    per_node = gpus * gcds
    sets = [*a.model_set, f"topology.gpus_per_node={gpus}", f"topology.gcds_per_gpu={gcds}",
            f"train_iters={a.steps}", "log_interval=1", "eval_interval=0", "save=null", "load=null",
            f"log_dir={log_dir}", "progress_bar=false", "zero_topo.quant_block_size=256",
            "zero_topo.grad_quant_block_size=256"] + ([f"gradient_accumulation_steps={accum}"] if accum else [])
    configs = [a.model, "configs/local_cpu.yml"]
    notes = ""
    if strategy == "auto":  # the emulated system block (links of this cluster) instead of local_cpu.yml
        from megatron_topo.config import load_config
        from megatron_topo.analysis.emulation.predict import emulated_system

        configs = [a.model, "configs/emulated_cpu.yml"]
        system = emulated_system(load_config([os.path.join(ROOT, configs[1])]).system, a.inter_bps, a.intra_bps)
        sets += ["distributed.backend=gloo", "distributed.device=cpu", "distributed.collective_timeout_s=300",
                 "zero_topo.preset=auto", f"system.bw_inter_node_gbs={system.bw_inter_node_gbs:.6g}",
                 f"system.bw_intra_node_gbs={system.bw_intra_node_gbs:.6g}"]
        argv = ["train.py", *configs] + [x for s in sets for x in ("--set", s)]
        return RunDef(strategy, "train", argv, configs, sets, nodes, gpus, gcds, "preset: auto (emulated_cpu model)")
    if strategy in PRESET_FILE:
        configs.append(f"configs/{PRESET_FILE[strategy]}.yml")
        if strategy == "topo":
            sets.append(f"zero_topo.secondary_degree={gcds}")
            notes = f"secondary degree {gcds} (the GCD pair)"
        elif strategy == "topo_rs":
            sets += [f"zero_topo.secondary_degree={gcds}", "zero_topo.inter_node_reduce=reduce_scatter"]
            notes = "cross-node gradient combine as a reduce-scatter (half the bytes of the all-reduce)"
        elif strategy == "topo_w16":
            sets += [f"zero_topo.secondary_degree={gcds}", "zero_topo.weight_bits=16", "zero_topo.secondary_bits=16"]
            notes = "bf16 weight gathers inside the GCD pair (no INT8 quantization work)"
        elif strategy in ("topo_q", "topo_q_ef"):
            sets += [f"zero_topo.secondary_degree={gcds}", *QUANTIZED_ONCE]
            sets += ["zero_topo.error_feedback=true"] if strategy == "topo_q_ef" else []
            notes = "INT8 cross-node combine and post-step gather" + (" + error feedback" if "ef" in strategy else "")
        elif strategy == "topo_sec8":
            sets.append(f"zero_topo.secondary_degree={per_node}")
            notes = f"secondary degree {per_node} (the node's ranks; 8 on Frontier)"
        argv = ["train.py", *configs] + [x for s in sets for x in ("--set", s)]
        return RunDef(strategy, "train", argv, configs, sets, nodes, gpus, gcds, notes)
    if strategy in ("fsdp2_full", "fsdp2_hsdp"):
        mode = strategy.split("_")[1]
        sets = [s for s in sets if not s.startswith("zero_topo.")]
        argv = ["tools/fsdp_baseline.py", *configs, "--mode", mode] + [x for s in sets for x in ("--set", s)]
        notes = ("fully_shard over the world" if mode == "full" else
                 "2-D mesh replicate(nodes) x shard(node); all-reduce on the last micro-batch only")
        return RunDef(strategy, "fsdp", argv, configs, sets, nodes, gpus, gcds, notes)
    raise SystemExit(f"bench_sharding: unknown strategy '{strategy}'; valid: "
                     f"{', '.join(ALL_STRATEGIES + EXTRA_STRATEGIES)}")


# ------------------------------------------------------------------------------ formulas
def run_plan(rd: RunDef):
    """(config, topology, plan) of a run: the trainer's plan (``preset: auto`` resolved as the
    trainer does), for FSDP2 the zero3 (full) / mics (hsdp) plan."""
    from megatron_topo.analysis import autoplan
    from megatron_topo.config import load_config
    from megatron_topo.topology import Topology, topology_from_config

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        cfg = load_config(rd.configs, [s for s in rd.sets if not s.startswith("log_dir")])
    finally:
        os.chdir(cwd)
    W = rd.nodes * rd.gpus_per_node * rd.gcds_per_gpu
    topo = topology_from_config(cfg.topology, W, rd.gpus_per_node * rd.gcds_per_gpu)
    if rd.kind == "train":
        return cfg, topo, autoplan.resolve(cfg, topo)[0]
    return cfg, topo, formulas.plan_for("zero3" if rd.strategy == "fsdp2_full" else "mics",
                                 Topology(W, topo.gcds_per_gpu, topo.gpus_per_node))


def formula_bytes(rd: RunDef) -> tuple[dict, str]:
    """Expected bytes per step summed over ranks (DESIGN §4) and how exact the match must be."""
    cfg, topo, plan = run_plan(rd)
    W = topo.world_size
    e = {"bf16": 2, "fp16": 2, "fp32": 4}[cfg.precision]
    micro = cfg.train.gradient_accumulation_steps
    if rd.kind == "train":
        Ls = formulas.unit_lengths(cfg.model, plan, W)
        exact = "exact"
    else:  # FSDP2 pads per parameter: unpadded units
        Ls = formulas.raw_unit_lengths(cfg.model)
        exact = "approx"
    per_rank = formulas.expected_bytes_per_rank(plan, topo, Ls, micro, elem_bytes=e)
    rd.extra["plan"] = {k: v for k, v in vars(plan).items()}
    return formulas.total_over_ranks(per_rank, W), exact


# ------------------------------------------------------------------------------ one run
def read_metrics(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return [r for r in out if "step_time_s" in r]


KERNEL_TIMES_ENV = "MEGATRON_TOPO_KERNEL_TIMES"  # kernels.timer: each rank writes its totals at exit


def read_kernel_times(directory: str, steps: int) -> dict:
    """Seconds per step inside the quantization kernels (kernels.timer, whole run / steps): the mean
    and the max over ranks; zero for rows that never quantize."""
    per_rank = []
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.startswith("kernel_times.") and name.endswith(".json"):
                try:
                    with open(os.path.join(directory, name)) as f:
                        per_rank.append(json.load(f)["seconds"] / max(steps, 1))
                except (OSError, ValueError, KeyError):
                    pass
    return {"quant_s": statistics.mean(per_rank) if per_rank else 0.0,
            "quant_s_max": max(per_rank) if per_rank else 0.0, "quant_ranks": len(per_rank)}


def run_one(rd: RunDef, a, shaped: bool, run_dir: str) -> dict:
    spec = ClusterSpec(rd.nodes, rd.gpus_per_node, rd.gcds_per_gpu,
                       inter_node_bps=a.inter_bps if shaped else None,
                       intra_node_bps=a.intra_bps if shaped else None,
                       intra_gpu_bps=a.intra_gpu_bps if shaped else None, mtu=a.mtu)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir, exist_ok=True)
    logf = open(os.path.join(run_dir, "launch.log"), "w")
    cluster = Cluster(spec)
    row = {"ok": False}
    try:
        cluster.up()
        before = cluster.counters()
        argv = [x.replace(LOG_DIR, run_dir) for x in rd.argv]
        res = launch(cluster, [sys.executable, *argv], stdout_ranks="0", out=logf, err=logf, cwd=ROOT,
                     timeout_s=a.timeout, env=dict(os.environ, **{KERNEL_TIMES_ENV: os.path.join(
                         run_dir, "kernel_times")}))
        after = cluster.counters()
    finally:
        cluster.down()
        logf.close()
    per_pkg = Cluster.delta(after, before)
    summ = summarize(per_pkg)
    recs = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    row.update({"returncode": res.returncode, "wall_s": res.wall_s, "peak_rss_bytes": max(res.max_rss_bytes),
                "peak_rss_bytes_per_rank": res.max_rss_bytes, "cpu_s_per_rank": res.cpu_s,
                "cpu_utilisation": sum(res.cpu_s) / max(res.wall_s, 1e-9)})
    if res.returncode or len(recs) < a.steps:
        row["error"] = f"exit {res.returncode}, {len(recs)} of {a.steps} steps logged; see {run_dir}/launch.log"
        return row
    timed = [r["step_time_s"] for r in recs if r["step"] > a.warmup]
    last = recs[-1]
    gb_tokens = last["tokens_per_sec"] * last["step_time_s"]
    steps = len(recs)
    wire = {lvl: summ["wire_bytes"][lvl] / steps for lvl in LEVELS}
    busiest_intra = max(max(p["tx_bytes"].get("intra_node", 0), p["rx_bytes"].get("intra_node", 0))
                        for p in per_pkg) / steps
    row.update({
        "ok": True, "step_time_s": statistics.median(timed), "step_times_s": [r["step_time_s"] for r in recs],
        "timed_s": timed, "tokens_per_step": gb_tokens,
        "loss_first": recs[0]["loss"], "loss_last": last["loss"],
        **{f"comm_bytes_{lvl}": int(last.get(f"comm_bytes_{lvl}", 0)) for lvl in LEVELS},
        "comm_bytes_constant": all(r.get("comm_bytes_inter_node") == last.get("comm_bytes_inter_node")
                                   for r in recs),
        **{f"wire_bytes_{lvl}": int(wire[lvl]) for lvl in LEVELS},
        "busiest_nic_bytes": int(summ["busiest_nic_bytes"] / steps),
        "busiest_intra_node_link_bytes": int(busiest_intra),
        "tx_drops": summ["tx_drops"], "wire_packages": per_pkg,
        **read_kernel_times(os.path.join(run_dir, "kernel_times"), steps),
    })
    return row


def _iqr(xs):
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


def measure(rd: RunDef, a, series: str, out: str, round_: int = 0, tag: Optional[str] = None,
            shared_unshaped: Optional[dict] = None) -> dict:
    """One round for one strategy: the shaped run, the formula check and the unshaped run
    (``shared_unshaped``: taken from a run already made, e.g. by another cluster of the series)."""
    tag = tag or f"{series}_{rd.strategy}_n{rd.nodes}" + (f"_r{round_}" if round_ else "")
    row = {"series": series, "strategy": rd.strategy, "kind": rd.kind, "notes": rd.notes, "nodes": rd.nodes,
           "gpus_per_node": rd.gpus_per_node, "gcds_per_gpu": rd.gcds_per_gpu,
           "world_size": rd.nodes * rd.gpus_per_node * rd.gcds_per_gpu,
           "inter_node_rate_bps": a.inter_bps, "intra_node_rate_bps": a.intra_bps,
           "command": " ".join(["python", *rd.argv]).replace(LOG_DIR, os.path.join(out, "runs", tag))}
    t0 = time.time()
    shaped = run_one(rd, a, True, os.path.join(out, "runs", tag))
    row.update(shaped)
    try:
        want, exact = formula_bytes(rd)
    except Exception as e:  # a formula problem must not lose the measurement
        want, exact = None, f"error: {e}"
    if want is not None:
        row.update({f"formula_bytes_{lvl}": int(round(want[lvl])) for lvl in LEVELS})
        if row.get("ok"):
            got = {lvl: row[f"comm_bytes_{lvl}"] for lvl in LEVELS}
            if exact == "exact":
                verdict, diffs = formulas.check(got, want, abs_tol=row["world_size"])
            else:
                verdict, diffs = formulas.check(got, want, rel=0.02, abs_tol=4096)
                verdict = verdict if verdict == "MISMATCH" else "OK (±2%, FSDP2 pads per parameter)"
            row["formula_check"] = verdict
            row["formula_rel_diff"] = diffs
    else:
        row["formula_check"] = exact
    if "plan" in rd.extra:
        row["plan"] = rd.extra["plan"]
    if shared_unshaped is not None:  # the accumulation series: one unshaped run per strategy and count
        row.update({k: v for k, v in shared_unshaped.items() if k.startswith("unshaped")})
    elif a.unshaped and row.get("ok") and rd.nodes == 1 and rd.gpus_per_node == 1 and not a.intra_gpu_bps:
        row["unshaped_timed_s"] = list(row["timed_s"])  # one package: no shaped link, same run
        row["unshaped_peak_rss_bytes"] = row["peak_rss_bytes"]
    elif a.unshaped and row.get("ok"):
        base = run_one(rd, a, False, os.path.join(out, "runs", tag + "_unshaped"))
        if base.get("ok"):
            row["unshaped_timed_s"] = base["timed_s"]
            row["unshaped_peak_rss_bytes"] = base["peak_rss_bytes"]
        else:
            row["unshaped_error"] = base.get("error")
    row["bench_seconds"] = time.time() - t0
    return finalize(row, a)


def finalize(row: dict, a) -> dict:
    """Median step time, tokens/s and the bounds from the pooled timed steps of every round."""
    if not row.get("ok"):
        return row
    med = statistics.median(row["timed_s"])
    row.update({"step_time_s": med, "step_time_iqr_s": _iqr(row["timed_s"]),
                "tokens_per_sec": row["tokens_per_step"] / med})
    if row.get("unshaped_timed_s"):
        t0c = statistics.median(row["unshaped_timed_s"])
        inter, intra = row.get("inter_node_rate_bps", a.inter_bps), row.get("intra_node_rate_bps", a.intra_bps)
        t_inter = row["busiest_nic_bytes"] * 8 / inter if inter else 0.0
        t_intra = row["busiest_intra_node_link_bytes"] * 8 / intra if intra else 0.0
        t_formula = (row["comm_bytes_inter_node"] / (row["nodes"] * row["gpus_per_node"])) * 8 / inter \
            if inter else 0.0
        row.update({
            "unshaped_step_time_s": t0c,
            "comm_time_inter_s": t_inter, "comm_time_intra_node_s": t_intra,
            "comm_time_formula_inter_s": t_formula,
            "lower_bound_s": t0c + max(t_inter, t_intra),  # compute, then the busiest link, no overlap
            "lower_bound_overlap_s": max(t0c, t_inter, t_intra),  # perfect overlap: a strict bound
            "lower_bound_formula_s": t0c + t_formula,  # our counters spread over every NIC
        })
    return row


def merge(rows: list[dict], a) -> dict:
    """Pool the rounds of one strategy (bytes must agree between rounds; times are pooled)."""
    good = [r for r in rows if r.get("ok")]
    if not good:
        return rows[0]
    m = dict(good[0])
    m["rounds"] = len(rows)
    m["rounds_failed"] = len(rows) - len(good)
    m["timed_s"] = [t for r in good for t in r["timed_s"]]
    m["step_times_s"] = [r["step_times_s"] for r in good]
    m["unshaped_timed_s"] = [t for r in good for t in r.get("unshaped_timed_s", [])]
    m["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in good)
    m["bytes_equal_across_rounds"] = all(
        r[f"comm_bytes_{lvl}"] == m[f"comm_bytes_{lvl}"] for r in good for lvl in LEVELS)
    m["bench_seconds"] = sum(r.get("bench_seconds", 0) for r in rows)
    m["quant_s"] = statistics.median(r.get("quant_s", 0.0) for r in good)
    return finalize(m, a)


# ------------------------------------------------------------------------------ reports
def _mb(x):
    return "—" if x is None else f"{x / 1e6:.1f}"


def _ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "—"


def table_main(rows: list[dict]) -> str:
    ok = {r["strategy"]: r for r in rows if r.get("ok")}
    z3 = ok.get("zero3", {}).get("tokens_per_sec")
    zpp = ok.get("zeropp", {}).get("tokens_per_sec")
    lines = ["| strategy | step s (median) | tokens/s | vs zero3 | vs zeropp | unshaped s | quant s | bound s (t0+comm) "
             "| bound s (overlap) | inter-node MB/step ours / formula / wire | check | intra-node MB ours / wire "
             "| intra-gpu MB ours / wire | busiest NIC MB | peak RSS MiB |",
             "|" + "---|" * 15]
    for r in rows:
        if not r.get("ok"):
            lines.append(f"| {r['strategy']} | failed: {r.get('error', '?')} |" + " |" * 13)
            continue
        tps = r["tokens_per_sec"]
        lines.append(
            f"| {r['strategy']} | {r['step_time_s']:.2f} | {tps:.0f} | {_ratio(tps, z3)} | {_ratio(tps, zpp)} | "
            f"{r.get('unshaped_step_time_s', float('nan')):.2f} | {r.get('quant_s', float('nan')):.2f} | "
            f"{r.get('lower_bound_s', float('nan')):.2f} | "
            f"{r.get('lower_bound_overlap_s', float('nan')):.2f} | "
            f"{_mb(r['comm_bytes_inter_node'])} / {_mb(r.get('formula_bytes_inter_node'))} / "
            f"{_mb(r['wire_bytes_inter_node'])} | {r.get('formula_check', '—')} | "
            f"{_mb(r['comm_bytes_intra_node'])} / {_mb(r['wire_bytes_intra_node'])} | "
            f"{_mb(r['comm_bytes_intra_gpu'])} / {_mb(r['wire_bytes_intra_gpu'])} | {_mb(r['busiest_nic_bytes'])} | "
            f"{r['peak_rss_bytes'] / 2**20:.0f} |")
    return "\n".join(lines)


def table_scaling(rows: list[dict]) -> str:
    """Per strategy and node count: tokens/s; tokens/s relative to the first node count (on a
    machine with fixed cores the CPU-bound ideal is 1.0); the classic weak-scaling efficiency
    (relative / node ratio, the ideal on a real cluster); comm eff. = unshaped / shaped step time."""
    by = {}
    for r in rows:
        by.setdefault(r["strategy"], {})[r["nodes"]] = r
    nodes = sorted({r["nodes"] for r in rows})
    head = ("| strategy | " + " | ".join(f"tokens/s {n}N" for n in nodes) + " | " +
            " | ".join(f"rel. {n}N" for n in nodes[1:]) + " | " + " | ".join(f"eff. {n}N" for n in nodes[1:]) +
            " | " + " | ".join(f"comm eff. {n}N" for n in nodes) + " |")
    lines = [head, "|" + "---|" * (1 + len(nodes) + 2 * (len(nodes) - 1) + len(nodes))]
    f = lambda x, fmt: "—" if x is None else fmt.format(x)  # noqa: E731
    for s, per in by.items():
        tps = [per[n]["tokens_per_sec"] if per.get(n, {}).get("ok") else None for n in nodes]
        base = tps[0]
        rel = [(t / base if t and base else None) for t in tps[1:]]
        eff = [(x * nodes[0] / n if x else None) for x, n in zip(rel, nodes[1:])]
        ceff = []
        for n in nodes:
            r = per.get(n, {})
            ceff.append(r["unshaped_step_time_s"] / r["step_time_s"] if r.get("ok") and r.get("unshaped_step_time_s")
                        else None)
        lines.append(f"| {s} | " + " | ".join(f(t, "{:.0f}") for t in tps) + " | " +
                     " | ".join(f(x, "{:.2f}") for x in rel) + " | " + " | ".join(f(x, "{:.2f}") for x in eff) +
                     " | " + " | ".join(f(x, "{:.2f}") for x in ceff) + " |")
    return "\n".join(lines)


def plot_main(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ok = [r for r in rows if r.get("ok")]
    if not ok:
        return None
    names = [r["strategy"] for r in ok]
    x = range(len(ok))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    ax1.bar(x, [r["tokens_per_sec"] for r in ok], color="tab:blue", label="measured")
    bound = [r["tokens_per_step"] / r["lower_bound_s"] if r.get("lower_bound_s") else 0 for r in ok]
    ax1.scatter(list(x), bound, color="black", marker="_", s=400, label="t0 + comm (no overlap)", zorder=3)
    best = [r["tokens_per_step"] / r["lower_bound_overlap_s"] if r.get("lower_bound_overlap_s") else 0 for r in ok]
    ax1.scatter(list(x), best, color="tab:red", marker="_", s=400, label="max(t0, comm) (perfect overlap)", zorder=3)
    ax1.set_xticks(list(x), names, rotation=30, ha="right")
    ax1.set_ylabel("tokens/s (global)")
    ax1.set_title("throughput on the emulated cluster")
    ax1.set_ylim(0, 1.3 * max([r["tokens_per_sec"] for r in ok] + best + bound))
    ax1.legend(fontsize=8, loc="upper right")
    w = 0.27
    for i, (key, lab) in enumerate((("comm_bytes_inter_node", "our counters"),
                                    ("formula_bytes_inter_node", "DESIGN §4 formula"),
                                    ("wire_bytes_inter_node", "measured on the veths"))):
        ax2.bar([k + (i - 1) * w for k in x], [(r.get(key) or 0) / 1e6 for r in ok], width=w, label=lab)
    ax2.set_xticks(list(x), names, rotation=30, ha="right")
    ax2.set_ylabel("inter-node MB per step (sum over ranks)")
    ax2.set_title("inter-node traffic")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_scaling(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    by = {}
    for r in rows:
        if r.get("ok"):
            by.setdefault(r["strategy"], []).append((r["nodes"], r["tokens_per_sec"]))
    for s, pts in by.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
    ax.set_xlabel("emulated nodes")
    ax.set_ylabel("tokens/s (global)")
    ax.set_title("weak scaling (fixed batch per rank)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def machine() -> dict:
    info = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu_model"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def write_reports(out, rows, meta):
    tmp = os.path.join(out, "results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(tmp, os.path.join(out, "results.json"))
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    main = [r for r in rows if r["series"] == "main"]
    scal = [r for r in rows if r["series"] == "scaling"]
    acc = [r for r in rows if r["series"] == "accum"]
    md = ["# bench_sharding results", "",
          f"Emulated cluster: {meta.get('main_spec', '')}. Model: {' '.join(meta['model_set'])}; "
          f"{meta['steps']} steps, median over steps > {meta['warmup']}"
          f"{' pooled over %d interleaved rounds' % meta['repeats'] if meta.get('repeats', 1) > 1 else ''}. "
          f"Machine: {meta['machine']}. "
          f"Load average before/after: {meta.get('load_before')} / {meta.get('load_after')}.", ""]
    if main:
        md += ["## Strategies", "", table_main(main), ""]
    if scal:
        md += ["## Weak scaling", "", meta.get("scaling_spec", ""), "", table_scaling(scal), "",
               "rel. N = tokens/s at N nodes / tokens/s at the first node count (all ranks share the same "
               "cores, so the CPU-bound ideal here is 1.0); eff. N = rel. N / node ratio (weak-scaling "
               "efficiency, ideal 1.0 on a real cluster); comm eff. = unshaped / shaped step time at that "
               "size (1.0 = communication fully hidden or free).", ""]
    if acc:
        from megatron_topo.analysis.emulation import accum_report

        md += [accum_report.render(acc, meta, ROOT), ""]
        accum_report.plot(acc, os.path.join(out, "accum.png"))
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md))
    if main:
        plot_main(main, os.path.join(out, "results.png"))
    if scal:
        plot_scaling(scal, os.path.join(out, "scaling.png"))


# ------------------------------------------------------------------------------ main
def build_parser():
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=2)
    ap.add_argument("--gcds-per-gpu", type=int, default=2)
    ap.add_argument("--model", default="configs/tiny.yml", help="model YAML (relative to the repo root)")
    ap.add_argument("--model-set", nargs="*", default=list(MODEL_SET), metavar="KEY=VALUE",
                    help="overrides applied to the model YAML (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds over all strategies (interleaved); step times are pooled over rounds")
    ap.add_argument("--out", default="runs/bench_sharding")
    ap.add_argument("--strategies", nargs="+", default=list(ALL_STRATEGIES),
                    choices=ALL_STRATEGIES + EXTRA_STRATEGIES)
    ap.add_argument("--inter-node", default=R.DEFAULT_INTER_NODE)
    ap.add_argument("--intra-node", default=R.DEFAULT_INTRA_NODE)
    ap.add_argument("--intra-gpu", default=R.DEFAULT_INTRA_GPU)
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--no-unshaped", dest="unshaped", action="store_false",
                    help="skip the shaping-off run per strategy (no bounds)")
    ap.add_argument("--series", nargs="+", default=["main"], choices=("main", "scaling", "accum"))
    ap.add_argument("--accumulation", nargs="+", type=int, default=[1, 2, 4, 8], metavar="K",
                    help="accum series: micro-batches per optimizer step")
    ap.add_argument("--accum-strategies", nargs="+", default=list(ACCUM_STRATEGIES),
                    choices=ALL_STRATEGIES + EXTRA_STRATEGIES)
    ap.add_argument("--clusters", nargs="+", default=["frontier", "nvlink"], choices=sorted(R.PROFILES),
                    help="accum series: link profiles (megatron_topo.analysis.emulation.rates.PROFILES); the unshaped run "
                         "of each strategy and count is shared by them")
    ap.add_argument("--scaling-nodes", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--scaling-gpus-per-node", type=int, default=1)
    ap.add_argument("--scaling-gcds-per-gpu", type=int, default=2)
    ap.add_argument("--scaling-strategies", nargs="+", default=list(SCALING_STRATEGIES),
                    choices=ALL_STRATEGIES + EXTRA_STRATEGIES)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is stopped")
    ap.add_argument("--dry-run", action="store_true", help="print the runs and exit")
    ap.add_argument("--pool", nargs="+", default=None, metavar="DIR",
                    help="run nothing: pool the rows of earlier runs' DIR/results.json (rounds of the same "
                         "series; step times are pooled per row, unshaped times kept) and write the reports to --out")
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    prog = "bench_sharding"
    if a.repeats < 1:
        print(f"{prog}: --repeats must be >= 1", file=sys.stderr)
        return 2
    if a.steps <= a.warmup:
        print(f"{prog}: --steps {a.steps} must exceed --warmup {a.warmup}", file=sys.stderr)
        return 2
    try:
        a.inter_bps, a.intra_bps = parse_rate(a.inter_node), parse_rate(a.intra_node)
        a.intra_gpu_bps = parse_rate(a.intra_gpu)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    out = os.path.abspath(a.out)
    if a.pool:
        return pool(a, out)
    plan = []
    if "main" in a.series:
        for s in a.strategies:
            plan.append(("main", s, a.nodes, a.gpus_per_node, a.gcds_per_gpu))
    if "scaling" in a.series:
        for n in a.scaling_nodes:
            for s in a.scaling_strategies:
                if s == "topo_sec8" and a.scaling_gpus_per_node == 1:
                    continue  # = topo when a node is one GPU
                plan.append(("scaling", s, n, a.scaling_gpus_per_node, a.scaling_gcds_per_gpu))
    defs = [(series, run_def(s, a, n, g, c, LOG_DIR)) for series, s, n, g, c in plan]
    accum = accum_defs(a) if "accum" in a.series else []
    if any(k < 1 for k in a.accumulation):
        print(f"{prog}: --accumulation counts must be >= 1", file=sys.stderr)
        return 2
    if a.dry_run:
        for series, rd in defs:
            print(f"[{series}] {rd.nodes}x{rd.gpus_per_node}x{rd.gcds_per_gpu} {rd.strategy}: "
                  f"python {' '.join(rd.argv)}")
        for k, s, cl, ca, rd in accum:
            print(f"[accum {cl} k={k}] {s}: python {' '.join(rd.argv)}")
        return 0
    why = check_privileges()
    if why:
        print(f"{prog}: cannot emulate a cluster here: {why}", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    meta = {"machine": machine(), "model": a.model, "model_set": a.model_set, "steps": a.steps,
            "warmup": a.warmup, "repeats": a.repeats, "rates": {"inter_node": format_rate(a.inter_bps),
                                          "intra_node": format_rate(a.intra_bps),
                                          "intra_gpu": format_rate(a.intra_gpu_bps)},
            "load_before": os.getloadavg(), "argv": sys.argv, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if "main" in a.series:
        meta["main_spec"] = ClusterSpec(a.nodes, a.gpus_per_node, a.gcds_per_gpu, a.inter_bps, a.intra_bps,
                                        a.intra_gpu_bps).describe()
    if "scaling" in a.series:
        meta["scaling_spec"] = "Per node: " + ClusterSpec(1, a.scaling_gpus_per_node, a.scaling_gcds_per_gpu,
                                                          a.inter_bps, a.intra_bps, a.intra_gpu_bps).describe()
    if accum:
        meta["clusters"] = {c: ClusterSpec(a.nodes, a.gpus_per_node, a.gcds_per_gpu, *(
            parse_rate(x) for x in R.PROFILES[c])).describe() for c in a.clusters}
        meta["accumulation"] = a.accumulation
    rows = []
    rounds: dict = {}
    old = install_signal_handlers()
    try:
        if accum:
            rows = run_accum(accum, a, out, meta, rounds)
        total = len(defs) * a.repeats
        k = 0
        for rep in range(a.repeats):  # rounds interleave the strategies: load drifts hit all alike
            for series, rd in defs:
                k += 1
                print(f"[{k}/{total}] {series} {rd.strategy} on {rd.nodes}x{rd.gpus_per_node}x{rd.gcds_per_gpu}"
                      f"{f' (round {rep + 1})' if a.repeats > 1 else ''} ...", flush=True)
                try:
                    row = measure(rd, a, series, out, rep)
                except EmulationError as e:
                    row = {"series": series, "strategy": rd.strategy, "nodes": rd.nodes, "ok": False,
                           "error": str(e)}
                print("    " + summary_line(row), flush=True)
                rounds.setdefault((series, rd.strategy, rd.nodes, "", 0), []).append(row)
                rows = [merge(v, a) for v in rounds.values()]
                meta["load_after"] = os.getloadavg()
                write_reports(out, rows, meta)
    except Interrupted as e:
        print(f"{prog}: interrupted ({e}); partial results in {out}", file=sys.stderr)
        write_reports(out, rows, meta)
        return 128 + e.signum
    finally:
        restore_signal_handlers(old)
    print(f"{prog}: wrote {out}/results.json, results.md, results.png")
    with open(os.path.join(out, "results.md")) as f:
        print(f.read())
    return 0 if all(r.get("ok") for r in rows) else 1


def pool(a, out: str) -> int:
    """Rows of several runs pooled as rounds of one (``merge``); meta from the first run, with the
    pooled runs listed. A run without unshaped rows (``--no-unshaped``) adds step times only."""
    runs = []
    for d in a.pool:
        try:
            with open(os.path.join(d, "results.json")) as f:
                rows = json.load(f)
            with open(os.path.join(d, "meta.json")) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            print(f"bench_sharding: --pool {d}: cannot read results.json/meta.json ({e})", file=sys.stderr)
            return 2
        runs.append((d, rows, meta))
    groups: dict = {}
    for _, rows, _ in runs:
        for r in rows:
            key = (r.get("series"), r.get("strategy"), r.get("nodes"), r.get("cluster", ""), r.get("accum", 0))
            groups.setdefault(key, []).append(r)
    merged = []
    for rows in groups.values():
        m = merge(rows, a)
        m["rounds"] = sum(r.get("rounds", 1) for r in rows if r.get("ok"))
        if "auto" == m.get("strategy"):
            m["auto_choices"] = sorted({r.get("auto_choice") or "?" for r in rows})
        merged.append(m)
    meta = dict(runs[0][2], pooled=[d for d, _, _ in runs], repeats=sum(x[2].get("repeats", 1) for x in runs))
    if any(x[2].get("cpu_fit") != meta.get("cpu_fit") and x[2].get("cpu_fit") for x in runs[1:]):
        meta["cpu_fit_note"] = "the pooled runs fitted different CPU constants; the first run's are shown"
    os.makedirs(out, exist_ok=True)
    write_reports(out, merged, meta)
    print(f"bench_sharding: pooled {len(runs)} runs into {out}/results.json, results.md")
    return 0 if all(r.get("ok") for r in merged) else 1


def accum_defs(a) -> list:
    """(count, strategy, cluster, that cluster's arguments, RunDef) of the accumulation series."""
    out = []
    for k in a.accumulation:
        for s in a.accum_strategies:
            for c in a.clusters:
                ca = argparse.Namespace(**vars(a))
                ca.inter_bps, ca.intra_bps, ca.intra_gpu_bps = (parse_rate(x) for x in R.PROFILES[c])
                out.append((k, s, c, ca, run_def(s, ca, a.nodes, a.gpus_per_node, a.gcds_per_gpu, LOG_DIR, k)))
    return out


def calibrate(accum: list, a, out: str, unshaped: dict, meta: dict) -> list:
    """Unshaped runs of every strategy except auto at every count (no network: CPU work only),
    then the four CPU constants of the emulated-cluster model fitted over them
    (``predict.fit_cpu``), handed to the auto runs as system-block settings."""
    from megatron_topo.analysis.emulation import predict as emu
    from megatron_topo.analysis.perf_model import Shape

    seen, fit_rows = set(), []
    for k, s, c, ca, rd in accum:
        if s == "auto" or (k, s) in seen:
            continue
        seen.add((k, s))
        print(f"[calibrate] {s} x{k} unshaped ...", flush=True)
        base = run_one(rd, ca, False, os.path.join(out, "runs", f"accum_{s}_a{k}_unshaped"))
        unshaped[(k, s)] = ({"unshaped_timed_s": base["timed_s"], "unshaped_peak_rss_bytes": base["peak_rss_bytes"]}
                            if base.get("ok") else {"unshaped_error": base.get("error")})
        if base.get("ok") and rd.kind == "train":
            cfg, topo, plan = run_plan(rd)
            fit_rows.append((plan, k, statistics.median(base["timed_s"])))
    if not fit_rows:
        return []
    cfg, topo, _ = run_plan(accum[0][4])
    cpu = emu.fit_cpu(Shape.from_config(cfg.model), topo, cfg.train.train_micro_batch_size_per_gpu, fit_rows,
                      cfg.model.checkpoint_activations)
    meta["cpu_fit"] = {"flops_per_rank": cpu.flops, "quant_ns_per_element": cpu.quant_s_per_element * 1e9,
                       "call_us": cpu.call_s * 1e6, "optimizer_ns_per_param": cpu.optimizer_s_per_param * 1e9,
                       "rows": len(fit_rows)}
    print(f"[calibrate] {meta['cpu_fit']}", flush=True)
    return [f"system.peak_tflops={cpu.flops / 1e12:.6g}", "system.gemm_tflops=" f"{cpu.flops / 1e12:.6g}",
            "system.compute_efficiency=1.0", f"system.quant_ns_per_element={cpu.quant_s_per_element * 1e9:.6g}",
            f"system.cpu_call_us={cpu.call_s * 1e6:.6g}",
            f"system.cpu_optimizer_ns_per_param={cpu.optimizer_s_per_param * 1e9:.6g}"]


def run_accum(accum: list, a, out: str, meta: dict, rounds: dict) -> list:
    """Calibration (``calibrate``), then rounds over (count, strategy, cluster), the clusters of a
    cell back to back; the unshaped run of a strategy and count is shared by the clusters."""
    total, n, unshaped = len(accum) * a.repeats, 0, {}
    if a.unshaped:
        sets = calibrate(accum, a, out, unshaped, meta)
        accum = [(k, s, c, ca, _with_sets(rd, sets) if s == "auto" else rd) for k, s, c, ca, rd in accum]
    for rep in range(a.repeats):
        for k, s, c, ca, rd in accum:
            n += 1
            print(f"[{n}/{total}] accum {c} {s} x{k}{f' (round {rep + 1})' if a.repeats > 1 else ''} ...", flush=True)
            if a.unshaped and (k, s) not in unshaped:
                base = run_one(rd, ca, False, os.path.join(out, "runs", f"accum_{s}_a{k}_unshaped"))
                unshaped[(k, s)] = ({"unshaped_timed_s": base["timed_s"], "unshaped_peak_rss_bytes":
                                     base["peak_rss_bytes"]} if base.get("ok") else {"unshaped_error": base.get("error")})
            try:
                row = measure(rd, ca, "accum", out, rep, tag=f"accum_{c}_{s}_a{k}_r{rep}",
                              shared_unshaped=unshaped.get((k, s), {}))
            except EmulationError as e:
                row = {"series": "accum", "strategy": s, "nodes": rd.nodes, "ok": False, "error": str(e)}
            row.update({"cluster": c, "accum": k, "inter_node_rate_bps": ca.inter_bps, "intra_node_rate_bps": ca.intra_bps})
            if s == "auto":
                row["auto_choice"] = auto_choice(os.path.join(out, "runs", f"accum_{c}_{s}_a{k}_r{rep}", "launch.log"))
            print("    " + summary_line(row), flush=True)
            rounds.setdefault(("accum", s, rd.nodes, c, k), []).append(row)
            rows = [merge(v, ca) for v in rounds.values()]
            meta["load_after"] = os.getloadavg()
            write_reports(out, rows, meta)
    return [merge(v, a) for v in rounds.values()]


def _with_sets(rd: RunDef, sets: list) -> RunDef:
    return RunDef(rd.strategy, rd.kind, rd.argv + [x for s in sets for x in ("--set", s)], rd.configs,
                  rd.sets + sets, rd.nodes, rd.gpus_per_node, rd.gcds_per_gpu, rd.notes, dict(rd.extra))


def auto_choice(log: str) -> Optional[str]:
    """The trainer's ``preset auto ...: chose ...`` line from a run's log."""
    try:
        with open(log) as f:
            return next((ln.split("preset auto", 1)[1].strip() for ln in f if "preset auto" in ln), None)
    except OSError:
        return None


def summary_line(r: dict) -> str:
    if not r.get("ok"):
        return f"FAILED: {r.get('error')}"
    s = (f"step {r['step_time_s']:.2f} s, {r['tokens_per_sec']:.0f} tok/s, inter-node ours "
         f"{r['comm_bytes_inter_node'] / 1e6:.1f} MB (formula {r.get('formula_bytes_inter_node', 0) / 1e6:.1f} MB: "
         f"{r.get('formula_check')}), wire {r['wire_bytes_inter_node'] / 1e6:.1f} MB, busiest NIC "
         f"{r['busiest_nic_bytes'] / 1e6:.1f} MB, peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB, "
         f"quantization {r.get('quant_s', 0.0):.3f} s/step per rank")
    if r.get("unshaped_timed_s"):
        r = dict(r, unshaped_step_time_s=statistics.median(r["unshaped_timed_s"]))
    if r.get("unshaped_step_time_s") is not None and r.get("lower_bound_s") is not None:
        s += (f"; unshaped {r['unshaped_step_time_s']:.2f} s, bound t0+comm {r['lower_bound_s']:.2f} s "
              f"(overlap {r['lower_bound_overlap_s']:.2f} s)")
    return s


if __name__ == "__main__":
    sys.exit(main())
