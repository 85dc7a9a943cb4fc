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
per step from our counters (sum over ranks) next to the docs/design.md §4.8 formula (OK/MISMATCH) and next
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
Rank output goes to DIR/runs/<row>/launch.log (a row's folder is replaced when it runs again). DIR is
checked before anything runs (--dry-run and --pool too; megatron_topo.tool_outputs): it is refused
when it is not a folder, is or lies inside a checkpoint, an HF export or a run's log folder, or
holds files but is not bench_sharding's own (its tool.json, written when it claims a new or empty
folder, or the meta.json of an earlier round); a report name there that is a link, a FIFO or a
folder, and a --pool round's own files, are refused too. Every run's config (--model, --model-set,
--steps, --accumulation ...), topology and plan are checked before any cluster is built (--dry-run
too): a run its ranks would refuse is one line naming it, and nothing runs. The CPU is shared:
numbers are as noisy as the machine is busy (meta.json records the load average before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from megatron_topo.analysis.bench.accum import accum_defs, run_accum
from megatron_topo.analysis.bench.measure import measure, merge, row_key, summary_line
from megatron_topo.analysis.bench.report import machine, write_reports
from megatron_topo.analysis.bench.runs import (
    ACCUM_STRATEGIES,
    ALL_STRATEGIES,
    EXTRA_STRATEGIES,
    LOG_DIR,
    MODEL_SET,
    SCALING_STRATEGIES,
    run_def,
)
from megatron_topo.analysis.emulation import (
    ClusterSpec,
    EmulationError,
    Interrupted,
    check_privileges,
    format_rate,
    parse_rate,
)
from megatron_topo.analysis.emulation import cluster_spec as CS
from megatron_topo.analysis.emulation import rates as R
from megatron_topo.analysis.emulation.launch import install_signal_handlers, restore_signal_handlers
from megatron_topo.cli import OneLineParser, bounded, interruptible, path_arg, schema_bounded
from megatron_topo.config import TrainConfig
from megatron_topo.error_lines import clean, escaped
from megatron_topo.safe_files import read_small_text
from megatron_topo.tool_outputs import OutputError, check_file, check_folder, claim_folder

TOOL = "bench_sharding"
POOL_CAP = 64 << 20  # an earlier round's results.json / meta.json
META_KEYS = ("machine", "model_set", "steps", "warmup")  # an earlier round's meta.json before "tool"

NODES = bounded(int, 1, CS.MAX_NODES, why="one /24 per emulated node")
GPUS = bounded(int, 1, CS.MAX_GPUS_PER_NODE, why="one address per GPU package in a node's /24")
GCDS = bounded(int, 1, CS.MAX_GCDS_PER_GPU)
MTU = bounded(int, CS.MIN_MTU, CS.MAX_MTU, unit="bytes", why="Linux's range for a veth link")
TIMEOUT = bounded(float, CS.MIN_TIMEOUT_S, CS.MAX_TIMEOUT_S, unit="seconds")


def build_parser():
    """bench_sharding's options (``--help``: the module docstring)."""
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=NODES, default=2)
    ap.add_argument("--gpus-per-node", type=GPUS, default=2)
    ap.add_argument("--gcds-per-gpu", type=GCDS, default=2)
    ap.add_argument("--model", type=path_arg, default="configs/tiny.yml", help="model YAML (relative to the repo root)")
    ap.add_argument(
        "--model-set",
        nargs="*",
        default=list(MODEL_SET),
        metavar="KEY=VALUE",
        help="overrides applied to the model YAML (default: %(default)s)",
    )
    # --steps/--repeats: a benchmark runs as long as asked (no upper bound, docs/reliability.md)
    ap.add_argument("--steps", type=bounded(int, 1), default=8)
    ap.add_argument("--warmup", type=bounded(int, 0, 10_000), default=2)
    ap.add_argument(
        "--repeats",
        type=bounded(int, 1),
        default=1,
        help="rounds over all strategies (interleaved); step times are pooled over rounds",
    )
    ap.add_argument(
        "--out",
        type=path_arg,
        default="runs/bench_sharding",
        help="results folder: new, empty or an earlier --out of bench_sharding (its reports are replaced)",
    )
    ap.add_argument("--strategies", nargs="+", default=list(ALL_STRATEGIES), choices=ALL_STRATEGIES + EXTRA_STRATEGIES)
    ap.add_argument("--inter-node", default=R.DEFAULT_INTER_NODE)
    ap.add_argument("--intra-node", default=R.DEFAULT_INTRA_NODE)
    ap.add_argument("--intra-gpu", default=R.DEFAULT_INTRA_GPU)
    ap.add_argument("--mtu", type=MTU, default=1500)
    ap.add_argument(
        "--no-unshaped", dest="unshaped", action="store_false", help="skip the shaping-off run per strategy (no bounds)"
    )
    ap.add_argument(
        "--cpu-fit",
        type=path_arg,
        metavar="DIR",
        default=None,
        help="accumulation series without unshaped runs: the auto runs rank with the CPU constants an "
        "earlier round fitted (DIR/meta.json's cpu_fit) instead of configs/emulated_cpu.yml's",
    )
    ap.add_argument("--series", nargs="+", default=["main"], choices=("main", "scaling", "accum"))
    ap.add_argument(
        "--accumulation",
        nargs="+",
        type=schema_bounded(TrainConfig, "gradient_accumulation_steps"),
        default=[1, 2, 4, 8],
        metavar="K",
        help="accum series: micro-batches per optimizer step",
    )
    ap.add_argument(
        "--accum-strategies", nargs="+", default=list(ACCUM_STRATEGIES), choices=ALL_STRATEGIES + EXTRA_STRATEGIES
    )
    ap.add_argument(
        "--clusters",
        nargs="+",
        default=["frontier", "nvlink"],
        choices=sorted(R.PROFILES),
        help="accum series: link profiles (megatron_topo.analysis.emulation.rates.PROFILES); the "
        "unshaped run of each strategy and count is shared by them",
    )
    ap.add_argument("--scaling-nodes", nargs="+", type=NODES, default=[1, 2, 4])
    ap.add_argument("--scaling-gpus-per-node", type=GPUS, default=1)
    ap.add_argument("--scaling-gcds-per-gpu", type=GCDS, default=2)
    ap.add_argument(
        "--scaling-strategies", nargs="+", default=list(SCALING_STRATEGIES), choices=ALL_STRATEGIES + EXTRA_STRATEGIES
    )
    ap.add_argument("--timeout", type=TIMEOUT, default=900.0, help="seconds per run before it is stopped")
    ap.add_argument("--dry-run", action="store_true", help="print the runs and exit")
    ap.add_argument(
        "--pool",
        type=path_arg,
        nargs="+",
        default=None,
        metavar="DIR",
        help="run nothing: pool the rows of earlier runs' DIR/results.json (rounds of the same "
        "series; step times are pooled per row, unshaped times kept) and write the reports to --out",
    )
    return ap


