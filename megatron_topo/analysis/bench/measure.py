"""One emulated run of a strategy, one measured row (shaped run, formula check, unshaped run) and
the rounds of a row pooled."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from typing import Optional

from megatron_topo.analysis import formulas
from megatron_topo.analysis.emulation import Cluster, ClusterSpec, launch, summarize
from megatron_topo.error_lines import child_error

from .runs import LEVELS, LOG_DIR, ROOT, RunDef, formula_bytes


def read_metrics(path: str) -> list[dict]:
    """The step records of a run's metrics.jsonl (none if it is missing)."""
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
    return {
        "quant_s": statistics.mean(per_rank) if per_rank else 0.0,
        "quant_s_max": max(per_rank) if per_rank else 0.0,
        "quant_ranks": len(per_rank),
    }


def _head(path: str, cap: int = 1 << 20) -> str:
    """The first ``cap`` bytes of a run's own launch.log (the ranks' error lines come early)."""
    try:
        with open(path, "rb") as f:
            return f.read(cap).decode("utf-8", "replace")
    except OSError:
        return ""


def run_one(rd: RunDef, a, shaped: bool, run_dir: str) -> dict:
    """One run on a fresh emulated cluster (links shaped or not): step times, bytes, RSS, CPU."""
    spec = ClusterSpec(
        rd.nodes,
        rd.gpus_per_node,
        rd.gcds_per_gpu,
        inter_node_bps=a.inter_bps if shaped else None,
        intra_node_bps=a.intra_bps if shaped else None,
        intra_gpu_bps=a.intra_gpu_bps if shaped else None,
        mtu=a.mtu,
    )
    if os.path.islink(run_dir):  # the link goes, not what it points to
        os.unlink(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir, exist_ok=True)
    logf = open(os.path.join(run_dir, "launch.log"), "w")
    cluster = Cluster(spec)
    row = {"ok": False}
    try:
        cluster.up()
        before = cluster.counters()
        argv = [x.replace(LOG_DIR, run_dir) for x in rd.argv]
        res = launch(
            cluster,
            [sys.executable, *argv],
            stdout_ranks="0",
            out=logf,
            err=logf,
            cwd=ROOT,
            timeout_s=a.timeout,
            env=dict(os.environ, **{KERNEL_TIMES_ENV: os.path.join(run_dir, "kernel_times")}),
        )
        after = cluster.counters()
    finally:
        cluster.down()
        logf.close()
    per_pkg = Cluster.delta(after, before)
    summ = summarize(per_pkg)
    recs = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    row.update(
        {
            "returncode": res.returncode,
            "wall_s": res.wall_s,
            "peak_rss_bytes": max(res.max_rss_bytes),
            "peak_rss_bytes_per_rank": res.max_rss_bytes,
            "cpu_s_per_rank": res.cpu_s,
            "cpu_utilisation": sum(res.cpu_s) / max(res.wall_s, 1e-9),
        }
    )
    if res.returncode or len(recs) < a.steps:
        cause = f": {child_error(_head(os.path.join(run_dir, 'launch.log')))}" if res.returncode else ""
        row["error"] = f"exit {res.returncode}, {len(recs)} of {a.steps} steps logged{cause}; see {run_dir}/launch.log"
        return row
    timed = [r["step_time_s"] for r in recs if r["step"] > a.warmup]
    last = recs[-1]
    gb_tokens = last["tokens_per_sec"] * last["step_time_s"]
    steps = len(recs)
    wire = {lvl: summ["wire_bytes"][lvl] / steps for lvl in LEVELS}
    busiest_intra = (
        max(max(p["tx_bytes"].get("intra_node", 0), p["rx_bytes"].get("intra_node", 0)) for p in per_pkg) / steps
    )
    row.update(
        {
            "ok": True,
            "step_time_s": statistics.median(timed),
            "step_times_s": [r["step_time_s"] for r in recs],
            "timed_s": timed,
            "tokens_per_step": gb_tokens,
            "loss_first": recs[0]["loss"],
            "loss_last": last["loss"],
            **{f"comm_bytes_{lvl}": int(last.get(f"comm_bytes_{lvl}", 0)) for lvl in LEVELS},
            "comm_bytes_constant": all(
                r.get("comm_bytes_inter_node") == last.get("comm_bytes_inter_node") for r in recs
            ),
            **{f"wire_bytes_{lvl}": int(wire[lvl]) for lvl in LEVELS},
            "busiest_nic_bytes": int(summ["busiest_nic_bytes"] / steps),
            "busiest_intra_node_link_bytes": int(busiest_intra),
            "tx_drops": summ["tx_drops"],
            "wire_packages": per_pkg,
            **read_kernel_times(os.path.join(run_dir, "kernel_times"), steps),
        }
    )
    return row


