"""Issue 29, probe 8's findings on outputs and their neighbours (C2, D2, D4, D5, D7, D8).

* C2/D2: an output whose folder passes the checks but cannot take files (/proc/self, /proc/1, /sys:
  root bypasses permission bits, these do not) was a traceback (torch.save, savefig, tokenizers) or a
  line naming an internal ``.tmp.PID`` temporary or no key. Now it is refused before any work in one
  line naming the flag or config key, the path and the reason; a write that still fails later names
  the target, not the temporary (megatron_topo/atomic.py).
* D4: plot_metrics --title/--labels with a control character: exit 0 and the raw ESC sequence
  printed to the terminal by matplotlib's warnings. Now one line.
* D5: an HF folder whose config.json (or weights) is a link to /dev/zero was "not a checkpoint
  directory"; now the file and what it is are named.
* D7: a metrics.jsonl line with a repeated key ({"step": 9, "step": 1}) was read as step 1 and hid
  the real records as superseded; now it is a bad line, skipped with the usual warning.
* D8: preprocess_data --output-prefix '' wrote ``_text_document.bin/.idx`` into the current folder.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest

from megatron_topo import atomic
from megatron_topo.commands import consolidate_checkpoint as CC
from megatron_topo.commands import convert_to_hf as CH
from megatron_topo.commands import plot_metrics as PM
from megatron_topo.commands import predict_perf as PP
from megatron_topo.commands import prepare_data as PD
from megatron_topo.commands import preprocess_data as PRE
from megatron_topo.commands import train as train_cli
from megatron_topo.commands import train_tokenizer as TT
from megatron_topo.metrics import read_metrics
from megatron_topo.safe_files import NotJSON, parse_json

from .cli_cases import build_hostile_world, call, one_error_line, scratch, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "configs", "tiny.yml")
SYSTEM = os.path.join(ROOT, "configs", "frontier.yml")
UNWRITABLE = ["/proc/self", "/sys", "/proc/1"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The hostile-input world plus mr/metrics.jsonl (4 records), text/in.jsonl and hf/ (an export)."""
    d = build_hostile_world(tmp_path_factory.mktemp("r8writes"))
    (d / "mr").mkdir()
    (d / "mr" / "metrics.jsonl").write_text("".join(f'{{"step": {i}, "loss": {4 - i / 10}}}\n' for i in range(1, 5)))
    (d / "text").mkdir()
    (d / "text" / "in.jsonl").write_text(
        "".join(json.dumps({"text": f"hello world number {i} and some more text " * 3}) + "\n" for i in range(40))
    )
    cwd = os.getcwd()
    os.chdir(d)
    try:
        assert CH.main(["--checkpoint", "ck", "--output", "hf"]) == 0
    finally:
        os.chdir(cwd)
    return d


@pytest.fixture
def w(world, tmp_path, monkeypatch):
    return scratch(world, tmp_path, monkeypatch)


def _refused(capfd, entry, argv, flag, path, w):
    before = snapshot(w, skip=("cache",))
    assert call(entry, argv) != 0
    line = one_error_line(capfd)
    assert line.startswith(f"error: {flag} {path}"), line
    assert "cannot create" in line and ".tmp" not in line, line
    assert snapshot(w, skip=("cache",)) == before
    return line


OUTPUT_FILES = {  # tool, argv before the output path, flag, output file name
    "consolidate-pt": (CC.main, ["--checkpoint", "ck", "--output"], "--output", "o.pt"),
    "consolidate-st": (CC.main, ["--checkpoint", "ck", "--output"], "--output", "o.safetensors"),
    "plot_metrics": (PM.main, ["mr", "--out"], "--out", "p.png"),
    "train_tokenizer": (
        TT.main,
        ["--input", "text/in.jsonl", "--model-type", "bpe", "--vocab-size", "300", "--output"],
        "--output",
        "t.json",
    ),
    "convert_to_hf": (CH.main, ["--checkpoint", "ck", "--output"], "--output", "hfo"),
    "predict_perf": (PP.main, ["--model", MODEL, "--system", SYSTEM, "--gcds", "8", "--plot"], "--plot", "p.png"),
}


@pytest.mark.parametrize("folder", UNWRITABLE)
@pytest.mark.parametrize("case", sorted(OUTPUT_FILES))
def test_an_output_file_in_a_folder_that_takes_no_files_is_one_line_naming_the_flag(case, folder, w, capfd):
    entry, argv, flag, name = OUTPUT_FILES[case]
    path = f"{folder}/{name}"
    extra = ["--force"] if case not in ("train_tokenizer", "predict_perf") and folder != "/proc/self" else []
    _refused(capfd, entry, argv + [path] + extra, flag, path, w)


def test_preprocess_output_prefix_in_a_folder_that_takes_no_files(w, capfd):
    argv = ["--input", "text/in.jsonl", "--output-prefix", "/proc/self/x", "--tokenizer-type", "CharLevelTokenizer"]
    _refused(capfd, PRE.main, argv, "--output-prefix", "/proc/self/x", w)


@pytest.mark.parametrize("key", ["data_cache_dir", "tensorboard_dir", "log_dir", "save"])
@pytest.mark.parametrize("folder", ["/proc/self", "/sys"])
def test_a_run_folder_that_cannot_be_created_names_its_key(key, folder, w, capfd):
    path = f"{folder}/c"
    before = snapshot(w, skip=("cache",))
    assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1", "--set", f"{key}={path}"]) != 0
    line = one_error_line(capfd)
    assert line.startswith(f"error: {key} {path}: cannot create a folder in {folder} ("), line
    assert snapshot(w, skip=("cache",)) == before


