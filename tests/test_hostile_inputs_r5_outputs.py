"""Issue 29, probe 5, outputs: a tool replaces only its own kind of output and writes nothing into
another artifact's folder; what it reports is what it built; a prompt the tokenizer cannot encode
and a plot of one run twice are one ``error:`` line; sampling settings without effect get a note.

* D1: ``convert_to_hf --force`` replaces only an earlier export of its own (config.json + weights
  whose safetensors metadata says ``source: megatron_topo``, or a folder carrying the conversion's
  marker): a user's tokenizer folder, a lone config.json or merges.txt, a Hub download are kept.
* D2: ``train_tokenizer --force`` replaces only a tokenizer of its kind (a tokenizers JSON with a
  ``model`` object; a sentencepiece model), and never writes into a checkpoint or an HF export.
* D3: ``distributed.trace_collectives`` is refused in a save folder, an HF export or another run's
  log folder, as log_dir and tensorboard_dir are.
* F2: train_tokenizer prints the vocabulary it built, with a warning when it is below the request.
* T5: generate with a prompt the tokenizer cannot encode (config and flag interfaces).
* generate's sample_output_file inside an HF export; plot_metrics of one run twice; --greedy with
  --temperature/--top-k/--top-p and temperature 0 with top_k (config mode): one note line.

Every refusal is one ``error:`` line, a non-zero exit, no traceback, and the files already there
are unchanged."""

import io
import json
import os
import shutil

import pytest

from megatron_topo.commands import convert_to_hf as H
from megatron_topo.commands import generate as G
from megatron_topo.commands import plot_metrics as PM
from megatron_topo.commands import train as train_cli
from megatron_topo.commands import train_tokenizer as TT

from .cli_cases import build_hostile_world, call, one_error_line, scratch, snapshot

TEXT = [f"document {i}: the quick brown fox jumps over the lazy dog {i % 7}" for i in range(40)]
TTA = ["--input", "text/in.jsonl", "--model-type", "bpe", "--vocab-size", "300", "--output"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = build_hostile_world(tmp_path_factory.mktemp("r5outputs"))
    cwd = os.getcwd()
    os.chdir(d)
    try:
        assert H.main(["--checkpoint", "ck", "--output", "hf"]) == 0
        (d / "text").mkdir()
        (d / "text" / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXT))
        (d / "tok").mkdir()
        assert TT.main(TTA + ["tok/tokenizer.json"]) == 0
        (d / "mr").mkdir()
        (d / "mr" / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s, "loss": 4.0 - s / 10}) + "\n" for s in range(1, 6))
        )
    finally:
        os.chdir(cwd)
    return d


def _refused(capfd, rc, before, root, *words):
    assert rc not in (0, None), rc
    line = one_error_line(capfd)
    for w in words:
        assert w in line, line
    assert snapshot(root) == before
    return line


