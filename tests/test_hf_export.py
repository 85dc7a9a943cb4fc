"""HF export with the tokenizer: a trained checkpoint exported by tools/convert_to_hf.py is a folder
that ``AutoTokenizer`` + ``AutoModelForCausalLM`` + ``pipeline("text-generation")`` use directly.
For every tokenizer type the exported tokenizer gives our ids and our text; bos/eos/pad are our
EOD (not transformers' default 2); greedy generation equals tools/generate.py's."""

import json
import os

import pytest
import torch

from megatron_topo.commands import convert_to_hf, generate, train_tokenizer
from megatron_topo.data import build_tokenizer
from megatron_topo.training import Trainer

from .data_cases import SAMPLES, write_corpus, write_jsonl
from .train_utils import datasets, local_runtime, small_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

transformers = pytest.importorskip("transformers")
VOCAB = 720  # >= every tokenizer below (600/700 BPE/SPM, 257 ByteLevel, 512 CharLevel, 501 HFGPT2)
EXTRA = [
    "x <|endoftext|> y",
    "  double  spaces  ",
    "\n\nleading newlines",
    "mixed 日本 and ascii",
    " ",
    "\n",
    "  x  \n  y",
    "ＡＢＣ full width ①",
]


def _gpt2_files(directory, corpus_texts):
    """vocab.json + merges.txt of a tiny GPT-2 style byte-level BPE trained here."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus_texts, trainer)
    vocab, merges = tok.model.save(str(directory))
    assert os.path.basename(vocab) == "vocab.json" and os.path.basename(merges) == "merges.txt"
    return vocab, merges


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """One tiny model (vocab 640, ByteLevel in its config) trained 2 steps and saved, and tiny
    tokenizer files of every kind."""
    tmp = tmp_path_factory.mktemp("hfexport")
    corpus = write_corpus(str(tmp))
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    files = {"corpus_texts": texts}
    files["bpe"] = str(tmp / "bpe.json")
    files["spm"] = str(tmp / "spm.model")
    files["spm_bpe"] = str(tmp / "spm_bpe.model")
    assert (
        train_tokenizer.main(
            ["--input", corpus, "--model-type", "bpe", "--vocab-size", "600", "--output", files["bpe"]]
        )
        == 0
    )
    assert (
        train_tokenizer.main(
            ["--input", corpus, "--model-type", "sentencepiece", "--vocab-size", "600", "--output", files["spm"]]
        )
        == 0
    )
    assert (
        train_tokenizer.main(
            [
                "--input",
                corpus,
                "--model-type",
                "sentencepiece",
                "--spm-model-type",
                "bpe",
                "--vocab-size",
                "600",
                "--output",
                files["spm_bpe"],
            ]
        )
        == 0
    )
    files["vocab"], files["merges"] = _gpt2_files(tmp, texts)
    import sentencepiece as spm  # sentencepiece's defaults (Llama-like): nmt_nfkc, dummy prefix, no byte fallback

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([t[:4000] for t in texts]),
        model_prefix=str(tmp / "spm_def"),
        vocab_size=700,
        minloglevel=2,
        num_threads=1,
    )
    files["spm_default"] = str(tmp / "spm_def.model")
    cfg = small_config(tmp, **{"train.train_iters": 2})
    cfg.model.vocab_size = VOCAB
    cfg.checkpoint.save = str(tmp / "ck")
    tr = Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg), log=lambda *a, **k: None)
    tr.train(until=2)
    return tmp, files


KINDS = {  # name -> (tokenizer_type, vocab_file key, merge_file key)
    "ByteLevel": ("ByteLevel", None, None),
    "CharLevel": ("CharLevelTokenizer", None, None),
    "HFTokenizer": ("HFTokenizer", "bpe", None),
    "SPM-unigram": ("SPMTokenizer", "spm", None),
    "SPM-bpe": ("SPMTokenizer", "spm_bpe", None),
    "SPM-default": ("SPMTokenizer", "spm_default", None),
    "GPT2BPE": ("GPT2BPETokenizer", "vocab", "merges"),
    "HFGPT2": ("HFGPT2Tokenizer", "vocab", "merges"),
}


def _export(setup, tmp_path, kind):
    tmp, files = setup
    ttype, vkey, mkey = KINDS[kind]
    out = tmp_path / f"hf_{kind}"
    args = ["--checkpoint", str(tmp / "ck"), "--output", str(out), "--tokenizer-type", ttype]
    if vkey:
        args += ["--vocab-file", files[vkey]]
    if mkey:
        args += ["--merge-file", files[mkey]]
    assert convert_to_hf.main(args) == 0
    ours = build_tokenizer(ttype, files.get(vkey), VOCAB if ttype == "CharLevelTokenizer" else None, files.get(mkey))
    return str(out), ours


@pytest.mark.parametrize("kind", list(KINDS))
def test_exported_tokenizer_gives_our_ids_and_text(setup, tmp_path, kind):
    out, ours = _export(setup, tmp_path, kind)
    hf = transformers.AutoTokenizer.from_pretrained(out)
    texts = SAMPLES + EXTRA + setup[1]["corpus_texts"]
    for text in texts:
        ids = ours.tokenize(text)
        assert hf(text, add_special_tokens=False)["input_ids"] == ids, (kind, text[:60])
        assert hf.encode(text) == ids, (kind, text[:60])  # no bos/eos added either
        assert hf.decode(ids) == ours.detokenize(ids), (kind, text[:60])
    # bos/eos are our EOD everywhere (tokenizer, config.json, generation_config.json)
    assert hf.eos_token_id == ours.eod and hf.bos_token_id == ours.eod
    # pad: the vocabulary's <|padding|> where it has one (train_tokenizer's BPE puts it at id 1, as
    # GPT-NeoX-20B's; HFGPT2Tokenizer appends it, as GPT-NeoX does), else EOD
    pad = {"HFTokenizer": 1, "HFGPT2": ours.vocab_size - 1}.get(kind, ours.eod)
    assert pad == ours.eod or hf.convert_ids_to_tokens(pad) == "<|padding|>"
    assert hf.pad_token_id == pad
    cfg = json.load(open(os.path.join(out, "config.json")))
    gen = json.load(open(os.path.join(out, "generation_config.json")))
    for d in (cfg, gen):
        assert (d["bos_token_id"], d["eos_token_id"], d["pad_token_id"]) == (ours.eod, ours.eod, pad)


def test_pipeline_generates_like_tools_generate(setup, tmp_path, capsys):
    """ByteLevel (the checkpoint's own tokenizer, no overrides): AutoModelForCausalLM +
    pipeline("text-generation") greedy == tools/generate.py --greedy, ids and text."""
    tmp, _ = setup
    out = tmp_path / "hf"
    assert convert_to_hf.main(["--checkpoint", str(tmp / "ck"), "--output", str(out)]) == 0
    names = sorted(os.listdir(out))
    assert names == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    prompt, n = "def f(x):", 7  # 16 tokens in all: within seq_length, where generate.py slides its window
    capsys.readouterr()
    assert (
        generate.main(["--checkpoint", str(tmp / "ck"), "--prompt", prompt, "--max-new-tokens", str(n), "--greedy"])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    want_ids = [int(x) for x in lines[0].split()[1:]]
    assert len(want_ids) == n
    eod = 256
    if eod in want_ids:  # HF stops at eos (our EOD): compare up to it
        want_ids = want_ids[: want_ids.index(eod) + 1]
    byte_level = build_tokenizer("ByteLevel")
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == byte_level.tokenize(prompt)
    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=n, do_sample=False)
    assert got[0, ids.shape[1] :].tolist() == want_ids
    pipe = transformers.pipeline("text-generation", model=str(out), device="cpu")
    res = pipe(prompt, max_new_tokens=n, do_sample=False, return_full_text=False)
    # the pipeline decodes without special tokens (our EOD)
    assert res[0]["generated_text"] == byte_level.detokenize([i for i in want_ids if i != eod])
    full = pipe(prompt, max_new_tokens=n, do_sample=False)[0]["generated_text"]
    assert full == prompt + res[0]["generated_text"]


def test_tokenizer_problems(setup, tmp_path, capsys):
    """A config tokenizer that cannot be built (its file moved) or does not fit: the model is
    exported without one and a warning says why; a bad override is an error and writes nothing."""
    import shutil

    _, files = setup
    moved = tmp_path / "tok.json"
    shutil.copyfile(files["bpe"], moved)
    cfg = small_config(tmp_path, **{"train.train_iters": 1})
    cfg.model.vocab_size = VOCAB
    cfg.data.tokenizer_type, cfg.data.vocab_file = "HFTokenizer", str(moved)
    cfg.checkpoint.save = str(tmp_path / "ck")
    Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg), log=lambda *a, **k: None).train(until=1)
    os.remove(moved)
    out = tmp_path / "out"
    out.mkdir()
    capsys.readouterr()
    assert convert_to_hf.main(["--checkpoint", str(tmp_path / "ck"), "--output", str(out / "a")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: no tokenizer written") and "tok.json" in err[0]
    assert sorted(os.listdir(out / "a")) == ["config.json", "model.safetensors"]
    # the override fixes it
    assert (
        convert_to_hf.main(
            ["--checkpoint", str(tmp_path / "ck"), "--output", str(out / "b"), "--vocab-file", files["bpe"]]
        )
        == 0
    )
    hf = transformers.AutoTokenizer.from_pretrained(str(out / "b"))
    assert hf("return the string")["input_ids"] == build_tokenizer("HFTokenizer", files["bpe"]).tokenize(
        "return the string"
    )
    # a tokenizer larger than the model's vocabulary
    big = str(tmp_path / "big.json")
    assert (
        train_tokenizer.main(
            [
                "--input",
                write_jsonl(str(tmp_path / "c.jsonl"), [{"text": t} for t in files["corpus_texts"]]),
                "--model-type",
                "bpe",
                "--vocab-size",
                "800",
                "--output",
                big,
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        convert_to_hf.main(["--checkpoint", str(tmp_path / "ck"), "--output", str(out / "c"), "--vocab-file", big]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "800 ids, more than the model's 720" in err[0]
    assert (
        convert_to_hf.main(
            [
                "--checkpoint",
                str(tmp_path / "ck"),
                "--output",
                str(out / "d"),
                "--tokenizer-type",
                "GPT2BPETokenizer",
                "--vocab-file",
                files["vocab"],
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: tokenizer:") and "merge_file" in err[0]
    assert sorted(os.listdir(out)) == ["a", "b"]