def test_prepare_data_cache_dir_that_cannot_be_created_names_its_key(w, capfd):
    assert call(PD.main, ["cfg.yml", "--world-size", "1", "--set", "data_cache_dir=/proc/1/c"]) != 0
    line = one_error_line(capfd)
    assert line.startswith("error: data_cache_dir /proc/1/c: cannot create a folder in /proc/1 ("), line


def test_a_write_that_fails_later_names_the_target_not_the_temporary(tmp_path):
    target = str(tmp_path / "out.bin")
    with pytest.raises(OSError) as e:
        with atomic.atomic_path(target):
            pass  # the writer made nothing (its folder emptied meanwhile): the fsync open fails
    assert e.value.filename == target
    with pytest.raises(OSError) as e:
        atomic.write_bytes("/proc/self/x.bin", b"1", makedirs=False)
    assert e.value.filename == "/proc/self/x.bin"
    assert not any(n.startswith("out.bin") for n in os.listdir(tmp_path))


def test_outputs_still_written_and_rewritten_over_their_own(w, capfd):
    assert CC.main(["--checkpoint", "ck", "--output", "o.pt"]) == 0
    assert CC.main(["--checkpoint", "ck", "--output", "o.pt", "--force"]) == 0
    assert PM.main(["mr", "--out", "p.png"]) == 0
    assert PM.main(["mr", "--out", "p.png"]) == 0  # its own earlier output: no --force needed
    argv = ["--input", "text/in.jsonl", "--output-prefix", "data/new", "--tokenizer-type", "CharLevelTokenizer"]
    assert PRE.main(argv) == 0 and PRE.main(argv + ["--force"]) == 0
    assert os.path.isfile("data/new_text_document.idx")
    assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1", "--set", "data_cache_dir=newcache/a"]) == 0
    assert os.path.isdir("newcache/a")
    assert not [n for n in os.listdir(".") if "write_probe" in n]
    assert not [n for n in os.listdir("newcache") if "write_probe" in n]


@pytest.mark.parametrize("text", ["a\x1b[2Jb", "x\x07", "tab\there", "c1\x9b2J"])
@pytest.mark.parametrize("flag", ["--title", "--labels"])
def test_plot_metrics_text_with_a_control_character_is_one_line(flag, text, w, capfd):
    assert call(PM.main, ["mr", "--out", "o.png", flag, text]) == 2
    line = one_error_line(capfd)
    assert line.startswith(f"error: {flag} ") and "control character" in line, line
    assert "\x1b" not in line and "\x07" not in line
    assert not os.path.exists("o.png")


def test_plot_metrics_title_with_a_line_break_still_drawn(w):
    assert PM.main(["mr", "--out", "o.png", "--title", "two\nlines", "--labels", "run one"]) == 0
    assert os.path.getsize("o.png") > 0


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_hf_folder_file_linked_to_a_device_is_named(name, w, capfd):
    os.remove(f"hf/{name}")
    os.symlink("/dev/zero", f"hf/{name}")
    assert call(train_cli.main, ["cfg.yml", "--set", "finetune_from=hf", "--set", "train_iters=1"]) != 0
    line = one_error_line(capfd)
    assert name in line and "/dev/zero" in line, line
    assert "no meta.json" not in line


def test_a_checkpoint_reader_given_an_hf_folder_says_so(w, capfd):
    assert call(CH.main, ["--checkpoint", "hf", "--output", "x"]) != 0
    line = one_error_line(capfd)
    assert "a HuggingFace model folder" in line, line


def test_a_metrics_line_with_a_repeated_key_is_a_bad_line(w, capfd):
    with open("mr/metrics.jsonl", "a") as f:
        f.write('{"step": 9, "step": 1, "loss": 1.0}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = read_metrics("mr", last_per_step=True)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert [r["loss"] for r in recs] == [3.9, 3.8, 3.7, 3.6]
    assert any("metrics.jsonl:5" in str(c.message) and "'step' appears twice" in str(c.message) for c in caught)
    assert PM.main(["mr", "--out", "o.png"]) == 0
    err = capfd.readouterr().err
    assert "appears twice" in err and "superseded" not in err


def test_parse_json_unique_keys():
    from megatron_topo.safe_files import RepeatedKey

    assert parse_json('{"a": 1, "a": 2}') == {"a": 2}  # the default is json.loads's
    with pytest.raises(NotJSON) as e:
        parse_json('{"a": {"b": 1, "b": 2}}', unique_keys=True)
    assert isinstance(e.value.cause, RepeatedKey) and "'b'" in str(e.value)
    assert parse_json('{"a": {"b": 1}, "b": 2}', unique_keys=True) == {"a": {"b": 1}, "b": 2}


@pytest.mark.parametrize("prefix", ["", " ", "data/", "data/ ", "/"])
def test_preprocess_output_prefix_without_a_file_name_is_one_line(prefix, w, capfd):
    before = snapshot(w, skip=("cache",))
    argv = ["--input", "text/in.jsonl", "--output-prefix", prefix, "--tokenizer-type", "CharLevelTokenizer"]
    assert call(PRE.main, argv) != 0
    line = one_error_line(capfd)
    assert line.startswith(f"error: --output-prefix {prefix!r}: "), line
    assert snapshot(w, skip=("cache",)) == before
