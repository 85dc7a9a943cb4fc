"""The trainer's side of checkpoints: where a run resumes from, loading a checkpoint or weights
only, saving the trainer state with the engine's."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Optional

from ..config import load_config
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


def _train_state(st: dict, path: str) -> TrainState:
    """The trainer state a resume continues from (meta.json's schema checked the types)."""
    if st.get("consumed_samples") is None:
        raise ckpt.CheckpointError(f"{ckpt.resolve(path)}/meta.json: trainer.consumed_samples: missing; without it the "
                                   f"run cannot tell where in the data it stopped")
    return TrainState(step=st["step"], consumed_samples=st["consumed_samples"],
                      consumed_valid=st.get("consumed_valid", 0))


class TrainerCheckpoints:
    """Resume, load and save for :class:`~megatron_topo.training.Trainer` (which holds ``cfg``,
    ``rt``, ``engine``, ``state``, ``effective_cfg``, ``weights_from``, ``lifecycle`` and ``log``)."""

    def _resume_source(self) -> Optional[str]:
        """Where this run resumes from: an explicit ``load`` (must exist); else, with
        ``auto_resume``, the ``save`` folder when it holds a checkpoint; else None (a fresh run,
        which must not save into a folder holding another run's checkpoints)."""
        c = self.cfg.checkpoint
        if c.load and c.load == c.save and c.load != self.weights_from and not ckpt.holds_checkpoints(c.load):
            self.log(f"load = save = {c.load} holds no checkpoint yet: starting fresh (as GPT-NeoX)")
            return None
        if c.load and c.load != self.weights_from:
            ckpt.resolve(c.load)
            if c.save and os.path.realpath(c.save) != os.path.realpath(c.load) and ckpt.holds_checkpoints(c.save):
                raise ckpt.CheckpointError(
                    f"checkpoint.save {c.save} already holds checkpoints ({self._latest_of(c.save)}) and this run "
                    f"resumes from load={c.load}; saving there would mix two runs: save elsewhere with --set "
                    f"save=DIR, or continue the run in {c.save} with --set load={c.save}")
            return c.load
        if c.save and ckpt.holds_checkpoints(c.save):
            if c.auto_resume:
                ckpt.resolve(c.save)
                return c.save
            latest = self._latest_of(c.save)
            raise ckpt.CheckpointError(
                f"checkpoint.save {c.save} already holds checkpoints ({latest}) and this run starts fresh; "
                f"resume it with --set load={c.save} or --set auto_resume=true, or save elsewhere with --set save=DIR")
        if c.auto_resume:
            self.log(f"no checkpoint in {c.save or '(checkpoint.save unset)'}: starting fresh")
        return None

    @staticmethod
    def _latest_of(root: str) -> str:
        try:
            return f"latest step {ckpt.read_meta(ckpt.resolve(root))['step']}"
        except (ckpt.CheckpointError, KeyError, TypeError) as e:
            return f"unreadable: {e}"

    def _kept_global_batch(self) -> tuple:
        """(global batch, where from) of the checkpoint this run resumes, when it was saved on
        another world size and the config sets no train_batch_size: the run keeps its global
        batch on the new node count. (None, "") otherwise."""
        if not self.resume_from or self.cfg.train.train_batch_size is not None:
            return None, ""
        try:
            meta = ckpt.read_meta(ckpt.resolve(self.resume_from))
        except ckpt.CheckpointError:
            return None, ""  # reported where the checkpoint is loaded
        trainer = meta.get("trainer") if isinstance(meta, dict) else None
        kept = trainer.get("global_batch") if isinstance(trainer, dict) else None
        world = meta.get("world_size")
        if not isinstance(kept, int) or isinstance(kept, bool) or kept < 1 or world == self.rt.world_size:
            return None, ""
        return kept, f"the checkpoint's, saved on {world} ranks"

    def _load_weights(self, path: str):
        """GPT-NeoX's finetune / no_load_optim: the weights of an HF folder or of one of our
        checkpoints, a fresh optimizer; the step is 0 except for no_load_optim without finetune."""
        c = self.cfg.checkpoint
        if is_hf_folder(path):
            load_hf_into_engine(self.engine, path)
            self.log(f"fine-tuning from the HuggingFace model {path} (step 0, fresh optimizer)")
            return
        if is_neox_checkpoint(path):  # GPT-NeoX/DeepSpeed layer files (model-parallel 1, checked at load)
            load_neox_into_engine(self.engine, path, self.cfg.model.num_layers)
            self.log(f"fine-tuning from the GPT-NeoX checkpoint {step_folder(path)} (step 0, fresh optimizer)")
            return
        st = load_weights_only(self.engine, path, self.cfg, _read_config)
        keep = c.no_load_optim and not c.finetune and not c.finetune_from
        if keep:
            self.state = _train_state(st, path)
        self.log(f"loaded the weights of {ckpt.resolve(path)} (step {self.state.step}, fresh optimizer)")

    def _load(self, path: str):
        st = ckpt.load(self.engine, path, self.rt.rank, config=self.cfg,  # refuses another architecture
                       unverified=self.cfg.checkpoint.load_unverified, read_config=_read_config)
        self.state = _train_state(st, path)
        if "python_rng" in st:
            random.seed(st["python_rng"])
        self.log(f"resumed from {ckpt.resolve(path)} at step {self.state.step}")

    def _check_data_position(self) -> None:
        """A loaded consumed_samples must be a position in this run's training data: beyond its end
        the sample index would silently wrap (meta.json's schema already refuses a negative one)."""
        n, src = self.state.consumed_samples, self.resume_from or self.weights_from
        if src and self.train_ds is not None and n > len(self.train_ds):
            raise ckpt.CheckpointError(
                f"{ckpt.resolve(src)}: trainer.consumed_samples {n:,} in meta.json is beyond the "
                f"{len(self.train_ds):,} samples of this run's training data (train_iters x global batch); the "
                f"data position would wrap; is meta.json from this run?")

    def save(self) -> Optional[str]:
        c = self.cfg.checkpoint
        if not c.save:
            return None
        s = self.state
        trainer_state = {"step": s.step, "consumed_samples": s.consumed_samples,
                         "consumed_valid": s.consumed_valid, "global_batch": self.batches_per_step}
        path = ckpt.save(self.engine, c.save, s.step, trainer_state, self.effective_cfg.to_flat_yaml(), self.rt.rank,
                         self.engine.comm.barrier, keep_last=c.keep_last, fault=fault_injection.maybe_fail)
        if self.lifecycle is not None:
            self.lifecycle.saved()  # the time-based interval restarts
        return path