def _iqr(xs):
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


def measure(
    rd: RunDef,
    a,
    series: str,
    out: str,
    round_: int = 0,
    tag: Optional[str] = None,
    shared_unshaped: Optional[dict] = None,
) -> dict:
    """One round for one strategy: the shaped run, the formula check and the unshaped run
    (``shared_unshaped``: taken from a run already made, e.g. by another cluster of the series)."""
    tag = tag or f"{series}_{rd.strategy}_n{rd.nodes}" + (f"_r{round_}" if round_ else "")
    row = {
        "series": series,
        "strategy": rd.strategy,
        "kind": rd.kind,
        "notes": rd.notes,
        "nodes": rd.nodes,
        "gpus_per_node": rd.gpus_per_node,
        "gcds_per_gpu": rd.gcds_per_gpu,
        "world_size": rd.nodes * rd.gpus_per_node * rd.gcds_per_gpu,
        "inter_node_rate_bps": a.inter_bps,
        "intra_node_rate_bps": a.intra_bps,
        "command": " ".join(["python", *rd.argv]).replace(LOG_DIR, os.path.join(out, "runs", tag)),
    }
    t0 = time.time()
    shaped = run_one(rd, a, True, os.path.join(out, "runs", tag))
    row.update(shaped)
    try:
        want, exact = formula_bytes(rd, os.path.join(out, "runs", tag))
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
    row.update(
        {"step_time_s": med, "step_time_iqr_s": _iqr(row["timed_s"]), "tokens_per_sec": row["tokens_per_step"] / med}
    )
    if row.get("unshaped_timed_s"):
        t0c = statistics.median(row["unshaped_timed_s"])
        inter, intra = row.get("inter_node_rate_bps", a.inter_bps), row.get("intra_node_rate_bps", a.intra_bps)
        t_inter = row["busiest_nic_bytes"] * 8 / inter if inter else 0.0
        t_intra = row["busiest_intra_node_link_bytes"] * 8 / intra if intra else 0.0
        t_formula = (row["comm_bytes_inter_node"] / (row["nodes"] * row["gpus_per_node"])) * 8 / inter if inter else 0.0
        row.update(
            {
                "unshaped_step_time_s": t0c,
                "comm_time_inter_s": t_inter,
                "comm_time_intra_node_s": t_intra,
                "comm_time_formula_inter_s": t_formula,
                "lower_bound_s": t0c + max(t_inter, t_intra),  # compute, then the busiest link, no overlap
                "lower_bound_overlap_s": max(t0c, t_inter, t_intra),  # perfect overlap: a strict bound
                "lower_bound_formula_s": t0c + t_formula,  # our counters spread over every NIC
            }
        )
    return row


def row_key(r: dict) -> tuple:
    """Rows with the same key are rounds of one measurement (``merge`` pools them)."""
    return r.get("series"), r.get("strategy"), r.get("nodes"), r.get("cluster", ""), r.get("accum", 0)


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
        r[f"comm_bytes_{lvl}"] == m[f"comm_bytes_{lvl}"] for r in good for lvl in LEVELS
    )
    m["bench_seconds"] = sum(r.get("bench_seconds", 0) for r in rows)
    m["quant_s"] = statistics.median(r.get("quant_s", 0.0) for r in good)
    if m.get("strategy") == "auto":  # rounds (and pooled runs) may choose different plans: name each
        m["auto_choices"] = sorted({c for r in good for c in (r.get("auto_choices") or [r.get("auto_choice")]) if c})
    return finalize(m, a)


def summary_line(r: dict) -> str:
    """One row as the line printed after its run."""
    if not r.get("ok"):
        return f"FAILED: {r.get('error')}"
    s = (
        f"step {r['step_time_s']:.2f} s, {r['tokens_per_sec']:.0f} tok/s, inter-node ours "
        f"{r['comm_bytes_inter_node'] / 1e6:.1f} MB (formula {r.get('formula_bytes_inter_node', 0) / 1e6:.1f} MB: "
        f"{r.get('formula_check')}), wire {r['wire_bytes_inter_node'] / 1e6:.1f} MB, busiest NIC "
        f"{r['busiest_nic_bytes'] / 1e6:.1f} MB, peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB, "
        f"quantization {r.get('quant_s', 0.0):.3f} s/step per rank"
    )
    if r.get("unshaped_timed_s"):
        r = dict(r, unshaped_step_time_s=statistics.median(r["unshaped_timed_s"]))
    if r.get("unshaped_step_time_s") is not None and r.get("lower_bound_s") is not None:
        s += (
            f"; unshaped {r['unshaped_step_time_s']:.2f} s, bound t0+comm {r['lower_bound_s']:.2f} s "
            f"(overlap {r['lower_bound_overlap_s']:.2f} s)"
        )
    return s
