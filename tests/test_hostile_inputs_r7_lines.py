"""Hostile inputs, probe 7 (issue 29), the families fixed by the session that ran it:

* F5: a line separator (``\\n``, ``\\r``, ``\\x0b``, ``\\x85``, U+2028, U+2029) inside an echoed value
  split the error line in two (``error: ... c`` + ``error: k``) or cut it (the reason lost): the
  printers split every message with ``str.splitlines``; now one message is one line with the
  separator escaped, and only an error carrying several ``problems`` is several lines;
* F6: preprocess_data wrote its dataset (``--output-prefix``) or the datasets cache
  (``--hf-cache-dir``) into a HuggingFace export or a checkpoint's folder (exit 0);
* F8 and the sampling family: ``--top-p 1e-310`` (and other tiny or huge top-p / temperature values)
  crashed sampling with a NaN probability tensor;
* small ones: ``--prompt-ids 1,,2``, ``--latency a,b,c``, sizes that round to 0 bytes, trace-folder
  messages, the trace's temporary name, a key repeated in an HF config.json.
"""

import json
import os

import pytest

from megatron_topo import error_lines
from megatron_topo.cli import fail
from megatron_topo.commands import convert_to_hf as H
from megatron_topo.commands import generate as G
from megatron_topo.commands import inspect_data as ID
from megatron_topo.commands import plot_metrics as PM
from megatron_topo.commands import predict_perf as PP
from megatron_topo.commands import preprocess_data as PD
from megatron_topo.commands import train as train_cli
from megatron_topo.config import ConfigError, ConfigErrors
from megatron_topo.data.errors import DataError, error_line

from .cli_cases import build_hostile_world, call, one_error_line, scratch, snapshot

SEPS = {"nl": "\n", "cr": "\r", "vt": "\x0b", "nel": "\x85", "ls": "\u2028", "ps": "\u2029"}
ESC = {"nl": "\\x0a", "cr": "\\x0d", "vt": "\\x0b", "nel": "\\x85", "ls": "\\u2028", "ps": "\\u2029"}
TEXT = ["the quick brown fox", "jumps over the lazy dog", "hello world"] * 14
PRE = ["--tokenizer-type", "CharLevelTokenizer", "--quiet"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = build_hostile_world(tmp_path_factory.mktemp("r7lines"))
    cwd = os.getcwd()
    os.chdir(d)
    try:
        assert H.main(["--checkpoint", "ck", "--output", "hf"]) == 0
        (d / "text").mkdir()
        (d / "text" / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXT))
        (d / "mr").mkdir()
        (d / "mr" / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s, "loss": 4.0 - s / 10}) + "\n" for s in range(1, 5))
        )
        (d / "m.yml").write_text(
            "".join(ln + "\n" for ln in (d / "cfg.yml").read_text().splitlines() if not ln.startswith("distributed:"))
        )
    finally:
        os.chdir(cwd)
    return d


# ------------------------------------------------------------------ F5: one message is one line
FRONTIER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "frontier.yml")

# (entry point, argv with {v} for the value, the value around the separator, the reason the line must keep)
ECHO = {
    "train-load": (train_cli.main, ["cfg.yml", "--set", "load={v}", "--set", "train_iters=1"], "c|k", "does not exist"),
    "train-data-path": (
        train_cli.main,
        ["cfg.yml", "--set", "data_path={v}", "--set", "train_iters=1"],
        "data/t|oy",
        ".idx: file not found",
    ),
    "train-config-name": (train_cli.main, ["{v}"], "cf|g.yml", "config file not found"),
    "inspect-prefix": (ID.main, ["{v}"], "data/t|oy", ".idx: file not found"),
    "generate-checkpoint": (
        G.main,
        ["--checkpoint", "{v}", "--prompt-ids", "1", "--max-new-tokens", "1"],
        "c|k",
        "does not exist",
    ),
    "convert-checkpoint": (H.main, ["--checkpoint", "{v}", "--output", "hf2"], "c|k", "does not exist"),
    "preprocess-input": (
        PD.main,
        ["--input", "{v}", "--output-prefix", "out/x"] + PRE,
        "te|xt.jsonl",
        "no such file or directory",
    ),
    "plot-run": (PM.main, ["{v}", "--out", "p.png"], "m|r", "no such run directory"),
    "perf-model": (PP.main, ["--model", "{v}", "--system", FRONTIER, "--gcds", "8"], "m|.yml", "not found"),
    "perf-system": (PP.main, ["--model", "m.yml", "--system", "{v}", "--gcds", "8"], "s|.yml", "not found"),
}


