"""The accumulation series: its runs, the CPU calibration over their unshaped runs, and the rounds."""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Optional

from megatron_topo.analysis.emulation import EmulationError, parse_rate
from megatron_topo.analysis.emulation import rates as R

from .measure import measure, merge, row_key, run_one, summary_line
from .report import write_reports
from .runs import LOG_DIR, RunDef, run_def, run_plan


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
    then the five CPU constants of the emulated-cluster model fitted over them
    (``predict.fit_cpu``), handed to the auto runs as system-block settings."""
    from megatron_topo.analysis.emulation import predict as emu
    from megatron_topo.analysis.perf_model import Shape

    seen, fit_rows = set(), []
    for k, s, _c, ca, rd in accum:
        if s == "auto" or (k, s) in seen:
            continue
        seen.add((k, s))
        print(f"[calibrate] {s} x{k} unshaped ...", flush=True)
        base = run_one(rd, ca, False, os.path.join(out, "runs", f"accum_{s}_a{k}_unshaped"))
        unshaped[(k, s)] = (
            {"unshaped_timed_s": base["timed_s"], "unshaped_peak_rss_bytes": base["peak_rss_bytes"]}
            if base.get("ok")
            else {"unshaped_error": base.get("error")}
        )
        if base.get("ok") and rd.kind == "train":
            cfg, topo, plan = run_plan(rd)
            fit_rows.append((plan, k, statistics.median(base["timed_s"])))
    if not fit_rows:
        return []
    cfg, topo, _ = run_plan(accum[0][4])
    cpu = emu.fit_cpu(
        Shape.from_config(cfg.model),
        topo,
        cfg.train.train_micro_batch_size_per_gpu,
        fit_rows,
        cfg.model.checkpoint_activations,
    )
    meta["cpu_fit"] = dict(emu.fit_record(cpu), rows=len(fit_rows))
    print(f"[calibrate] {meta['cpu_fit']}", flush=True)
    return _system_sets(cpu)


def _system_sets(cpu) -> list:
    """``--set`` lines of the system-block fields that state the CPU constants ``cpu``."""
    from megatron_topo.analysis.emulation import predict as emu

    return [f"system.{k}={v:.6g}" for k, v in emu.system_fields(cpu).items()]


def earlier_fit(directory: Optional[str], meta: dict) -> list:
    """The system-block settings of the CPU constants an earlier round fitted (its meta.json's
    ``cpu_fit``), recorded in ``meta`` as this round's; none without ``directory``."""
    from megatron_topo.analysis.emulation import predict as emu

    if not directory:
        return []
    from megatron_topo.safe_files import read_json

    path = os.path.join(directory, "meta.json")
    try:  # capped and non-blocking; nesting too deep or a 5,000-digit integer is a reason, not a traceback
        fit = read_json(path, 16 << 20, OSError)["cpu_fit"]
        cpu = emu.from_fit_record(fit)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"error: --cpu-fit {directory}: no fitted constants in {path} ({e})") from None
    meta["cpu_fit"] = dict(fit, from_run=directory)
    print(f"[calibrate] constants of {directory}: {meta['cpu_fit']}", flush=True)
    return _system_sets(cpu)


def run_accum(accum: list, a, out: str, meta: dict, rounds: dict) -> list:
    """Calibration (``calibrate``), then rounds over (count, strategy, cluster), the clusters of a
    cell back to back; the unshaped run of a strategy and count is shared by the clusters."""
    total, n, unshaped = len(accum) * a.repeats, 0, {}
    sets = calibrate(accum, a, out, unshaped, meta) if a.unshaped else earlier_fit(getattr(a, "cpu_fit", None), meta)
    if sets:
        accum = [(k, s, c, ca, _with_sets(rd, sets) if s == "auto" else rd) for k, s, c, ca, rd in accum]
    for rep in range(a.repeats):
        for k, s, c, ca, rd in accum:
            n += 1
            print(f"[{n}/{total}] accum {c} {s} x{k}{f' (round {rep + 1})' if a.repeats > 1 else ''} ...", flush=True)
            if a.unshaped and (k, s) not in unshaped:
                base = run_one(rd, ca, False, os.path.join(out, "runs", f"accum_{s}_a{k}_unshaped"))
                unshaped[(k, s)] = (
                    {"unshaped_timed_s": base["timed_s"], "unshaped_peak_rss_bytes": base["peak_rss_bytes"]}
                    if base.get("ok")
                    else {"unshaped_error": base.get("error")}
                )
            try:
                row = measure(
                    rd,
                    ca,
                    "accum",
                    out,
                    rep,
                    tag=f"accum_{c}_{s}_a{k}_r{rep}",
                    shared_unshaped=unshaped.get((k, s), {}),
                )
            except EmulationError as e:
                row = {"series": "accum", "strategy": s, "nodes": rd.nodes, "ok": False, "error": str(e)}
            row.update(
                {"cluster": c, "accum": k, "inter_node_rate_bps": ca.inter_bps, "intra_node_rate_bps": ca.intra_bps}
            )
            if s == "auto":
                log = os.path.join(out, "runs", f"accum_{c}_{s}_a{k}_r{rep}", "launch.log")
                row["auto_choice"], row["auto_trials"] = auto_lines(log)
            print("    " + summary_line(row), flush=True)
            rounds.setdefault(row_key(row), []).append(row)
            rows = [merge(v, ca) for v in rounds.values()]
            meta["load_after"] = os.getloadavg()
            write_reports(out, rows, meta)
    return [merge(v, a) for v in rounds.values()]


def _with_sets(rd: RunDef, sets: list) -> RunDef:
    return RunDef(
        rd.strategy,
        rd.kind,
        rd.argv + [x for s in sets for x in ("--set", s)],
        rd.configs,
        rd.sets + sets,
        rd.nodes,
        rd.gpus_per_node,
        rd.gcds_per_gpu,
        rd.notes,
        dict(rd.extra),
    )


def auto_lines(log: str) -> tuple[Optional[str], Optional[str]]:
    """From a run's log: ``chose PLAN ...`` of the trainer's last ``preset auto`` line (the timed
    choice when plans were timed, training.auto_trials, else the model's) and the ``preset auto:
    timed ...`` line (every timed plan, measured and modelled), each None when absent."""
    try:
        with open(log) as f:
            lines = [ln.strip() for ln in f if "preset auto" in ln]
    except OSError:
        return None, None
    chose = [ln for ln in lines if "chose " in ln]
    timed = next((ln for ln in lines if "preset auto: timed" in ln), None)
    return (chose[-1][chose[-1].rindex("chose ") :] if chose else None), timed
