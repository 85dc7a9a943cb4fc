"""Memory and strategy planner: model-state memory of every preset, the largest model each fits,
and the fastest legal sharding plan under the device memory (modelled step time).

    python tools/plan.py --model configs/20B.yml --system configs/frontier.yml --nodes 48
    python tools/plan.py --model configs/20B.yml --system configs/frontier.yml --nodes 2 --json

Memory, by default (``--convention engine``), is what megatron_topo allocates per rank, byte for
byte as ``train.py --dry-run`` measures it (fp32 gradient shards, every secondary at its bits,
padding and quantization scales; zero_topo/memory.py), and a plan fits when those model states
plus the activation and gathered-unit estimate the trainer's preflight uses fit the device.
``--convention paper`` is the ZeRO-topo paper's accounting (docs/design.md §4.10: weights 2psi/w + secondary,
16-bit gradients 2psi/g, Adam 12psi/o, model states only), for comparing with its tables.
``--reserve-gib`` replaces the activation estimate by a fixed reserve.
Times come from megatron_topo.analysis.perf_model with the model YAML's micro-batch and accumulation. The last
table is the ranking ``zero_topo.preset: auto`` uses (megatron_topo.analysis.autoplan.rank_plans); the plans
marked * are the ones a run times before training (autoplan.shortlist; it trains with the fastest measured).
Bad input prints one line on stderr and exits 2.
"""

from __future__ import annotations

import json
import sys

from megatron_topo import preflight
from megatron_topo.analysis import autoplan
from megatron_topo.analysis import perf_model as pm
from megatron_topo.cli import OneLineParser, bounded, fail, interruptible, path_arg
from megatron_topo.config import ConfigError, load_config
from megatron_topo.model import unit_numels
from megatron_topo.zero_topo.sharding import PRESETS

GB = 1e9
MAX_NODES = 100_000  # larger than any machine; the legal-plan search walks the divisors of nodes x ranks


