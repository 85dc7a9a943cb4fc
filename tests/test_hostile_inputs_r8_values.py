"""Hostile inputs, round 8 (issue 29, probe 8): values in configs and tool flags.

C1: a float literal past float's range (``1e400``) was echoed as ``inf`` (``optimizer.params.lr must be
a finite number, got inf``, ``--temperature inf``): now one line quoting the literal and its source.
C3/C4/C5: comma-separated values skipped an empty item (``split=969,,30`` read as ``969,30,0``,
``--gcds 8,,16``, ``--presets ''`` an empty table): every comma list now refuses an empty item naming
its position (cli.comma_items). D1: numbers in other scripts' digits or with Unicode spaces (``seed=٣``)
were read: config values and tool flags take ASCII digits only. D3: a config with thousands of problems
printed one line each: capped. D6: an HF config.json value outside the key it sets named neither the
file nor the HF field.
"""

import json
import os
import re
import shutil
import typing

import pytest

from megatron_topo import cli
from megatron_topo.commands import generate as generate_cli
from megatron_topo.commands import measure_collectives, predict_perf
from megatron_topo.commands import train as train_cli
from megatron_topo.config import ConfigError, load_config
from megatron_topo.config.deepspeed import SchedulerBlock, ZeroOptimizationBlock
from megatron_topo.config.options import _strip_optional
from megatron_topo.config.schema import Config, SystemConfig, _declared
from megatron_topo.data.corpus_sources import split_inputs
from megatron_topo.data.errors import DataError
from megatron_topo.data.gpt_dataset import parse_split
from megatron_topo.model.hf_schema import check_config

from .cli_cases import call, one_error_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny.yml")
FRONTIER = os.path.join(ROOT, "configs", "frontier.yml")
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def cfg_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k, raising=False)
    shutil.copy(TINY, tmp_path / "cfg.yml")
    return tmp_path


def _float_keys():
    cfg = Config(system=SystemConfig(), zero_optimization=ZeroOptimizationBlock())
    cfg.train.scheduler = SchedulerBlock()
    out = []
    for path, _value, _meta, tp in _declared(cfg, with_type=True):
        t = _strip_optional(tp)
        if typing.get_origin(t) not in (list, tuple) and t is float:
            out.append(path)
    return out


def _nested(dotted: str, value):
    out = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def _lines(paths, sets=()):
    with pytest.raises(ConfigError) as e:
        load_config(list(paths), list(sets), require=False)
    return str(e.value).splitlines()


# ------------------------------------------------------------------------------ C1: overflowing literals
@pytest.mark.parametrize("literal", ["1e400", "-1e400", "1e309", "1.8e308", "1e99999999999999999999"])
def test_a_float_literal_past_floats_range_is_quoted_for_every_float_key(cfg_dir, literal):
    """Before: ``hidden_dropout must be a finite number, got inf`` (a value never written)."""
    keys = _float_keys()
    assert len(keys) > 30 and "optimizer.params.lr" in keys
    want = f"{literal} is beyond the largest float (about 1.8e308) and would be read as"
    bad = []
    for key in keys:
        (cfg_dir / "k.json").write_text(json.dumps(_nested(key, "@")).replace('"@"', literal))
        for how, args in (("json", (["k.json"], [])), ("set", ([], [f"{key}={literal}"]))):
            try:
                load_config(*args, require=False)
                bad.append((key, how, "accepted"))
            except ConfigError as e:
                lines = str(e).splitlines()
                if not any(f"{key}: {want}" in ln and "got inf" not in ln for ln in lines):
                    bad.append((key, how, lines))
    assert not bad, bad[:6]


@pytest.mark.parametrize(
    "doc",
    [
        "hidden_dropout: !!float 1e400\n",
        "%TAG !e! tag:yaml.org,2002:\n---\nhidden_dropout: !e!float 1e400\n",
        "hidden_dropout: '1e400'\n",
        "hidden_dropout: 1e400\n",
    ],
)
def test_an_overflowing_literal_in_yaml_names_the_file_and_key(cfg_dir, doc):
    (cfg_dir / "y.yml").write_text(doc)
    lines = _lines(["y.yml"])
    assert len(lines) == 1 and "y.yml" in lines[0] and "hidden_dropout: 1e400 is beyond the largest float" in lines[0]


