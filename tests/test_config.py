"""Config errors: one clear line, the file named, non-zero exit from train.py."""

import os
import subprocess
import sys

import pytest

from megatron_topo.config import ConfigError, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# the keys GPT-NeoX requires (and seq_length, train_iters, a batch size): every loadable file states them
REQUIRED = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 64,
    "max_position_embeddings": 64,
    "train_iters": 10,
    "train_micro_batch_size_per_gpu": 2,
}


def write(tmp_path, name, text, required=True):
    """A config file: ``text`` plus the required keys it does not set itself."""
    p = tmp_path / name
    given = {line.split(":")[0].strip().replace("-", "_") for line in text.splitlines()}
    extra = "".join(f"{k}: {v}\n" for k, v in REQUIRED.items() if required and k not in given)
    p.write_text(text + extra)
    return str(p)


def test_unknown_key_names_file_and_suggests(tmp_path):
    p = write(tmp_path, "a.yml", "num_layers: 2\nhiden_size: 64\n")
    with pytest.raises(ConfigError) as e:
        load_config([p])
    msg = str(e.value)
    assert p in msg and "hiden_size" in msg and "did you mean 'hidden_size'" in msg


def test_unknown_nested_key_suggests(tmp_path):
    p = write(tmp_path, "a.yml", "zero_topo:\n  secondary_degre: 8\n")
    with pytest.raises(ConfigError, match="did you mean 'secondary_degree'"):
        load_config([p])


def test_duplicate_key_across_files(tmp_path):
    a = write(tmp_path, "a.yml", "num_layers: 2\n")
    b = write(tmp_path, "b.yml", "num-layers: 3\n", required=False)  # '-' and '_' are the same key
    with pytest.raises(ConfigError) as e:
        load_config([a, b])
    assert a in str(e.value) and b in str(e.value)


def test_duplicate_key_inside_one_file(tmp_path):
    a = write(tmp_path, "a.yml", "num_layers: 2\nnum_layers: 3\n")
    with pytest.raises(ConfigError, match="repeated"):
        load_config([a])


def test_wrong_type_names_expected_type(tmp_path):
    a = write(tmp_path, "a.yml", "train_iters: lots\n")
    with pytest.raises(ConfigError, match="train_iters: expected an integer"):
        load_config([a])
    b = write(tmp_path, "b.yml", "gpt_j_residual: 1\n")
    with pytest.raises(ConfigError, match="expected a boolean"):
        load_config([b])


def test_dash_underscore_and_overrides(tmp_path):
    a = write(tmp_path, "a.yml", "num-layers: 2\noptimizer: {params: {lr: 6e-4}}\nzero_topo: {preset: topo}\n")
    cfg = load_config([a], ["num_layers=5", "zero_topo.secondary_degree=8"])
    assert cfg.model.hidden_size == 64  # (the required keys write() adds)
    assert cfg.model.num_layers == 5 and cfg.zero_topo.secondary_degree == 8
    assert cfg.train.optimizer.params.lr == 6e-4 and cfg.zero_topo.preset == "topo"


def test_effective_config_round_trips(tmp_path):
    a = write(tmp_path, "a.yml", "num_layers: 3\nzero_topo: {preset: zeropp}\nfp16: {enabled: true}\n")
    cfg = load_config([a])
    b = write(tmp_path, "eff.yml", cfg.to_flat_yaml())
    again = load_config([b])
    assert again == cfg and again.precision == "fp16"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("hiden_size: 64\n", "did you mean 'hidden_size'"),
        ("train_iters: [1]\n", "expected an integer"),
        ("zero_topo: {preset: zero4}\n", "use one of ddp, zero1"),
        ("hidden_size: 30\nnum_attention_heads: 4\n", "not divisible"),
    ],
)
def test_train_py_exits_with_one_line(tmp_path, text, needle):
    a = write(tmp_path, "bad.yml", text)
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), a], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert r.returncode == 2
    lines = [x for x in r.stderr.strip().splitlines() if x]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not os.path.exists(tmp_path / "runs")  # nothing written for a bad config


def test_required_keys_have_no_default(tmp_path):
    """GPT-NeoX requires num_layers, hidden_size, num_attention_heads and max_position_embeddings (and
    fails without seq_length): a partial file is one line, not a 2-layer model."""
    a = write(tmp_path, "partial.yml", "num_layers: 2\nhidden_size: 64\n", required=False)
    with pytest.raises(ConfigError) as e:
        load_config([a])
    lines = str(e.value).splitlines()
    assert lines == [
        "num_attention_heads, max_position_embeddings, seq_length are required (GPT-NeoX has no default for them); "
        "set them in a config file or with --set"
    ], lines
    cfg = load_config([a], ["num_attention_heads=4", "max_position_embeddings=64", "seq_length=64"])
    assert cfg.model.num_attention_heads == 4
