"""What ``predict_perf`` prints and draws: the presets' table, ratios and scaling, the published
measurements next to the model, and the TFLOPS/GCD plot (a PNG that never replaces a user's file)."""

from __future__ import annotations

import os

from megatron_topo.config import ConfigError

GB = 1e9
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
        artifacts=True,  # never into a checkpoint save folder, an HF export or a run's log folder
    )


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
