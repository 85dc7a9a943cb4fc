"""Hostile inputs, probe 7 (issue 29): F3 (JSON readers that missed RecursionError, Python's
4,300-digit integer limit, or read without a cap), F9 (lone surrogates), F10 (a tokenizer file
without a size cap; a metrics step that is a float) and the `.replacing` digits case (names in
Arabic-Indic digits taken for ASCII ones). Each test failed before the fix (a traceback, a hang,
or a file removed); the controls show that valid files still work."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from megatron_topo.commands import plot_metrics, predict_perf, preprocess_data, train_tokenizer
from megatron_topo.data import DataError
from megatron_topo.data.tokenizer import build_tokenizer

from .cli_cases import ROOT, call, one_error_line

DEEP = "[" * 3000 + "]" * 3000
DOCS = "".join(json.dumps({"text": f"document {i} with some words"}) + "\n" for i in range(20))


def _pre(out="out/x", inp="in.jsonl"):
    return ["--input", inp, "--output-prefix", out, "--tokenizer-type", "CharLevelTokenizer", "--quiet"]


# ---------------------------------------------------------------- F3: the shared JSON reader
@pytest.mark.parametrize(
    "text, reason",
    [
        (DEEP, "nested too deeply"),
        ("[" + "9" * 5000 + "]", "an integer of more than 4,300 digits"),
        (b'{"a": "\xff"}', "not UTF-8 text (byte 0xff at offset 7)"),
        ("{", "Expecting property name enclosed in double quotes at line 1 column 2"),
    ],
)
def test_parse_json_gives_one_reason(text, reason):
    from megatron_topo.safe_files import NotJSON, parse_json

    with pytest.raises(NotJSON) as e:
        parse_json(text)
    assert str(e.value) == reason
    assert parse_json(b'\xef\xbb\xbf{"a": [1]}') == {"a": [1]}  # control: a leading BOM is fine


def test_read_json_is_capped_and_names_the_file(tmp_path):
    from megatron_topo.safe_files import read_json

    p = tmp_path / "r.json"
    p.write_text(DEEP)
    with pytest.raises(ValueError, match=r"r\.json: not valid JSON \(nested too deeply\)"):
        read_json(str(p), 1 << 20, ValueError)
    p.write_text("[1]" + " " * 100)
    with pytest.raises(ValueError, match=r"is 103 bytes; a file of this kind is at most 10 bytes"):
        read_json(str(p), 10, ValueError)
    assert read_json(str(p), 1 << 20, ValueError) == [1]


# ---------------------------------------------------------------- F3: the dataset journal
@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "in.jsonl").write_text(DOCS)
    (tmp_path / "out").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    "journal",
    [
        "[" * 2000 + "]" * 2000,  # fits the 4 KiB cap; a RecursionError traceback before
        # Arabic-Indic digits matched \d: taken for a journal and removed without a word before
        json.dumps({"bin": "x_text_document.bin.tmp.\u0661", "idx": "x_text_document.idx.tmp.\u0661"}),
    ],
    ids=["deep", "arabic-indic-digits"],
)
def test_a_journal_that_is_not_ours_is_refused_and_kept(corpus, capfd, journal):
    j = corpus / "out" / "x_text_document.replacing"
    j.write_text(journal)
    assert call(preprocess_data.main, _pre()) == 1
    line = one_error_line(capfd)
    assert "x_text_document.replacing: not a replacement journal of out/x_text_document" in line, line
    assert j.read_text() == journal
    assert sorted(os.listdir(corpus / "out")) == ["x_text_document.replacing"]


def test_a_journal_of_ours_is_still_finished(corpus, capfd):
    """Control: a journal naming ASCII-digit temporaries is completed (the renames finished)."""
    from megatron_topo.data.pair_commit import finish_interrupted

    (corpus / "out" / "x.bin.tmp.7").write_bytes(b"B")
    (corpus / "out" / "x.idx.tmp.7").write_bytes(b"I")
    (corpus / "out" / "x.replacing").write_text(json.dumps({"bin": "x.bin.tmp.7", "idx": "x.idx.tmp.7"}))
    assert finish_interrupted(str(corpus / "out" / "x"))
    assert sorted(os.listdir(corpus / "out")) == ["x.bin", "x.idx"]


def test_a_leftover_sweep_keeps_names_in_other_digits(tmp_path):
    from megatron_topo.data.pair_commit import sweep_leftovers

    user = tmp_path / "x.bin.tmp.\u0669\u0669\u0669\u0669\u0669\u0669\u0669"  # int() reads 9999999: no such pid
    user.write_bytes(b"mine")
    dead = tmp_path / "x.idx.tmp.9999999"
    dead.write_bytes(b"left by a dead writer")
    assert sweep_leftovers(str(tmp_path / "x"), min_age_s=0) == ["x.idx.tmp.9999999"]
    assert user.read_bytes() == b"mine" and not dead.exists()


# ---------------------------------------------------------------- F3: other tools' checks
def test_generate_sample_file_check_reads_a_deep_first_line_as_not_ours(tmp_path):
    from megatron_topo.commands.generate_neox import FIELDS, _ours

    p = tmp_path / "s.jsonl"
    p.write_text(DEEP + "\n")
    assert _ours(str(p)) is False
    p.write_text(json.dumps({k: 1 for k in FIELDS}) + "\n")  # control
    assert _ours(str(p)) is True


def test_convert_marker_deep_is_not_a_conversion_record(tmp_path):
    from megatron_topo.commands.convert_to_hf_folders import MARKER, _marked, _marker_record

    (tmp_path / MARKER).write_text("[" * 2000 + "]" * 2000)  # within the marker's 4 KiB cap
    assert _marked(str(tmp_path)) == f"its {MARKER} cannot be read as a conversion's record"
    assert _marker_record(str(tmp_path / MARKER)) is False


def test_consolidate_output_check_deep_header(tmp_path):
    from megatron_topo.commands.consolidate_checkpoint import _not_ours

    p = tmp_path / "o.safetensors"
    p.write_bytes(len(DEEP).to_bytes(8, "little") + DEEP.encode())
    assert "is not a safetensors file written by consolidation" in _not_ours(str(p))


def test_metrics_resume_keeps_a_deep_line_in_place(tmp_path):
    from megatron_topo.metrics import _move_superseded

    p = tmp_path / "metrics.jsonl"
    lines = ['{"step": 1}\n', '{"step": 2}\n', DEEP + "\n", '{"step": 3}\n']
    p.write_text("".join(lines))
    assert _move_superseded(str(p), 1) == 2
    assert p.read_text() == lines[0] + lines[2]
    assert (tmp_path / "metrics.jsonl.superseded").read_text() == lines[1] + lines[3]


@pytest.mark.parametrize(
    "text, want",
    [
        (DEEP, "error: res.json: not valid JSON (nested too deeply)"),
        ('[{"x": ' + "9" * 5000 + "}]", "error: res.json: not valid JSON (an integer of more than 4,300 digits)"),
    ],
)
def test_predict_perf_emulated_bad_json_names_the_file(tmp_path, monkeypatch, capfd, text, want):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "res.json").write_text(text)
    assert call(predict_perf.main, ["--emulated", "res.json"]) == 2
    assert one_error_line(capfd) == want


@pytest.mark.parametrize("entry", ["preprocess_data", "train_tokenizer"])
def test_a_corpus_line_nested_deeply_is_a_bad_line(corpus, capfd, entry):
    (corpus / "c.jsonl").write_text(json.dumps({"text": "a"})[:-1] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}\n")
    if entry == "preprocess_data":
        rc = call(preprocess_data.main, _pre(inp="c.jsonl"))
    else:
        rc = call(
            train_tokenizer.main,
            ["--input", "c.jsonl", "--model-type", "bpe", "--vocab-size", "300", "--output", "t.json"],
        )
    line = one_error_line(capfd)
    assert rc != 0
    assert "c.jsonl:1: invalid JSON (nested too deeply)" in line, line


# ---------------------------------------------------------------- F9: lone surrogates
@pytest.mark.parametrize("entry", ["preprocess_data", "train_tokenizer"])
def test_a_lone_surrogate_in_a_corpus_line_is_refused_alike(corpus, capfd, entry):
    (corpus / "c.jsonl").write_text('{"text": "a\\ud800b"}\n' * 3)
    if entry == "preprocess_data":
        rc = call(preprocess_data.main, _pre(inp="c.jsonl"))
    else:
        rc = call(
            train_tokenizer.main,
            ["--input", "c.jsonl", "--model-type", "bpe", "--vocab-size", "300", "--output", "t.json"],
        )
    line = one_error_line(capfd)
    assert rc != 0
    assert "c.jsonl:1: key 'text' holds the lone surrogate U+D800" in line, line
    assert not os.path.exists("t.json") and not os.listdir("out")


def test_a_surrogate_pair_escape_is_text(corpus, capfd):
    """Control: a JSON escape of a surrogate pair is one character (U+1F600), accepted."""
    (corpus / "c.jsonl").write_text('{"text": "smile \\ud83d\\ude00 ok"}\n' * 3)
    assert call(preprocess_data.main, _pre(inp="c.jsonl")) == 0


def test_an_hf_index_name_with_a_lone_surrogate_is_one_line(tmp_path):
    from megatron_topo.safe_files import inside

    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"holds the lone surrogate U\+D800 .*; no file name can"):
        inside(str(tmp_path), "\ud800model.safetensors", "index weight_map", ValueError)
    assert inside(str(tmp_path), "model.safetensors", "w", ValueError) == str(tmp_path / "model.safetensors")


# ---------------------------------------------------------------- GPT-2 vocab.json / merges.txt
def _gpt2(tmp_path, vocab, merges=b"#version: 0.2\na b\n"):
    v, m = tmp_path / "vocab.json", tmp_path / "merges.txt"
    v.write_text(vocab if isinstance(vocab, str) else json.dumps(vocab))
    m.write_bytes(merges)
    return build_tokenizer("GPT2BPETokenizer", str(v), merge_file=str(m))


GOOD_VOCAB = {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}


@pytest.mark.parametrize(
    "vocab, merges, want",
    [
        (DEEP, None, r"vocab\.json: not a GPT-2 vocab\.json \(nested too deeply\)"),
        ({**GOOD_VOCAB, "c": -5}, None, r"token 'c' has id -5; ids are integers in \[0, 4,294,967,295\]"),
        ({**GOOD_VOCAB, "c": 1 << 32}, None, r"token 'c' has id 4294967296"),
        (GOOD_VOCAB, b"#version: 0.2\na \xffb\n", r"merges\.txt: not UTF-8 text \(byte 0xff at offset 16\)"),
    ],
    ids=["deep", "negative-id", "over-u32-id", "merges-not-utf8"],
)
def test_a_bad_gpt2_vocab_is_one_data_error(tmp_path, vocab, merges, want):
    with pytest.raises(DataError, match=want):
        _gpt2(tmp_path, vocab, merges or b"#version: 0.2\na b\n")


def test_a_good_gpt2_vocab_still_works(tmp_path):
    tok = _gpt2(tmp_path, GOOD_VOCAB)
    assert tok.tokenize("ab") == [2] and tok.eod == 3


# ---------------------------------------------------------------- F10: tokenizer files capped
_SPARSE = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # the old whole-file read dies, not the machine
    from megatron_topo.data import DataError
    from megatron_topo.data.tokenizer import build_tokenizer
    kind, path, merges = sys.argv[1], sys.argv[2], sys.argv[3] or None
    try:
        build_tokenizer(kind, path, merge_file=merges)
    except DataError as e:
        print("DataError:", e)
    """
)


