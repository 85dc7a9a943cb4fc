"""Hostile inputs, round 5 (issue 29, probe 5): config files and config values.

Families: a config file of any size (H1: read with a cap, values counted while parsing); numeric
keys with no upper bound (T2: a 400-digit value or 1e308 for every int/float key is one line);
timeouts that round to 0 ms (T3); ``precision`` contradicting the fp16/bf16 flags (F3); lenient
values read as "unset" without a word (empty paths and lists, ``mics_shard_size: 0``, ``--set
save=~``); one bad value reported as several lines; an HF config.json naming one setting twice
with different values.
"""

import json
import os
import shutil
import time
import typing

import pytest

from megatron_topo.commands import check_neox_configs
from megatron_topo.commands import train as train_cli
from megatron_topo.config import ConfigError, load_config
from megatron_topo.config.deepspeed import SchedulerBlock, ZeroOptimizationBlock
from megatron_topo.config.options import _strip_optional
from megatron_topo.config.schema import Config, SystemConfig, _declared
from megatron_topo.config.yaml_io import MAX_CONFIG_BYTES

from .cli_cases import call, one_error_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny.yml")
BIG = "9" * 400


def _problems(paths, sets=()):
    """The problem lines load_config reports (asserting it refuses)."""
    with pytest.raises(ConfigError) as e:
        load_config(list(paths), list(sets))
    return str(e.value).splitlines()


def _one_line(paths, sets=()):
    lines = _problems(paths, sets)
    assert len(lines) == 1, lines
    assert len(lines[0]) < 400, lines[0]  # never the whole value echoed
    return lines[0]


def _tiny_without(tmp_path, *keys, name="base.yml"):
    """configs/tiny.yml without the given top-level keys (and their indented lines)."""
    out, skipping = [], False
    for line in open(TINY).read().splitlines():
        if line[:1] not in (" ", "\t"):
            skipping = line.split(":")[0].strip() in keys
        if not skipping:
            out.append(line + "\n")
    p = tmp_path / name
    p.write_text("".join(out))
    return str(p)


@pytest.fixture
def cfg_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    shutil.copy(TINY, tmp_path / "cfg.yml")
    return tmp_path


# ------------------------------------------------------------------------------ H1: config file size
@pytest.mark.parametrize("suffix", [".yml", ".json"])
def test_a_config_file_over_the_cap_is_one_line_at_once(cfg_dir, capfd, suffix):
    """A sparse 3 GiB file (probe: check_neox_configs read it whole) and a 60 MB one (train.py ran
    > 30 s): refused by size before anything is read."""
    for size in (3 << 30, 60_000_000, MAX_CONFIG_BYTES + 1):
        p = cfg_dir / f"x{suffix}"
        with open(p, "wb") as f:
            f.truncate(size)
        t = time.monotonic()
        assert call(train_cli.main, ["cfg.yml", str(p.name), "--set", "train_iters=1"]) == 2
        line = one_error_line(capfd)
        assert time.monotonic() - t < 10
        assert f"x{suffix} is {size:,} bytes; a config file is at most {MAX_CONFIG_BYTES:,} bytes" in line, line


def test_check_neox_configs_on_a_huge_yml_ends(cfg_dir, capfd):
    (cfg_dir / "nx").mkdir()
    with open(cfg_dir / "nx" / "big.yml", "wb") as f:
        f.truncate(3 << 30)
    t = time.monotonic()
    call(check_neox_configs.main, ["nx"])
    out = capfd.readouterr()
    assert time.monotonic() - t < 20
    assert "big.yml" in out.out + out.err and f"{3 << 30:,} bytes" in out.out + out.err
    assert "Traceback" not in out.err


def test_the_capped_read_ends_on_a_file_that_grows(tmp_path, monkeypatch):
    """fstat says small, the read finds more (a file still being written, a /proc-like file): the
    read stops at the cap instead of reading on."""
    p = tmp_path / "x.yml"
    p.write_bytes(b"seed: 1\n")
    real_fstat = os.fstat

    class Small:
        def __init__(self, st):
            self.st_mode, self.st_size = st.st_mode, 8

    monkeypatch.setattr(os, "fstat", lambda fd: Small(real_fstat(fd)))
    p.write_bytes(b"# " + b"x" * (MAX_CONFIG_BYTES + 10) + b"\n")
    line = _one_line([str(p)])
    assert "holds more than" in line and "a config file is at most" in line


