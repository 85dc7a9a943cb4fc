"""Dynamic loss scaling for fp16 (DeepSpeed semantics: window, hysteresis, minimum)."""

from __future__ import annotations


class LossScaler:
    def __init__(self, cfg=None):
        static = getattr(cfg, "loss_scale", 0.0) or 0.0
        self.dynamic = static == 0.0
        self.scale = float(static) if not self.dynamic else 2.0 ** getattr(cfg, "initial_scale_power", 16)
        self.window = getattr(cfg, "loss_scale_window", 1000)
        self.hysteresis = getattr(cfg, "hysteresis", 2)
        self.min_scale = getattr(cfg, "min_loss_scale", 1.0)
        self.consecutive = bool(getattr(cfg, "consecutive_hysteresis", False))  # DeepSpeed's consecutive_hysteresis
        self._good_steps = 0
        self._hyst_left = self.hysteresis

    def update(self, overflow: bool) -> None:
        if not self.dynamic:
            return
        if overflow:
            self._good_steps = 0
            if self.hysteresis <= 1 or self._hyst_left <= 1:
                self.scale = max(self.scale / 2.0, self.min_scale)
                self._hyst_left = self.hysteresis
            else:
                self._hyst_left -= 1
            return
        self._good_steps += 1
        if self.consecutive:
            self._hyst_left = self.hysteresis
        if self._good_steps % self.window == 0:
            self.scale *= 2.0
            self._hyst_left = self.hysteresis

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self._good_steps, "hyst_left": self._hyst_left}

    def load_state_dict(self, sd: dict) -> None:
        self.scale = sd["scale"]
        self._good_steps = sd["good_steps"]
        self._hyst_left = sd["hyst_left"]
