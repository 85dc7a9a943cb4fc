"""The accumulation series of ``tools/bench_sharding.py --series accum``: step time per strategy at
1, 2, 4, 8 micro-batches per step on each cluster profile, next to the performance model's
prediction (``predict.estimate_emulated``, CPU constants fitted over the unshaped rows),
the best topo variant's ratio to every other strategy, ``preset: auto`` against the fastest
measured preset, and where the lines cross (measured and predicted)."""

from __future__ import annotations

import math
import os
import statistics
from typing import Optional

from ...config import load_config
from ...topology import Topology
from ...zero_topo.sharding import Plan
from ..autoplan import COMPARED
from ..perf_model import Shape
from . import predict as emu

TOPO_VARIANTS = ("topo", "topo_q", "topo_q_ef", "topo_sec8")
RIVALS = ("zeropp", "mics", "zero3", "fsdp2_full", "fsdp2_hsdp")
PRESET_ROWS = ("ddp",) + TOPO_VARIANTS + RIVALS  # what "the fastest measured preset" is taken from


def cells(rows: list[dict]) -> dict:
    """{cluster: {strategy: {count: row}}} of the rows that finished."""
    out: dict = {}
    for r in rows:
        if r.get("ok"):
            out.setdefault(r["cluster"], {}).setdefault(r["strategy"], {})[r["accum"]] = r
    return out


def predictions(rows: list[dict], meta: dict, root: str) -> tuple[dict, Optional[dict]]:
    """{(cluster, strategy, count): predicted step s} and the CPU constants used; empty without
    unshaped rows."""
    ok = [r for r in rows if r.get("ok") and r.get("plan")]  # predicted; fitted only where unshaped runs exist
    if not any(r.get("unshaped_step_time_s") for r in ok):
        return {}, None
    r0 = ok[0]
    sets = [s for s in meta["model_set"] if not s.startswith("gradient_accumulation_steps")]
    cfg = load_config([os.path.join(root, meta["model"]), os.path.join(root, "configs", "emulated_cpu.yml")], sets)
    shape = Shape.from_config(cfg.model)
    topo = Topology(r0["world_size"], r0["gcds_per_gpu"], r0["gpus_per_node"])
    mb, rc = cfg.train.train_micro_batch_size_per_gpu, cfg.model.checkpoint_activations
    plan = lambda r: Plan(**r["plan"])  # noqa: E731  (per row: auto's plan differs between counts)
    fit = meta.get("cpu_fit")
    if fit:  # the constants the auto runs used (analysis.bench.accum.calibrate)
        cpu = emu.from_fit_record(fit)
    else:  # fitted over the unshaped rows of our own trainer (FSDP2 and auto are not in the fit)
        rows = [
            (plan(r), r["accum"], r["unshaped_step_time_s"])
            for r in ok
            if r["kind"] == "train" and r["strategy"] != "auto" and r.get("unshaped_step_time_s")
        ]
        # no unshaped run at all (--no-unshaped): configs/emulated_cpu.yml's constants, as auto's
        cpu = emu.fit_cpu(shape, topo, mb, rows, rc) if rows else emu.cpu_rates(cfg.system)
    # PyTorch FSDP2 runs the same plans with its own code: one constant, its CPU time per second of
    # ours, from its unshaped rows (one measurement per strategy and count, not per cluster)
    other: dict = {}
    for r in ok:
        if r["kind"] != "train" and r.get("unshaped_step_time_s"):
            other.setdefault(r["strategy"], {})[r["accum"]] = (plan(r), r["accum"], r["unshaped_step_time_s"])
    overhead = {s: emu.fit_stack_overhead(shape, topo, mb, list(v.values()), cpu, rc) for s, v in other.items()}
    out = {}
    for r in ok:
        system = emu.emulated_system(cfg.system, r["inter_node_rate_bps"], r["intra_node_rate_bps"])
        out[(r["cluster"], r["strategy"], r["accum"])] = emu.estimate_emulated(
            shape, plan(r), topo, system, mb, r["accum"], cpu, rc, stack_overhead=overhead.get(r["strategy"], 0.0)
        )["step_s"]
    return out, dict(emu.fit_record(cpu), stack_overhead=overhead)