# ------------------------------------------------------------------------- D1 convert_to_hf --force
def _hub_folder(p):
    """config.json + model.safetensors with no source metadata (as a Hub download holds)."""
    import torch
    from safetensors.torch import save_file

    p.mkdir()
    (p / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    save_file({"w": torch.zeros(2)}, str(p / "model.safetensors"))


@pytest.mark.parametrize(
    "case, words",
    [
        ("tok", ["no export", "not replaced"]),  # the probe's case: tok/ holds only tokenizer.json
        ("config-only", ["no export"]),
        ("merges-only", ["no export"]),
        ("tokenizer-set", ["no export"]),  # tokenizer.json + tokenizer_config.json + vocab.json + merges.txt
        ("hub", ["did not write", "Hub"]),
        ("export-with-linked-weights", ["not a regular file"]),
    ],
)
def test_convert_force_replaces_only_its_own_exports(case, words, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    out = d / "out"
    if case == "tok":
        out = d / "tok"
    elif case == "config-only":
        out.mkdir()
        (out / "config.json").write_text('{"mine": true}\n')
    elif case == "merges-only":
        out.mkdir()
        (out / "merges.txt").write_text("#version: 0.2\na b\n")
    elif case == "tokenizer-set":
        shutil.copytree(d / "hf", out)
        for n in ("config.json", "model.safetensors", "generation_config.json"):
            (out / n).unlink(missing_ok=True)
        (out / "tokenizer.json").write_text((d / "tok" / "tokenizer.json").read_text())
    elif case == "hub":
        _hub_folder(out)
    else:
        shutil.copytree(d / "hf", out)
        os.replace(out / "model.safetensors", d / "elsewhere.safetensors")
        os.symlink(d / "elsewhere.safetensors", out / "model.safetensors")
    before = snapshot(d)
    capfd.readouterr()
    rc = call(H.main, ["--checkpoint", "ck", "--output", os.path.basename(out), "--force"])
    line = _refused(capfd, rc, before, d, *words)
    assert "even with --force" in line


@pytest.mark.parametrize("case", ["earlier-export", "marked-by-a-stopped-replace"])
def test_convert_force_still_replaces_its_own_export(case, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    out = d / "hf2"
    shutil.copytree(d / "hf", out)
    if case == "marked-by-a-stopped-replace":  # replace_dir marks the old export before the exchange
        (out / "model.safetensors").unlink()
        H.write_marker(str(out))
    (out / "config.json").write_text('{"old": true}\n')
    assert call(H.main, ["--checkpoint", "ck", "--output", "hf2", "--force"]) == 0
    assert json.loads((out / "config.json").read_text()) == json.loads((d / "hf" / "config.json").read_text())
    assert (out / "model.safetensors").read_bytes() == (d / "hf" / "model.safetensors").read_bytes()
    assert "error" not in capfd.readouterr().err


def test_convert_export_weights_carry_the_source_the_force_check_reads(world):
    from megatron_topo.safe_outputs import safetensors_source

    assert safetensors_source(str(world / "hf" / "model.safetensors")) == "megatron_topo"
    assert safetensors_source(str(world / "hf" / "config.json")) is None
    assert H.not_an_export(str(world / "hf")) is None
    assert "no export" in H.not_an_export(str(world / "tok"))


# --------------------------------------------------------------------- D2 train_tokenizer --output
@pytest.mark.parametrize(
    "output, content, extra, words",
    [
        ("cfg.json", '{"user": 1}\n', [], ["not a tokenizers JSON"]),  # the probe's case
        ("cfg2.json", '{"model": "mine"}\n', [], ["not a tokenizers JSON"]),
        ("list.json", "[1, 2, 3]\n", [], ["not a tokenizers JSON"]),
        ("hf/config.json", None, [], ["HuggingFace model folder"]),  # the probe's case
        ("hf/tokenizer.json", None, [], ["HuggingFace model folder"]),
        ("hf/new_tokenizer.json", None, [], ["HuggingFace model folder"]),
        ("ck/tokenizer.json", None, [], ["checkpoint save folder"]),
        ("notes.model", "my notes\n", ["spm"], ["not a sentencepiece model"]),
        ("tok/tokenizer.json", None, ["spm"], ["not a sentencepiece model"]),  # a bpe JSON is no spm model
    ],
)
def test_train_tokenizer_force_replaces_only_a_tokenizer(
    output, content, extra, words, world, tmp_path, monkeypatch, capfd
):
    d = scratch(world, tmp_path, monkeypatch)
    if content is not None:
        (d / output).write_text(content)
    argv = TTA + [output, "--force"]
    if extra == ["spm"]:
        argv = [
            "--input",
            "text/in.jsonl",
            "--model-type",
            "sentencepiece",
            "--vocab-size",
            "300",
            "--output",
            output,
            "--force",
        ]
    before = snapshot(d)
    capfd.readouterr()
    rc = call(TT.main, argv)
    _refused(capfd, rc, before, d, *words)


def test_train_tokenizer_force_replaces_its_earlier_tokenizer(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    assert call(TT.main, TTA + ["tok/tokenizer.json", "--vocab-size", "270", "--force"]) == 0
    assert json.loads((d / "tok" / "tokenizer.json").read_text())["model"]["type"] == "BPE"


# ------------------------------------------------------------------ F2 the vocabulary it built
@pytest.mark.parametrize("extra", [["--min-frequency", "4611686018427387904"], ["--vocab-size", "5000"]])
def test_train_tokenizer_reports_the_vocabulary_it_built(extra, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    capfd.readouterr()
    assert call(TT.main, TTA + ["t2.json"] + extra) == 0
    built = json.loads((d / "t2.json").read_text())
    n = len(built["model"]["vocab"]) + len(
        [t for t in built["added_tokens"] if t["content"] not in built["model"]["vocab"]]
    )
    asked = 5000 if "5000" in extra else 300
    assert n < asked
    out, err = capfd.readouterr()
    assert f"vocab {n:,} of {asked:,} asked" in out, out
    warns = [x for x in err.splitlines() if x.strip()]
    assert len(warns) == 1 and warns[0].startswith("warning: ") and f"{n:,} ids" in warns[0], err


def test_train_tokenizer_reaching_the_request_says_nothing_more(world, tmp_path, monkeypatch, capfd):
    scratch(world, tmp_path, monkeypatch)
    capfd.readouterr()
    assert call(TT.main, TTA[:-2] + ["270", "--output", "t3.json"]) == 0
    out, err = capfd.readouterr()
    assert "(bpe, vocab 270, 40 documents)" in out and not err.strip(), (out, err)


# ----------------------------------------------------------------------- D3 trace_collectives
def _train(*sets):
    return call(train_cli.main, ["cfg.yml", "--set", "train_iters=1"] + [a for s in sets for a in ("--set", s)])


@pytest.mark.parametrize(
    "trace, words",
    [
        ("ck", ["checkpoint save folder"]),  # the probe's cases
        ("hf", ["HuggingFace model folder"]),
        ("mr", ["another run's log folder"]),
        ("ck/global_step2", ["checkpoint step folder"]),
        ("hf/trace", ["HuggingFace model folder"]),
        ("mr/trace", ["another run's log folder"]),
    ],
)
def test_trace_collectives_into_another_artifact_is_refused(trace, words, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    capfd.readouterr()
    rc = _train(f"distributed.trace_collectives={trace}")
    _refused(capfd, rc, before, d, "distributed.trace_collectives", *words)


def test_trace_collectives_in_the_runs_own_folders_still_traces(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    assert _train("distributed.trace_collectives=log") == 0  # the run's own log_dir
    assert (d / "log" / "rank_0.jsonl").is_file()  # (one rank: no collective, an empty trace)
    assert _train("save=ck2", "distributed.trace_collectives=ck2/trace") == 0  # inside its own save folder
    assert (d / "ck2" / "trace" / "rank_0.jsonl").is_file()
    assert "error" not in capfd.readouterr().err


# ----------------------------------------------------------------- T5 and generate's outputs
def _gencfg(d, **kw):
    base = {
        "load": "ck",
        "text_gen_type": "input-file",
        "sample_input_file": "p.txt",
        "maximum_tokens": 2,
        "sample_output_file": "s.txt",
        "tokenizer_type": "CharLevelTokenizer",
    }
    base.update(kw)
    if base["text_gen_type"] == "interactive":  # keys interactive mode does not read (they get a note)
        base.pop("sample_input_file"), base.pop("sample_output_file")
    (d / "gen.yml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in base.items()))


@pytest.mark.parametrize("mode", ["input-file", "input-file-second-prompt", "interactive"])
def test_generate_prompt_outside_the_tokenizer_is_one_line(mode, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    (d / "p.txt").write_text("12\nzzz\n" if mode == "input-file-second-prompt" else "zzz\n")
    _gencfg(d, text_gen_type="interactive" if mode == "interactive" else "input-file")
    if mode == "interactive":
        monkeypatch.setattr("sys.stdin", io.StringIO("zzz\n"))
    before = snapshot(d)
    capfd.readouterr()
    rc = call(G.main, ["cfg.yml", "gen.yml"])
    line = _refused(capfd, rc, before, d, "zzz", "outside its 64 ids")
    assert "Traceback" not in line


def test_generate_interactive_goes_on_after_a_prompt_it_cannot_encode(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    _gencfg(d, text_gen_type="interactive")
    monkeypatch.setattr("sys.stdin", io.StringIO("zzz\n12\n"))
    capfd.readouterr()
    assert call(G.main, ["cfg.yml", "gen.yml"]) == 1
    out, err = capfd.readouterr()
    assert out.count("Generated Text: ") == 1, out
    assert [x for x in err.splitlines() if x.strip()] == [x for x in err.splitlines() if x.startswith("error: ")]
    assert err.count("error: ") == 1 and "zzz" in err


def test_generate_flag_prompt_outside_the_tokenizer_is_one_line(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    assert _train("save=ckc", "tokenizer_type=CharLevelTokenizer") == 0  # its tokenizer: CharLevel, 64 ids
    before = snapshot(d)
    capfd.readouterr()
    rc = call(G.main, ["--checkpoint", "ckc", "--prompt", "zzz", "--max-new-tokens", "2", "--greedy"])
    _refused(capfd, rc, before, d, "--prompt", "outside its 64 ids")


@pytest.mark.parametrize("where", ["hf/samples.txt", "ck/samples.txt"])
def test_generate_sample_file_inside_another_artifact_is_refused(where, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    (d / "p.txt").write_text("12\n")
    _gencfg(d, sample_output_file=where)
    before = snapshot(d)
    capfd.readouterr()
    rc = call(G.main, ["cfg.yml", "gen.yml"])
    _refused(capfd, rc, before, d, "sample_output_file", "lies inside")


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--temperature", "0.5"], ["--temperature has no effect with --greedy"]),
        (["--top-k", "3"], ["--top-k has no effect with --greedy"]),
        (["--top-p", "0.9", "--top-k", "3"], ["--top-k, --top-p have no effect"]),
    ],
)
def test_generate_greedy_notes_sampling_flags_without_effect(flags, words, world, tmp_path, monkeypatch, capfd):
    scratch(world, tmp_path, monkeypatch)
    capfd.readouterr()
    assert call(G.main, ["--checkpoint", "ck", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--greedy"] + flags) == 0
    out, err = capfd.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("note: ") and all(w in lines[0] for w in words), err
    assert out.startswith("ids: ")


def test_generate_config_temperature_zero_with_top_k_is_noted(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    (d / "p.txt").write_text("12\n")
    _gencfg(d, temperature=0, top_k=5)
    capfd.readouterr()
    assert call(G.main, ["cfg.yml", "gen.yml"]) == 0
    err = capfd.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("note: temperature 0 with top_k 5") and "greedy" in lines[0], err
    _gencfg(d, temperature=0)  # all three 0: greedy, nothing to say
    assert call(G.main, ["cfg.yml", "gen.yml", "--force"]) == 0
    assert not capfd.readouterr().err.strip()


# ------------------------------------------------------------------------ plot_metrics one run twice
@pytest.mark.parametrize("second", ["mr", "mr2", "mr/metrics.jsonl", "./mr/", "mr3"])
def test_plot_same_run_twice_is_refused(second, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    os.symlink("mr", d / "mr2")
    (d / "mr3").mkdir()
    os.link(d / "mr" / "metrics.jsonl", d / "mr3" / "metrics.jsonl")  # a hard link
    before = snapshot(d)
    capfd.readouterr()
    rc = call(PM.main, ["mr", second, "--out", "o.png"])
    _refused(capfd, rc, before, d, "same run")
    assert not (d / "o.png").exists()


# ------------------------------------------------------------- MEGATRON_TOPO_KERNEL_TIMES folder
@pytest.mark.parametrize("where, words", [("hf", "HuggingFace model folder"), ("ck/kt", "checkpoint save folder")])
def test_kernel_times_folder_inside_another_artifact_is_not_written(where, words, world, tmp_path, monkeypatch, capfd):
    from megatron_topo.zero_topo import kernels

    d = scratch(world, tmp_path, monkeypatch)
    monkeypatch.setenv("RANK", "0")
    before = snapshot(d)
    capfd.readouterr()
    kernels._write_times_at_exit(where)  # what the atexit hook of MEGATRON_TOPO_KERNEL_TIMES=DIR runs
    lines = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: ") and words in lines[0], lines
    assert snapshot(d) == before
    kernels._write_times_at_exit("kt")  # a folder of its own: written
    assert not capfd.readouterr().err.strip() and len(os.listdir(d / "kt")) == 1


@pytest.mark.parametrize("out", ["hf/loss.png", "ck/loss.png"])
def test_plot_out_inside_another_artifact_is_refused(out, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    capfd.readouterr()
    rc = call(PM.main, ["mr", "--out", out])
    _refused(capfd, rc, before, d, "--out", "lies inside")