@pytest.mark.parametrize("sep", list(SEPS))
@pytest.mark.parametrize("case", list(ECHO))
def test_a_line_separator_in_an_echoed_value_is_escaped_in_one_line(case, sep, world, tmp_path, monkeypatch, capfd):
    entry, argv, value, reason = ECHO[case]
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    raw = value.replace("|", SEPS[sep])
    rc = call(entry, [a.replace("{v}", raw) for a in argv])
    assert rc not in (0, None), rc
    line = one_error_line(capfd)  # one line: the separator neither splits it nor cuts it
    assert value.replace("|", ESC[sep]) in line, line
    assert reason in line, line
    assert snapshot(d) == before


def test_a_line_separator_in_a_yaml_value_is_escaped_in_one_line(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    (d / "c2.yml").write_text(
        "".join(ln + "\n" for ln in (d / "cfg.yml").read_text().splitlines() if "data_path" not in ln)
    )
    (d / "y.yml").write_text('train_data_paths: ["data/toy\\n", "data/o\\u2028ther"]\n')
    assert call(train_cli.main, ["c2.yml", "y.yml", "--set", "train_iters=1"]) == 2
    line = one_error_line(capfd)
    assert "data/toy\\x0a.idx: file not found" in line, line


@pytest.mark.parametrize("sep", list(SEPS))
def test_emit_and_fail_never_split_a_message(sep, capfd):
    msg = f"checkpoint path does not exist: c{SEPS[sep]}k"
    assert fail(ConfigError(msg)) == 2
    assert fail(OSError(2, "No such file or directory", f"a{SEPS[sep]}b")) == 2
    error_lines.emit("warning", msg)
    err = capfd.readouterr().err
    assert err == (
        f"error: checkpoint path does not exist: c{ESC[sep]}k\n"
        f"error: a{ESC[sep]}b: No such file or directory\n"
        f"warning: checkpoint path does not exist: c{ESC[sep]}k\n"
    )


def test_only_a_problems_list_is_several_lines(capfd):
    e = ConfigErrors(["a.yml: key x\u2028y unknown", "b.yml: key z unknown"])
    assert fail(e) == 2
    train_cli.print_errors(e)
    one = "error: a.yml: key x\\u2028y unknown\nerror: b.yml: key z unknown\n"
    assert capfd.readouterr().err == one + one
    long = ConfigError("v=" + "a\n" * 2000)  # escaped and capped like any other line
    fail(long)
    (line,) = capfd.readouterr().err.splitlines()
    assert len(line) <= error_lines.LINE_CAP and "cut:" in line and "\\x0a" in line


def test_first_line_keeps_our_messages_whole_and_summarises_a_library_s():
    assert error_line(DataError("data/t\u2028oy.idx: file not found")) == "data/t\u2028oy.idx: file not found"
    assert error_lines.first_line(DataError("x\ny: reason")) == "x\ny: reason"
    assert error_lines.first_line(ConfigErrors(["one", "two"])) == "one"
    assert error_lines.first_line(ValueError("summary\nparagraph two")) == "summary"
    assert error_lines.first_line(ValueError("a\u2028b\rc")) == "a\u2028b\rc"  # never cut at another separator
    assert error_lines.first_line(ValueError("")) == "ValueError"


# ------------------------------------------------------------------ F6: preprocess outputs
@pytest.mark.parametrize(
    "prefix, words",
    [
        ("hf/x", ["a HuggingFace model folder"]),
        ("hf/sub/x", ["a HuggingFace model folder"]),
        ("ck/x", ["a checkpoint save folder"]),
    ],
)
def test_preprocess_output_prefix_inside_another_artifact_is_refused(
    prefix, words, world, tmp_path, monkeypatch, capfd
):
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    rc = call(PD.main, ["--input", "text/in.jsonl", "--output-prefix", prefix] + PRE)
    assert rc == 1
    line = one_error_line(capfd)
    assert f"--output-prefix {prefix}_text_document.bin lies inside" in line, line
    for w in words:
        assert w in line, line
    assert snapshot(d) == before
    assert not (d / "hf" / "sub").exists()


@pytest.mark.parametrize(
    "tool, argv",
    [
        ("consolidate_checkpoint", ["--checkpoint", "ck", "--output", "hf/o.pt"]),
        ("consolidate_checkpoint", ["--checkpoint", "ck", "--output", "hf/o.safetensors"]),
        ("consolidate_checkpoint", ["--checkpoint", "ck", "--output", "ck/o.pt"]),
        ("predict_perf", ["--model", "m.yml", "--gcds", "8", "--plot", "hf/p.png"]),
        ("predict_perf", ["--model", "m.yml", "--gcds", "8", "--plot", "ck/p.png"]),
    ],
)
def test_consolidate_and_predict_perf_outputs_inside_another_artifact_are_refused(
    tool, argv, world, tmp_path, monkeypatch, capfd
):
    """Probe 7's recheck: consolidate --output and predict_perf --plot were checked only against a
    checkpoint step, so both wrote into an HF export (exit 0)."""
    import importlib

    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    rc = call(importlib.import_module(f"megatron_topo.commands.{tool}").main, argv)
    assert rc == 2
    line = one_error_line(capfd)
    assert f"{argv[-1]} lies inside" in line and ("HuggingFace model folder" in line or "checkpoint" in line), line
    assert snapshot(d) == before


@pytest.mark.parametrize(
    "cache, words",
    [
        ("ck/global_step2/c", ["lies inside", "a checkpoint step folder"]),
        ("ck", ["is ", "a checkpoint save folder"]),
        ("hf/c", ["lies inside", "a HuggingFace model folder"]),
    ],
)
def test_preprocess_hf_cache_dir_inside_another_artifact_is_refused(cache, words, world, tmp_path, monkeypatch, capfd):
    pytest.importorskip("datasets")
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    argv = ["--output-prefix", "out/x"] + PRE + ["--hf-dataset", "text", "--hf-data-files", "text/in.jsonl"]
    rc = call(PD.main, argv + ["--hf-cache-dir", cache])
    assert rc == 1
    line = one_error_line(capfd)
    assert line.startswith(f"error: --hf-cache-dir {cache} "), line
    for w in words:
        assert w in line, line
    assert snapshot(d) == before
    assert not (d / "out").exists()


@pytest.mark.parametrize("prefix", ["out/x", "mr/x"])
def test_preprocess_into_a_plain_folder_still_writes(prefix, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    assert call(PD.main, ["--input", "text/in.jsonl", "--output-prefix", prefix] + PRE) == 0
    assert (d / f"{prefix}_text_document.idx").is_file()


def test_preprocess_hf_cache_dir_of_its_own_still_works(world, tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    d = scratch(world, tmp_path, monkeypatch)
    argv = ["--output-prefix", "out/x"] + PRE + ["--hf-dataset", "text", "--hf-data-files", "text/in.jsonl"]
    assert call(PD.main, argv + ["--hf-cache-dir", "hfc"]) == 0
    assert (d / "out" / "x_text_document.idx").is_file() and (d / "hfc").is_dir()


# ------------------------------------------------------------------ F8: sampling with tiny / huge values
TINY_P = [5e-324, 1e-310, 1e-300, 1e-46, 1e-45, 1e-39, 1e-30, 1e-9]
TEMPS = [5e-324, 1e-310, 1e-7, 1e-6, 0.5, 1.0, 1e30, 3.5e38, 1e300, 1.7976931348623157e308]


def _logit_family():
    import torch

    g = torch.Generator().manual_seed(0)
    yield torch.randn(64, generator=g)
    yield torch.randn(64, generator=g) * 1e30  # spans past what a division by a small temperature keeps finite
    yield torch.tensor([3e38, -3e38, 0.0, 1e38])  # float32's extremes
    yield torch.zeros(64)  # all tied
    yield torch.tensor([1.0, 1.0, 0.5, -1.0])  # a tie at the top


@pytest.mark.parametrize("top_p", TINY_P)
def test_a_tiny_top_p_keeps_exactly_the_most_likely_token(top_p):
    import torch

    from megatron_topo.model.sampling import filter_logits, next_token

    for logits in _logit_family():
        kept = torch.isfinite(filter_logits(logits, top_p=top_p))
        first = int(torch.sort(torch.softmax(logits, -1), descending=True, stable=True).indices[0])
        assert kept.tolist() == [i == first for i in range(logits.numel())], (top_p, logits)
        g = torch.Generator().manual_seed(1)
        assert {next_token(logits, False, 1.0, 0, top_p, g) for _ in range(20)} == {first}


@pytest.mark.parametrize("temperature", TEMPS)
@pytest.mark.parametrize("top_k, top_p", [(0, 0.0), (1, 0.0), (3, 0.5), (0, 1e-310), (10**9, 0.999999)])
def test_sampling_never_sees_nan_at_extreme_temperatures(temperature, top_k, top_p):
    """Every draw is a token in range (torch.multinomial raises on a NaN or all-zero probability
    vector); top_k 1 or a tiny top_p draws a most likely token of the scaled logits."""
    import torch

    from megatron_topo.model.sampling import next_token

    g = torch.Generator().manual_seed(2)
    for logits in _logit_family():
        draws = {next_token(logits, False, temperature, top_k, top_p, g) for _ in range(8)}
        assert all(0 <= t < logits.numel() for t in draws), (temperature, logits)
        if top_k == 1 or top_p == 1e-310:
            best = float(logits.max())
            assert all(float(logits[t]) == best for t in draws) or temperature > 1e29, (draws, logits)


@pytest.mark.parametrize("temperature", TEMPS)
def test_scale_logits_is_never_nan(temperature):
    import torch

    from megatron_topo.model.sampling import filter_logits, scale_logits

    for logits in _logit_family():
        scaled = scale_logits(logits, temperature)
        assert not torch.isnan(scaled).any() and float(scaled.max()) == 0.0
        for top_k, top_p in [(0, 0.0), (3, 0.5), (0, 1e-310)]:
            probs = torch.softmax(filter_logits(scaled, top_k, top_p), -1)
            assert not torch.isnan(probs).any() and float(probs.sum()) == pytest.approx(1.0, abs=1e-5)
            # a most likely token (after scaling: a huge temperature ties them all) can always be drawn
            full = torch.softmax(scaled, -1)
            assert bool(((full == full.max()) & (probs > 0)).any())


def test_scale_logits_is_the_old_division_for_ordinary_values():
    import torch

    from megatron_topo.model.sampling import scale_logits

    x = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    for t in (0.3, 0.8, 1.0, 2.0):
        assert torch.allclose(torch.softmax(scale_logits(x, t), -1), torch.softmax(x / t, -1), atol=1e-7)


def _ids(capsys, argv):
    rc = call(G.main, argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    (line,) = [ln for ln in out.out.splitlines() if ln.startswith("ids:")]
    return [int(t) for t in line.split()[1:]]


@pytest.mark.parametrize("flags", [["--top-p", "1e-310"], ["--top-p", "5e-324"], ["--top-p", "1e-45"]])
def test_generate_with_a_subnormal_top_p_is_greedy(flags, world, tmp_path, monkeypatch, capsys):
    scratch(world, tmp_path, monkeypatch)
    base = ["--checkpoint", "ck", "--prompt-ids", "1,2", "--max-new-tokens", "6"]
    greedy = _ids(capsys, base + ["--greedy"])
    assert _ids(capsys, base + flags + ["--seed", "5"]) == greedy
    assert len(greedy) == 6 and all(0 <= t < 64 for t in greedy)


@pytest.mark.parametrize("temperature", ["5e-324", "1e-300", "1e300", "1.7976931348623157e308"])
def test_generate_at_an_extreme_temperature_gives_tokens_in_range(temperature, world, tmp_path, monkeypatch, capsys):
    scratch(world, tmp_path, monkeypatch)
    ids = _ids(
        capsys, ["--checkpoint", "ck", "--prompt-ids", "1,2", "--max-new-tokens", "6", "--temperature", temperature]
    )
    assert len(ids) == 6 and all(0 <= t < 64 for t in ids)


# ------------------------------------------------------------------ small ones (probe 7's debatable list)
@pytest.mark.parametrize("ids, item", [("1,,2", "item 2 of 3"), ("1,2,", "item 3 of 3"), (",1", "item 1 of 2")])
def test_generate_prompt_ids_with_an_empty_item_is_refused(ids, item, world, tmp_path, monkeypatch, capfd):
    scratch(world, tmp_path, monkeypatch)
    assert call(G.main, ["--checkpoint", "ck", "--prompt-ids", ids, "--max-new-tokens", "1"]) == 2
    line = one_error_line(capfd)
    assert f"--prompt-ids '{ids}': {item} is empty" in line, line


def test_generate_prompt_ids_with_spaces_still_read(world, tmp_path, monkeypatch, capsys):
    scratch(world, tmp_path, monkeypatch)
    base = ["--checkpoint", "ck", "--max-new-tokens", "3", "--greedy"]
    assert _ids(capsys, base + ["--prompt-ids", " 1, 2"]) == _ids(capsys, base + ["--prompt-ids", "1,2"])


def test_emulate_cluster_latency_takes_at_most_two_values(capfd):
    from megatron_topo.analysis.emulation import RateError
    from megatron_topo.analysis.emulation.rates import parse_latency_pair
    from megatron_topo.commands import emulate_cluster as EC

    a = EC.build_parser().parse_args(["--latency", "1us,2us,3us", "--", "true"])
    with pytest.raises(RateError, match=r"latency '1us,2us,3us' gives 3 values; give INTER\[,INTRA\]"):
        EC.spec_from_args(a)
    a = EC.build_parser().parse_args(["--latency", "50us,1ms", "--", "true"])
    spec = EC.spec_from_args(a)
    assert (spec.latency_inter_us, spec.latency_intra_us) == (50.0, 1000.0)
    assert parse_latency_pair("2ms") == (2000.0, 0.0)
    assert call(EC.main, ["--latency", "1us,2us,3us", "--", "true"]) == 2
    assert "gives 3 values" in one_error_line(capfd)


@pytest.mark.parametrize("text, unit", [("5e-324", "MiB"), ("1e-7", "MB"), ("1e-300", "GiB"), ("0.5", "B")])
def test_a_positive_size_below_one_byte_is_refused(text, unit):
    import argparse

    from megatron_topo.cli import bounded

    parse = bounded(float, 0.0, 1e6, lo_open=True, unit=unit)
    with pytest.raises(argparse.ArgumentTypeError, match=f"{text} {unit} is less than one byte"):
        parse(text)
    assert parse("1") == 1.0  # one unit is at least a byte
    assert bounded(float, 0.0, 1e6, lo_open=True, unit="MB")("1e-6") == 1e-6  # exactly one byte
    assert bounded(float, 0.0, 1e6, unit=unit)(text) == float(text)  # 0 allowed: so is what rounds to it


def test_bench_kernels_sizes_below_one_byte_is_one_line(capfd):
    from megatron_topo.commands import bench_kernels as BK

    assert call(BK.main, ["--sizes-mib", "1", "5e-324"]) == 2
    assert "argument --sizes-mib: 5e-324 MiB is less than one byte" in one_error_line(capfd)


TRACE = ["cfg.yml", "--set", "train_iters=1", "--set"]


@pytest.mark.parametrize(
    "make, path, words",
    [
        (lambda d: os.symlink("nowhere", d / "tr"), "tr", ["symbolic link (to 'nowhere') that leads nowhere"]),
        (lambda d: os.symlink("tr", d / "tr"), "tr", ["symbolic link (to 'tr') that leads nowhere", "loop"]),
        (lambda d: None, "tr/../cfg.yml", ["leads to", "cfg.yml, which exists and is not a directory"]),
    ],
)
def test_a_trace_folder_that_cannot_be_one_names_the_key_and_why(
    make, path, words, world, tmp_path, monkeypatch, capfd
):
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    make(d)
    names = sorted(os.listdir(d))
    link = os.readlink(d / "tr") if os.path.islink(d / "tr") else None
    assert call(train_cli.main, TRACE + [f"distributed.trace_collectives={path}"]) == 2
    line = one_error_line(capfd)
    assert line.startswith(f"error: distributed.trace_collectives {path} "), line
    for w in words:
        assert w in line, line
    assert sorted(os.listdir(d)) == names  # no tr/ made for tr/../cfg.yml
    if link is not None:
        assert os.readlink(d / "tr") == link
        os.unlink(d / "tr")
    assert snapshot(d) == before


@pytest.mark.parametrize("path", ["/proc/self/fd", "/sys/kernel"])
def test_a_trace_folder_where_no_file_can_be_made_names_the_key(path, world, tmp_path, monkeypatch, capfd):
    if not os.path.isdir(path):
        pytest.skip(f"no {path} here")
    try:
        fd = os.open(os.path.join(path, "probe.new"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        pass
    else:
        os.close(fd)
        os.unlink(os.path.join(path, "probe.new"))
        pytest.skip(f"{path} takes new files on this machine")
    scratch(world, tmp_path, monkeypatch)
    assert call(train_cli.main, TRACE + [f"distributed.trace_collectives={path}"]) == 2
    line = one_error_line(capfd)
    assert line.startswith(f"error: distributed.trace_collectives {path}: cannot create rank_0.jsonl there ("), line
    assert ".new" not in line, line


def test_the_trace_temporary_never_touches_a_user_file(world, tmp_path, monkeypatch, capfd):
    """The temporary was rank_0.jsonl.PID.new, unlinked before use: a user's file of that name was
    deleted without a word. Now a random name, made with O_EXCL; a name taken is left alone."""
    import secrets

    d = scratch(world, tmp_path, monkeypatch)
    (d / "tr").mkdir()
    mine = d / "tr" / f"rank_0.jsonl.{os.getpid()}.new"
    mine.write_text("my notes\n")
    drawn = iter(["aaaa", "aaaa", "bbbb"])
    monkeypatch.setattr(secrets, "token_hex", lambda n=None: next(drawn))
    taken = d / "tr" / f"rank_0.jsonl.{os.getpid()}.aaaa.new"
    taken.write_text("also mine\n")
    assert call(train_cli.main, TRACE + ["distributed.trace_collectives=tr"]) == 0
    assert mine.read_text() == "my notes\n" and taken.read_text() == "also mine\n"
    assert sorted(p.name for p in (d / "tr").iterdir()) == sorted(["rank_0.jsonl", mine.name, taken.name])
    assert (d / "tr" / "rank_0.jsonl").is_file() and not (d / "tr" / "rank_0.jsonl").is_symlink()


def test_an_hf_config_with_a_repeated_key_names_it(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    cfg = d / "hf" / "config.json"
    text = cfg.read_text()
    assert text.count('"hidden_size": 32') == 1
    cfg.write_text(text.replace('"hidden_size": 32', '"hidden_size": 32, "hidden_size": 64'))
    before = snapshot(d)
    assert call(train_cli.main, ["cfg.yml", "--set", "finetune_from=hf", "--set", "train_iters=1"]) == 2
    line = one_error_line(capfd)
    assert "hf/config.json: key 'hidden_size' is given twice (int 32, then int 64); state each key once" in line
    assert "intermediate_size" not in line
    assert snapshot(d) == before
