"""The reports of a benchmark: results.json, meta.json, results.md (tables) and the plots; each
written atomically into the --out folder that bench_sharding checked and claimed
(megatron_topo.tool_outputs: a fresh temporary file renamed over the old one, never through a link)."""

from __future__ import annotations

import json
import os
import platform

from megatron_topo.tool_outputs import save_figure, write_bytes, write_result

from .runs import ROOT

TOOL = "bench_sharding"
REPORTS = ("results.json", "meta.json", "results.md", "results.png", "scaling.png", "accum.png")


def _mb(x):
    return "—" if x is None else f"{x / 1e6:.1f}"


def _ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "—"


def table_main(rows: list[dict]) -> str:
    """The main series as a markdown table, with ratios against zero3 and zeropp."""
    ok = {r["strategy"]: r for r in rows if r.get("ok")}
    z3 = ok.get("zero3", {}).get("tokens_per_sec")
    zpp = ok.get("zeropp", {}).get("tokens_per_sec")
    lines = [
        "| strategy | step s (median) | tokens/s | vs zero3 | vs zeropp | unshaped s | quant s | bound s (t0+comm) "
        "| bound s (overlap) | inter-node MB/step ours / formula / wire | check | intra-node MB ours / wire "
        "| intra-gpu MB ours / wire | busiest NIC MB | peak RSS MiB |",
        "|" + "---|" * 15,
    ]
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
            f"{r['peak_rss_bytes'] / 2**20:.0f} |"
        )
    return "\n".join(lines)


def table_scaling(rows: list[dict]) -> str:
    """Per strategy and node count: tokens/s; tokens/s relative to the first node count (on a
    machine with fixed cores the CPU-bound ideal is 1.0); the classic weak-scaling efficiency
    (relative / node ratio, the ideal on a real cluster); comm eff. = unshaped / shaped step time."""
    by = {}
    for r in rows:
        by.setdefault(r["strategy"], {})[r["nodes"]] = r
    nodes = sorted({r["nodes"] for r in rows})
    head = (
        "| strategy | "
        + " | ".join(f"tokens/s {n}N" for n in nodes)
        + " | "
        + " | ".join(f"rel. {n}N" for n in nodes[1:])
        + " | "
        + " | ".join(f"eff. {n}N" for n in nodes[1:])
        + " | "
        + " | ".join(f"comm eff. {n}N" for n in nodes)
        + " |"
    )
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
            ceff.append(
                r["unshaped_step_time_s"] / r["step_time_s"] if r.get("ok") and r.get("unshaped_step_time_s") else None
            )
        lines.append(
            f"| {s} | "
            + " | ".join(f(t, "{:.0f}") for t in tps)
            + " | "
            + " | ".join(f(x, "{:.2f}") for x in rel)
            + " | "
            + " | ".join(f(x, "{:.2f}") for x in eff)
            + " | "
            + " | ".join(f(x, "{:.2f}") for x in ceff)
            + " |"
        )
    return "\n".join(lines)


def plot_main(rows, path):
    """Throughput with its bounds and inter-node bytes per strategy (None without matplotlib)."""
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
    for i, (key, lab) in enumerate(
        (
            ("comm_bytes_inter_node", "our counters"),
            ("formula_bytes_inter_node", "docs/design.md §4.8 formula"),
            ("wire_bytes_inter_node", "measured on the veths"),
        )
    ):
        ax2.bar([k + (i - 1) * w for k in x], [(r.get(key) or 0) / 1e6 for r in ok], width=w, label=lab)
    ax2.set_xticks(list(x), names, rotation=30, ha="right")
    ax2.set_ylabel("inter-node MB per step (sum over ranks)")
    ax2.set_title("inter-node traffic")
    ax2.legend()
    fig.tight_layout()
    save_figure(fig, path, TOOL, dpi=110)
    plt.close(fig)
    return path


def plot_scaling(rows, path):
    """Tokens/s against node count per strategy (None without matplotlib)."""
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
    save_figure(fig, path, TOOL, dpi=110)
    plt.close(fig)
    return path


def machine() -> dict:
    """CPUs, platform, Python, torch, CPU model and memory of this machine."""
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
    """results.json, meta.json (``"tool": "bench_sharding"``), results.md and the plots of the series
    present in ``rows``."""
    write_bytes(os.path.join(out, "results.json"), json.dumps(rows, indent=1).encode())
    write_result(os.path.join(out, "meta.json"), meta, TOOL)
    main = [r for r in rows if r["series"] == "main"]
    scal = [r for r in rows if r["series"] == "scaling"]
    acc = [r for r in rows if r["series"] == "accum"]
    md = [
        "# bench_sharding results",
        "",
        f"Emulated cluster: {meta.get('main_spec', '')}. Model: {' '.join(meta['model_set'])}; "
        f"{meta['steps']} steps, median over steps > {meta['warmup']}"
        f"{' pooled over %d interleaved rounds' % meta['repeats'] if meta.get('repeats', 1) > 1 else ''}. "
        f"Machine: {meta['machine']}. "
        f"Load average before/after: {meta.get('load_before')} / {meta.get('load_after')}.",
        "",
    ]
    if main:
        md += ["## Strategies", "", table_main(main), ""]
    if scal:
        md += [
            "## Weak scaling",
            "",
            meta.get("scaling_spec", ""),
            "",
            table_scaling(scal),
            "",
            "rel. N = tokens/s at N nodes / tokens/s at the first node count (all ranks share the same "
            "cores, so the CPU-bound ideal here is 1.0); eff. N = rel. N / node ratio (weak-scaling "
            "efficiency, ideal 1.0 on a real cluster); comm eff. = unshaped / shaped step time at that "
            "size (1.0 = communication fully hidden or free).",
            "",
        ]
    if acc:
        from megatron_topo.analysis.emulation import accum_report

        md += [accum_report.render(acc, meta, ROOT), ""]
        accum_report.plot(acc, os.path.join(out, "accum.png"))
    write_bytes(os.path.join(out, "results.md"), "\n".join(md).encode())
    if main:
        plot_main(main, os.path.join(out, "results.png"))
    if scal:
        plot_scaling(scal, os.path.join(out, "scaling.png"))
