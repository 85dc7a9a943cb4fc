"""What a benchmark run is: the strategies, the train.py / fsdp_baseline.py command of each, and
the bytes per link level the volume formulas expect of it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import yaml

from megatron_topo.analysis import formulas

# the repository root: runs start train.py / tools/fsdp_baseline.py with it as their cwd
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

LEVELS = ("intra_gpu", "intra_node", "inter_node")
ALL_STRATEGIES = ("ddp", "zero3", "zeropp", "mics", "topo", "topo_sec8", "paro_iig", "fsdp2_full", "fsdp2_hsdp")
# on demand: docs/design.md §4.6 step 4's reduce-scatter; 16-bit pair gathers
EXTRA_STRATEGIES = (
    "topo_rs",
    "topo_w16",
    "topo_q",
    "topo_q_ef",
    "auto",
)  # INT8 combine + publish (+ error feedback); preset: auto
ACCUM_STRATEGIES = ("ddp", "topo", "topo_q", "zeropp", "mics", "zero3", "fsdp2_full", "fsdp2_hsdp", "auto")
SCALING_STRATEGIES = ("ddp", "zero3", "zeropp", "mics", "topo", "fsdp2_full", "fsdp2_hsdp")
MODEL_SET = (
    "num_layers=4",
    "hidden_size=256",
    "num_attention_heads=4",
    "seq_length=128",
    "max_position_embeddings=128",
    "train_micro_batch_size_per_gpu=2",
    "gradient_accumulation_steps=4",
    "precision=bf16",
)
LOG_DIR = "{LOG_DIR}"  # replaced by each run's own directory
PRESET_FILE = {
    "ddp": "ddp",
    "zero3": "zero3",
    "zeropp": "zeropp",
    "mics": "mics",
    "topo": "topo",
    "topo_sec8": "topo",
    "paro_iig": "paro_iig",
    "topo_rs": "topo",
    "topo_w16": "topo",
    "topo_q": "topo",
    "topo_q_ef": "topo",
}
QUANTIZED_ONCE = ["zero_topo.combine_bits=8", "zero_topo.publish_bits=8"]


@dataclass
class RunDef:
    """One run: its command after the python executable, configs, overrides and cluster shape."""

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
    """The run of ``strategy`` on nodes x gpus x gcds (``accum``: micro-batches per step)."""
    per_node = gpus * gcds
    sets = [
        *a.model_set,
        f"topology.gpus_per_node={gpus}",
        f"topology.gcds_per_gpu={gcds}",
        f"train_iters={a.steps}",
        "log_interval=1",
        "eval_interval=0",
        "save=null",
        "load=null",
        f"log_dir={log_dir}",
        "progress_bar=false",
        "zero_topo.quant_block_size=256",
        "zero_topo.grad_quant_block_size=256",
    ] + ([f"gradient_accumulation_steps={accum}"] if accum else [])
    configs = [a.model, "configs/local_cpu.yml"]
    notes = ""
    if strategy == "auto":  # the emulated system block (links of this cluster) instead of local_cpu.yml
        from megatron_topo.analysis.emulation.predict import emulated_system
        from megatron_topo.config import load_config

        configs = [a.model, "configs/emulated_cpu.yml"]
        system = emulated_system(
            load_config([os.path.join(ROOT, configs[1])], require=False).system, a.inter_bps, a.intra_bps
        )
        sets += [
            "distributed.backend=gloo",
            "distributed.device=cpu",
            "distributed.collective_timeout_s=300",
            "zero_topo.preset=auto",
            f"system.bw_inter_node_gbs={system.bw_inter_node_gbs:.6g}",
            f"system.bw_intra_node_gbs={system.bw_intra_node_gbs:.6g}",
        ]
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
        notes = (
            "fully_shard over the world"
            if mode == "full"
            else "2-D mesh replicate(nodes) x shard(node); all-reduce on the last micro-batch only"
        )
        return RunDef(strategy, "fsdp", argv, configs, sets, nodes, gpus, gcds, notes)
    raise SystemExit(f"error: unknown strategy '{strategy}'; valid: {', '.join(ALL_STRATEGIES + EXTRA_STRATEGIES)}")


# ------------------------------------------------------------------------------ formulas
def _ran_zero_topo(run_dir: Optional[str]) -> list[str]:
    """``--set`` lines of the ``zero_topo`` block a finished run recorded in its config.yml (the
    plan ``preset: auto`` ran: the model's choice or, after timing, another); none without one."""
    path = os.path.join(run_dir, "config.yml") if run_dir else ""
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        block = (yaml.safe_load(f) or {}).get("zero_topo") or {}
    text = lambda v: "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)  # noqa: E731
    return [f"zero_topo.{k}={text(v)}" for k, v in block.items()]


def run_plan(rd: RunDef, run_dir: Optional[str] = None):
    """(config, topology, plan) of a run: the trainer's plan (``preset: auto``: the plan the run in
    ``run_dir`` recorded, else resolved from the model as the trainer does before timing), for FSDP2
    the zero3 (full) / mics (hsdp) plan."""
    from megatron_topo.analysis import autoplan
    from megatron_topo.config import load_config
    from megatron_topo.topology import Topology, topology_from_config

    cwd = os.getcwd()
    os.chdir(ROOT)
    ran = _ran_zero_topo(run_dir) if rd.kind == "train" and rd.strategy == "auto" else []
    try:
        cfg = load_config(rd.configs, [s for s in rd.sets if not s.startswith("log_dir")] + ran)
    finally:
        os.chdir(cwd)
    W = rd.nodes * rd.gpus_per_node * rd.gcds_per_gpu
    topo = topology_from_config(cfg.topology, W, rd.gpus_per_node * rd.gcds_per_gpu)
    if rd.kind == "train":
        return cfg, topo, autoplan.resolve(cfg, topo)[0]
    return (
        cfg,
        topo,
        formulas.plan_for(
            "zero3" if rd.strategy == "fsdp2_full" else "mics", Topology(W, topo.gcds_per_gpu, topo.gpus_per_node)
        ),
    )


def formula_bytes(rd: RunDef, run_dir: Optional[str] = None) -> tuple[dict, str]:
    """Expected bytes per step summed over ranks (docs/design.md §4.8) and how exact the match must be."""
    cfg, topo, plan = run_plan(rd, run_dir)
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
