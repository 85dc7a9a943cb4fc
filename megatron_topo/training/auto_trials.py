"""``preset: auto``, measured: the step model ranks the plans, and the few it cannot tell apart are
timed on the job's own ranks before training starts.

The models are validated to within about 25 % per plan and cell (docs/benchmark.md, "Accumulation
series"); plans modelled a few per cent apart are therefore a coin toss for the model alone. So the
trainer builds each of the first ``zero_topo.auto_trials`` plans modelled within
``zero_topo.auto_trial_window`` of the fastest, one at a time, runs one warm-up step and
``zero_topo.auto_trial_steps`` timed optimizer steps of it on random tokens (same micro-batch,
accumulation count, precision and links as the run, and the training loop's own end-of-step
collectives, :mod:`.step_sync`) and keeps the slowest rank's time of each step.
Every plan is then built and timed once more, in the reverse order (A B C C B A: a drift over the
trials weighs on all alike, and no plan is timed only in the first pass, right after start-up). A
plan's time is the lowest of its passes' medians: on a shared machine interference only ever adds
time, so a disturbed pass does not decide. While the two fastest plans are within ``RACE_MARGIN`` of
each other, they are timed again (the runner-up first), up to ``zero_topo.auto_trial_passes`` passes
each. Measured on the emulated cluster (Frontier ratios, 1 micro-batch): topo_q's plan's pass medians
spread 0.35-0.47 s, both of its first two passes were slow (0.41-0.47 s) in 5 of 11 runs, and each
of those lost the choice to ZeRO++ (0.39-0.41 s in trials), whose own runs trained 1.05-1.17x
topo_q's; the extra passes are spent only where the choice is that close. The run
trains with the plan whose time is lowest. Every rank times the same steps and reduces the times
with one MAX all-reduce, so every rank makes the same choice.

A trial engine is a throw-away: its own sharded initialisation and process groups, freed (the groups
destroyed) before the next one is built;
the run's engine is built afterwards exactly as for an explicit plan (the RNGs are re-seeded), so a
run under ``auto`` equals the same run with the chosen plan written out, bit for bit. A run resumed
on the same number of ranks keeps its checkpoint's plan when that plan is on the shortlist (it was
measured when the run started), so walltime-chained jobs do not pay for the trials again.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from .. import lifecycle, preflight
from ..analysis import autoplan
from ..analysis.autoplan import Ranked
from ..config import Config, ConfigError
from ..zero_topo import checkpoint as ckpt
from ..zero_topo import kernels
from ..zero_topo.comm import Comm
from ..zero_topo.sharding import Plan
from . import step_sync
from .batches import learning_rate
from .runtime import Runtime, seed_everything
from .step import run_step


@dataclass(frozen=True)
class Trial:
    ranked: Ranked  # the plan and its modelled step
    passes: tuple[tuple[float, ...], ...]  # per pass, the slowest rank's time of each timed step

    @property
    def step_s(self) -> float:
        """The plan's measured step: the lower of its passes' medians (interference only adds time)."""
        return min(statistics.median(p) for p in self.passes)


RACE_MARGIN = 0.15  # one plan's pass median varies up to about this much within a launch (module docstring)


def pick(trials: Sequence[Trial]) -> Trial:
    """The fastest measured plan (ties: the model's order)."""
    return min(trials, key=lambda t: t.step_s)


def more_passes(trials: Sequence[Trial], max_passes: int, margin: float = RACE_MARGIN) -> list[int]:
    """Indices of the plans to time once more, runner-up first: the two fastest so far while the
    runner-up is within ``margin`` of the fastest, each until it has ``max_passes`` passes; [] when the
    choice is clear or both are timed out."""
    if len(trials) < 2:
        return []
    order = sorted(range(len(trials)), key=lambda i: (trials[i].step_s, i))
    best, runner_up = order[0], order[1]
    if trials[runner_up].step_s > trials[best].step_s * (1.0 + margin):
        return []
    return [i for i in (runner_up, best) if len(trials[i].passes) < max_passes]


def with_pass(trial: Trial, steps: Sequence[float]) -> Trial:
    """``trial`` with one more pass of timed steps."""
    return Trial(trial.ranked, trial.passes + (tuple(steps),))


def summary(trials: Sequence[Trial], chosen: Trial, window: float) -> str:
    """One line: every timed plan, measured (each pass's median) vs modelled, and the choice."""

    def passes(t: Trial) -> str:
        return " / ".join(f"{statistics.median(p):.3g}" for p in t.passes)

    parts = [f"{t.ranked.label} {t.step_s:.3g} s (passes {passes(t)}; model {t.ranked.step_s:.3g})" for t in trials]
    how = (
        "once each"
        if max(len(t.passes) for t in trials) == 1
        # zero_topo.auto_trial_passes: 1
        else f"twice each (the second pass in reverse order), the two fastest again while within {RACE_MARGIN:.0%} "
        f"of each other"
    )
    return (
        f"preset auto: timed {len(trials)} plans modelled within {window:.0%} of the fastest, {how} (the fastest "
        f"pass's median step, slowest rank): {'; '.join(parts)}; chose {chosen.ranked.label}"
    )


def _trial_cfg(cfg: Config) -> Config:
    """``cfg`` for a trial engine: fp16 starts at loss scale 1, so no trial step is skipped as an
    overflow (a skipped step would not run the optimizer and would time short)."""
    t = cfg.train
    if cfg.precision != "fp16":
        return cfg
    fp16 = dataclasses.replace(t.fp16, initial_scale_power=0, loss_scale=0.0)
    return dataclasses.replace(cfg, train=dataclasses.replace(t, fp16=fp16))


def time_plan(
    cfg: Config, rt: Runtime, plan: Plan, comm: Comm, steps: int, build: Callable[..., object]
) -> list[float]:
    """Build an engine for ``plan``, run one warm-up and ``steps`` timed optimizer steps on random
    tokens; returns the slowest rank's seconds for each timed step. The engine is freed.

    A step is timed as the trainer times it: with the collectives the training loop runs after
    every optimizer step (step_sync: the pipelined stop/save agreement every step, the log
    reduction every ``logging.log_interval`` steps). They cost plans differently: measured on the
    emulated NVLink-like cluster, a blocking log reduction every step added 15-20 % to a plan whose
    16-bit post-step gather spans the node (PaRO-IIG + INT8 combine) and nothing to topo's, so trials
    without them ranked that plan first, and the runs that trained it measured 1.14-1.22x their trial."""
    t, m = cfg.train, cfg.model
    accum = t.gradient_accumulation_steps
    gen = torch.Generator().manual_seed(t.seed + rt.rank)
    tokens = torch.randint(
        0, m.vocab_size, (accum, t.train_micro_batch_size_per_gpu, m.seq_length + 1), generator=gen
    ).to(rt.device)
    mark = comm.group_mark()
    eng = build(_trial_cfg(cfg), rt, plan, comm=comm)
    lr = learning_rate(cfg, 1)
    agree = step_sync.agreement(comm, rt, lifecycle.StopSignals())  # signals not installed: never stops
    log_every = cfg.logging.log_interval
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    times = []
    finished = False
    try:
        for i in range(1 + steps):
            t0 = time.perf_counter()
            stats = run_step(eng, lambda k: (tokens[k, :, :-1], tokens[k, :, 1:]), accum, lr)  # the trainer's step
            agree.poll()
            loss_sum += stats["loss"].double()  # the trainer's log window
            if (i + 1) % log_every == 0:
                step_sync.reduce_log(comm, rt.world_size, loss_sum / log_every, comm.reset_counters())
                loss_sum.zero_()
            if rt.device.type == "cuda":
                torch.cuda.synchronize(rt.device)
            if i:
                times.append(time.perf_counter() - t0)
        agree.close()
        for u in eng.units:  # the last step's post-step gathers land before their buffers are freed
            u.wait_publish()
        finished = True
    finally:
        eng.remove_hooks()  # the hooks' closures hold the engine from the trial model's modules
        del eng
        gc.collect()
        if finished:  # the trial's process groups go with it (not after a failure: teardown can hang)
            comm.destroy_groups_since(mark)
        if rt.device.type == "cuda":
            torch.cuda.empty_cache()
    return comm.all_reduce_host(times, op=dist.ReduceOp.MAX) if rt.distributed else times


def _checkpoint_plan(path: Optional[str], world_size: int) -> Optional[dict]:
    """The plan fields of the checkpoint a run resumes from, when it was saved on ``world_size``
    ranks (None otherwise or when its meta cannot be read: the load reports that)."""
    if not path:
        return None
    try:
        meta = ckpt.read_meta(ckpt.resolve(path))
    except ckpt.CheckpointError:
        return None
    return meta.plan if meta.world_size == world_size else None


def choose(
    cfg: Config,
    rt: Runtime,
    ranked: Sequence[Ranked],
    comm: Comm,
    build: Callable[..., object],
    resume_from: Optional[str] = None,
    log: Callable[[str], None] = print,
) -> Plan:
    """The plan a ``preset: auto`` run trains with (module docstring). ``comm`` is the run's: each
    trial engine creates its process groups in it and destroys them when it is freed; the run's
    engine then creates its own."""
    z, topo = cfg.zero_topo, rt.topo
    short = autoplan.shortlist(ranked, z.auto_trials, z.auto_trial_window)
    if not short:
        return autoplan.plan_of(ranked[0], cfg, topo)
    saved = _checkpoint_plan(resume_from, topo.world_size)
    if saved is not None:
        for r in short:
            if all(saved.get(k) == getattr(r.plan, k) for k in autoplan.COMPARED):
                log(
                    f"preset auto: resuming on the same {topo.world_size} ranks: keeping the checkpoint's plan "
                    f"{r.label} (timed when the run started)"
                )
                return autoplan.plan_of(r, cfg, topo)
    trials = []
    for r in short:
        plan = autoplan.plan_of(r, cfg, topo)
        try:
            preflight.check(cfg, plan, topo, rt.device)  # the device's own memory, not the system block's
        except ConfigError as e:
            log(f"preset auto: not timing {r.label}: {e}")
            continue
        trials.append(Trial(r, (tuple(time_plan(cfg, rt, plan, comm, z.auto_trial_steps, build)),)))

    def again(i: int) -> None:
        more = time_plan(cfg, rt, autoplan.plan_of(trials[i].ranked, cfg, topo), comm, z.auto_trial_steps, build)
        trials[i] = with_pass(trials[i], more)

    if len(trials) > 1 and z.auto_trial_passes > 1:  # the second pass, in reverse order
        for i in reversed(range(len(trials))):
            again(i)
    while idx := more_passes(trials, z.auto_trial_passes):  # the same numbers on every rank: the same loop
        for i in idx:
            again(i)
    kernels.timer.reset()  # the run's kernel totals count its own steps only
    seed_everything(cfg.train.seed)  # the run starts from the same RNG state as without trials
    if not trials:
        return autoplan.plan_of(ranked[0], cfg, topo)
    best = pick(trials)
    log(summary(trials, best, z.auto_trial_window))
    return autoplan.plan_of(best.ranked, cfg, topo)
