"""tools/generate.py CONFIG.yml ...: GPT-NeoX's text-generation keys (text_generation.yml) on a tiny
checkpoint: each text_gen_type, the same tokens as the flag interface for a seed, temperature 0 as
--greedy, nucleus (top_p) filtering, and bad input as one error line."""

import io
import json
import os

import pytest
import torch

from megatron_topo.commands import generate
from megatron_topo.commands import train as train_cli
from megatron_topo.commands.generate_neox import FIELDS, stdin_prompts
from megatron_topo.data import build_tokenizer
from megatron_topo.model.sampling import filter_logits, next_token
from megatron_topo.training import Trainer

from .train_utils import datasets, local_runtime, small_config

ARCH = (
    "num_layers: 2\nhidden_size: 32\nnum_attention_heads: 4\nseq_length: 16\nmax_position_embeddings: 16\n"
    "vocab_size: 64\nrotary_pct: 0.25\ngpt_j_residual: true\nno_weight_tying: true\n"
    "tokenizer_type: CharLevelTokenizer\n"
)
TOK = build_tokenizer("CharLevelTokenizer", None, 64)  # eod 0, ids = UTF-8 bytes: digits and punctuation fit 64


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    """A 2-layer model trained 2 steps (CharLevelTokenizer, 64 ids, seq_length 16) and saved."""
    tmp = tmp_path_factory.mktemp("gen")
    cfg = small_config(tmp, **{"train.train_iters": 2, "data.tokenizer_type": "CharLevelTokenizer"})
    cfg.checkpoint.save = str(tmp / "ck")
    tr = Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg), log=lambda *a, **k: None)
    tr.train(until=2)
    (tmp / "125M.yml").write_text(ARCH)
    return tmp


def _gen_yml(tmp_path, name="gen.yml", **keys):
    base = dict(maximum_tokens=8, temperature=0.0, top_p=0.0, top_k=0, recompute=False, prompt_end="\n")
    base.update(keys)
    p = tmp_path / name
    p.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in base.items()))
    return str(p)


def _run(capsys, argv, stdin=None, monkeypatch=None):
    capsys.readouterr()
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    try:
        rc = generate.main(argv)
    except SystemExit as e:  # argparse's one error line
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def _flag_text(capsys, ck, prompt_ids, n, *extra):
    """The flag interface's tokens, cut at the first end-of-document token (where a config sample ends)."""
    rc, out, err = _run(
        capsys,
        ["--checkpoint", str(ck / "ck"), "--prompt-ids", ",".join(map(str, prompt_ids)), "--max-new-tokens", str(n)]
        + list(extra),
    )
    assert rc == 0, err
    ids = [int(x) for x in out.splitlines()[0].split()[1:]]
    ended = TOK.eod in ids
    ids = ids[: ids.index(TOK.eod)] if ended else ids
    return (TOK.detokenize(ids) if ids else None), len(ids), ended


def test_each_text_gen_type_and_the_flag_interface_agree(ck, tmp_path, capsys, monkeypatch):
    """input-file, unconditional and interactive give, for one seed, the tokens of the equivalent
    flags (--prompt-ids, the same sampling settings and --seed), in GPT-NeoX's JSON-line records."""
    model, load = str(ck / "125M.yml"), f"load={ck / 'ck'}"
    settings = dict(temperature=0.8, top_k=20, top_p=0.9, maximum_tokens=8)
    flags = ["--temperature", "0.8", "--top-k", "20", "--top-p", "0.9"]
    # input-file: one prompt per line (stripped, empty lines dropped); one sample each
    (tmp_path / "prompts.txt").write_text("0!\n\n  12 \n")
    out = tmp_path / "out.jsonl"
    for prompt, seed in (("0!", 7), ("12", 3)):
        (tmp_path / "one.txt").write_text(prompt + "\n")
        y = _gen_yml(tmp_path, text_gen_type="input-file", sample_input_file=str(tmp_path / "one.txt"), **settings)
        rc, o, err = _run(
            capsys, [model, y, "--set", load, "--set", f"seed={seed}", "--set", f"sample_output_file={out}"]
        )
        assert rc == 0, err
        assert o.strip() == f"wrote 1 sample(s) (input-file) to {out}"
        (rec,) = _records(out)
        assert list(rec) == list(FIELDS) and rec["context"] == prompt and rec["message"] is None
        text, n, ended = _flag_text(capsys, ck, TOK.tokenize(prompt), 8, *flags, "--seed", str(seed))
        assert (rec["text"], rec["length"], rec["finished"]) == (text, n, ended)
    # --seed overrides the config's seed; both prompts of the file, in order
    y = _gen_yml(tmp_path, text_gen_type="input-file", sample_input_file=str(tmp_path / "prompts.txt"), **settings)
    rc, _, err = _run(capsys, [model, y, "--set", load, "--seed", "5", "--set", f"sample_output_file={out}"])
    assert rc == 0, err
    recs = _records(out)
    assert [r["context"] for r in recs] == ["0!", "12"]
    text, n, ended = _flag_text(capsys, ck, TOK.tokenize("0!"), 8, *flags, "--seed", "5")
    assert (recs[0]["text"], recs[0]["length"], recs[0]["finished"]) == (text, n, ended)
    # unconditional: num_samples records from the end-of-document token alone
    y = _gen_yml(tmp_path, text_gen_type="unconditional", num_samples=3, sample_output_file=str(out), **settings)
    rc, _, err = _run(capsys, [model, y, "--set", load, "--set", "seed=11"])
    assert rc == 0, err
    recs = _records(out)
    assert len(recs) == 3 and all(r["context"] == "" for r in recs)
    assert all(r["length"] <= 8 and (r["finished"] or r["length"] == 8) for r in recs)
    text, n, ended = _flag_text(capsys, ck, [TOK.eod], 8, *flags, "--seed", "11")
    assert (recs[0]["text"], recs[0]["length"], recs[0]["finished"]) == (text, n, ended)
    # interactive: prompts from stdin until EOF, one completion printed each
    y = _gen_yml(tmp_path, text_gen_type="interactive", **settings)
    rc, o, err = _run(capsys, [model, y, "--set", load, "--seed", "7"], "0!\n", monkeypatch)
    assert rc == 0, err
    text, _, _ = _flag_text(capsys, ck, TOK.tokenize("0!"), 8, *flags, "--seed", "7")
    assert o == f"Generated Text: {text or ''}\n"