@pytest.mark.parametrize(
    "body",
    [
        "a:\n" + "  - x\n" * 600_000,  # a long block list
        "a: [" + "1," * 1_500_000 + "1]\n",  # a long flow list
        "".join(f"k{i}: {i}\n" for i in range(250_000)),  # many keys
    ],
    ids=["block-list", "flow-list", "many-keys"],
)
def test_a_config_with_too_many_values_is_refused_while_parsing(tmp_path, body):
    """Under the byte cap but hundreds of thousands of values: PyYAML took minutes to parse them all
    before the value bound was checked; now counted as they are composed."""
    p = tmp_path / "x.yml"
    p.write_text(body)
    assert p.stat().st_size <= MAX_CONFIG_BYTES
    t = time.monotonic()
    line = _one_line([str(p)])
    assert time.monotonic() - t < 20
    assert "more than 100,000 values" in line


# ------------------------------------------------------------------------------ T2: numeric upper bounds
def _numeric_keys():
    cfg = Config(system=SystemConfig(), zero_optimization=ZeroOptimizationBlock())
    cfg.train.scheduler = SchedulerBlock()
    out = []
    for path, _value, _meta, tp in _declared(cfg, with_type=True):
        t = _strip_optional(tp)
        if typing.get_origin(t) in (list, tuple):
            t = (typing.get_args(t) or (None,))[0]
        if t in (int, float):
            out.append(path)
    return out


NUMERIC_KEYS = _numeric_keys()


def test_every_numeric_key_refuses_a_huge_value_with_one_line(tmp_path):
    """A 400-digit integer and 1e308 (and their negatives) for every int/float key, through --set:
    one line each (the probe: rotary_emb_base=9...9 gave an OverflowError traceback in torch.pow)."""
    assert len(NUMERIC_KEYS) > 100 and "rotary_emb_base" in NUMERIC_KEYS
    no_schedule = _tiny_without(tmp_path, "lr_decay_style", "warmup", "min_lr")  # scheduler.*: no clash
    bad = []
    for key in NUMERIC_KEYS:
        base = str(no_schedule) if key.startswith("scheduler.") else TINY
        for v in (BIG, "-" + BIG, "1e308"):
            try:
                load_config([base], [f"{key}={v}"])
                bad.append((key, v[:5], "accepted"))
            except ConfigError as e:
                lines = str(e).splitlines()
                if len(lines) != 1 or len(lines[0]) > 300:
                    bad.append((key, v[:5], lines))
    assert not bad, bad[:5]


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("rotary_emb_base", BIG, "rotary_emb_base must lie in [1, 1000000000000], got 999999999999...(400 digits)"),
        ("rotary_emb_base", "1e308", "rotary_emb_base must lie in [1, 1000000000000]"),
        ("init_method_std", "1e308", "init_method_std must lie in (0, 10], got 1e+308"),
        ("layernorm_epsilon", BIG, "layernorm_epsilon: 999999999999...(400 digits) is too large; expected a number"),
        ("optimizer.params.lr", "1e308", "optimizer.params.lr must lie in [0, 10]"),
        ("min_lr", "1e308", "min_lr must lie in [0, 10]"),
        ("weight_decay", "11", "weight_decay must lie in [0, 10], got 11"),
        ("optimizer.params.eps", "2", "optimizer.params.eps must lie in (0, 1], got 2"),
        ("gradient_clipping", "1e308", "gradient_clipping must lie in [0, 1000000]"),
        ("fp16.hysteresis", BIG, "fp16.hysteresis must lie in [1, 65536]"),
        ("fp16.loss_scale", "1e308", "fp16.loss_scale must lie in [0, 1.7014118346046923e+38]"),
        ("bf16.hysteresis", "-1", "bf16.hysteresis must lie in [1, 65536], got -1"),
        ("master_port", "70000", "master_port must lie in [0, 65535], got 70000"),
        ("warmup_iters", BIG, "warmup_iters must lie in [0, 1099511627776]"),
        ("decay_lr_to", "1e308", "decay_lr_to must lie in [0, 1], got 1e+308"),
        ("system.peak_tflops", "1e308", "system.peak_tflops must be <= 1e+15, got 1e+308"),
        ("log_interval", BIG, "log_interval must be <= 9223372036854775807, got 999999999999...(400 digits)"),
        ("train_data_weights", f"[{BIG}]", "train_data_weights[0]: 999999999999...(400 digits) is too large"),
    ],
)
def test_huge_values_name_the_key_and_its_bounds(key, value, needle):
    line = _one_line([TINY], [f"{key}={value}"])
    assert needle in line, line


