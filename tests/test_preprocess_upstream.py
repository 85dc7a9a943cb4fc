"""tools/preprocess_data.py writes the same .bin/.idx bytes as GPT-NeoX's tools/datasets/preprocess_data.py
for every tokenizer kind GPT-NeoX has (GPT2BPETokenizer, HFTokenizer, SPMTokenizer, CharLevelTokenizer).

The reference here is GPT-NeoX's pipeline written out in the test, not our code: per document the
upstream tokenizer's ids (GPT-2's encoder in plain Python with no special tokens, so a literal
``<|endoftext|>`` is ordinary text; ``tokenizers``' ``encode(text).ids``; sentencepiece's
``encode``; ``np.fromstring(text, uint8)`` = the UTF-8 bytes), the EOD id appended, stored as
``uint16`` below 65500 ids (``best_fitting_dtype``), and the MMIDIDX files written with ``struct``
(tests/data_cases.py). ``--merge-file`` with HFTokenizer (GPT-NeoX's own corpora.py passes it) is
ignored with a note, as GPT-NeoX ignores it."""

from __future__ import annotations

import filecmp
import json

import numpy as np
import pytest

from .data_cases import SAMPLES, run_tool, write_corpus, write_jsonl, write_pair
from .test_preprocess_neox import gpt2_files, gpt2_reference_encode  # noqa: F401 (fixture)

TEXTS = [t for t in SAMPLES if t] + ["x <|endoftext|> y", "NUL\x00byte", "ünïcödé 日本 🙂 <|endoftext|>"]


def _upstream(prefix, docs_ids, eod, vocab_size):
    code = 8 if vocab_size < 65500 else 4  # GPT-NeoX's best_fitting_dtype: uint16, else int32
    write_pair(prefix, code, [ids + [eod] for ids in docs_ids])


def _ours(tmp_path, name, tokenizer, *args):
    src = write_jsonl(str(tmp_path / f"{name}.jsonl"), [{"text": t} for t in TEXTS])
    r = run_tool(
        "preprocess_data",
        "--input",
        src,
        "--output-prefix",
        tmp_path / name,
        "--tokenizer-type",
        tokenizer,
        *args,
        "--append-eod",
        "--quiet",
        check=True,
    )
    return str(tmp_path / f"{name}_text_document"), r


def _same(a, b):
    for suffix in (".bin", ".idx"):
        assert filecmp.cmp(a + suffix, b + suffix, shallow=False), (a, b, suffix)


def test_gpt2bpe_bytes_equal_upstream(gpt2_files, tmp_path):  # noqa: F811
    ours, _ = _ours(
        tmp_path, "gpt2", "GPT2BPETokenizer", "--vocab-file", gpt2_files["vocab"], "--merge-file", gpt2_files["merges"]
    )
    vocab = gpt2_files["vocab_map"]
    ids = [gpt2_reference_encode(t, vocab, gpt2_files["merge_list"]) for t in TEXTS]
    _upstream(str(tmp_path / "ref_gpt2"), ids, vocab["<|endoftext|>"], len(vocab))
    _same(ours, str(tmp_path / "ref_gpt2"))
    # GPT-NeoX's GPT2Tokenizer is built with special_tokens=[]: "<|endoftext|>" in text is ordinary pieces
    assert vocab["<|endoftext|>"] not in ids[TEXTS.index("x <|endoftext|> y")]


def test_hf_tokenizer_bytes_equal_upstream_and_merge_file_is_ignored(gpt2_files, tmp_path):  # noqa: F811
    from tokenizers import Tokenizer

    ours, _ = _ours(tmp_path, "hf", "HFTokenizer", "--vocab-file", gpt2_files["json"])
    up = Tokenizer.from_file(gpt2_files["json"])  # GPT-NeoX's HFTokenizer: encode(text).ids
    ids = [up.encode(t).ids for t in TEXTS]
    _upstream(str(tmp_path / "ref_hf"), ids, up.token_to_id("<|endoftext|>"), up.get_vocab_size())
    _same(ours, str(tmp_path / "ref_hf"))
    assert up.token_to_id("<|endoftext|>") in ids[TEXTS.index("x <|endoftext|> y")]  # an added token there
    # GPT-NeoX's corpora.py passes --merge-file with HFTokenizer; its build_tokenizer ignores it
    again, r = _ours(
        tmp_path, "hf_merge", "HFTokenizer", "--vocab-file", gpt2_files["json"], "--merge-file", gpt2_files["merges"]
    )
    _same(again, ours)
    assert (
        f"note: --merge-file {gpt2_files['merges']} is ignored: HFTokenizer does not read a merges file" in r.stdout
        and r.stderr == ""
    )


def test_spm_tokenizer_bytes_equal_upstream(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    corpus = [json.loads(line)["text"] for line in open(write_corpus(str(tmp_path)), encoding="utf-8")]
    (tmp_path / "c.txt").write_text("\n".join(corpus), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(tmp_path / "c.txt"),
        model_prefix=str(tmp_path / "m"),
        vocab_size=300,
        user_defined_symbols=["<|endoftext|>"],
        minloglevel=2,
    )
    model = str(tmp_path / "m.model")
    ours, _ = _ours(tmp_path, "spm", "SPMTokenizer", "--vocab-file", model)
    up = spm.SentencePieceProcessor(model_file=model)  # GPT-NeoX's SentencePieceTokenizer
    ids = [up.encode(t) for t in TEXTS]
    _upstream(str(tmp_path / "ref_spm"), ids, up.piece_to_id("<|endoftext|>"), up.get_piece_size())
    _same(ours, str(tmp_path / "ref_spm"))


def test_char_level_bytes_equal_upstream(tmp_path):
    """GPT-NeoX: ``list(np.fromstring(text, dtype=np.uint8))`` (NumPy encodes str as UTF-8), 512 ids,
    EOD 0; characters beyond U+01FF are bytes like any other (no abort)."""
    ours, _ = _ours(tmp_path, "char", "CharLevelTokenizer")
    ids = [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).tolist() for t in TEXTS]
    assert max(max(i) for i in ids) > 200 and any(ord(c) >= 512 for t in TEXTS for c in t)
    _upstream(str(tmp_path / "ref_char"), ids, 0, 512)
    _same(ours, str(tmp_path / "ref_char"))