def crossings(series: dict, counts: list[int]) -> list[str]:
    """Where one strategy's step time overtakes another's between consecutive counts (log2 interpolation)."""
    names, out = sorted(series), []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for k0, k1 in zip(counts, counts[1:]):
                try:
                    d0, d1 = series[a][k0] - series[b][k0], series[a][k1] - series[b][k1]
                except KeyError:
                    continue
                if d0 * d1 < 0:
                    x = math.log2(k0) + (math.log2(k1) - math.log2(k0)) * d0 / (d0 - d1)
                    first, then = (a, b) if d0 < 0 else (b, a)
                    out.append(f"{then} overtakes {first} between {k0} and {k1} micro-batches (at ~{2**x:.1f})")
    return out


PLAN_FIELDS = COMPARED + ("error_feedback",)  # what makes two runs of our trainer the same plan


def same_plan(a: dict, b: dict) -> bool:
    """Two rows ran the same plan (our trainer; FSDP2 rows run other code)."""
    return (
        a.get("kind") == b.get("kind") == "train"
        and bool(a.get("plan"))
        and bool(b.get("plan"))
        and all(a["plan"].get(f) == b["plan"].get(f) for f in PLAN_FIELDS)
    )


def _best(by: dict, names, k: int) -> Optional[tuple[str, float]]:
    got = [(s, by[s][k]["step_time_s"]) for s in names if k in by.get(s, {})]
    return min(got, key=lambda x: x[1]) if got else None


def _num(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.2f}"