def test_temperature_zero_is_greedy_and_samples_stop_at_seq_length(ck, tmp_path, capsys, monkeypatch):
    """temperature, top_k and top_p all 0: argmax decoding (the seed changes nothing), as --greedy;
    maximum_tokens 0 and large values stop when the context holds seq_length (16) tokens."""
    model, load = str(ck / "125M.yml"), f"load={ck / 'ck'}"
    y = _gen_yml(tmp_path, text_gen_type="interactive", maximum_tokens=5)
    outs = []
    for seed in ("1", "2"):
        rc, o, err = _run(capsys, [model, y, "--set", load, "--seed", seed], "0!\n12\n", monkeypatch)
        assert rc == 0, err
        outs.append(o)
    want = [_flag_text(capsys, ck, TOK.tokenize(p), 5, "--greedy")[0] or "" for p in ("0!", "12")]
    assert outs[0] == outs[1] == "".join(f"Generated Text: {t}\n" for t in want)
    for max_tokens in (0, 100):  # 0: GPT-NeoX's "until the context is full"
        y = _gen_yml(tmp_path, text_gen_type="input-file", maximum_tokens=max_tokens)
        (tmp_path / "p.txt").write_text("0!\n")
        argv = [model, y, "--set", load, "--set", f"sample_input_file={tmp_path / 'p.txt'}"]
        rc, _, err = _run(capsys, argv + ["--set", f"sample_output_file={tmp_path / 'o.jsonl'}"])
        assert rc == 0, err
        (rec,) = _records(tmp_path / "o.jsonl")
        text, n, ended = _flag_text(capsys, ck, TOK.tokenize("0!"), 14, "--greedy")
        assert (rec["text"], rec["length"], rec["finished"]) == (text, n, ended) and n <= 14


def test_stdin_prompts_follow_prompt_end():
    assert list(stdin_prompts("\n", io.StringIO("a\n\nb"))) == ["a", "", "b"]
    assert list(stdin_prompts("###", io.StringIO("def f():\n  x###tail\ny\n"))) == ["def f():\n  x", "y"]


def test_top_p_keeps_the_smallest_set_reaching_p():
    """filter_logits keeps exactly the most likely tokens up to the first whose cumulative
    probability reaches top_p (a brute-force reference over random logits), after top_k; sampling
    never leaves that set; 0 and 1 keep every token."""
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        logits = torch.randn(50, generator=g) * 3
        p = float(torch.rand(1, generator=g)) * 0.98 + 0.01
        k = (0, 10)[trial % 2]
        base = filter_logits(logits, top_k=k)
        probs = torch.softmax(base.double(), -1)
        order = torch.argsort(probs, descending=True, stable=True)
        cum = torch.cumsum(probs[order], 0)
        if ((cum - p).abs() < 1e-6).any():
            continue  # a tie at p: float rounding decides
        n = int((cum < p).sum()) + 1  # the smallest prefix whose mass is >= p
        want = set(order[:n].tolist())
        kept = set(torch.nonzero(torch.isfinite(filter_logits(logits, top_k=k, top_p=p))).flatten().tolist())
        assert kept == want, (trial, p, k)
        assert float(probs[list(kept)].sum()) >= p and (n == 1 or float(cum[n - 2]) < p)
        draws = {next_token(logits, False, 1.0, k, p, g) for _ in range(200)}
        assert draws <= want
    x = torch.tensor([2.0, 1.0, 0.5, -1.0])
    assert torch.equal(filter_logits(x, top_p=1.0), x) and torch.equal(filter_logits(x, top_p=0.0), x)
    assert torch.isfinite(filter_logits(x, top_p=1e-9)).tolist() == [True, False, False, False]


