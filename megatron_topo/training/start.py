"""What a run starts from, decided before the Trainer is built: the checks of its folders, the
checkpoint it resumes or the weights it fine-tunes from, its global batch, and its plan (for
``preset: auto`` the modelled ranking and the timed trials of :mod:`.auto_trials`)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Callable, Optional

from ..analysis import autoplan
from ..config import Config, ConfigError, DistributedConfig, check_batch_size, check_run_outputs
from ..config.hf_config import weights_source
from ..model import build_model
from ..zero_topo import checkpoint as ckpt
from ..zero_topo import trace
from ..zero_topo.comm import Comm
from ..zero_topo.engine import ZeroTopoEngine
from ..zero_topo.sharding import Plan
from . import auto_trials, profiling
from .checkpoints import check_resume_keys, kept_global_batch, resume_source
from .runtime import Runtime, seed_everything


@dataclass
class RunStart:
    """The decisions a Trainer is built from."""

    plan: Plan
    comm: Comm  # the run's collectives (preset auto's trial engines built and freed their groups in it)
    resume_from: Optional[str]  # the checkpoint the run resumes (None: a fresh or fine-tuning run)
    weights_from: Optional[str]  # the weights a fine-tuning run starts from (None otherwise)


def new_comm(rt: Runtime, dcfg: Optional[DistributedConfig] = None) -> Comm:
    """The collectives of this process on the runtime's topology and device (groups created on use,
    with ``dcfg``'s collective timeout; its collective trace, when ``trace_collectives`` is set)."""
    dcfg = dcfg or DistributedConfig()
    if dcfg.trace_collectives:
        bad = trace.check_dir(dcfg.trace_collectives)
        if bad:
            raise ConfigError(bad)
    try:
        return Comm(
            rt.topo,
            rt.rank,
            distributed=rt.distributed,
            device=rt.device,
            strict=rt.strict,
            timeout=datetime.timedelta(seconds=dcfg.collective_timeout_s),
            trace_dir=dcfg.trace_collectives,
        )
    except OSError as e:  # the trace file cannot be made there (/proc/self/fd, /sys/kernel): name the key
        raise ConfigError(
            f"distributed.trace_collectives {dcfg.trace_collectives}: cannot create "
            f"{trace.FILE.format(rank=rt.rank)} there ({e.strerror or e}); point it at a writable directory"
        ) from None


def build_engine(cfg: Config, rt: Runtime, plan: Optional[Plan] = None, model=None, comm: Optional[Comm] = None):
    """Sharded initialisation: the model is built without storage and the engine materialises,
    initialises and shards one unit at a time, so no rank ever holds the whole model. ``comm``:
    an existing one (the run's: its collective trace; preset auto's trial engines build in it)."""
    t = cfg.train
    model = model if model is not None else build_model(cfg.model, device="meta")
    model.init_buffers(rt.device)
    plan = plan or autoplan.resolve(cfg, rt.topo)[0]
    comm = comm or new_comm(rt, cfg.distributed)
    eng = ZeroTopoEngine(
        model,
        model.shard_units(),
        plan,
        comm,
        precision=cfg.precision,
        lr=t.optimizer.params.lr,
        betas=tuple(t.optimizer.params.betas),
        eps=t.optimizer.params.eps,
        weight_decay=t.weight_decay,
        grad_clip=t.gradient_clipping,
        fp16_cfg=t.fp16,
        kernel_backend=cfg.zero_topo.kernels,
        max_combines_in_flight=cfg.zero_topo.max_combines_in_flight,
        device=rt.device,
        init=lambda unit: model.init_parameters(unit, t.seed),
    )
    return eng


def choose_plan(cfg: Config, rt: Runtime, log: Callable[[str], None] = print) -> RunStart:
    """Check the run's folders, find what it starts from, settle its global batch (the accumulation
    count follows train_batch_size, or a resumed run's batch when the world changed) and choose its
    plan: preset auto's modelled fastest, with the plans the model cannot tell apart timed on the
    job's ranks. Seeds the RNGs, so the engine built next is the one an explicit plan builds."""
    ckpt.check_save_dir(cfg.checkpoint.save)  # before anything is built or written
    check_run_outputs(cfg)  # log_dir, metrics.jsonl, tensorboard_dir, data_cache_dir: not over others' files
    profiling.check(cfg, rt.device)  # profile, memory_profiling: what the device can do, their folders
    weights_from = weights_source(cfg)  # finetune_from / an HF `load` / finetune, no_load_optim
    resume_from = resume_source(cfg, weights_from, log)  # `load`, `save` under auto_resume, or None
    if resume_from and resume_from != cfg.checkpoint.load:
        weights_from = None  # an interrupted fine-tuning run resumes from its own save folder
    elif weights_from:
        resume_from = None
    c = cfg.checkpoint  # no_load_optim alone keeps the step and the data position as a resume does
    kept_from = resume_from or (weights_from if c.no_load_optim and not c.finetune and not c.finetune_from else None)
    for line in check_resume_keys(cfg, kept_from):  # seq_length refused; data order, schedule: noted
        log(line)
    # DeepSpeed's train_batch_size, now that the world is known
    batch_note = check_batch_size(
        cfg, rt.world_size, rt.topo.ranks_per_node, *kept_global_batch(cfg, kept_from, rt.world_size)
    )
    if batch_note:
        log(batch_note)
    seed_everything(cfg.train.seed)
    plan, ranked = autoplan.resolve(cfg, rt.topo)  # preset auto: the modelled fastest plan that fits
    comm = new_comm(rt, cfg.distributed)
    if ranked:
        log(autoplan.summary(ranked, cfg.system))
        # the plans the model cannot tell apart are timed here (training.auto_trials)
        plan = auto_trials.choose(cfg, rt, ranked, comm, build_engine, resume_from, log)
    return RunStart(plan, comm, resume_from, weights_from)
