"""``zero_topo.preset: auto``: the fastest legal plan that fits, from the performance and memory models.

Candidates are the named presets, each also with INT8 once-per-step traffic (``combine_bits`` /
``publish_bits`` 8), restricted to the fields the user's ``zero_topo`` block sets explicitly
(``preset: auto`` with ``combine_bits: 16`` keeps the combine exact); when the pinned fields match
no preset, every legal plan that matches them (``perf_model.legal_plans``, the AMSP-style space).
The presets are where the step models are validated against measurements (docs/benchmark.md); over
the whole legal space the emulated-cluster model ranked a plan first (w 4, g 8, secondary 1) that
measured 1.29x slower than topo (docs/benchmark.md, "preset: auto"). A plan
fits when the trainer's preflight estimate (model states exactly as the engine allocates them +
activations + gathered units) fits ``system.device_memory_gib``. Plans are ranked by modelled step
time for the configured micro-batch and accumulation count, with the step model the system block
names: ``device`` (``perf_model.estimate_step``) or ``emulated_cpu``
(``emulation.predict.estimate_emulated``, where quantization and gloo's copying cost CPU time).
Steps within 0.5 % of the fastest tie; ties go to fewer quantized bits (accuracy), then to a named
preset (or fewest changes to one), then to less memory. The models are validated to about 25 % per
plan, so a training run then times the few plans modelled closest to the fastest
(:func:`shortlist`; megatron_topo.training.auto_trials) and trains with the fastest measured.
``tools/plan.py`` prints the same ranking (:func:`rank_plans`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from .. import preflight
from ..config import Config, ConfigError, SystemConfig, ZeroTopoConfig
from ..model import unit_numels
from ..topology import Topology
from ..zero_topo.plan_space import COMBINE_BITS, PUBLISH_BITS, UNQUANTIZED
from ..zero_topo.sharding import PRESETS, Plan, resolve_plan
from . import perf_model as pm

GIB = 2**30
# plan fields a user may pin under ``preset: auto`` (None in the block = searched)
SEARCHED = (
    "weight_factor",
    "grad_factor",
    "optimizer_factor",
    "secondary_degree",
    "weight_bits",
    "secondary_bits",
    "grad_bits",
    "combine_bits",
    "publish_bits",
)
# fields copied from the user's block onto every candidate
CARRIED = ("quant_block_size", "grad_quant_block_size", "prefetch", "deterministic", "error_feedback")
COMPARED = SEARCHED + ("inter_node_reduce",)
TIE = 0.005  # modelled steps within 0.5 % of each other count as equally fast


@dataclass(frozen=True)
class Ranked:
    plan: Plan  # its ``preset`` is the closest named preset (``label`` says how it differs)
    label: str  # "topo", or "topo+combine_bits=8,publish_bits=8"
    step_s: float  # modelled optimizer step
    memory_bytes: int  # preflight estimate per rank: model states + activations + buffers


def step_time(
    shape: pm.Shape,
    plan: Plan,
    topo: Topology,
    system: SystemConfig,
    micro_batch: int,
    grad_accum: int,
    recompute: bool,
) -> float:
    """Modelled seconds per optimizer step under ``system.step_model``."""
    if system.step_model == "emulated_cpu":
        from .emulation import predict as emu

        return emu.estimate_emulated(
            shape, plan, topo, system, micro_batch, grad_accum, emu.cpu_rates(system), recompute
        )["step_s"]
    return pm.estimate_step(shape, plan, topo, system, micro_batch, grad_accum, recompute).step_s


def _fields(plan: Plan) -> dict:
    return {k: getattr(plan, k) for k in COMPARED}


@functools.lru_cache(maxsize=64)
def _preset_plans(topo: Topology) -> tuple[Plan, ...]:
    out = []
    for name in PRESETS:
        try:
            out.append(resolve_plan(ZeroTopoConfig(preset=name), topo))
        except ConfigError:
            pass
    return tuple(out)


def label(plan: Plan, topo: Topology) -> tuple[str, dict]:
    """The named preset ``plan`` is, or the closest one and the fields that differ from it."""
    mine, best = _fields(plan), None
    for p in _preset_plans(topo):
        name, ref = p.preset, _fields(p)
        diff = {k: v for k, v in mine.items() if ref[k] != v}
        if best is None or len(diff) < len(best[1]):
            best = (name, diff)
    name, diff = best
    text = name + ("+" + ",".join(f"{k}={'none' if v is None else v}" for k, v in diff.items()) if diff else "")
    return text, diff


def as_zero_topo(plan: Plan, topo: Topology, z: ZeroTopoConfig) -> ZeroTopoConfig:
    """A ``zero_topo`` block that resolves to ``plan``: its closest preset plus every field that differs."""
    text, diff = label(plan, topo)
    over = {k: (0 if k == "secondary_degree" and v is None else v) for k, v in diff.items()}
    out = dataclasses.replace(z, **{"preset": text.split("+")[0], **{k: None for k in SEARCHED}, **over})
    if "inter_node_reduce" not in diff:
        out = dataclasses.replace(out, inter_node_reduce=plan.inter_node_reduce)
    got = resolve_plan(out, topo)
    if _fields(got) != _fields(plan):  # a defect, not a user error
        raise AssertionError(f"auto: {out} resolves to {_fields(got)}, not {_fields(plan)}")
    return out


def preset_variants(topo: Topology) -> list[Plan]:
    """The named presets, each also with its once-per-step traffic in INT8 (combine and/or publish,
    where the plan has that collective)."""
    out = []
    for p in _preset_plans(topo):
        w, g, o = p.factors
        for cb in COMBINE_BITS if g < topo.world_size else (UNQUANTIZED,):
            for pb in PUBLISH_BITS if o > w else (UNQUANTIZED,):
                out.append(dataclasses.replace(p, combine_bits=cb, publish_bits=pb))
    return out


def candidates(z: ZeroTopoConfig, topo: Topology) -> list[Plan]:
    """The presets and their INT8 once-per-step variants that agree with the fields ``z`` pins
    (when none does, every legal plan that does), with ``z``'s block sizes, prefetch, determinism
    and error feedback."""
    pinned = {k: getattr(z, k) for k in SEARCHED if getattr(z, k) is not None}
    if pinned.get("secondary_degree") == 0:
        pinned["secondary_degree"] = None

    def agree(plans: Iterable[Plan]) -> list[Plan]:
        seen, out = set(), []
        for p in plans:
            if any(getattr(p, k) != v for k, v in pinned.items()):
                continue
            p = dataclasses.replace(p, **{k: getattr(z, k) for k in CARRIED})
            key = tuple(_fields(p).values())
            if key not in seen and pm._legal(p, topo):
                seen.add(key)
                out.append(p)
        return out

    return agree(preset_variants(topo)) or agree(pm.legal_plans(topo))


def rank_plans(
    cfg: Config,
    topo: Topology,
    system: Optional[SystemConfig] = None,
    plans: Optional[Sequence[Plan]] = None,
    reserve_bytes: Optional[float] = None,
    progress: Callable[[Iterable], Iterable] = lambda it: it,
) -> list[Ranked]:
    """Every candidate plan that fits, fastest first (module docstring). ``reserve_bytes`` replaces
    the activation/buffer estimate by a fixed reserve (tools/plan.py --reserve-gib)."""
    system = system or cfg.system
    if system is None:
        raise ConfigError(
            "zero_topo.preset: auto needs a system: block (the machine's rates and memory); add "
            "configs/frontier.yml, configs/dgx_a100.yml or configs/emulated_cpu.yml"
        )
    shape, t, m = pm.Shape.from_config(cfg.model), cfg.train, cfg.model
    numels = unit_numels(m)
    limit = system.device_memory_gib * GIB
    limit -= preflight.reserve_bytes(dataclasses.replace(cfg, system=system), int(limit))
    ranked = []
    for p in progress(candidates(cfg.zero_topo, topo) if plans is None else plans):
        est = preflight.estimate(cfg, p, topo.world_size, numels)
        need = est["model_states"] + (est["total"] - est["model_states"] if reserve_bytes is None else reserve_bytes)
        if need > limit:
            continue
        s = step_time(
            shape,
            p,
            topo,
            system,
            t.train_micro_batch_size_per_gpu,
            t.gradient_accumulation_steps,
            m.checkpoint_activations,
        )
        name, _ = label(p, topo)
        ranked.append(Ranked(dataclasses.replace(p, preset=name.split("+")[0]), name, s, int(need)))
    return tie_order(ranked)


def _tie_key(r: Ranked) -> tuple:
    """Among plans as fast as each other: fewer quantized bits (accuracy), then a named preset or
    fewer changes to one, then less memory."""
    p = r.plan
    bits = (
        p.weight_bits + (p.secondary_bits if p.secondary_degree else 16) + p.grad_bits + p.combine_bits + p.publish_bits
    )
    return -bits, r.label.count(",") + ("+" in r.label), r.memory_bytes, r.label


def tie_order(ranked: list[Ranked]) -> list[Ranked]:
    """Fastest first, where plans within ``TIE`` of the fastest remaining one tie (``_tie_key``)."""
    rest, out = sorted(ranked, key=lambda r: r.step_s), []
    while rest:
        n = next((i for i, r in enumerate(rest) if r.step_s > rest[0].step_s * (1 + TIE)), len(rest))
        out += sorted(rest[:n], key=_tie_key)
        rest = rest[n:]
    return out


def choose(cfg: Config, topo: Topology) -> tuple[ZeroTopoConfig, list[Ranked]]:
    """The ``zero_topo`` block ``preset: auto`` runs, and the ranking it came from."""
    ranked = rank_plans(cfg, topo)
    if not ranked:
        raise ConfigError(
            f"zero_topo.preset: auto: no legal plan fits {cfg.system.device_memory_gib:g} GiB per device "
            f"on {topo.describe()} with this model; add nodes or use a smaller model"
        )
    return as_zero_topo(ranked[0].plan, topo, cfg.zero_topo), ranked


def plan_of(r: Ranked, cfg: Config, topo: Topology) -> Plan:
    """The plan a run of ``r`` trains with (resolved from its ``zero_topo`` block, as a user's)."""
    return resolve_plan(as_zero_topo(r.plan, topo, cfg.zero_topo), topo)


def resolve(cfg: Config, topo: Topology) -> tuple[Plan, Optional[list[Ranked]]]:
    """``resolve_plan`` for every preset; for ``auto`` the chosen plan and its ranking."""
    if cfg.zero_topo.preset != "auto":
        return resolve_plan(cfg.zero_topo, topo, cfg.zero_optimization), None
    if cfg.zero_optimization is not None:
        raise ConfigError("zero_topo.preset: auto and a zero_optimization block exclude each other; keep one")
    z, ranked = choose(cfg, topo)
    return resolve_plan(z, topo), ranked


def shortlist(ranked: Sequence[Ranked], count: int, window: float) -> list[Ranked]:
    """The plans a run times before choosing (training.auto_trials): the first ``count`` of the
    ranking modelled within ``window`` (a fraction) of the fastest; none when fewer than two."""
    if not ranked or count < 2:
        return []
    best = ranked[0].step_s
    near = [r for r in ranked if r.step_s <= best * (1 + window)][:count]
    return list(near) if len(near) > 1 else []


def timed_note(ranked: Sequence[Ranked], z: ZeroTopoConfig) -> Optional[str]:
    """One line naming the plans a run would time, or None when it runs the model's choice untimed."""
    short = shortlist(ranked, z.auto_trials, z.auto_trial_window)
    if not short:
        return None
    return (
        f"preset auto: a run first times {len(short)} plans modelled within {z.auto_trial_window:.0%} of the "
        f"fastest ({', '.join(r.label for r in short)}; {z.auto_trial_steps} steps per pass, two passes each, the "
        f"two fastest up to {z.auto_trial_passes} while close, zero_topo.auto_trials) and trains with the fastest "
        f"measured"
    )


def summary(ranked: Sequence[Ranked], system: SystemConfig) -> str:
    """One line: the choice and the runner-up with their modelled step times."""

    def one(r: Ranked) -> str:
        p = r.plan
        sec = f", secondary {p.secondary_degree}" if p.secondary_degree else ""
        return (
            f"{r.label} (w {p.weight_factor}, g {p.grad_factor}, os {p.optimizer_factor}{sec}; "
            f"{r.step_s:.3g} s/step, {r.memory_bytes / GIB:.2f} GiB/rank)"
        )

    text = f"preset auto ({system.name}, {system.step_model} model): chose {one(ranked[0])}"
    if len(ranked) > 1:
        text += f"; runner-up {one(ranked[1])}, {ranked[1].step_s / ranked[0].step_s - 1:+.1%}"
    return text + f"; {len(ranked)} plans fit"