def render(rows: list[dict], meta: dict, root: str) -> str:
    pred, cpu = predictions(rows, meta, root)
    counts = sorted({r["accum"] for r in rows if "accum" in r})
    md = [
        "## Accumulation series",
        "",
        f"Micro-batches per optimizer step {', '.join(map(str, counts))}; every other setting as above. "
        "Cells: measured median step s / the performance model's prediction (error). "
        + (
            f"The model's CPU constants, fitted over the unshaped rows of our trainer at every count "
            f"(predict.fit_cpu; the auto runs used the same): {cpu['flops_per_rank'] / 1e9:.2f} GFLOP/s per rank, "
            f"{cpu['transport_gbs']:.2f} GB/s of gloo copying machine-wide, "
            f"{cpu['quant_ns_per_element']:.2f} ns per quantized element, {cpu['call_us']:.0f} us per collective "
            f"ring step, {cpu['optimizer_ns_per_param']:.1f} ns per optimizer-shard parameter."
            + (
                " FSDP2's rows: the model of the same plan plus FSDP2's own CPU time in series, "
                + ", ".join(f"{s} {1 + v:.2f}x" for s, v in sorted(cpu["stack_overhead"].items()))
                + " our engine's modelled CPU time (predict.fit_stack_overhead over each one's unshaped rows)."
                if cpu["stack_overhead"]
                else ""
            )
            if cpu
            else "No prediction (no unshaped rows)."
        ),
        "",
    ]
    for cluster, by in cells(rows).items():
        md += [
            f"### {cluster}: {meta.get('clusters', {}).get(cluster, '')}",
            "",
            "| strategy | " + " | ".join(f"{k} micro-batch{'es' if k > 1 else ''}" for k in counts) + " |",
            "|---|" + "---:|" * len(counts),
        ]
        for s, per in by.items():
            cells_ = []
            for k in counts:
                r = per.get(k)
                if r is None:
                    cells_.append("—")
                    continue
                p = pred.get((cluster, s, k))
                cells_.append(
                    f"{r['step_time_s']:.2f}" + (f" / {p:.2f} ({p / r['step_time_s'] - 1:+.0%})" if p else "")
                )
            md.append(f"| {s} | " + " | ".join(cells_) + " |")
        md += [
            "",
            "Per cell: unshaped step s (all CPU work) · quantization s per step and rank · bound "
            "t0 + busiest link (no overlap):",
            "",
            "| strategy | " + " | ".join(str(k) for k in counts) + " |",
            "|---|" + "---:|" * len(counts),
        ]
        for s, per in by.items():
            md.append(
                f"| {s} | "
                + " | ".join(
                    (
                        f"{_num(per[k].get('unshaped_step_time_s'))} · {per[k].get('quant_s', 0):.2f} · "
                        f"{_num(per[k].get('lower_bound_s'))}"
                    )
                    if k in per
                    else "—"
                    for k in counts
                )
                + " |"
            )
        md += [
            "",
            "| micro-batches | best topo variant | "
            + " | ".join(f"vs {x}" for x in RIVALS)
            + " | fastest measured | auto's plan | auto vs fastest preset |",
            "|---|---|" + "---:|" * len(RIVALS) + "---|---|---:|",
        ]
        for k in counts:
            bt = _best(by, TOPO_VARIANTS, k)
            if bt is None:
                continue
            ratios = [f"{by[x][k]['step_time_s'] / bt[1]:.2f}x" if k in by.get(x, {}) else "—" for x in RIVALS]
            fastest = _best(by, PRESET_ROWS, k)
            auto = by.get("auto", {}).get(k)
            cell = "— | — |"
            if auto:
                said = auto.get("auto_choices") or [auto.get("auto_choice") or "?"]  # pooled rounds may differ
                names = sorted({c.split(" (")[0].split("chose ")[-1] for c in said})
                choice = " / ".join(names)
                twin = (
                    None
                    if len(names) > 1
                    else next(  # rounds that chose differently have no twin
                        (x for x in PRESET_ROWS if k in by.get(x, {}) and same_plan(by[x][k], auto)), None
                    )
                )
                cell = f"{choice}{f' (= {twin})' if twin else ''} | {auto['step_time_s'] / fastest[1]:.2f}x"
                if twin:  # the same configuration measured twice: both samples of it
                    both = statistics.median(auto["timed_s"] + by[twin][k]["timed_s"])
                    cell += f" (pooled with {twin}: {both / fastest[1]:.2f}x)"
                cell += " |"
            md.append(
                f"| {k} | {bt[0]} {bt[1]:.2f} s | "
                + " | ".join(ratios)
                + f" | {fastest[0]} {fastest[1]:.2f} s | "
                + cell
            )
        timed = [(k, by["auto"][k]["auto_trials"]) for k in counts if by.get("auto", {}).get(k, {}).get("auto_trials")]
        if timed:  # what preset auto measured before training (training.auto_trials), per cell
            md += [
                "",
                "preset auto's timing before training (first round of each cell; measured s, the model's s):",
                "",
            ]
            md += [f"- {k}: {line.split('slowest rank): ', 1)[-1]}" for k, line in timed]
        meas = {s: {k: r["step_time_s"] for k, r in per.items()} for s, per in by.items() if s != "auto"}
        prd = {
            s: {k: pred[(cluster, s, k)] for k in per if (cluster, s, k) in pred}
            for s, per in by.items()
            if s != "auto"
        }
        md += [
            "",
            "Crossings measured: " + ("; ".join(crossings(meas, counts)) or "none"),
            "",
            "Crossings predicted: " + ("; ".join(crossings(prd, counts)) or "none"),
            "",
        ]
    md.append(
        "Ratios > 1: the rival's step is longer than the best topo variant's. auto vs fastest preset "
        "< 1.05 is the acceptance bound (within 5 %)."
    )
    return "\n".join(md)


def plot(rows: list[dict], path: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    by = cells(rows)
    if not by:
        return None
    fig, axes = plt.subplots(1, len(by), figsize=(6.5 * len(by), 4.5), squeeze=False)
    for ax, (cluster, per) in zip(axes[0], by.items()):
        for s, pts in per.items():
            ks = sorted(pts)
            ax.plot(
                ks,
                [pts[k]["step_time_s"] / k for k in ks],
                marker="o",
                label=s,
                linestyle="--" if s.startswith("fsdp2") else "-",
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batches per optimizer step")
        ax.set_ylabel("step s per micro-batch (median)")
        ax.set_title(f"{cluster} links")
        ax.legend(fontsize=7)
    fig.tight_layout()
    from ...tool_outputs import save_figure

    save_figure(fig, path, "bench_sharding", dpi=110)
    plt.close(fig)
    return path
