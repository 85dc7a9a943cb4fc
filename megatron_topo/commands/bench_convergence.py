"""Convergence with quantized communication, like ZeRO++'s accuracy table: the tiny GPT on the
built-in corpus, 8 local ranks (2 nodes x 2 GPUs x 2 GCDs), one run per variant, same data/seed.

    python tools/bench_convergence.py [--steps 1000] [--out runs/bench_convergence] [--variants ...] [--reuse]

Variants (zero_topo overrides on configs/topo.yml):
  exact        topo's factors, every wire at 16 bits (the unquantized reference)
  topo         the paper: INT8 weight gathers and secondary, INT4 in-node gradient reduction
  topo_ef      + error feedback on the INT4 reduction
  topo_q       + INT8 cross-node combine and INT8 post-step gather (combine_bits/publish_bits 8)
  topo_q_ef    + error feedback on both
--ranks and --steps are checked against every variant's config before anything starts (its topology,
2 GPUs x 2 GCDs per node, takes a multiple of 4 ranks); a failed run is reported with its ranks' own
error line. Prints a table (final loss = mean of the last 3 logged windows, ratio to exact), writes
DIR/results.json (with ``"tool": "bench_convergence"``) and DIR/loss.png. About 1 min per 100 steps
per variant on 2 cores.

Each variant trains with log_dir DIR/VARIANT, whose metrics.jsonl is removed first: DIR must be
new, empty or bench_convergence's own (its tool.json, written when it claims the folder, or the
results.json of an earlier run), and is refused when it is not a folder, is or lies inside a
checkpoint, an HF export or a run's log folder, or a DIR/VARIANT is a link or not a folder
(megatron_topo.tool_outputs). So ``--out runs`` never deletes a run's ``runs/topo/metrics.jsonl``.
``--reuse`` reads a variant's metrics like plot_metrics does (capped lines; a corrupt line is
skipped with a warning).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

from megatron_topo.cli import OneLineParser, bounded, interruptible, path_arg
from megatron_topo.error_lines import child_error, clean, emit, escaped, first_line
from megatron_topo.tool_outputs import (
    OutputError,
    check_file,
    check_folder,
    claim_folder,
    lines_of,
    save_figure,
    write_result,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

EXACT = ["zero_topo.weight_bits=16", "zero_topo.secondary_bits=16", "zero_topo.grad_bits=16"]
Q = ["zero_topo.combine_bits=8", "zero_topo.publish_bits=8"]
EF = ["zero_topo.error_feedback=true"]
VARIANTS = {"exact": EXACT, "topo": [], "topo_ef": EF, "topo_q": Q, "topo_q_ef": Q + EF}
TOOL = "bench_convergence"
LEGACY = ("steps", "ranks", "final_loss", "curves")  # a results.json written before the "tool" field
OUTPUTS = ("results.json", "loss.png")


def check_out(out: str, variants) -> None:
    """Refuse ``--out`` (OutputError) unless bench_convergence may remove its variants' metrics
    there (megatron_topo.tool_outputs: its own, new or empty folder; see the module docstring)."""
    from megatron_topo.tool_outputs import MARKER

    check_folder(
        out,
        "--out",
        TOOL,
        owned=True,
        results="results.json",
        legacy=LEGACY,
        derived=[(os.path.join(out, v), f"the {v} variant's training logs") for v in variants],
    )
    for name in (*OUTPUTS, MARKER):
        check_file(os.path.join(out, name), "--out", TOOL, own_folder=True)
    for v in variants:
        m = os.path.join(out, v, "metrics.jsonl")
        if os.path.isdir(m) and not os.path.islink(m):
            raise OutputError(f"--out {out}: {m} is a folder; the {v} variant writes its metrics file there")


def read_curve(metrics: str) -> list[dict]:
    """The training records (a finite ``loss``) of a variant's metrics.jsonl, one per step, read
    capped and tolerant (metrics.read_metrics); its warnings printed as warning: lines."""
    from megatron_topo.metrics import drop_superseded, read_metrics

    try:
        recs, warned = lines_of(lambda: read_metrics(metrics))
    except FileNotFoundError:
        return []
    for w in warned:
        emit("warning", w)
    ok = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    recs = [r for r in recs if ok(r.get("loss")) and isinstance(r.get("step"), int) and not isinstance(r["step"], bool)]
    by_step = {r["step"]: r for r in drop_superseded(recs)[0]}  # a resumed run's repeated steps: the last
    return [by_step[s] for s in sorted(by_step)]


CONFIGS = ("configs/tiny.yml", "configs/topo.yml", "configs/local_cpu.yml")  # relative to ROOT
MAX_RANKS = 64  # local processes


def variant_sets(name: str, steps: int, log: str) -> list[str]:
    """The ``--set`` overrides of a variant's training run."""
    return [
        f"train_iters={steps}",
        f"log_dir={log}",
        "save=null",
        "eval_interval=0",
        "log_interval=10",
        "progress_bar=false",
        *VARIANTS[name],
    ]


