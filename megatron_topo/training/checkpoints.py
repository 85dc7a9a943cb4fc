"""The trainer's side of checkpoints: where a run resumes from (decided before anything is built,
:func:`resume_source`), and the :class:`Checkpointer` a Trainer holds: it loads the checkpoint or
the weights the run starts from, decides when a step is saved (``checkpoint_factor``,
``extra_save_iters``, the time-based interval, the end of the run) and saves the trainer state
with the engine's."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Callable, Optional

from ..config import Config, load_config
from ..config.hf_config import is_hf_folder
from ..model.neox_checkpoint import is_neox_checkpoint, step_folder
from ..zero_topo import checkpoint as ckpt
from ..zero_topo.checkpoint.weights import load_hf_into_engine, load_neox_into_engine, load_weights_only
from . import fault_injection


def _read_config(path: str):
    """One saved config.yml as a Config (the checkpoint package hands its parsing to the caller)."""
    return load_config([path])


@dataclass
class TrainState:
    """Where the run is (saved in checkpoints) and its count of consecutive non-finite steps."""

    step: int = 0
    consumed_samples: int = 0
    consumed_valid: int = 0
    bad_steps: int = 0


def _train_state(st: ckpt.TrainerState, path: str) -> TrainState:
    """The trainer state a resume continues from (meta.json's schema checked the types)."""
    if st.consumed_samples is None:
        raise ckpt.CheckpointError(
            f"{ckpt.resolve(path)}/meta.json: trainer.consumed_samples: missing; without it the "
            f"run cannot tell where in the data it stopped"
        )
    return TrainState(step=st.step, consumed_samples=st.consumed_samples, consumed_valid=st.consumed_valid)


def _latest_of(root: str) -> str:
    try:
        return f"latest step {ckpt.read_meta(ckpt.resolve(root)).step}"
    except ckpt.CheckpointError as e:
        return f"unreadable: {e}"


def resume_source(cfg: Config, weights_from: Optional[str], log: Callable[[str], None]) -> Optional[str]:
    """Where this run resumes from: an explicit ``load`` (must exist); else, with ``auto_resume``,
    the ``save`` folder when it holds a checkpoint; else None (a fresh run, which must not save
    into a folder holding another run's checkpoints). ``weights_from``: the weights-only source
    (config.hf_config.weights_source), which is not resumed."""
    c = cfg.checkpoint
    if c.load and c.load == c.save and c.load != weights_from and not ckpt.holds_checkpoints(c.load):
        log(f"load = save = {c.load} holds no checkpoint yet: starting fresh (as GPT-NeoX)")
        return None
    if c.load and c.load != weights_from:
        ckpt.resolve(c.load)
        if c.save and os.path.realpath(c.save) != os.path.realpath(c.load) and ckpt.holds_checkpoints(c.save):
            raise ckpt.CheckpointError(
                f"checkpoint.save {c.save} already holds checkpoints ({_latest_of(c.save)}) and this run "
                f"resumes from load={c.load}; saving there would mix two runs: save elsewhere with --set "
                f"save=DIR, or continue the run in {c.save} with --set load={c.save}"
            )
        return c.load
    if c.save and ckpt.holds_checkpoints(c.save):
        if c.auto_resume:
            ckpt.resolve(c.save)
            return c.save
        latest = _latest_of(c.save)
        raise ckpt.CheckpointError(
            f"checkpoint.save {c.save} already holds checkpoints ({latest}) and this run starts fresh; "
            f"resume it with --set load={c.save} or --set auto_resume=true, or save elsewhere with --set save=DIR"
        )
    if c.auto_resume:
        log(f"no checkpoint in {c.save or '(checkpoint.save unset)'}: starting fresh")
    return None


def _saved_run(cfg: Config, resume_from: str):
    """(step folder, meta.json, the Config the checkpoint was saved with) of the checkpoint a run
    resumes; None where it cannot be read or has no config.yml (reported where it is loaded)."""
    from ..config import ConfigError

    try:
        sp = ckpt.resolve(resume_from)
        meta = ckpt.read_meta(sp, unverified=cfg.checkpoint.load_unverified)
        if ckpt.read_config_yaml(sp, meta) is None:
            return None
        return sp, meta, _read_config(os.path.join(sp, "config.yml"))
    except (ckpt.CheckpointError, ConfigError):
        return None


def kept_global_batch(cfg: Config, resume_from: Optional[str], world_size: int) -> tuple:
    """(global batch, where from) of the checkpoint this run resumes when the config sets no
    train_batch_size and the run's micro-batch x accumulation x world size would give another one
    (another world size, micro-batch or accumulation): the run keeps the saved global batch and the
    accumulation count is derived (a line says so; train_batch_size changes it deliberately).
    (None, "") otherwise."""
    if not resume_from or cfg.train.train_batch_size is not None:
        return None, ""
    try:
        meta = ckpt.read_meta(ckpt.resolve(resume_from), unverified=cfg.checkpoint.load_unverified)
    except ckpt.CheckpointError:
        return None, ""  # reported where the checkpoint is loaded
    kept, world = meta.trainer.global_batch, meta.world_size  # global_batch: None unless a positive integer
    t = cfg.train
    if kept is None or kept == t.train_micro_batch_size_per_gpu * t.gradient_accumulation_steps * world_size:
        return None, ""
    if world != world_size:
        return kept, f"the checkpoint's, saved on {world} ranks"
    return kept, "the checkpoint's; set train_batch_size to change it"


# keys whose change across a resume changes what the saved state means (besides the architecture,
# which checkpoint.load refuses, and the global batch, which kept_global_batch keeps)
DATA_ORDER_KEYS = (
    ("data", "data_path"),
    ("data", "train_data_paths"),
    ("data", "train_data_weights"),
    ("data", "split"),
    ("train", "seed"),
    ("data", "tokenizer_type"),
    ("data", "vocab_file"),
    ("data", "merge_file"),
)
SCHEDULE_KEYS = (("train", "min_lr"), ("train", "warmup"), ("train", "lr_decay_iters"), ("train", "lr_decay_style"))


def optimizer_changes(saved: Config, cfg: Config) -> list[str]:
    """``key saved -> now`` for each optimizer key (type, betas, eps, weight_decay) a resume changes;
    the type compares without case, as the schema reads it."""
    a, b = saved.train, cfg.train
    pairs = (
        ("optimizer.type", a.optimizer.type, b.optimizer.type, str.lower),
        ("betas", list(a.optimizer.params.betas), list(b.optimizer.params.betas), None),
        ("eps", a.optimizer.params.eps, b.optimizer.params.eps, None),
        ("weight_decay", a.weight_decay, b.weight_decay, None),
    )
    return [f"{k} {x!r} -> {y!r}" for k, x, y, norm in pairs if (norm(x) != norm(y) if norm else x != y)]


def _value(cfg: Config, section: str, key: str):
    return getattr(getattr(cfg, section), key)


def check_resume_keys(cfg: Config, resume_from: Optional[str]) -> list[str]:
    """Before anything is built: a resume whose seq_length differs from the checkpoint's is refused
    (its consumed_samples counts samples of the saved length: the data position would be
    reinterpreted); the data order, tokenizer, learning-rate schedule, optimizer keys and an explicit
    train_batch_size may change, each with a note line (returned) naming the keys and both values."""
    saved_run = _saved_run(cfg, resume_from) if resume_from else None
    if saved_run is None:
        return []
    sp, meta, saved = saved_run
    n = meta.trainer.consumed_samples
    if saved.model.seq_length != cfg.model.seq_length:
        raise ckpt.CheckpointError(
            f"{sp}: seq_length {cfg.model.seq_length} differs from the checkpoint's {saved.model.seq_length}: its "
            f"consumed_samples {n} counts {saved.model.seq_length}-token samples, so the data position would be "
            f"reinterpreted; resume with --set seq_length={saved.model.seq_length}, or start from its weights "
            f"with finetune_from={resume_from} instead of load (step 0, a fresh data position)"
        )
    notes = []

    def changed(keys):
        return [
            f"{k} {_value(saved, s, k)!r} -> {_value(cfg, s, k)!r}"
            for s, k in keys
            if _value(saved, s, k) != _value(cfg, s, k)
        ]

    data = changed(DATA_ORDER_KEYS)
    if data:
        notes.append(
            f"note: resuming with other data keys than the checkpoint's ({'; '.join(data)}): consumed_samples "
            f"{n} is taken as a position in the new data order"
        )
    lr_now, lr_saved = cfg.train.optimizer.params.lr, saved.train.optimizer.params.lr
    sched = ([f"lr {lr_saved!r} -> {lr_now!r}"] if lr_now != lr_saved else []) + changed(SCHEDULE_KEYS)
    if sched:
        notes.append(
            f"note: resuming with another learning-rate schedule than the checkpoint's ({'; '.join(sched)}): it "
            f"continues at step {meta.step} with the new values"
        )
    opt = [] if cfg.checkpoint.no_load_optim else optimizer_changes(saved, cfg)
    if opt:  # the saved moments are loaded: say they continue under other settings
        notes.append(
            f"note: resuming with other optimizer keys than the checkpoint's ({'; '.join(opt)}): its Adam moments "
            f"continue with the new values (Adam and AdamW are one update here, weight decay decoupled in both as "
            f"GPT-NeoX's FusedAdam, so the saved state means the same under either type)"
        )
    kept, t = meta.trainer.global_batch, cfg.train
    if kept is not None and t.train_batch_size is not None and t.train_batch_size != kept:
        notes.append(
            f"note: global batch {t.train_batch_size} (train_batch_size) differs from the checkpoint's {kept}: "
            f"consumed_samples {n} counts samples, so the data position holds"
        )
    return notes


class Checkpointer:
    """Loads what a run starts from and saves its steps. ``resume_from`` / ``weights_from``: the
    checkpoint the run resumes, or the weights it starts from (at most one is set);
    ``effective_cfg``: the config each checkpoint records; ``global_batch``: samples per step
    (recorded, so a resume on another world size keeps it). ``lifecycle``: the running loop's
    stop/save agreement (set by the trainer while it trains), told of every save."""

    def __init__(
        self,
        cfg: Config,
        rank: int,
        engine,
        effective_cfg: Config,
        global_batch: int,
        resume_from: Optional[str],
        weights_from: Optional[str],
        log: Callable[[str], None],
    ) -> None:
        self.cfg, self.c, self.rank, self.engine = cfg, cfg.checkpoint, rank, engine
        self.effective_cfg, self.global_batch = effective_cfg, global_batch
        self.resume_from, self.weights_from, self.log = resume_from, weights_from, log
        self.lifecycle = None
        self.extra = set(self.c.extra_save_iters or ())  # GPT-NeoX's extra_save_iters (Pythia: log-spaced)

    # ---------------------------------------------------------------- load
    def load_start(self, state: TrainState) -> TrainState:
        """Load what the run starts from into the engine; returns the trainer state it continues."""
        if self.weights_from:  # weights only: step 0 (finetune), fresh optimizer
            return self._load_weights(self.weights_from, state)
        if self.resume_from:  # a bad checkpoint fails before data is built or logs are written
            return self._load(self.resume_from)
        return state

    def _load_weights(self, path: str, state: TrainState) -> TrainState:
        """GPT-NeoX's finetune / no_load_optim: the weights of an HF folder or of one of our
        checkpoints, a fresh optimizer; the step is 0 except for no_load_optim without finetune."""
        c = self.c
        if is_hf_folder(path):
            load_hf_into_engine(self.engine, path, self.cfg.model)
            self.log(f"fine-tuning from the HuggingFace model {path} (step 0, fresh optimizer)")
            return state
        if is_neox_checkpoint(path):  # GPT-NeoX/DeepSpeed layer files (model-parallel 1, checked at load)
            load_neox_into_engine(self.engine, path, self.cfg.model)
            self.log(f"fine-tuning from the GPT-NeoX checkpoint {step_folder(path)} (step 0, fresh optimizer)")
            return state
        st = load_weights_only(self.engine, path, self.cfg, _read_config)
        keep = c.no_load_optim and not c.finetune and not c.finetune_from
        if keep:
            state = _train_state(st, path)
        self.log(f"loaded the weights of {ckpt.resolve(path)} (step {state.step}, fresh optimizer)")
        return state

    def _load(self, path: str) -> TrainState:
        st = ckpt.load(
            self.engine,
            path,
            self.rank,
            config=self.cfg,  # refuses another architecture
            unverified=self.c.load_unverified,
            read_config=_read_config,
        )
        state = _train_state(st, path)
        if st.python_rng is not None:
            random.seed(st.python_rng)
        self.log(f"resumed from {ckpt.resolve(path)} at step {state.step}")
        return state

    def check_data_position(self, state: TrainState, train_ds) -> None:
        """A loaded consumed_samples must be a position in this run's training data: beyond its end
        the sample index would silently wrap (meta.json's schema already refuses a negative one)."""
        n, src = state.consumed_samples, self.resume_from or self.weights_from
        if src and train_ds is not None and n > len(train_ds):
            raise ckpt.CheckpointError(
                f"{ckpt.resolve(src)}: trainer.consumed_samples {n:,} in meta.json is beyond the "
                f"{len(train_ds):,} samples of this run's training data (train_iters x global batch); the "
                f"data position would wrap; is meta.json from this run?"
            )

    # ---------------------------------------------------------------- when to save
    def at_start(self, state: TrainState) -> None:
        """GPT-NeoX saves step 0 when extra_save_iters asks for it and the run starts from it."""
        if self.c.save and 0 in self.extra and state.step == 0 and not self.resume_from:
            self.save(state)

    def after_step(self, state: TrainState, end: int, stop: bool, save_due: bool) -> None:
        """Save after a step of the loop: every ``checkpoint_factor`` steps, at ``extra_save_iters``
        and when the time-based interval is due (``save_due``, agreed by all ranks); not at the
        last step or when stopping (:meth:`at_end` saves those)."""
        c, step = self.c, state.step
        if (
            c.save
            and step < end
            and not stop
            and ((c.checkpoint_factor and step % c.checkpoint_factor == 0) or save_due or step in self.extra)
        ):
            self.save(state)

    def at_end(self, state: TrainState, start_step: int) -> dict:
        """The run's last checkpoint: saved when it trained (or started fresh); a run resumed at
        ``train_iters`` keeps the checkpoint it loaded. {} when ``checkpoint.save`` is unset."""
        if not self.c.save:
            return {}
        if state.step > start_step or not self.resume_from:
            return {"checkpoint": self.save(state)}
        return {"checkpoint": ckpt.resolve(self.resume_from)}  # nothing trained: the checkpoint stands

    # ---------------------------------------------------------------- save
    def save(self, state: TrainState) -> Optional[str]:
        c = self.c
        if not c.save:
            return None
        trainer_state = ckpt.TrainerState(state.step, state.consumed_samples, state.consumed_valid, self.global_batch)
        path = ckpt.save(
            self.engine,
            c.save,
            state.step,
            trainer_state,
            self.effective_cfg.to_flat_yaml(),
            self.rank,
            self.engine.comm.barrier,
            keep_last=c.keep_last,
            fault=fault_injection.maybe_fail,
        )
        if self.lifecycle is not None:
            self.lifecycle.saved()  # the time-based interval restarts
        return path
