"""Tokenizers: exact round trips for every type (tiny BPE and sentencepiece models trained with
tools/train_tokenizer.py), GPT-NeoX conventions, errors, and preprocessing with each."""

import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_topo.data import DataError, MMapIndexedDataset, build_tokenizer

from .data_cases import SAMPLES, error_line, run_tool, write_corpus, write_jsonl


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    corpus = write_corpus(str(d))
    bpe, spm = str(d / "bpe.json"), str(d / "spm.model")
    run_tool(
        "train_tokenizer", "--input", corpus, "--model-type", "bpe", "--vocab-size", 600, "--output", bpe, check=True
    )
    run_tool(
        "train_tokenizer",
        "--input",
        corpus,
        "--model-type",
        "sentencepiece",
        "--vocab-size",
        600,
        "--output",
        spm,
        check=True,
    )
    return {"dir": d, "corpus": corpus, "HFTokenizer": bpe, "SPMTokenizer": spm}


def _tokenizers(trained):
    return [
        build_tokenizer("ByteLevel", None),
        build_tokenizer("CharLevelTokenizer", None),
        build_tokenizer("HFTokenizer", trained["HFTokenizer"]),
        build_tokenizer("SPMTokenizer", trained["SPMTokenizer"]),
    ]


def test_round_trip_every_tokenizer(trained):
    for tok in _tokenizers(trained):
        for text in SAMPLES:
            ids = tok.tokenize(text)
            assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids), tok.name
            assert tok.detokenize(ids) == text, (tok.name, text)
        assert 0 <= tok.eod < tok.vocab_size


def test_trained_models_have_eod_and_learn_merges(trained):
    hf = build_tokenizer("HFTokenizer", trained["HFTokenizer"])
    sp = build_tokenizer("SPMTokenizer", trained["SPMTokenizer"])
    assert hf.vocab_size == 600 and sp.vocab_size == 600
    assert hf.detokenize([hf.eod]) == "<|endoftext|>" and sp.detokenize([sp.eod]) == "<|endoftext|>"
    text = "return the string"
    assert len(hf.tokenize(text)) < len(text) and len(sp.tokenize(text)) < len(text)


def test_gpt_neox_conventions():
    b = build_tokenizer("bytelevel", None)
    assert (b.vocab_size, b.eod) == (257, 256)
    assert b.tokenize("é") == [0xC3, 0xA9] and b.detokenize([104, 105, 256]) == "hi"
    c = build_tokenizer("CharLevelTokenizer", None)
    assert (c.vocab_size, c.eod) == (512, 0)
    assert c.tokenize("Hi!") == [72, 105, 33]
    # GPT-NeoX's CharLevelTokenizer: np.fromstring(text, uint8), the UTF-8 bytes; no character is out of range
    assert c.tokenize("日é") == list("日é".encode("utf-8")) and c.detokenize(c.tokenize("日é")) == "日é"
    with pytest.raises(DataError, match="byte 230 .* outside its 200 ids"):
        build_tokenizer("CharLevelTokenizer", None, vocab_size=200).tokenize("日")


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_byte_level_round_trip_any_text(text):
    tok = build_tokenizer("ByteLevel", None)
    assert tok.detokenize(tok.tokenize(text)) == text


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_char_level_round_trip(text):
    tok = build_tokenizer("CharLevelTokenizer", None)
    assert tok.tokenize(text) == list(text.encode("utf-8"))
    assert tok.detokenize(tok.tokenize(text)) == text


def test_build_tokenizer_errors(tmp_path):
    with pytest.raises(DataError, match="'GPT3' is not valid; use one of ByteLevel"):
        build_tokenizer("GPT3", None)
    with pytest.raises(DataError, match="HFTokenizer needs vocab_file"):
        build_tokenizer("HFTokenizer", None)
    with pytest.raises(DataError, match="file not found"):
        build_tokenizer("SPMTokenizer", str(tmp_path / "missing.model"))
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    with pytest.raises(DataError, match="junk.json: not a HuggingFace tokenizers JSON file"):
        build_tokenizer("HFTokenizer", str(junk))
    with pytest.raises(DataError, match="junk.json: not a sentencepiece model"):
        build_tokenizer("SPMTokenizer", str(junk))


@pytest.mark.parametrize("ttype", ["ByteLevel", "CharLevelTokenizer", "HFTokenizer", "SPMTokenizer"])
def test_preprocess_with_each_tokenizer_round_trips(trained, ttype, tmp_path):
    texts = [s for s in SAMPLES if s]
    src = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": t} for t in texts])
    vocab = trained.get(ttype)
    args = ["--input", src, "--output-prefix", tmp_path / "out", "--tokenizer-type", ttype, "--append-eod"]
    run_tool("preprocess_data", *args, *(["--vocab-file", vocab] if vocab else []), check=True)
    tok = build_tokenizer(ttype, vocab)
    ds = MMapIndexedDataset(str(tmp_path / "out_text_document"))
    assert ds.num_documents == len(texts)
    for k, text in enumerate(texts):
        ids = ds.document(k).tolist()
        assert ids == tok.tokenize(text) + [tok.eod]
        assert tok.detokenize(ids[:-1]) == text


def test_train_tokenizer_errors_keep_existing_output(trained, tmp_path):
    out = tmp_path / "tok.json"
    out.write_text('{"previous": true, "model": {}}')  # a tokenizer --force may replace; a failed run keeps it
    spm_out = tmp_path / "tok.model"  # and a sentencepiece model (--force replaces only a tokenizer of its kind)
    shutil.copyfile(trained["SPMTokenizer"], spm_out)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    line = error_line(
        run_tool(
            "train_tokenizer", "--input", empty, "--model-type", "bpe", "--vocab-size", 300, "--output", out, "--force"
        )
    )
    assert "empty input" in line
    bad = write_jsonl(str(tmp_path / "bad.jsonl"), [{"text": "fine"}, b"{oops"])
    line = error_line(
        run_tool(
            "train_tokenizer",
            "--input",
            bad,
            "--model-type",
            "sentencepiece",
            "--vocab-size",
            300,
            "--output",
            spm_out,
            "--force",
        )
    )
    assert "bad.jsonl:2: invalid JSON" in line
    assert out.read_text() == '{"previous": true, "model": {}}'
    assert spm_out.read_bytes() == open(trained["SPMTokenizer"], "rb").read()
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "empty.jsonl", "tok.json", "tok.model"]