def parse_args(argv=None):
    p = OneLineParser(prog="plan.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=path_arg, required=True, help="model YAML (configs/20B.yml)")
    p.add_argument("--system", type=path_arg, required=True, help="system YAML (configs/frontier.yml)")
    p.add_argument("--nodes", required=True, type=bounded(int, 1, MAX_NODES), help="number of nodes")
    p.add_argument(
        "--convention",
        choices=("paper", "engine"),
        default="engine",
        help="engine: what megatron_topo allocates (fp32 gradient shards, padding, scales) plus an "
        "activation estimate; paper: the paper's model-state accounting (16-bit gradients)",
    )
    p.add_argument(
        "--reserve-gib",
        type=bounded(float, 0.0, 1 << 20, unit="GiB"),
        default=None,
        help="memory kept free per device for activations and buffers (default: the trainer's "
        "estimate with --convention engine, 0 with paper)",
    )
    p.add_argument(
        "--nic-sharing",
        choices=pm.NIC_SHARING,
        default="ring",
        help="how ranks share the NICs (docs/design.md §7.1; ring is the validated rule)",
    )
    p.add_argument("--top", type=bounded(int, 0, 1 << 20), default=10, help="plans shown from the search")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return p.parse_args(argv)


def plan_dict(plan) -> dict:
    return {
        "weight_factor": plan.weight_factor,
        "grad_factor": plan.grad_factor,
        "optimizer_factor": plan.optimizer_factor,
        "secondary_degree": plan.secondary_degree,
        "weight_bits": plan.weight_bits,
        "secondary_bits": plan.secondary_bits if plan.secondary_degree else None,
        "grad_bits": plan.grad_bits,
        "inter_node_reduce": plan.inter_node_reduce,
    }


def run(args) -> dict:
    import math

    if not 1 <= args.nodes <= MAX_NODES:
        raise ConfigError(f"--nodes must lie in [1, {MAX_NODES:,}], got {args.nodes}")
    if args.reserve_gib is not None and not (math.isfinite(args.reserve_gib) and args.reserve_gib >= 0):
        raise ConfigError(f"--reserve-gib must be a finite number >= 0, got {args.reserve_gib}")
    if args.top < 0:
        raise ConfigError(f"--top must be >= 0, got {args.top}")
    cfg = load_config([args.model, args.system])
    if cfg.system is None:
        raise ConfigError(f"{args.system}: no 'system:' block; use a system YAML such as configs/frontier.yml")
    if cfg.topology.gpus_per_node is None:
        raise ConfigError(f"{args.system}: set topology.gpus_per_node")
    shape, system = pm.Shape.from_config(cfg.model), cfg.system
    per_node = cfg.topology.gcds_per_gpu * cfg.topology.gpus_per_node
    topo = pm.topology_for(args.nodes * per_node, cfg.topology)
    mem = system.device_memory_gib * pm.GIB
    # kept free for the GPU context, NCCL/RCCL buffers, fragmentation (system.memory_reserve_gib)
    kept = preflight.reserve_bytes(cfg, int(mem)) if engine_conv(args) else 0
    if args.reserve_gib is not None and args.reserve_gib >= system.device_memory_gib:
        raise ConfigError(
            f"--reserve-gib {args.reserve_gib:g} leaves nothing of the {system.device_memory_gib:g} GiB "
            f"per device; reserve less"
        )
    engine = args.convention == "engine"
    numels = unit_numels(cfg.model) if engine else None

    def need(plan) -> tuple[dict, float]:
        """(model-state bytes by kind, reserve bytes) of one plan, in this convention."""
        if engine:
            est = preflight.estimate(cfg, plan, topo.world_size, numels)
            states = {k: v for k, v in est["states"].items() if k != "total"}
            reserve = est["total"] - est["model_states"]
        else:
            states = dict(pm.model_state_memory(shape.params, plan, "paper").__dict__)
            reserve = 0.0
        if args.reserve_gib is not None:
            reserve = args.reserve_gib * pm.GIB
        return states, reserve + kept

    mb, ga, rc = (
        cfg.train.train_micro_batch_size_per_gpu,
        cfg.train.gradient_accumulation_steps,
        cfg.model.checkpoint_activations,
    )
    presets = []
    for name in PRESETS:
        plan = pm.preset_plan(name, topo)
        states, reserve = need(plan)
        total = sum(states.values())
        est = pm.estimate_step(shape, plan, topo, system, mb, ga, rc, args.nic_sharing, args.convention)
        presets.append(
            {
                "preset": name,
                "plan": plan_dict(plan),
                "memory_gib": {k: v / pm.GIB for k, v in states.items()} | {"total": total / pm.GIB},
                "reserve_gib": reserve / pm.GIB,
                "system_reserve_gib": kept / pm.GIB,
                "fits": total + reserve <= mem,
                "max_params": pm.max_params(mem - reserve, plan, args.convention),
                "step_s": est.step_s,
                "tflops_per_gcd": est.tflops_per_gcd,
                "bytes_per_level": est.bytes_per_level,
            }
        )
    from tqdm import tqdm

    legal = pm.legal_plans(topo)
    bar = lambda it: tqdm(
        it,
        total=len(legal),
        desc="plans",
        unit="plan",
        file=sys.stderr,  # noqa: E731
        disable=None,
        leave=False,
    )  # a bar on a terminal only
    found = []
    for p, e in pm.search_plans(
        shape, topo, system, mb, ga, rc, mem, args.convention, args.nic_sharing, plans=legal, progress=bar
    ):
        states, reserve = need(p)
        if sum(states.values()) + reserve <= mem:
            found.append((p, e, sum(states.values())))
    best = [
        {
            "plan": plan_dict(p),
            "memory_gib": st / pm.GIB,
            "step_s": e.step_s,
            "tflops_per_gcd": e.tflops_per_gcd,
            "bytes_per_level": e.bytes_per_level,
        }
        for p, e, st in found[: args.top]
    ]
    limit = mem - (args.reserve_gib or 0.0) * pm.GIB - kept
    ranked = autoplan.rank_plans(
        cfg, topo, reserve_bytes=None if args.reserve_gib is None else args.reserve_gib * pm.GIB
    )
    timed = {x.label for x in autoplan.shortlist(ranked, cfg.zero_topo.auto_trials, cfg.zero_topo.auto_trial_window)}
    auto = [
        {
            "label": x.label,
            "plan": plan_dict(x.plan) | {"combine_bits": x.plan.combine_bits, "publish_bits": x.plan.publish_bits},
            "step_s": x.step_s,
            "memory_gib": x.memory_bytes / pm.GIB,
            "timed": x.label in timed,
        }
        for x in ranked
    ]
    return {
        "model": args.model,
        "params": shape.params,
        "system": system.name,
        "topology": topo.describe(),
        "nodes": args.nodes,
        "gcds": topo.world_size,
        "device_memory_gib": system.device_memory_gib,
        "memory_limit_gib": limit / pm.GIB,
        "system_reserve_gib": kept / pm.GIB,
        "convention": args.convention,
        "micro_batch": mb,
        "grad_accum": ga,
        "top": args.top,
        "presets": presets,
        "searched_plans": len(legal),
        "fitting_plans": len(found),
        "best": best,
        "step_model": system.step_model,
        "auto": auto,
    }


def engine_conv(args) -> bool:
    return args.convention == "engine"


def _bits(p: dict) -> str:
    sec = f"/{p['secondary_bits']}" if p["secondary_degree"] else "/-"
    return f"{p['weight_bits']}{sec}/{p['grad_bits']}"


def render(r: dict) -> str:
    lines = [
        f"model {r['model']}: {r['params'] / 1e9:.2f} B parameters; {r['system']}: {r['topology']}; "
        f"{r['device_memory_gib']:g} GiB per device ({r['convention']} convention: "
        + (
            f"model states as the engine allocates them + activations and buffers + {r['system_reserve_gib']:g} GiB "
            f"reserve for context, communicators, fragmentation"
            if r["convention"] == "engine"
            else "the paper's model states only"
        )
        + f"); micro-batch {r['micro_batch']} x {r['grad_accum']} per step",
        "",
        "model-state memory per device (GiB), extra = activations + buffers + reserve, largest model that fits, "
        "modelled TFLOPS/GCD",
        f"{'preset':<9} {'w':>4} {'g':>4} {'os':>4} {'sec':>4} {'weights':>8} {'second.':>8} {'grads':>7} "
        f"{'optim':>7} {'total':>7} {'extra':>7} {'fits':>4} {'max B':>7} {'TFLOPS':>7}",
    ]
    for p in r["presets"]:
        m, pl = p["memory_gib"], p["plan"]
        lines.append(
            f"{p['preset']:<9} {pl['weight_factor']:>4} {pl['grad_factor']:>4} {pl['optimizer_factor']:>4} "
            f"{pl['secondary_degree'] or '-':>4} {m['weights']:>8.2f} {m['secondary']:>8.2f} {m['gradients']:>7.2f} "
            f"{m['optimizer']:>7.2f} {m['total']:>7.2f} {p['reserve_gib']:>7.2f} {'yes' if p['fits'] else 'NO':>4} "
            f"{p['max_params'] / 1e9:>7.1f} {p['tflops_per_gcd']:>7.1f}"
        )
    lines += [
        "",
        f"fastest plans ({r['fitting_plans']} of {r['searched_plans']} legal plans fit)",
        f"{'#':>3} {'w':>4} {'g':>4} {'os':>4} {'sec':>4} {'bits w/s/g':>11} {'combine':>14} "
        f"{'GiB':>6} {'step s':>8} {'TFLOPS':>7} {'inter-node GB/step':>19}",
    ]
    for i, b in enumerate(r["best"], 1):
        pl = b["plan"]
        lines.append(
            f"{i:>3} {pl['weight_factor']:>4} {pl['grad_factor']:>4} {pl['optimizer_factor']:>4} "
            f"{pl['secondary_degree'] or '-':>4} {_bits(pl):>11} {pl['inter_node_reduce']:>14} "
            f"{b['memory_gib']:>6.1f} {b['step_s']:>8.2f} {b['tflops_per_gcd']:>7.1f} "
            f"{b['bytes_per_level']['inter_node'] / GB:>19.1f}"
        )
    if not r["best"]:
        lines.append("    no legal plan fits: add nodes, lower --reserve-gib, or use a smaller model")
    n_timed = sum(x.get("timed", False) for x in r["auto"])
    lines += [
        "",
        f"zero_topo.preset: auto ranks the presets and their INT8 combine/publish variants "
        f"({r['step_model']} step model; memory as the engine allocates it + reserve); "
        + (
            f"a run times the {n_timed} marked * (zero_topo.auto_trials) and trains with the fastest measured"
            if n_timed
            else "it runs #1"
        ),
        f"{'#':>3} {'plan':<44} {'GiB':>6} {'step s':>8}",
    ]
    for i, x in enumerate(r["auto"][: max(args_top(r), 2, n_timed)], 1):
        lines.append(
            f"{i:>3} {x['label']:<44} {x['memory_gib']:>6.1f} {x['step_s']:>8.3f}" + (" *" if x.get("timed") else "")
        )
    if not r["auto"]:
        lines.append("    nothing fits: auto would stop with one line")
    return "\n".join(lines)


def args_top(r: dict) -> int:
    return r.get("top", 10)


@interruptible
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        r = run(args)
    except (ConfigError, ValueError) as e:
        return fail(e)
    print(json.dumps(r, indent=1) if args.json else render(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