def test_rotary_base_huge_through_train_is_one_line(cfg_dir, capfd):
    assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1", "--set", f"rotary_emb_base={BIG}"]) == 2
    assert "rotary_emb_base must lie in [1, 1000000000000]" in one_error_line(capfd)


# ------------------------------------------------------------------------------ T3: timeouts
@pytest.mark.parametrize(
    "key,value",
    [
        ("distributed.rendezvous_timeout_s", "1e-300"),
        ("distributed.rendezvous_timeout_s", "0.0004"),
        ("distributed.collective_timeout_s", "1e-300"),
        ("distributed.collective_timeout_s", "1e308"),
        ("distributed.rendezvous_timeout_s", "1e308"),
    ],
)
def test_timeouts_are_at_least_a_second_and_at_most_a_day(key, value):
    line = _one_line([TINY], [f"{key}={value}"])
    assert f"{key} must lie in [1, 86400]" in line, line


def test_rendezvous_timeout_that_rounds_to_0ms_is_one_line_before_any_store(cfg_dir, capfd, monkeypatch):
    """The probe's case: WORLD_SIZE=2 RANK=0 and a timeout of 1e-300 s: a DistNetworkError
    traceback from TCPStore (0 ms); now the config refuses it before any socket."""
    for k, v in (("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MASTER_PORT", "29731")
    argv = ["cfg.yml", "--set", "train_iters=1", "--set", "distributed.rendezvous_timeout_s=1e-300"]
    assert call(train_cli.main, argv) == 2
    assert "distributed.rendezvous_timeout_s must lie in [1, 86400], got 1e-300" in one_error_line(capfd)


def test_rank0_store_error_is_one_line(monkeypatch):
    """Whatever TCPStore raises on rank 0 (other than a port in use) is one RendezvousError line."""
    import torch.distributed as dist

    from megatron_topo.training import rendezvous

    def boom(*a, **k):
        raise dist.DistNetworkError("The client socket has timed out after 0ms while trying to connect\nframe #1")

    monkeypatch.setattr(dist, "TCPStore", boom)
    with pytest.raises(rendezvous.RendezvousError) as e:
        rendezvous.connect(0, "127.0.0.1", 29731, 1.0)
    assert str(e.value).count("\n") == 0 and "rank 0: cannot serve the rendezvous store on 127.0.0.1:29731" in str(
        e.value
    )


# ------------------------------------------------------------------------------ F3: precision vs flags
@pytest.mark.parametrize(
    "sets,needle",
    [
        (["precision=fp32", "bf16.enabled=true"], "precision: fp32 contradicts bf16.enabled: true"),
        (["precision=fp32", "fp16.enabled=true"], "precision: fp32 contradicts fp16.enabled: true"),
        (["precision=bf16", "fp16.enabled=true"], "precision: bf16 contradicts fp16.enabled: true"),
        (["precision=fp16", "bf16.enabled=true"], "precision: fp16 contradicts bf16.enabled: true"),
        (["precision=fp16", "fp16.type=bfloat16"], "precision: fp16 contradicts fp16.type: bfloat16"),
        (["precision=float32", "fp16.fp16=true"], "precision: float32 contradicts fp16.fp16: true"),
    ],
)
def test_precision_contradicting_a_flag_is_one_line(sets, needle):
    line = _one_line([TINY], sets)
    assert needle in line, line


@pytest.mark.parametrize(
    "sets,precision",
    [
        (["precision=bf16", "bf16.enabled=true"], "bf16"),
        (["precision=fp16", "fp16.enabled=true"], "fp16"),
        (["precision=bf16", "fp16.type=bfloat16", "fp16.enabled=true"], "bf16"),  # GPT-NeoX's bf16 spelling
        (["precision=fp16", "fp16.enabled=false"], "fp16"),  # a flag set false asks for nothing
        (["precision=fp32", "bf16.enabled=false", "fp16.enabled=false"], "fp32"),
    ],
)
def test_precision_and_flags_that_agree_load(sets, precision):
    assert load_config([TINY], sets).precision == precision


def test_precision_and_bf16_enabled_through_train_is_one_line(cfg_dir, capfd):
    argv = ["cfg.yml", "--set", "train_iters=1", "--set", "precision=fp32", "--set", "bf16.enabled=true"]
    assert call(train_cli.main, argv) == 2
    assert "precision: fp32 contradicts bf16.enabled: true" in one_error_line(capfd)
    assert not os.path.exists("log")


# ------------------------------------------------------------------------------ lenient values
@pytest.mark.parametrize(
    "yml,needle",
    [
        ("train_data_paths: []\n", "train_data_paths=[] is not valid; give at least one value, or null"),
        ("valid_data_paths: []\n", "valid_data_paths=[] is not valid"),
        ("test_data_paths: []\n", "test_data_paths=[] is not valid"),
        ("distributed: {trace_collectives: ''}\n", "distributed.trace_collectives='' is not valid; give a value"),
        ("save: ''\n", "save='' is not valid"),
        ("load: '  '\n", "load='  ' is not valid"),
        ("log_dir: ''\n", "log_dir='' is not valid; give a value"),  # (metrics.jsonl would go to the cwd)
        ("system: {name: ' '}\n", "system.name=' ' is not valid"),
        ("data_cache_dir: ''\n", "data_cache_dir='' is not valid"),
        ("zero_optimization: {stage: 3, mics_shard_size: 0}\n", "zero_optimization.mics_shard_size=0 is not valid"),
    ],
)
def test_empty_or_meaningless_values_are_refused(tmp_path, yml, needle):
    p = tmp_path / "x.yml"
    p.write_text(yml)
    line = _one_line([_tiny_without(tmp_path, yml.split(":")[0]), str(p)])
    assert needle in line, line


def test_an_empty_list_that_means_none_like_unset_loads():
    """``extra_save_iters: []`` (no extra saves) means what leaving it unset means: not refused."""
    assert load_config([TINY], ["extra_save_iters=[]"]).checkpoint.extra_save_iters == []


def test_mics_shard_size_minus_one_and_sizes_load():
    assert load_config([TINY], ["zero_optimization.stage=3", "zero_optimization.mics_shard_size=-1"])
    assert "must" in _one_line([TINY], ["zero_optimization.stage=3", "zero_optimization.mics_shard_size=-2"])


def test_quoted_integers_are_read_alike_for_every_int_key(tmp_path):
    """``stage: '3'`` is read as 3 like every int key (DeepSpeed's JSON files quote numbers); a
    string that is not an integer is refused alike."""
    p = tmp_path / "x.yml"
    p.write_text("zero_optimization: {stage: '3', reduce_bucket_size: '5e8'}\nlog_interval: '3'\n")
    base = _tiny_without(tmp_path, "log_interval")
    cfg = load_config([base, str(p)])
    assert (cfg.zero_optimization.stage, cfg.zero_optimization.reduce_bucket_size, cfg.logging.log_interval) == (
        3,
        500_000_000,
        3,
    )
    for yml, key in (("zero_optimization: {stage: three}\n", "stage"), ("log_interval: three\n", "log_interval")):
        p.write_text(yml)
        assert f"{key}: expected an integer" in _one_line([base, str(p)])


def test_tilde_for_a_path_key_is_refused_null_is_not(cfg_dir, capfd):
    assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1", "--set", "save=~"]) == 2
    assert "'~' is ambiguous" in one_error_line(capfd) and not os.path.exists("log")
    assert load_config([TINY], ["save=null"]).checkpoint.save is None
    assert load_config([TINY], ["save=~/ck"]).checkpoint.save == "~/ck"
    p = cfg_dir / "x.yml"
    p.write_text("save: ~\n")  # YAML's own null, in a file: unambiguous
    assert load_config([_tiny_without(cfg_dir, "save"), str(p)]).checkpoint.save is None


# ------------------------------------------------------------------------------ one bad value, one line
@pytest.mark.parametrize(
    "yml,needle",
    [
        ("norm: '\\e[2J" + "Q" * 3000 + "'\n", "norm="),
        ("num_kv_heads: 0\n", "num_kv_heads must lie in [1, 16384], got 0"),
        ("activation: GELU\n", "activation='GELU' is not valid"),
        ("scheduler: {type: WarmupDecayLR, params: x}\n", "scheduler.params: expected a mapping"),
        ("hidden_size: 99999999999999999999\n", "hidden_size must lie in [1, 262144]"),
        ("warmup_iters: -5\n", "warmup_iters must lie in [0, 1099511627776], got -5"),
        ("optimizer: {type: AdamW, params: {lr: 1.0e+300}}\n", "optimizer.params.lr must lie in [0, 10]"),
        ("seq_length: 0\n", "seq_length must lie in [1, 1048576], got 0"),
        ("profile_step_start: -1\n", "profile_step_start must be >= 0, got -1"),
    ],
    ids=["enum-long", "kv-heads-zero", "activation-upper", "scheduler-params-string", "hidden-huge",
         "warmup-iters-negative", "lr-huge", "seq-zero", "profile-start-negative"],
)  # fmt: skip
def test_one_bad_value_is_one_line(tmp_path, yml, needle):
    """The rules that depend on a field already reported (the architecture's, the schedule's, the
    profile window's) do not report it again."""
    key = yml.split(":")[0]
    drop = (key, "lr_decay_style", "warmup", "min_lr") if key == "scheduler" else (key,)
    p = tmp_path / "x.yml"
    p.write_text(yml)
    line = _one_line([_tiny_without(tmp_path, *drop), str(p)])
    assert needle in line, line


def test_independent_problems_are_still_all_reported(tmp_path):
    """The one-line rule drops only what follows from an already reported value."""
    p = tmp_path / "x.yml"
    p.write_text("num_kv_heads: 0\nsplit: abc\nhiden_size: 3\n")
    lines = _problems([TINY, str(p)])
    assert len(lines) == 3, lines
    assert any("num_kv_heads" in x for x in lines) and any("split" in x for x in lines)
    assert any("hidden_size" in x for x in lines)


# ------------------------------------------------------------------------------ HF config.json aliases
HF = {
    "model_type": "gpt_neox",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 64,
    "max_position_embeddings": 64,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-5,
    "use_parallel_residual": True,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"rotary_pct": 0.25, "partial_rotary_factor": 0.5}, "rotary_pct 0.25, partial_rotary_factor 0.5"),
        ({"rotary_emb_base": 10000, "rope_theta": 500000.0}, "rotary_emb_base 10000, rope_theta 500000.0"),
        (
            {"rotary_pct": 0.25, "rope_parameters": {"partial_rotary_factor": 1.0, "rope_type": "default"}},
            "rope_parameters.partial_rotary_factor 1.0",
        ),
    ],
)
def test_hf_config_naming_one_setting_twice_with_different_values_is_one_line(extra, needle):
    from megatron_topo.config.hf_config import model_keys_from_hf

    hf = {**HF, **extra}
    with pytest.raises(ConfigError) as e:
        model_keys_from_hf(hf, "hf/config.json")
    assert str(e.value).count("\n") == 0 and needle in str(e.value), str(e.value)
    assert "make them agree" in str(e.value)
    same = {k: v for k, v in hf.items()}
    for k, v in extra.items():  # the same value under every name: fine
        if isinstance(v, dict):
            same[k] = {**v, "partial_rotary_factor": same.get("rotary_pct", 1.0)}
    if "partial_rotary_factor" in extra:
        same["partial_rotary_factor"] = same["rotary_pct"]
    if "rope_theta" in extra:
        same["rope_theta"] = float(same["rotary_emb_base"])
    keys = model_keys_from_hf(same, "hf/config.json")
    assert keys["rotary_pct"] == same.get("rotary_pct", 1.0)


def test_hf_rotary_conflict_through_finetune_is_one_line(cfg_dir, capfd):
    """The probe's case: finetune_from an HF folder whose config.json has rotary_pct 0.25 and
    partial_rotary_factor 0.5 trained without a word (the config is refused before any weight is read)."""
    hf = dict(HF, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512, vocab_size=512)
    (cfg_dir / "hf").mkdir()
    (cfg_dir / "hf" / "config.json").write_text(json.dumps({**hf, "rotary_pct": 0.25, "partial_rotary_factor": 0.5}))
    (cfg_dir / "hf" / "model.safetensors").write_bytes(b"")
    argv = ["cfg.yml", "--set", "train_iters=1", "--set", "finetune_from=hf"]
    assert call(train_cli.main, argv) == 2
    line = one_error_line(capfd)
    assert "hf/config.json: rotary_pct 0.25, partial_rotary_factor 0.5 name one setting (rotary_pct)" in line, line
    assert not os.path.exists("log")
