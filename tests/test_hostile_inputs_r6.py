"""Hostile inputs, probe 6 (issue 29), the members fixed in the session that ran it: a NUL
character or a path longer than PATH_MAX in any text key of a config (a ValueError / RecursionError
traceback from os.path before), and integers of more than 4,300 digits in meta.json or
metrics.jsonl (Python's int_max_str_digits ValueError from json before)."""

import json
import warnings

import pytest

from megatron_topo.commands import train as train_cli
from megatron_topo.metrics import read_metrics
from megatron_topo.zero_topo.checkpoint import CheckpointError, storage

from .cli_cases import BASE_CFG, call, one_error_line


@pytest.mark.parametrize(
    "text, want",
    [
        ('save: "runs/a\\0b"', "save='runs/a\\x00b' holds a NUL character"),
        ('tensorboard_dir: "tb\\0"', "tensorboard_dir='tb\\x00' holds a NUL character"),
        ('train_data_paths: ["data/toy", "x\\0y"]', "train_data_paths='x\\x00y' holds a NUL character"),
        ('save: "' + "d/" * 3000 + '"', "save='d/d/d/d/d/d/d/d/d/d/...' (6,000 characters) is 6,000 bytes"),
        ('load: "' + "x" * 5000 + '"', "is 5,000 bytes; a path or name is at most 4,095"),
    ],
)
def test_a_text_key_with_nul_or_beyond_path_max_is_one_line(tmp_path, monkeypatch, capfd, text, want):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yml").write_text(BASE_CFG)
    (tmp_path / "x.yml").write_text(text + "\n")
    assert call(train_cli.main, ["cfg.yml", "x.yml", "--set", "train_iters=1"]) == 2
    line = one_error_line(capfd)
    assert want in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yml", "x.yml"]  # nothing made


def test_a_meta_json_with_a_5000_digit_integer_is_unreadable_in_one_line(tmp_path):
    step = tmp_path / "global_step2"
    step.mkdir()
    (step / "meta.json").write_text('{"step": ' + "9" * 5000 + "}")
    with pytest.raises(CheckpointError, match=r"meta.json is unreadable: Exceeds the limit"):
        storage.read_meta(str(step))


def test_a_metrics_line_with_a_5000_digit_integer_is_skipped(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n" + '{"step": 2, "loss": ' + "9" * 5000 + "}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = read_metrics(str(p))
    assert [r["step"] for r in recs] == [1]
    assert [str(w.message) for w in caught] == [
        f"{p}:2: skipping a line that is not a record (Exceeds the limit (4300 digits) for integer string conversion)"
    ]