def test_bad_input_is_one_error_line(ck, tmp_path, capsys):
    model, load = str(ck / "125M.yml"), f"load={ck / 'ck'}"
    (tmp_path / "p.txt").write_text("0!\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    existing = tmp_path / "notes.txt"
    existing.write_text("my notes\n")
    cases = [
        (
            ["--set", "text_gen_type=banana"],
            "text_gen_type='banana' is not valid; use one of unconditional, input-file, interactive",
        ),
        (["--set", "text_gen_type=input-file"], "text_gen_type input-file needs sample_input_file"),
        (["--set", "text_gen_type=input-file", "--set", f"sample_input_file={tmp_path / 'nope'}"], "file not found"),
        (["--set", "text_gen_type=input-file", "--set", f"sample_input_file={tmp_path / 'fifo'}"], "a FIFO"),
        (["--set", "text_gen_type=input-file", "--set", f"sample_input_file={tmp_path / 'dir'}"], "a directory"),
        (
            ["--set", "text_gen_type=unconditional", "--set", "maximum_tokens=-1"],
            "maximum_tokens must lie in [0, 1048576], got -1",
        ),
        (["--set", "text_gen_type=unconditional", "--set", "top_p=1.5"], "top_p must"),
        (["--set", "text_gen_type=unconditional", "--set", "top_p=-0.1"], "top_p must"),
        (
            ["--set", "text_gen_type=unconditional", "--set", "num_samples=0"],
            "num_samples must lie in [1, 1048576], got 0",
        ),
        (["--set", "text_gen_type=interactive", "--set", "prompt_end="], "prompt_end"),
        (["--set", "maximum_tokens=3"], "text_gen_type is not set"),
        (
            ["--set", "text_gen_type=unconditional", "--set", "sample_output_file= "],
            "sample_output_file='' is not valid; give a file name, or null",
        ),
        (
            ["--set", "text_gen_type=unconditional", "--set", f"sample_output_file={existing}"],
            "already exists; pass --force",
        ),
        (["--set", "text_gen_type=interactive", "--prompt", "0!"], "--prompt is for the flag interface"),
        (["--set", "text_gen_type=interactive", "--greedy"], "--greedy is for the flag interface"),
        (
            ["--set", "text_gen_type=unconditional", "--set", "num_layers=3"],
            "num_layers is 3 in --set num_layers=3 but 2",
        ),
    ]
    for extra, want in cases:
        rc, out, err = _run(capsys, [model, "--set", load] + extra)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], (extra, err)
        assert "Traceback" not in err
    assert existing.read_text() == "my notes\n"  # refused: nothing lost
    rc, out, err = _run(capsys, [str(tmp_path / "p.txt") + ".yml", "--set", "text_gen_type=interactive"])
    assert rc == 2 and "error: " in err
    rc, out, err = _run(capsys, [model, "--set", "text_gen_type=interactive"])
    assert rc == 2 and "no checkpoint: set load" in err
    # --force replaces a file the tool did not write; its own output is replaced without it
    argv = [model, "--set", load, "--set", "text_gen_type=unconditional", "--set", f"sample_output_file={existing}"]
    assert _run(capsys, argv + ["--force"])[0] == 0 and len(_records(existing)) == 1
    assert _run(capsys, argv + ["--set", "num_samples=2"])[0] == 0 and len(_records(existing)) == 2
    # the flag interface's new --top-p is checked too
    rc, _, err = _run(
        capsys, ["--checkpoint", str(ck / "ck"), "--prompt-ids", "1", "--max-new-tokens", "1", "--top-p", "2"]
    )
    assert rc == 2 and "--top-p 2.0: must lie in [0, 1]" in err
    rc, _, err = _run(capsys, ["--checkpoint", str(ck / "ck"), "--prompt-ids", "1", "--max-new-tokens", "1", "--force"])
    assert rc == 2 and "--force goes with CONFIG.yml files" in err


def test_train_notes_generation_keys_and_runs(ck, tmp_path, capsys):
    """train.py 125M.yml text_generation.yml: the generation keys are named in a note line (training
    does not read them, as GPT-NeoX's train.py), not refused."""
    y = _gen_yml(tmp_path, text_gen_type="interactive", maximum_tokens=102, top_k=4)
    argv = [str(ck / "125M.yml"), y, "--set", "train_iters=1", "--set", f"log_dir={tmp_path / 'log'}", "--dry-run"]
    capsys.readouterr()
    rc = train_cli.main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert (
        "note: read by tools/generate.py CONFIG.yml, not by training (GPT-NeoX's too): text_gen_type='interactive', "
        "maximum_tokens=102, top_k=4" in out
    )
