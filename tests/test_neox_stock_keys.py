"""The keys that kept GPT-NeoX's stock config files from loading unchanged (issue 30's count):
llemma's ``data_types`` (DeepSpeed's block, accepted when it asks for the fp32 accumulation done
here) and ``warmup_iters`` / ``decay_lr_to`` (mapped onto warmup / min_lr), ``deepspeed_extra_args``
(its keys read as top-level keys, as GPT-NeoX hands them to DeepSpeed), the Slurm runner's
``comment`` / ``account`` and ``comms_logger`` (accepted, named in the note line), ``num_experts``
(named as a GPT-NeoX MoE key, not a typo of num_layers), and a warmup step count that lands exactly.
Fixtures: tests/data/neox_stock/*.yml (written for these tests)."""

from __future__ import annotations

import os

import pytest

from megatron_topo.config import ConfigError, load_config
from megatron_topo.training.batches import learning_rate

DATA = os.path.join(os.path.dirname(__file__), "data", "neox_stock")
TINY = (
    "num_layers: 2\nhidden_size: 32\nnum_attention_heads: 4\nseq_length: 16\nmax_position_embeddings: 16\n"
    "vocab_size: 64\ntrain_micro_batch_size_per_gpu: 2\n"
)


def _f(name: str) -> str:
    return os.path.join(DATA, name)


def _lines(excinfo) -> list[str]:
    return list(getattr(excinfo.value, "problems", None) or [str(excinfo.value)])