def test_an_overflowing_literal_through_train_is_one_line_naming_the_set(cfg_dir, capfd):
    assert call(train_cli.main, ["cfg.yml", "--dry-run", "--set", "optimizer.params.lr=1e400"]) == 2
    line = one_error_line(capfd)
    assert "optimizer.params.lr=1e400" in line and "1e400 is beyond the largest float" in line, line
    assert "inf" not in line.replace("read as inf", ""), line


def test_an_overflowing_integer_key_literal_is_quoted(cfg_dir):
    lines = _lines([], ["seed=1e400"])
    assert len(lines) == 1 and "seed: 1e400 is beyond the largest float" in lines[0], lines


@pytest.mark.parametrize("literal", ["1e308", "1.7976931348623157e308", "0.1", "-1e308"])
def test_control_large_finite_literals_still_read(cfg_dir, literal):
    """A finite literal is read as its float: a bound then quotes it (1e308 is no overflow)."""
    if abs(float(literal)) <= 10:
        assert load_config([], [f"optimizer.params.lr={literal}"], require=False).train.optimizer.params.lr == 0.1
        return
    lines = _lines([], [f"optimizer.params.lr={literal}"])
    assert lines == [f"optimizer.params.lr must lie in [0, 10], got {float(literal):g}"] or (
        len(lines) == 1 and lines[0].endswith(f"got {float(literal)!r}")
    ), lines


@pytest.mark.parametrize("flag", ["--temperature", "--top-p"])
def test_generate_float_flags_quote_an_overflowing_literal(cfg_dir, capfd, flag):
    """Before: ``--temperature inf: must be a finite number > 0``."""
    assert call(generate_cli.main, ["cfg.yml", "--prompt-ids", "1", flag, "1e400"]) == 2
    line = one_error_line(capfd)
    assert "1e400 is beyond the largest float" in line and flag in line, line


# ------------------------------------------------------------------------------ C3/C4/C5: empty items
@pytest.mark.parametrize(
    "split, pos",
    [
        ("100,,0", "item 2 of 3"),
        ("100,0,0,", "item 4 of 4"),
        ("969,,30", "item 2 of 3"),
        (",1", "item 1 of 2"),
        ("1/ /2", "item 2 of 3"),
    ],
)
def test_split_refuses_an_empty_item(cfg_dir, capfd, split, pos):
    """Before: exit 0; ``969,,30`` was read as ``969,30,0`` (the test share became validation)."""
    with pytest.raises(DataError, match=f"{pos} is empty"):
        parse_split(split)
    assert call(train_cli.main, ["cfg.yml", "--dry-run", "--set", f"split={split}"]) == 2
    line = one_error_line(capfd)
    assert "split" in line and f"{pos} is empty" in line, line


@pytest.mark.parametrize(
    "split, want",
    [
        ("969,30,1", [0.969, 0.03, 0.001]),
        ("949/50/1", [0.949, 0.05, 0.001]),
        ("1,1,1", [1 / 3, 1 / 3, 1 / 3]),
        (" 1 , 1 ", [0.5, 0.5, 0.0]),
    ],
)
def test_control_valid_splits_still_read(cfg_dir, split, want):
    assert parse_split(split) == pytest.approx(want)
    assert load_config(["cfg.yml"], [f"split='{split}'"]).data.split.strip() == split.strip()


@pytest.fixture
def model_yml(cfg_dir):
    import yaml

    doc = yaml.safe_load((cfg_dir / "cfg.yml").read_text())
    doc.pop("distributed", None)
    (cfg_dir / "m.yml").write_text(yaml.safe_dump(doc))
    return "m.yml"


@pytest.mark.parametrize(
    "gcds, why",
    [
        ("8,,16", "item 2 of 3 is empty"),
        (",8", "item 1 of 2 is empty"),
        ("8,", "item 2 of 2 is empty"),
        ("8, ,16", "item 2 of 3 is empty"),
        (" ", "is empty"),
        ("٨", "expected"),
    ],
)
def test_predict_perf_gcds_refuses_an_empty_item(model_yml, capfd, gcds, why):
    assert call(predict_perf.main, ["--model", model_yml, "--system", FRONTIER, "--gcds", gcds]) == 2
    line = one_error_line(capfd)
    assert "--gcds" in line and why in line, line


