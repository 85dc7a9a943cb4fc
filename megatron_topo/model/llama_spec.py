"""The Llama spec: sizes, FLOPs, activation bytes, arch keys and the HF mapping of model/llama.py
(HF ``LlamaForCausalLM``; ``MistralForCausalLM`` when a sliding window is set)."""

from __future__ import annotations

from ..safe_files import excerpt
from .llama import Llama, gated, kv_heads, mlp_bias, mlp_width
from .spec_base import ModelSpec

HF_ACT = "silu"


class LlamaSpec(ModelSpec):
    """RMSNorm, SwiGLU MLP with GPT-NeoX's sizing, grouped-query attention, bias switches, rotary
    base, optional sliding window; sequential residual."""

    name = "llama"
    hf_model_types = ("llama", "mistral")
    arch_keys = (
        "arch",
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_kv_heads",
        "vocab_size",
        "rotary_pct",
        "rotary_emb_base",
        "no_weight_tying",
        "norm",
        "rms_norm_epsilon",
        "activation",
        "mlp_type",
        "intermediate_size",
        "mlp_multiple_of",
        "use_bias_in_attn_linear",
        "use_bias_in_mlp",
        "sliding_window_width",
    )

    def module_class(self, cfg):
        return Llama

    def check(self, cfg) -> list:
        out = []
        if cfg.norm != "rmsnorm":
            out.append(
                f"norm={cfg.norm!r} with a gated MLP (activation={cfg.activation!r}, mlp_type={cfg.mlp_type!r}) "
                f"is not built here: the llama architecture uses norm: rmsnorm"
            )
        elif cfg.use_bias_in_norms:
            out.append("use_bias_in_norms=true is not valid with norm: rmsnorm (RMSNorm has no bias); set it to false")
        if not gated(cfg):
            out.append(
                f"activation={cfg.activation!r} with mlp_type={cfg.mlp_type!r} is not valid for the llama "
                f"architecture; use activation: swiglu, or mlp_type: llama with activation: silu"
            )
        elif cfg.mlp_type == "llama" and cfg.activation != "silu":
            out.append(f"mlp_type: llama takes activation: silu (GPT-NeoX's LLaMAParallelMLP), not {cfg.activation!r}")
        if cfg.gpt_j_residual:
            out.append("gpt_j_residual=true is not valid for the llama architecture (its residual is sequential)")
        if cfg.num_kv_heads is not None and cfg.num_attention_heads % cfg.num_kv_heads:
            out.append(
                f"num_kv_heads {cfg.num_kv_heads} does not divide num_attention_heads "
                f"{cfg.num_attention_heads}; use a divisor (1: multi-query, {cfg.num_attention_heads}: "
                f"multi-head)"
            )
        if gated(cfg):
            try:
                mlp_width(cfg)
            except ValueError as e:
                out.append(str(e))
        return out

    # ---------------------------------------------------------------- sizes
    def _dims(self, cfg):
        h = cfg.hidden_size
        kvd = kv_heads(cfg) * (h // cfg.num_attention_heads)
        return h, kvd, mlp_width(cfg)

    def layer_matmul_params(self, cfg) -> int:
        h, kvd, f = self._dims(cfg)
        return 2 * h * h + 2 * h * kvd + 3 * h * f

    def param_count(self, cfg) -> int:
        """Per layer: q, o (h^2 each), k, v (h x kv width each), gate/up/down (3 h f), their biases
        when on, two RMSNorm weights; embedding V*h (+ an untied head V*h); final RMSNorm h."""
        h, kvd, f = self._dims(cfg)
        layer = self.layer_matmul_params(cfg) + 2 * h
        if cfg.use_bias_in_attn_linear:
            layer += 2 * h + 2 * kvd
        if mlp_bias(cfg):
            layer += 2 * f + h
        emb = cfg.vocab_size * h * (2 if cfg.no_weight_tying else 1)
        return cfg.num_layers * layer + emb + h

    def forward_flops(self, cfg, sequences: float, seq_length=None, passes: float = 1.0) -> float:
        """GPT-NeoX's count (``model.gpt_neox.gpt_flops``) with the layer's own matmul weights P in place of
        its 12 h^2: ``passes * B * s * (2 L P + 4 L s h + 1.5 h V)`` (attention over the whole causal
        square, as GPT-NeoX counts it, whatever the sliding window)."""
        s = float(seq_length or cfg.seq_length)
        h, L, V = float(cfg.hidden_size), float(cfg.num_layers), float(cfg.vocab_size)
        P = float(self.layer_matmul_params(cfg))
        return passes * float(sequences) * s * (2.0 * L * P + 4.0 * L * s * h + 1.5 * h * V)

    def activation_bytes(self, cfg, micro_batch: int, precision: str, recompute: bool) -> int:
        """``zero_topo.memory.activation_bytes``'s accounting (Korthikanti et al. 2022) with this
        layer's tensors: per layer ``s*b*(14h + 4*kv_width + 8f) + 5*a*s^2*b`` bytes at 16 bits
        (GPT-NeoX's layer gives the same 34 s b h + 5 a s^2 b with kv_width = h and its
        non-gated 4h MLP); with recompute each layer's input plus one layer's working set."""
        from ..zero_topo.memory import DTYPE_BYTES

        e = DTYPE_BYTES[precision]
        h, kvd, f = self._dims(cfg)
        s, b, a = cfg.seq_length, micro_batch, cfg.num_attention_heads
        per_layer = int((s * b * (14 * h + 4 * kvd + 8 * f) + 5 * a * s * s * b) * e / 2)
        sbh = s * b * h
        body = cfg.num_layers * sbh * e + per_layer if recompute else cfg.num_layers * per_layer
        return body + b * s * cfg.vocab_size * (e + 4 + 4)

    # ---------------------------------------------------------------- HF
    def hf_head_name(self) -> str:
        return "lm_head"

    def to_hf_key(self, name: str, head_name=None) -> str:
        if name.startswith("head.lm_head."):
            return "lm_head" + name[len("head.lm_head") :]
        if name.startswith("head."):
            return "model." + name[len("head.") :]
        return "model." + name

    def from_hf_key(self, name: str) -> str:
        if name.startswith("lm_head."):
            return "head." + name
        name = name[len("model.") :] if name.startswith("model.") else name
        if name.startswith("norm."):
            return "head." + name
        return name

    def hf_config(self, cfg) -> tuple:
        """(``LlamaForCausalLM`` or, with a sliding window, ``MistralForCausalLM``, config dict) with the
        rotary base under every name a transformers version reads: ``rope_theta`` (4.x) and
        ``rope_parameters`` (5.x), ``rope_scaling: null``."""
        from ..config.options import ConfigError

        if cfg.rotary_pct != 1.0:
            raise ConfigError(
                f"rotary_pct {cfg.rotary_pct}: HF Llama/Mistral rotate every channel of a head; "
                f"only rotary_pct 1 exports"
            )
        mistral = bool(cfg.sliding_window_width)
        if mistral and (cfg.use_bias_in_attn_linear or mlp_bias(cfg)):
            raise ConfigError("a sliding-window model with biases has no HF equivalent (MistralForCausalLM has none)")
        h = cfg.hidden_size
        kw = dict(
            vocab_size=cfg.vocab_size,
            hidden_size=h,
            intermediate_size=mlp_width(cfg),
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=kv_heads(cfg),
            head_dim=h // cfg.num_attention_heads,
            hidden_act=HF_ACT,
            max_position_embeddings=cfg.max_position_embeddings,
            rms_norm_eps=cfg.rms_norm_epsilon,
            tie_word_embeddings=not cfg.no_weight_tying,
            attention_dropout=0.0,
        )
        if mistral:
            kw["sliding_window"] = cfg.sliding_window_width
        else:
            kw.update(attention_bias=bool(cfg.use_bias_in_attn_linear), mlp_bias=mlp_bias(cfg))
        theta = float(cfg.rotary_emb_base)
        model_type, arch, cls = (
            ("mistral", "MistralForCausalLM", "MistralConfig")
            if mistral
            else ("llama", "LlamaForCausalLM", "LlamaConfig")
        )
        try:
            import transformers

            d = getattr(transformers, cls)(**kw, rope_theta=theta).to_dict()
        except ImportError:
            d = {"model_type": model_type, **kw}
        d["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
        d["rope_theta"] = theta
        d["rope_scaling"] = None
        return arch, d

    def model_keys_from_hf(self, hf: dict, where: str) -> dict:
        from ..config.options import ConfigError

        try:
            return self._model_keys(hf, where)
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # a missing or mistyped field: one line
            raise ConfigError(
                f"{where}: not a readable {hf.get('model_type')} config ({type(e).__name__}: {e})"
            ) from None

    def _model_keys(self, hf: dict, where: str) -> dict:
        from ..config.options import ConfigError

        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        for r in (hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}):  # both: either may be stale
            if r.get("rope_type", r.get("type", "default")) not in ("default", None):
                kind = excerpt(r.get("rope_type", r.get("type")))
                raise ConfigError(f"{where}: rope_type {kind} is not supported (plain rotary only)")
        base = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        h, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        unsupported = []
        if hf.get("hidden_act", HF_ACT) != HF_ACT:
            unsupported.append(f"hidden_act {excerpt(hf['hidden_act'])} (ours is silu)")
        if int(hf.get("head_dim") or h // heads) * heads != h:
            unsupported.append(f"head_dim {hf.get('head_dim')} x {heads} heads != hidden_size {h}")
        if float(base) != int(float(base)):
            unsupported.append(f"rope_theta {base} (an integer rotary_emb_base here)")
        if unsupported:
            raise ConfigError(
                f"{where}: this {hf.get('model_type')} variant cannot be built here: {'; '.join(unsupported)}"
            )
        window = hf.get("sliding_window") if hf.get("model_type") == "mistral" else None
        return dict(
            arch="llama",
            norm="rmsnorm",
            use_bias_in_norms=False,
            activation="swiglu",
            mlp_type="regular",
            mlp_multiple_of=1,
            gpt_j_residual=False,
            num_layers=int(hf["num_hidden_layers"]),
            hidden_size=h,
            num_attention_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            intermediate_size=3 * int(hf["intermediate_size"]),
            vocab_size=int(hf["vocab_size"]),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            rotary_pct=1.0,
            rotary_emb_base=int(float(base)),
            rms_norm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
            no_weight_tying=not bool(hf.get("tie_word_embeddings", False)),
            use_bias_in_attn_linear=bool(hf.get("attention_bias", False)),
            use_bias_in_mlp=bool(hf.get("mlp_bias", False)),
            sliding_window_width=int(window) if window else None,
        )
