"""Frontier-scale dry run on one CPU: the real engine as one rank of 8..384 on meta tensors and the
fake process group. Its memory equals the exact formula (zero_topo/memory.py), tools/plan.py's
engine convention and docs/design.md §4.10's per-parameter formulas up to padding; its traffic equals the
per-level volume formulas; the CLI prints one JSON line last."""

import functools
import json
import os
import subprocess
import sys

import pytest

from megatron_topo.analysis import formulas
from megatron_topo.config import load_config
from megatron_topo.dryrun import dry_run
from megatron_topo.topology import LEVELS
from megatron_topo.zero_topo import memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = {
    m: [
        os.path.join(REPO, f"configs/{m}.yml"),
        os.path.join(REPO, "configs/topo.yml"),
        os.path.join(REPO, "configs/frontier.yml"),
    ]
    for m in ("20B", "10B")
}
GIB = 2**30


@functools.lru_cache(maxsize=None)
def _dry(model, gcds, rank, *sets):
    return dry_run(load_config(CFG[model], list(sets)), gcds, rank)


def _plan_tool_states(model, nodes):
    from megatron_topo.commands import plan as tool

    r = tool.run(tool.parse_args(["--model", CFG[model][0], "--system", CFG[model][2], "--nodes", str(nodes)]))
    return {p["preset"]: p for p in r["presets"]}["topo"]


@pytest.mark.parametrize("model,gcds,rank", [("20B", 8, 5), ("20B", 16, 11), ("10B", 16, 3)])
def test_dry_run_memory_and_traffic_equal_the_formulas(model, gcds, rank):
    cfg = load_config(CFG[model])
    r = _dry(model, gcds, rank)
    assert r["world_size"] == gcds and r["rank"] == rank
    st = r["model_state_bytes_per_rank"]
    numels = [int(n) for n in formulas.raw_unit_lengths(cfg.model)]
    from megatron_topo.zero_topo.sharding import Plan

    plan = Plan(**r["plan"])
    assert st == memory.state_bytes(numels, plan, gcds, cfg.precision)  # exact, padding and scales included
    # tools/plan.py (engine convention, its default) shows the same numbers
    tool = _plan_tool_states(model, gcds // 8)
    for k in ("weights", "secondary", "gradients", "optimizer", "total"):
        assert tool["memory_gib"][k] == pytest.approx(st[k] / GIB, rel=1e-12), k
    # docs/design.md §4.10 per parameter (fp16 weights 2psi/w, INT8 secondary psi/s, fp32 gradients 4psi/g,
    # Adam 12psi/os) up to the padding of each unit to whole blocks on every shard
    psi, (w, g, o), s = (
        r["parameters"],
        (plan.weight_factor, plan.grad_factor, plan.optimizer_factor),
        plan.secondary_degree,
    )
    assert st["weights"] == pytest.approx(2 * psi / w, rel=2e-3)
    assert st["secondary"] == pytest.approx(psi / s, rel=5e-3)  # + one fp32 scale per 2048 values
    assert st["gradients"] == pytest.approx(4 * psi / g, rel=2e-3)
    assert st["optimizer"] == pytest.approx(12 * psi / o, rel=2e-3)
    # one step's bytes per level equal docs/design.md §4.8's volume table for this rank
    topo = formulas.Topology(gcds, 2, 4)
    want = formulas.expected_bytes_per_rank(
        plan, topo, formulas.unit_lengths(cfg.model, plan, gcds), cfg.train.gradient_accumulation_steps, elem_bytes=2
    )
    for lvl in LEVELS:
        assert r["collective_bytes_per_step"][lvl] == pytest.approx(want[lvl], rel=1e-9, abs=1), lvl
    # peak: at least the states, the init peak at most the states + one unit's fp32 copy (+ a
    # quarter of it for the shard copies taken from it)
    big = max(memory.padded_units(numels, plan, gcds))
    assert r["peak_bytes_per_rank"] >= st["total"]
    assert r["init_peak_bytes_per_rank"] <= st["total"] - st["secondary"] + 1.25 * 4 * big
    # fits: the measured peak (dry run) and the estimate (plan tool, preflight), each + frontier.yml's reserve
    assert r["reserve_bytes"] == int(5.2 * GIB)
    assert r["fits"] is (r["peak_bytes_per_rank"] + r["reserve_bytes"] <= 64 * GIB)
    assert tool["fits"] is r["estimate_fits"]
    assert r["peak_bytes_per_rank"] <= r["estimate_bytes_per_rank"]["total"]  # the estimate bounds the step


def test_20b_topo_does_not_fit_8_or_16_gcds_with_the_reserve():
    small, big = _dry("20B", 8, 5), _dry("20B", 16, 11)
    assert small["model_state_bytes_per_rank"]["total"] / GIB == pytest.approx(67.0, abs=0.05)
    assert not small["fits"] and not small["estimate_fits"]
    # 16 GCDs: the estimate does not fit with the 5.2 GiB kept for context, RCCL buffers and
    # fragmentation (docs/frontier.md "Memory margin"): the preflight refuses it. The measured peak
    # does since the combines are bounded (4 units' fp16 copies in flight, not every unit's: 58.0
    # GiB); unbounded (max_combines_in_flight 0) it fits the 64 GiB only without the reserve
    assert big["peak_bytes_per_rank"] + big["reserve_bytes"] <= 64 * GIB and big["fits"]
    assert not big["estimate_fits"]
    every = _dry("20B", 16, 11, "zero_topo.max_combines_in_flight=0")
    assert every["peak_bytes_per_rank"] <= 64 * GIB < every["peak_bytes_per_rank"] + every["reserve_bytes"]
    assert every["peak_bytes_per_rank"] - big["peak_bytes_per_rank"] > 2.5 * GIB


def test_cli_20b_on_384_gcds_prints_json_last():
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "train.py"),
            *CFG["20B"],
            "--dry-run",
            "--world-size",
            "384",
            "--rank",
            "200",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    for key in (
        "parameters",
        "plan",
        "world_size",
        "model_state_bytes_per_rank",
        "peak_bytes_per_rank",
        "fits",
        "config",
    ):
        assert key in report, key
    assert report["parameters"] == 20_554_567_680 and report["world_size"] == 384 and report["rank"] == 200
    assert report["plan"]["preset"] == "topo" and report["plan"]["optimizer_factor"] == 384
    assert report["config"]["num_layers"] == 44 and report["config"]["zero_topo"]["preset"] == "topo"
    assert report["fits"] is True
    assert "plan: preset=topo" in out.stdout and "effective config:" in out.stdout


def test_cli_bad_rank_is_one_line():
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "train.py"),
            *CFG["20B"],
            "--dry-run",
            "--world-size",
            "16",
            "--rank",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: --rank 16 is outside the world of 16 ranks; valid 0..15"]