@pytest.mark.parametrize(
    "presets, why",
    [
        ("", "is empty"),
        (",zero3", "item 1 of 2 is empty"),
        ("zero3,", "item 2 of 2 is empty"),
        ("zero3,,topo", "item 2 of 3 is empty"),
    ],
)
def test_predict_perf_presets_refuses_an_empty_item(model_yml, capfd, presets, why):
    """Before: exit 0 (``''``: a table with no columns; an empty item skipped)."""
    argv = ["--model", model_yml, "--system", FRONTIER, "--gcds", "8", "--presets", presets]
    assert call(predict_perf.main, argv) == 2
    line = one_error_line(capfd)
    assert "--presets" in line and why in line and "zero3" in line, line


def test_control_predict_perf_valid_lists_still_run(model_yml, capfd):
    argv = ["--model", model_yml, "--system", FRONTIER, "--gcds", "8,16", "--presets", "zero3,topo", "--json"]
    assert call(predict_perf.main, argv) == 0
    out = capfd.readouterr().out
    assert "zero3" in out and "topo" in out


def test_measure_collectives_lists_refuse_an_empty_item():
    class A:
        sizes_mb, ops = "16,,64", "all_gather"

    with pytest.raises(ConfigError, match=r"--sizes-mb '16,,64': item 2 of 3 is empty"):
        measure_collectives.check(A)
    A.sizes_mb, A.ops = "16", "all_gather,"
    with pytest.raises(ConfigError, match=r"--ops 'all_gather,': item 2 of 2 is empty"):
        measure_collectives.check(A)


def test_preprocess_input_list_refuses_an_empty_item(tmp_path):
    with pytest.raises(DataError, match=r"--input 'a.jsonl,,b.jsonl': item 2 of 3 is empty"):
        split_inputs([str("a.jsonl,,b.jsonl")])
    assert split_inputs(["a.jsonl,b.jsonl"]) == ["a.jsonl", "b.jsonl"]  # control


def test_comma_items_names_flag_value_and_position():
    with pytest.raises(ValueError) as e:
        cli.comma_items("1,2,,3", "--x", "integers")
    assert str(e.value) == "--x '1,2,,3': item 3 of 4 is empty; expected integers"
    assert cli.comma_items(" 1, 2 ", "--x", "integers") == ["1", "2"]


# ------------------------------------------------------------------------------ D1: ASCII digits only
@pytest.mark.parametrize(
    "setting",
    [
        "seed=٣",
        "seed=١e3",
        "seed=1\u00a0",
        "seed=\u20072",
        "optimizer.params.lr=٠.1",
        "split=١٠٠,0,0",
        "extra_save_iters=[١]",
        "keep_last=３",
        "hidden_dropout=０.1",
    ],
)
def test_config_numbers_in_other_digits_or_unicode_spaces_are_refused(cfg_dir, setting):
    """Before: ``seed=٣`` was seed 3, ``seed=١e3`` 1000, ``lr=٠.1`` 0.1."""
    key = setting.split("=")[0]
    lines = _lines([], [setting])
    assert len(lines) == 1 and key in lines[0], lines
    assert "ASCII" in lines[0] or "expected up to 3 non-negative numbers" in lines[0], lines


def test_config_numbers_in_other_digits_are_refused_from_yaml_and_json(cfg_dir):
    (cfg_dir / "y.yml").write_text("seed: '٣'\n")
    (cfg_dir / "j.json").write_text('{"seed": "٣"}')
    for f in ("y.yml", "j.json"):
        lines = _lines([f])
        assert len(lines) == 1 and "seed" in lines[0] and "ASCII" in lines[0], lines


@pytest.mark.parametrize("setting, key, value", [("seed=3", "seed", 3), ("seed=' 7 '", "seed", 7)])
def test_control_ascii_numbers_still_read(cfg_dir, setting, key, value):
    assert getattr(load_config([], [setting], require=False).train, key) == value