@pytest.mark.parametrize(
    "kind, name", [("SPMTokenizer", "s.model"), ("GPT2BPETokenizer", "vocab.json"), ("HFTokenizer", "tokenizer.json")]
)
def test_a_huge_sparse_tokenizer_file_is_refused_at_once(tmp_path, kind, name):
    big = tmp_path / name
    with open(big, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB, sparse: no disk used
    merges = tmp_path / "merges.txt"
    merges.write_text("#version: 0.2\n")
    try:
        r = subprocess.run(
            [sys.executable, "-c", _SPARSE, kind, str(big), str(merges) if kind == "GPT2BPETokenizer" else ""],
            capture_output=True,
            text=True,
            timeout=25,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{kind}: {name} of 3 GiB was still being read after 25 s")
    assert r.stdout.strip() == (
        f"DataError: {big}: 3,221,225,472 bytes; a tokenizer file ({_KINDS[kind]}) is at most "
        f"1,073,741,824 bytes (1 GiB): is it the right file?"
    ), (r.stdout[-500:], r.stderr[-1500:])


_KINDS = {
    "SPMTokenizer": "a sentencepiece .model",
    "GPT2BPETokenizer": "GPT-2's vocab.json",
    "HFTokenizer": "a tokenizers JSON file",
}


# ---------------------------------------------------------------- F10: a metrics step is a JSON integer
@pytest.mark.parametrize("step", ["1e-400", "5.0000000000000001", "true", "2.0"])
def test_a_metrics_record_whose_step_is_no_json_integer_is_skipped(tmp_path, step):
    from megatron_topo.metrics import read_metrics

    p = tmp_path / "metrics.jsonl"
    good = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3, 4))
    p.write_text(good + '{"step": ' + step + ', "loss": 1.0}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = read_metrics(str(p), last_per_step=True)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert len(caught) == 1 and f"{p}:5: skipping a record whose step" in str(caught[0].message)


def test_plot_metrics_refuses_a_float_step_instead_of_hiding_records(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mr").mkdir()
    good = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3, 4))
    (tmp_path / "mr" / "metrics.jsonl").write_text(good + '{"step": 1e-400, "loss": 1.0}\n')
    assert call(plot_metrics.main, ["mr", "--out", "p.png"]) == 2
    line = one_error_line(capfd)
    assert "a record has step 0.0 (a JSON float); steps must be integers" in line, line
    assert not (tmp_path / "p.png").exists()