def check_runs(defs) -> None:
    """ValueError (one line naming the run) when a run's config (--model, --model-set, --steps,
    --accumulation ...) does not load or its topology or plan is refused: what the run's ranks
    would find first, found here before any cluster is built. Runs that differ only in their log
    folder or cluster rates are checked once."""
    from megatron_topo.analysis.bench.runs import run_plan
    from megatron_topo.error_lines import first_line

    seen = set()
    for series, rd in defs:
        sets = tuple(x for x in rd.sets if not x.startswith("log_dir"))
        key = (rd.kind, rd.strategy, tuple(rd.configs), sets, rd.nodes, rd.gpus_per_node, rd.gcds_per_gpu)
        if key in seen:
            continue
        seen.add(key)
        try:
            run_plan(rd)
        except (ValueError, OSError) as e:
            raise ValueError(
                f"[{series}] {rd.strategy} on {rd.nodes}x{rd.gpus_per_node}x{rd.gcds_per_gpu} would be refused by "
                f"its ranks: {first_line(e)}; nothing was run"
            ) from None


@interruptible
def main(argv=None) -> int:
    """Run the series (or print them, or pool earlier runs); exit 0 when every row ran."""
    a = build_parser().parse_args(argv)
    prog = "bench_sharding"
    if a.steps <= a.warmup:
        print(f"error: --steps {a.steps} must exceed --warmup {a.warmup}", file=sys.stderr)
        return 2
    try:
        a.inter_bps, a.intra_bps = parse_rate(a.inter_node, "--inter-node"), parse_rate(a.intra_node, "--intra-node")
        a.intra_gpu_bps = parse_rate(a.intra_gpu, "--intra-gpu")
    except ValueError as e:
        print(clean(f"error: {e}"), file=sys.stderr)
        return 2
    out = os.path.abspath(a.out)
    try:
        check_out(a.out, [os.path.join(d, n) for d in a.pool or [] for n in ("results.json", "meta.json")])
    except OutputError as e:
        print(clean(f"error: {e}"), file=sys.stderr)
        return 2
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
    try:  # every run's config, topology and plan, before any cluster is built (--dry-run too)
        check_runs([*defs, *((f"accum {cl} k={k}", rd) for k, _s, cl, _ca, rd in accum)])
    except ValueError as e:
        print(clean(f"error: {e}"), file=sys.stderr)
        return 2
    if a.dry_run:
        for series, rd in defs:
            print(
                f"[{series}] {rd.nodes}x{rd.gpus_per_node}x{rd.gcds_per_gpu} {rd.strategy}: python {' '.join(rd.argv)}"
            )
        for k, s, cl, _ca, rd in accum:
            print(f"[accum {cl} k={k}] {s}: python {' '.join(rd.argv)}")
        return 0
    why = check_privileges()
    if why:
        print(f"error: cannot emulate a cluster here: {why}", file=sys.stderr)
        return 2
    claim_folder(out, TOOL)
    meta = {
        "machine": machine(),
        "model": a.model,
        "model_set": a.model_set,
        "steps": a.steps,
        "warmup": a.warmup,
        "repeats": a.repeats,
        "rates": {
            "inter_node": format_rate(a.inter_bps),
            "intra_node": format_rate(a.intra_bps),
            "intra_gpu": format_rate(a.intra_gpu_bps),
        },
        "load_before": os.getloadavg(),
        "argv": sys.argv,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if "main" in a.series:
        meta["main_spec"] = ClusterSpec(
            a.nodes, a.gpus_per_node, a.gcds_per_gpu, a.inter_bps, a.intra_bps, a.intra_gpu_bps
        ).describe()
    if "scaling" in a.series:
        meta["scaling_spec"] = (
            "Per node: "
            + ClusterSpec(
                1, a.scaling_gpus_per_node, a.scaling_gcds_per_gpu, a.inter_bps, a.intra_bps, a.intra_gpu_bps
            ).describe()
        )
    if accum:
        meta["clusters"] = {
            c: ClusterSpec(a.nodes, a.gpus_per_node, a.gcds_per_gpu, *(parse_rate(x) for x in R.PROFILES[c])).describe()
            for c in a.clusters
        }
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
                print(
                    f"[{k}/{total}] {series} {rd.strategy} on {rd.nodes}x{rd.gpus_per_node}x{rd.gcds_per_gpu}"
                    f"{f' (round {rep + 1})' if a.repeats > 1 else ''} ...",
                    flush=True,
                )
                try:
                    row = measure(rd, a, series, out, rep)
                except EmulationError as e:
                    row = {"series": series, "strategy": rd.strategy, "nodes": rd.nodes, "ok": False, "error": str(e)}
                print("    " + summary_line(row), flush=True)
                rounds.setdefault(row_key(row), []).append(row)
                rows = [merge(v, a) for v in rounds.values()]
                meta["load_after"] = os.getloadavg()
                write_reports(out, rows, meta)
    except Interrupted as e:
        print(f"error: interrupted ({e}); partial results in {out}", file=sys.stderr)
        write_reports(out, rows, meta)
        return 128 + e.signum
    finally:
        restore_signal_handlers(old)
    print(escaped(f"{prog}: wrote {out}/results.json, results.md, results.png"))
    with open(os.path.join(out, "results.md")) as f:
        print(f.read())
    return 0 if all(r.get("ok") for r in rows) else 1


def check_out(path: str, inputs=()) -> None:
    """Refuse the --out folder (OutputError) unless bench_sharding may write its reports there:
    megatron_topo.tool_outputs' folder rule (its own, new or empty; no artifact, no run log folder;
    runs/ a folder) and file rule for each report (not a link, FIFO or folder; not an --pool input)."""
    from megatron_topo.analysis.bench.report import REPORTS
    from megatron_topo.tool_outputs import MARKER

    check_folder(
        path,
        "--out",
        TOOL,
        owned=True,
        results="meta.json",
        legacy=META_KEYS,
        derived=[(os.path.join(path, "runs"), "each run's launch.log and logs")],
    )
    for name in (*REPORTS, MARKER):
        check_file(os.path.join(path, name), "--out", TOOL, inputs=inputs, own_folder=True)


def pool(a, out: str) -> int:
    """Rows of several runs pooled as rounds of one (``merge``); meta from the first run, with the
    pooled runs listed. A run without unshaped rows (``--no-unshaped``) adds step times only."""
    runs = []
    for d in a.pool:
        try:  # capped, non-blocking (a FIFO is refused, not waited on)
            rows = json.loads(read_small_text(os.path.join(d, "results.json"), POOL_CAP, ValueError))
            meta = json.loads(read_small_text(os.path.join(d, "meta.json"), POOL_CAP, ValueError))
            if not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows) and isinstance(meta, dict)):
                raise ValueError("not the row list and meta object bench_sharding writes")
        except (OSError, ValueError, RecursionError) as e:
            print(clean(f"error: --pool {d}: cannot read results.json/meta.json ({e})"), file=sys.stderr)
            return 2
        runs.append((d, rows, meta))
    groups: dict = {}
    for _, rows, _ in runs:
        for r in rows:
            groups.setdefault(row_key(r), []).append(r)
    merged = []
    try:  # rows of another shape (a field missing or of another type): one line, nothing written
        for rows in groups.values():
            m = merge(rows, a)
            m["rounds"] = sum(r.get("rounds", 1) for r in rows if r.get("ok"))
            merged.append(m)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        what = f"field {e.args[0]!r} missing" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        print(
            clean(f"error: --pool: the rows of {', '.join(a.pool)} are not the rows bench_sharding writes ({what})"),
            file=sys.stderr,
        )
        return 2
    meta = dict(runs[0][2], pooled=[d for d, _, _ in runs], repeats=sum(x[2].get("repeats", 1) for x in runs))
    meta.pop("tool", None)
    fit = lambda m: {k: v for k, v in (m.get("cpu_fit") or {}).items() if k != "from_run"}  # noqa: E731
    if any(fit(x[2]) != fit(meta) and fit(x[2]) for x in runs[1:]):  # --cpu-fit rounds reuse a fit: the same
        meta["cpu_fit_note"] = "the pooled runs fitted different CPU constants; the first run's are shown"
    claim_folder(out, TOOL)
    write_reports(out, merged, meta)
    print(escaped(f"bench_sharding: pooled {len(runs)} runs into {out}/results.json, results.md"))
    return 0 if all(r.get("ok") for r in merged) else 1