@pytest.mark.parametrize("argv", [["--seed", "٣"], ["--top-k", "１"], ["--temperature", "٠.5"]])
def test_generate_number_flags_take_ascii_digits_only(cfg_dir, capfd, argv):
    assert call(generate_cli.main, ["cfg.yml", "--prompt-ids", "1"] + argv) == 2
    line = one_error_line(capfd)
    assert argv[0] in line and "ASCII" in line, line


def test_prompt_ids_in_other_digits_are_refused():
    from megatron_topo.commands.generate_load import GenerateError

    with pytest.raises(GenerateError, match="--prompt-ids '١,2': expected comma-separated integers"):
        generate_cli.parse_ids("١,2", 100)
    assert generate_cli.parse_ids(" 1, 2 ", 100) == [1, 2]  # control
    with pytest.raises(GenerateError, match="item 2 of 3 is empty"):  # round 7's rule kept
        generate_cli.parse_ids("1,,2", 100)


def test_bounded_flags_take_ascii_digits_only(capfd):
    assert call(measure_collectives.main, ["cfg.yml", "--iters", "٣"]) == 2
    line = one_error_line(capfd)
    assert "--iters" in line and "ASCII" in line, line


# ------------------------------------------------------------------------------ D3: capped problem lines
def test_a_config_with_thousands_of_problems_prints_a_capped_list(cfg_dir, capfd):
    doc = {f"unknown_key_{i}": 1 for i in range(2000)}
    doc.update({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32})
    (cfg_dir / "x.json").write_text(json.dumps(doc))
    assert call(train_cli.main, ["x.json", "--dry-run"]) == 2
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 20 + 1  # error_lines.MAX_PROBLEM_LINES, len(lines)
    assert all(ln.startswith("error: ") for ln in lines)
    assert re.fullmatch(r"error: \.\.\. and 1,98\d more problems", lines[-1]), lines[-1]


def test_control_a_few_problems_are_all_printed(cfg_dir, capfd):
    (cfg_dir / "x.json").write_text(json.dumps({"unknown_a": 1, "unknown_b": 2}))
    assert call(train_cli.main, ["cfg.yml", "x.json", "--dry-run"]) == 2
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 2 and "unknown_a" in lines[0] and "unknown_b" in lines[1], lines


# ------------------------------------------------------------------------------ D6: HF config values
HF = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128, "model_type": "gpt_neox"}


@pytest.mark.parametrize(
    "key, value",
    [
        ("layer_norm_eps", 2.0000000000000001),
        ("rms_norm_eps", 1.5),
        ("num_hidden_layers", 1 << 20),
        ("rope_theta", 1e13),
    ],
)
def test_an_hf_value_outside_our_key_names_the_file_and_the_hf_field(key, value):
    """Before: ``layernorm_epsilon must lie in (0, 1], got 2`` (neither the file nor the HF key)."""
    with pytest.raises(ConfigError) as e:
        check_config({**HF, key: value}, "hf/config.json")
    assert str(e.value).startswith(f"hf/config.json: {key}: "), str(e.value)


def test_control_hf_values_inside_our_keys_pass():
    check_config({**HF, "layer_norm_eps": 1e-5, "rope_theta": 10000.0, "rms_norm_eps": 1.0}, "hf/config.json")


# ------------------------------------------------------------------------------ D1: launcher variables
@pytest.mark.parametrize("var", ["RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS", "SLURM_LOCALID"])
def test_launcher_variables_take_ascii_digits_only(var):
    """Before: ``RANK=٠`` was rank 0 (isdecimal takes other scripts' digits); the rule is the config's."""
    from megatron_topo.topology import launcher_env

    base = {"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0"} if not var.startswith("SLURM") else {}
    with pytest.raises(ConfigError, match=f"{var}=.* is not an integer"):
        launcher_env({**base, var: "١"})
    assert launcher_env({**base, var: "1"}) is not None  # control


@pytest.mark.parametrize("port", ["٢٩٥٠٠", "²"])
def test_master_port_takes_ascii_digits_only(cfg_dir, capfd, monkeypatch, port):
    """Before: ``٢٩٥٠٠`` was handed to torch as is; ``²`` (isdigit, but int() refuses) a traceback."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    for k, v in {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}.items():
        monkeypatch.setenv(k, v)
    assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1"]) == 2
    assert f"MASTER_PORT={port!r} is not a port number" in one_error_line(capfd)