def _yml(tmp_path, text: str, name: str = "c.yml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_llemma_schedule_keys_map_onto_warmup_and_min_lr(tmp_path):
    cfg = load_config([_f("llemma_like.yml")], ["vocab_size=64"])
    t = cfg.train
    assert t.min_lr == pytest.approx(0.05 * 0.002, rel=1e-15)
    assert t.warmup_iters is None and t.decay_lr_to is None  # mapped: the effective config states warmup/min_lr
    lrs = [learning_rate(cfg, s) for s in range(1, 56)]
    # exactly 7 warmup steps (7 / 55 * 55 is 6.999... in floating point: the fraction is nudged up)
    assert lrs[5] == pytest.approx(0.002 * 6 / 7) and lrs[6] == 0.002 and lrs[7] < 0.002
    assert lrs[-1] == pytest.approx(t.min_lr)
    # the effective config loads back into the same schedule
    again = load_config([_yml(tmp_path, cfg.to_flat_yaml(), "effective.yml")])
    assert [learning_rate(again, s) for s in range(1, 56)] == lrs


def test_data_types_fp32_is_accepted_with_the_note_and_other_dtypes_are_refused(tmp_path):
    cfg = load_config([_f("llemma_like.yml")], ["vocab_size=64"])
    assert "data_types.grad_accum_dtype=fp32" in cfg.no_effect
    with pytest.raises(ConfigError) as e:
        load_config([_f("llemma_like.yml")], ["vocab_size=64", "data_types.grad_accum_dtype=bf16"])
    [line] = [x for x in _lines(e) if "grad_accum_dtype" in x]
    assert "'bf16'" in line and "fp32" in line and "accumulate in fp32" in line


@pytest.mark.parametrize(
    "extra, words",
    [
        ("warmup: 0.1\n", "warmup_iters and warmup both set"),
        ("min_lr: 0.0001\n", "decay_lr_to and min_lr both set"),
        ("lr_decay_iters: 6\n", "warmup_iters 7 exceeds the lr_decay_iters 6"),
        ("scheduler: {type: WarmupLR, params: {warmup_num_steps: 5}}\n", "scheduler (WarmupLR) and warmup_iters"),
    ],
)
def test_llemma_schedule_keys_conflicts_are_one_line_each(tmp_path, extra, words):
    with pytest.raises(ConfigError) as e:
        load_config([_f("llemma_like.yml"), _yml(tmp_path, extra)], ["vocab_size=64"])
    assert any(words in line for line in _lines(e)), _lines(e)


def test_deepspeed_scheduler_warmup_steps_land_exactly(tmp_path):
    # 7 of 55 steps: 7 / 55 as the warmup fraction gave int(0.1272... * 55) = 6 warmup steps
    p = _yml(
        tmp_path,
        TINY + "train_iters: 55\noptimizer: {type: Adam, params: {lr: 0.001}}\n"
        "scheduler: {type: WarmupDecayLR, params: {warmup_num_steps: 7, total_num_steps: 55}}\n",
    )
    cfg = load_config([p])
    assert learning_rate(cfg, 6) == pytest.approx(0.001 * 6 / 7)
    assert learning_rate(cfg, 7) == 0.001 and learning_rate(cfg, 8) < 0.001


def test_slurm_runner_keys_and_comms_logger_are_noted():
    cfg = load_config([_f("slurm_runner.yml")], ["vocab_size=64"])
    for item in ("comment=pretrain", "account=proj123", "launcher=slurm", "deepspeed_slurm=True"):
        assert item in cfg.no_effect
    assert any(x.startswith("comms_logger=") for x in cfg.no_effect)


def test_deepspeed_extra_args_are_read_as_top_level_keys(tmp_path):
    cfg = load_config([_f("extra_args.yml")], ["vocab_size=64"])
    assert cfg.neox.dump_state is True and cfg.neox.comms_logger == {"enabled": True, "verbose": True}
    assert "dump_state=True" in cfg.no_effect
    # GPT-NeoX refuses a key given both there and at the top level
    with pytest.raises(ConfigError) as e:
        load_config([_yml(tmp_path, "dump_state: false\n", "a.yml"), _f("extra_args.yml")], ["vocab_size=64"])
    assert any("deepspeed_extra_args.dump_state is also set elsewhere" in line for line in _lines(e))
    # and its keys get the same checks as top-level ones
    with pytest.raises(ConfigError) as e:
        load_config(
            [_yml(tmp_path, TINY + "train_iters: 3\ndeepspeed_extra_args: {sparse_attention: {mode: fixed}}\n")]
        )
    assert any("GPT-NeoX key 'sparse_attention' is not supported here" in line for line in _lines(e))


def test_num_experts_is_named_as_a_moe_key_not_a_typo():
    with pytest.raises(ConfigError) as e:
        load_config([_f("old_moe.yml")], ["vocab_size=64"])
    [line] = _lines(e)
    assert "GPT-NeoX key 'num_experts' is not supported here: mixture of experts is not implemented" in line
    assert "did you mean" not in line


def test_check_neox_configs_counts_the_fixture_folder(capsys):
    from megatron_topo.commands.check_neox_configs import main

    assert main([DATA, "--vocab-size", "64", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "| `llemma_like.yml` | passes |" in out and "| `slurm_runner.yml` | passes |" in out
    assert "| `old_moe.yml` | refused | GPT-NeoX key 'num_experts'" in out
    assert "3 of 4 files pass" in out


@pytest.mark.parametrize(
    "value, error",
    [
        ('[[["flash"], "all"]]', None),  # GPT-NeoX: the pattern repeats over every layer
        ('["global", "flash"]', None),  # already expanded: one type per layer
        ('[["global", "flash"], "all"]', "bad"),  # not a list of [types, count] items
        ('[[["global", "flash", "global"], "all"]]', 'attention_config\'s "all" pattern does not divide num_layers 2'),
        ('[[["gmlp"], "all"]]', "attention type 'gmlp' is not supported"),
        ('["global"]', "attention_config covers 1 layers but num_layers is 2"),
    ],
)
def test_attention_config_all_and_expanded_forms(tmp_path, value, error):
    p = _yml(tmp_path, TINY + f"train_iters: 3\nattention_config: {value}\n")
    if error is None:
        assert load_config([p]).model.attention_config is not None
        return
    with pytest.raises(ConfigError) as e:
        load_config([p])
    want = "expected [[[types], count], ...]" if error == "bad" else error
    assert any(want in line for line in _lines(e)), _lines(e)


def test_fp16_scaling_keys_copied_into_the_bf16_block_are_noted(tmp_path):
    p = _yml(
        tmp_path,
        TINY + "train_iters: 3\nbf16: {bf16: true, enabled: true, loss_scale: 0, "
        "loss_scale_window: 1000, initial_scale_power: 12, hysteresis: 2, min_loss_scale: 1}\n",
    )
    cfg = load_config([p])
    assert cfg.precision == "bf16"
    for item in ("bf16.bf16=True", "bf16.loss_scale=0.0", "bf16.hysteresis=2", "bf16.min_loss_scale=1.0"):
        assert item in cfg.no_effect, cfg.no_effect
    # bf16.bf16 alone does not enable bf16 (DeepSpeed reads enabled)
    assert load_config([_yml(tmp_path, TINY + "train_iters: 3\nbf16: {bf16: true}\n", "b.yml")]).precision == "fp32"
