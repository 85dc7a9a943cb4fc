"""Loading a checkpoint's model for tools/generate.py (both interfaces: the flags in
:mod:`megatron_topo.commands.generate`, GPT-NeoX's config keys in
:mod:`megatron_topo.commands.generate_neox`) and their one-line error."""

from __future__ import annotations

import os


class GenerateError(ValueError):
    pass


def build_tokenizer_or_none(cfg):
    from megatron_topo.data import DataError, build_tokenizer

    try:
        return build_tokenizer(cfg.data.tokenizer_type, cfg.data.vocab_file, cfg.model.vocab_size), None
    except (DataError, ImportError, OSError) as e:
        return None, str(e)


def load_model(checkpoint: str, device: str = "cpu", unverified: bool = False):
    """(model in eval mode, full Config) from any checkpoint (``unverified``: --load-unverified)."""
    import torch

    from megatron_topo.config import ConfigError, load_config
    from megatron_topo.model.spec import spec_for
    from megatron_topo.zero_topo.checkpoint import CheckpointError, read_full_state
    from megatron_topo.zero_topo.checkpoint.offline import check_saved_config
    from megatron_topo.zero_topo.checkpoint.param_table import check_param_table, module_unit_table

    st = read_full_state(checkpoint, unverified=unverified, ask="pass --load-unverified")
    path = os.path.join(st["step_dir"], "config.yml")
    if st["config_yaml"] is None:
        raise CheckpointError(f"{st['step_dir']} has no config.yml; cannot tell the model's shape")
    try:
        cfg = load_config([path])
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None
    check_saved_config(st["step_dir"], st["meta"], cfg)  # meta.json's precision is the saved run's
    with torch.device(device):  # the architecture the config names (its spec's module)
        model = spec_for(cfg.model).module_class(cfg.model)(cfg.model)  # rotary buffers built here
    check_param_table(st["step_dir"], st["meta"], module_unit_table(model), "the model config.yml builds")
    try:
        missing, unexpected = model.load_state_dict(st["params"], strict=False)
    except RuntimeError as e:
        raise CheckpointError(
            f"{st['step_dir']}: weights do not fit config.yml's model: {str(e).strip().splitlines()[-1].strip()}"
        ) from None
    # tied: the head's weight is the embedding's (stored once, under the embedding's name)
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise CheckpointError(
            f"{st['step_dir']}: parameters do not match config.yml (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.eval(), cfg


def check_device(name: str) -> str:
    """'cpu', 'cuda' or 'cuda:N' that exists here; anything else is one line."""
    import torch

    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise GenerateError(f"--device {name!r} is not a device; use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return name
    if dev.type != "cuda":
        raise GenerateError(f"--device {name!r}: only cpu and cuda are supported")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        raise GenerateError(f"--device {name}: no GPU is visible; use --device cpu")
    if dev.index is not None and not 0 <= dev.index < n:
        raise GenerateError(f"--device {name}: this machine has {n} GPU(s), cuda:0..cuda:{n - 1}")
    return name