def check_runnable(out: str, variants, steps: int, ranks: int) -> None:
    """Refuse (ValueError, one line) flags the variants' runs would refuse, before any run starts: each
    variant's config loads with these --steps, and its topology and plan hold on ``ranks`` local ranks
    (what train.py checks first; the valid rank counts named when they do not)."""
    from megatron_topo.analysis import autoplan
    from megatron_topo.config import load_config
    from megatron_topo.topology import topology_from_config

    cwd = os.getcwd()
    os.chdir(ROOT)  # the configs' relative paths, as the runs see them (cwd=ROOT)
    try:
        cfgs = {}
        for v in variants:
            try:
                cfgs[v] = load_config(list(CONFIGS), variant_sets(v, steps, os.path.join(out, v)))
            except ValueError as e:  # ConfigError: e.g. --steps past train_iters' bound
                raise ValueError(f"--steps {steps}: variant {v}'s config is refused: {first_line(e)}") from None
    finally:
        os.chdir(cwd)

    def why(n: int) -> str:
        for v, cfg in cfgs.items():
            try:
                autoplan.resolve(cfg, topology_from_config(cfg.topology, n, n))
            except ValueError as e:
                return f"variant {v}: {first_line(e)}"
        return ""

    reason = why(ranks)
    if reason:
        ok = [n for n in range(1, MAX_RANKS + 1) if not why(n)]
        shown = ", ".join(map(str, ok[:8])) + (f", ... {ok[-1]}" if len(ok) > 8 else "") if ok else "none"
        raise ValueError(f"--ranks {ranks} cannot run {reason}; valid --ranks: {shown}")


def run(out: str, name: str, steps: int, ranks: int, reuse: bool = False) -> list[dict]:
    log = os.path.join(out, name)
    metrics = os.path.join(log, "metrics.jsonl")
    if reuse and os.path.isfile(metrics):
        recs = read_curve(metrics)
        if recs and recs[-1]["step"] == steps:
            print(f"{name}: reusing {metrics} ({steps} steps)", flush=True)
            return recs
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "torchrun"),
        "--standalone",
        "--nproc_per_node",
        str(ranks),
        "train.py",
        *CONFIGS,
    ]
    for s in variant_sets(name, steps, log):
        cmd += ["--set", s]
    if os.path.lexists(metrics):  # this tool's own earlier run (check_out): a link goes, not its target
        os.remove(metrics)
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if r.returncode != 0:  # the ranks' own error line, not torchrun's summary around it
        raise SystemExit(clean(f"error: variant {name} failed (exit {r.returncode}): {child_error(r.stderr)}"))
    recs = read_curve(metrics)
    if len(recs) < 3:
        raise SystemExit(clean(f"error: variant {name}: {metrics} holds {len(recs)} loss records, not the 3 needed"))
    return recs


@interruptible
def main(argv=None) -> int:
    ap = OneLineParser(prog="bench_convergence.py", description=__doc__.splitlines()[0])
    # --steps: a benchmark runs as long as asked (no upper bound, docs/reliability.md)
    ap.add_argument("--steps", type=bounded(int, 30, why="three logged windows"), default=1000)
    ap.add_argument("--ranks", type=bounded(int, 1, MAX_RANKS, why="local processes"), default=8)
    ap.add_argument(
        "--out",
        type=path_arg,
        default=os.path.join(ROOT, "runs", "bench_convergence"),
        help="results folder: new, empty or an earlier --out of bench_convergence (its variants' runs are replaced)",
    )
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="read a variant whose DIR/VARIANT/metrics.jsonl already reaches --steps instead of rerunning it",
    )
    a = ap.parse_args(argv)
    try:
        check_out(a.out, a.variants)
        check_runnable(a.out, a.variants, a.steps, a.ranks)
    except (OutputError, ValueError) as e:
        print(clean(f"error: {e}"), file=sys.stderr)
        return 2
    claim_folder(a.out, TOOL)
    curves = {name: run(a.out, name, a.steps, a.ranks, a.reuse) for name in a.variants}
    final = {n: sum(r["loss"] for r in c[-3:]) / 3 for n, c in curves.items()}
    ref = final.get("exact")
    print(f"{'variant':<10} {'final loss':>10} {'vs exact':>9}")
    for n, v in final.items():
        print(f"{n:<10} {v:>10.4f} {(v / ref - 1) * 100 if ref else float('nan'):>+8.2f}%")
    res = {
        "steps": a.steps,
        "ranks": a.ranks,
        "final_loss": final,
        "curves": {n: [(r["step"], r["loss"]) for r in c] for n, c in curves.items()},
    }
    write_result(os.path.join(a.out, "results.json"), res, TOOL)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for n, c in res["curves"].items():
        ax.plot([s for s, _ in c], [v for _, v in c], label=n)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (10-step windows)")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, os.path.join(a.out, "loss.png"), TOOL, dpi=120)
    print(escaped(f"results: {os.path.join(a.out, 'results.json')}, {os.path.join(a.out, 'loss.png')}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
