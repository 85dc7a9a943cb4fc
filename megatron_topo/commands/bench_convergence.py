"""Convergence with quantized communication, like ZeRO++'s accuracy table: the tiny GPT on the
built-in corpus, 8 local ranks (2 nodes x 2 GPUs x 2 GCDs), one run per variant, same data/seed.

    python tools/bench_convergence.py [--steps 1000] [--out runs/bench_convergence] [--variants ...] [--reuse]

Variants (zero_topo overrides on configs/topo.yml):
  exact        topo's factors, every wire at 16 bits (the unquantized reference)
  topo         the paper: INT8 weight gathers and secondary, INT4 in-node gradient reduction
  topo_ef      + error feedback on the INT4 reduction
  topo_q       + INT8 cross-node combine and INT8 post-step gather (combine_bits/publish_bits 8)
  topo_q_ef    + error feedback on both
Prints a table (final loss = mean of the last 3 logged windows, ratio to exact), writes
DIR/results.json and DIR/loss.png. About 1 min per 100 steps per variant on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from megatron_topo.atomic import write_text
from megatron_topo.cli import OneLineParser, bounded

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

EXACT = ["zero_topo.weight_bits=16", "zero_topo.secondary_bits=16", "zero_topo.grad_bits=16"]
Q = ["zero_topo.combine_bits=8", "zero_topo.publish_bits=8"]
EF = ["zero_topo.error_feedback=true"]
VARIANTS = {"exact": EXACT, "topo": [], "topo_ef": EF, "topo_q": Q, "topo_q_ef": Q + EF}


def run(out: str, name: str, steps: int, ranks: int, reuse: bool = False) -> list[dict]:
    log = os.path.join(out, name)
    metrics = os.path.join(log, "metrics.jsonl")
    if reuse and os.path.exists(metrics):
        recs = [json.loads(x) for x in open(metrics) if x.strip()]
        if recs and recs[-1].get("step") == steps:
            print(f"{name}: reusing {metrics} ({steps} steps)", flush=True)
            return recs
    sets = [
        f"train_iters={steps}",
        f"log_dir={log}",
        "save=null",
        "eval_interval=0",
        "log_interval=10",
        "progress_bar=false",
        *VARIANTS[name],
    ]
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "torchrun"),
        "--standalone",
        "--nproc_per_node",
        str(ranks),
        "train.py",
        "configs/tiny.yml",
        "configs/topo.yml",
        "configs/local_cpu.yml",
    ]
    for s in sets:
        cmd += ["--set", s]
    if os.path.exists(metrics):
        os.remove(metrics)
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: variant {name} failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    return [json.loads(x) for x in open(metrics)]


def main(argv=None) -> int:
    ap = OneLineParser(prog="bench_convergence.py", description=__doc__.splitlines()[0])
    # --steps: a benchmark runs as long as asked (no upper bound, docs/reliability.md)
    ap.add_argument("--steps", type=bounded(int, 30, why="three logged windows"), default=1000)
    ap.add_argument("--ranks", type=bounded(int, 1, 64, why="local processes"), default=8)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_convergence"))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="read a variant whose DIR/VARIANT/metrics.jsonl already reaches --steps instead of rerunning it",
    )
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
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
    write_text(os.path.join(a.out, "results.json"), json.dumps(res, indent=1))
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
    fig.savefig(os.path.join(a.out, "loss.png"), dpi=120)
    print(f"results: {os.path.join(a.out, 'results.json')}, {os.path.join(a.out, 'loss.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