# ---------------------------------------------------------------- digits: checkpoint step names
def test_prune_keeps_a_step_name_in_other_digits(tmp_path):
    from megatron_topo.zero_topo.checkpoint import storage

    for d in ("global_step1", "global_step2", "global_step\u0663", "global_step\u00b2"):
        (tmp_path / d).mkdir()
    storage.prune(str(tmp_path), keep_last=1)
    assert sorted(os.listdir(tmp_path)) == sorted(["global_step2", "global_step\u0663", "global_step\u00b2"])


def test_bench_cpu_fit_meta_nested_deeply_is_one_line(tmp_path):
    """A member the probe did not list: bench_sharding's ``--cpu-fit DIR`` reads DIR/meta.json."""
    from megatron_topo.analysis.bench import accum

    (tmp_path / "meta.json").write_text(DEEP)
    with pytest.raises(SystemExit) as e:
        accum.earlier_fit(str(tmp_path), {})
    assert str(e.value.code).endswith("meta.json: not valid JSON (nested too deeply))"), e.value.code


def test_an_output_check_never_opens_a_fifo_beside_the_file(corpus):
    """preprocess_data --force over PREFIX.bin checks PREFIX.idx's header: a FIFO there was opened
    blocking (safe_outputs.head), a hang; it is now read non-blocking and is no dataset index."""
    (corpus / "out" / "x_text_document.bin").write_bytes(b"mine")
    os.mkfifo(corpus / "out" / "x_text_document.idx")
    try:
        r = subprocess.run(
            [sys.executable, os.path.join(ROOT, "tools", "preprocess_data.py"), *_pre(), "--force"],
            capture_output=True,
            text=True,
            timeout=25,
            cwd=corpus,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("preprocess_data waited on the FIFO out/x_text_document.idx")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "error: --output-prefix out/x_text_document.bin exists and is not part of a dataset (no dataset index "
        "out/x_text_document.idx beside it); it is not replaced, even with --force: write it elsewhere"
    ], r.stderr[-2000:]
    assert (corpus / "out" / "x_text_document.bin").read_bytes() == b"mine"
