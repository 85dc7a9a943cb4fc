"""GPT-NeoX / Megatron-LM preprocessing compatibility (tools/preprocess_data.py):

- the same documents give byte-identical .bin/.idx from every container: .jsonl, .jsonl.zst/.gz/.xz,
  parquet, .arrow, a ``datasets`` save_to_disk folder (Dataset and DatasetDict), and
  ``datasets.load_dataset`` (json streamed, parquet materialized);
- NeoX's flags: comma-separated ``--input``, ``--merge-file`` with GPT2BPETokenizer (ids checked
  against a pure-Python GPT-2 BPE written here) and HFGPT2Tokenizer, ``--ftfy``, ``--num-docs``,
  ``--log-interval``, ``--dataset-impl``, ``--vocab``; Megatron's ``--json-keys``,
  ``--tokenizer-model`` and its no-op / refused flags;
- bad inputs: one ``error:`` line, exit 1, existing output untouched.
"""

import filecmp
import gzip
import json
import lzma
import os

import pytest

from megatron_topo.data import MMapIndexedDataset, build_tokenizer
from megatron_topo.data.preprocess import preprocess

from .data_cases import SAMPLES, error_line, run_tool, write_corpus, write_jsonl

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """No hub here: datasets must never try the network, and caches stay in tmp."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))


def _docs(n=5000):
    """Enough documents for several chunks (2048 rows each); unicode, long, empty and blank-ish texts."""
    out = []
    for i in range(n):
        text = f"doc {i} " + "héllo wörld 日本 🙂 " * (i % 7) + "x" * (i % 131)
        if i % 997 == 5:
            text = ""  # empty documents are left out, the same way from every container
        out.append({"text": text, "title": f"T{i}", "meta": {"n": i}})
    return out


def _same(a, b, keys=("text",)):
    for key in keys:
        for suffix in (".bin", ".idx"):
            fa, fb = f"{a}_{key}_document{suffix}", f"{b}_{key}_document{suffix}"
            assert filecmp.cmp(fa, fb, shallow=False), (fa, fb)


def _bytes_of(prefix, key="text"):
    return [open(f"{prefix}_{key}_document{s}", "rb").read() for s in (".bin", ".idx")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("containers")
    docs = _docs()
    ref = write_jsonl(str(d / "ref.jsonl"), docs)
    raw = open(ref, "rb").read()
    write_jsonl(str(d / "c.jsonl.zst"), docs, compress=True)
    with gzip.open(d / "c.jsonl.gz", "wb") as f:
        f.write(raw)
    with lzma.open(d / "c.jsonl.xz", "wb") as f:
        f.write(raw)
    table = pa.table(
        {"text": [x["text"] for x in docs], "title": [x["title"] for x in docs], "n": [x["meta"]["n"] for x in docs]}
    )
    pq.write_table(table, d / "c.parquet", row_group_size=1500)  # row groups != our chunks
    flat = {"text": [x["text"] for x in docs], "title": [x["title"] for x in docs]}
    datasets.Dataset.from_dict(flat).save_to_disk(str(d / "saved"))
    half = len(docs) // 2
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(flat),
            "validation": datasets.Dataset.from_dict({k: v[:half] for k, v in flat.items()}),
        }
    ).save_to_disk(str(d / "saved_dict"))
    arrow = [f for f in os.listdir(d / "saved") if f.endswith(".arrow")]
    assert len(arrow) == 1
    return {"dir": d, "docs": docs, "ref": ref, "arrow": str(d / "saved" / arrow[0])}


def _run(inputs, prefix, **kw):
    kw.setdefault("append_eod", True)
    return preprocess(inputs, str(prefix), "ByteLevel", keys=("text", "title"), progress=False, **kw)


def test_every_container_gives_the_same_bytes(corpus, tmp_path):
    d = corpus["dir"]
    st = _run([corpus["ref"]], tmp_path / "ref")
    n_nonempty = sum(1 for x in corpus["docs"] if x["text"])
    assert st.documents == n_nonempty and st.empty == len(corpus["docs"]) - n_nonempty
    ds = MMapIndexedDataset(str(tmp_path / "ref_text_document"))  # and it holds what it should
    assert ds.document(1).tolist() == list(corpus["docs"][1]["text"].encode()) + [256]
    cases = {
        "zst": dict(inputs=[str(d / "c.jsonl.zst")]),
        "gz": dict(inputs=[str(d / "c.jsonl.gz")]),
        "xz": dict(inputs=[str(d / "c.jsonl.xz")]),
        "parquet": dict(inputs=[str(d / "c.parquet")]),
        "arrow": dict(inputs=[corpus["arrow"]]),
        "save_to_disk": dict(inputs=[str(d / "saved")]),
        "save_to_disk_dict": dict(inputs=[str(d / "saved_dict")], hf_split="train"),
        "load_dataset_json_streamed": dict(inputs=[], hf_dataset={"path": "json", "data_files": [corpus["ref"]]}),
        "load_dataset_parquet_cached": dict(
            inputs=[],
            hf_dataset={
                "path": "parquet",
                "data_files": [str(d / "c.parquet")],
                "streaming": False,
                "cache_dir": str(tmp_path / "cache"),
            },
        ),
        "hf_dataset_saved_folder": dict(inputs=[], hf_dataset={"path": str(d / "saved")}),
        "two_workers_gz": dict(inputs=[str(d / "c.jsonl.gz")], workers=2),
        "two_workers_parquet": dict(inputs=[str(d / "c.parquet")], workers=2),
    }
    for name, kw in cases.items():
        st = _run(kw.pop("inputs"), tmp_path / name, **kw)
        assert st.documents == n_nonempty, name
        _same(tmp_path / "ref", tmp_path / name, keys=("text", "title"))
    # the DatasetDict's other split is really another split
    _run([str(d / "saved_dict")], tmp_path / "val", hf_split="validation")
    assert MMapIndexedDataset(str(tmp_path / "val_title_document")).num_documents == len(corpus["docs"]) // 2


def test_save_to_disk_folder_via_cli_equals_jsonl(corpus, tmp_path):
    """The acceptance case, through the tool: a datasets folder == the same jsonl, byte for byte."""
    for name, src in (("a", corpus["ref"]), ("b", corpus["dir"] / "saved")):
        run_tool(
            "preprocess_data",
            "--input",
            src,
            "--output-prefix",
            tmp_path / name,
            "--tokenizer-type",
            "ByteLevel",
            "--append-eod",
            "--quiet",
            check=True,
        )
    _same(tmp_path / "a", tmp_path / "b")


def test_comma_separated_inputs_in_order(corpus, tmp_path):
    d = corpus["dir"]
    a = write_jsonl(str(tmp_path / "a.jsonl"), [{"text": "first"}, {"text": "second"}])
    both = write_jsonl(
        str(tmp_path / "both.jsonl"),
        [{"text": "first"}, {"text": "second"}] + [{"text": x["text"]} for x in corpus["docs"]],
    )
    run_tool(
        "preprocess_data",
        "--input",
        f"{a},{d / 'c.jsonl.gz'}",
        "--output-prefix",
        tmp_path / "comma",
        "--tokenizer-type",
        "ByteLevel",
        "--quiet",
        check=True,
    )
    run_tool(
        "preprocess_data",
        "--input",
        both,
        "--output-prefix",
        tmp_path / "one",
        "--tokenizer-type",
        "ByteLevel",
        "--quiet",
        check=True,
    )
    _same(tmp_path / "comma", tmp_path / "one")
    # a name that exists with a comma in it is one input
    odd = tmp_path / "x,y.jsonl"
    odd.write_text(json.dumps({"text": "comma name"}) + "\n")
    run_tool(
        "preprocess_data",
        "--input",
        odd,
        "--output-prefix",
        tmp_path / "odd",
        "--tokenizer-type",
        "ByteLevel",
        "--quiet",
        check=True,
    )
    assert MMapIndexedDataset(str(tmp_path / "odd_text_document")).document(0).tolist() == list(b"comma name")


# ------------------------------------------------------------------------------ GPT-2 BPE
def _bytes_to_unicode():
    """GPT-2's table, written out here (not imported): printable bytes map to themselves, the
    other 68 to chr(256 + k) in byte order."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    out, k = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + k)
            k += 1
    return out


def gpt2_reference_encode(text, vocab, merges):
    """GPT-2's encoder in plain Python (its published algorithm): regex pre-split, bytes to
    characters, then repeatedly merge the best-ranked adjacent pair."""
    import regex

    pat = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    ranks = {pair: r for r, pair in enumerate(merges)}
    b2u = _bytes_to_unicode()
    ids = []
    for piece in pat.findall(text):
        word = [b2u[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best = min(range(len(word) - 1), key=lambda i: ranks.get((word[i], word[i + 1]), float("inf")))
            pair = (word[best], word[best + 1])
            if pair not in ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == pair:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        ids += [vocab[w] for w in word]
    return ids


@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
    """vocab.json + merges.txt (and the same model as tokenizer.json) of a tiny BPE trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("gpt2")
    texts = [json.loads(line)["text"] for line in open(write_corpus(str(d)), encoding="utf-8")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=450,
            special_tokens=["<|endoftext|>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    vocab_path, merges_path = tok.model.save(str(d))
    tok.save(str(d / "tokenizer.json"))
    vocab = json.load(open(vocab_path, encoding="utf-8"))
    lines = open(merges_path, encoding="utf-8").read().splitlines()
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    assert len(merges) > 100
    return {
        "vocab": vocab_path,
        "merges": merges_path,
        "json": str(d / "tokenizer.json"),
        "vocab_map": vocab,
        "merge_list": merges,
        "texts": SAMPLES + texts + ["it's we're I'll 2024 ... ", "x <|endoftext|> y"],
    }


def test_gpt2bpe_with_merge_file_matches_reference_encoder(gpt2_files, tmp_path):
    texts = [t for t in gpt2_files["texts"] if t]
    src = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": t} for t in texts])
    run_tool(
        "preprocess_data",
        "--input",
        src,
        "--output-prefix",
        tmp_path / "o",
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--vocab",
        gpt2_files["vocab"],
        "--merge-file",
        gpt2_files["merges"],
        "--append-eod",
        "--quiet",
        check=True,
    )
    ds = MMapIndexedDataset(str(tmp_path / "o_text_document"))
    eod = gpt2_files["vocab_map"]["<|endoftext|>"]
    tok = build_tokenizer("GPT2BPETokenizer", gpt2_files["vocab"], merge_file=gpt2_files["merges"])
    assert (tok.vocab_size, tok.eod) == (len(gpt2_files["vocab_map"]), eod)
    merged = 0
    for k, text in enumerate(texts):
        want = gpt2_reference_encode(text, gpt2_files["vocab_map"], gpt2_files["merge_list"])
        assert ds.document(k).tolist() == want + [eod], text[:60]
        assert tok.detokenize(want) == text
        merged += len(want) < len(text.encode())
    assert merged > len(texts) // 2  # the merges are really used
    # "<|endoftext|>" inside text is plain text for GPT-2's encoder (not the EOD id)
    assert eod not in ds.document(len(texts) - 1).tolist()[:-1]


def test_hfgpt2_tokenizer_adds_padding_and_reads_a_folder(gpt2_files, tmp_path):
    tok = build_tokenizer("HFGPT2Tokenizer", gpt2_files["vocab"], merge_file=gpt2_files["merges"])
    base = len(gpt2_files["vocab_map"])
    assert tok.vocab_size == base + 1 and tok.pad == base  # <|padding|> appended, as GPT-NeoX does
    text = "return the string"
    assert tok.tokenize(text) == gpt2_reference_encode(text, gpt2_files["vocab_map"], gpt2_files["merge_list"])
    assert tok.tokenize("a<|endoftext|>b")[1] == tok.eod  # GPT2TokenizerFast recognises it
    folder = os.path.dirname(gpt2_files["vocab"])  # a from_pretrained-style folder (tokenizer.json)
    assert build_tokenizer("HFGPT2Tokenizer", folder).tokenize(text) == tok.tokenize(text)


def test_megatron_json_keys_and_tokenizer_model_aliases(gpt2_files, corpus, tmp_path):
    src = corpus["ref"]
    base = ["--input", src, "--tokenizer-type", "HFTokenizer", "--quiet"]
    run_tool(
        "preprocess_data",
        *base,
        "--vocab-file",
        gpt2_files["json"],
        "--jsonl-keys",
        "text",
        "title",
        "--output-prefix",
        tmp_path / "neox",
        check=True,
    )
    run_tool(
        "preprocess_data",
        *base,
        "--tokenizer-model",
        gpt2_files["json"],
        "--json-keys",
        "text",
        "title",
        "--output-prefix",
        tmp_path / "megatron",
        check=True,
    )
    _same(tmp_path / "neox", tmp_path / "megatron", keys=("text", "title"))
    # Megatron's no-op flags change nothing
    run_tool(
        "preprocess_data",
        *base,
        "--vocab-file",
        gpt2_files["json"],
        "--jsonl-keys",
        "text",
        "title",
        "--output-prefix",
        tmp_path / "noop",
        "--partitions",
        "4",
        "--keep-sequential-samples",
        "--keep-newlines",
        "--lang",
        "english",
        "--chunk-size",
        "25",
        "--dataset-impl",
        "mmap",
        check=True,
    )
    _same(tmp_path / "neox", tmp_path / "noop", keys=("text", "title"))


# ------------------------------------------------------------------------------ other NeoX flags
def test_ftfy_fixes_text_before_tokenizing(tmp_path):
    pytest.importorskip("ftfy")
    broken, fixed = "schÃ¶n â€” cafÃ©", "schön — café"
    src = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": broken}, {"text": "plain"}])
    for flag, want in (([], broken), (["--ftfy"], fixed)):
        prefix = tmp_path / ("f" if flag else "n")
        run_tool(
            "preprocess_data",
            "--input",
            src,
            "--output-prefix",
            prefix,
            "--tokenizer-type",
            "ByteLevel",
            "--quiet",
            *flag,
            check=True,
        )
        ds = MMapIndexedDataset(f"{prefix}_text_document")
        assert ds.document(0).tolist() == list(want.encode()) and ds.document(1).tolist() == list(b"plain")


def test_num_docs_and_log_interval(corpus, tmp_path):
    proc = run_tool(
        "preprocess_data",
        "--input",
        corpus["ref"],
        "--output-prefix",
        tmp_path / "o",
        "--tokenizer-type",
        "ByteLevel",
        "--num-docs",
        len(corpus["docs"]),
        "--log-interval",
        "2000",
        "--append-eod",
        check=True,
    )
    logged = [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if ln.startswith("processed ")]
    counts = [int(ln.split()[1]) for ln in logged]
    assert len(counts) == 2 and counts[0] >= 2000 and counts[1] >= 4000, proc.stderr  # chunk granularity
    assert "docs/s" in proc.stderr and "/5.00k [" in proc.stderr  # the bar counts documents of --num-docs
    _run([corpus["ref"]], tmp_path / "plain")
    assert _bytes_of(tmp_path / "o") == _bytes_of(tmp_path / "plain")


# ------------------------------------------------------------------------------ refusals and bad input
@pytest.fixture
def existing(tmp_path):
    prefix = tmp_path / "out"
    src = write_jsonl(str(tmp_path / "good.jsonl"), [{"text": "keep me"}])
    run_tool(
        "preprocess_data",
        "--input",
        src,
        "--output-prefix",
        prefix,
        "--tokenizer-type",
        "ByteLevel",
        "--quiet",
        check=True,
    )
    before = _bytes_of(prefix)
    yield prefix
    assert _bytes_of(prefix) == before
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]


def _fail(prefix, *args, tokenizer="ByteLevel"):
    return error_line(
        run_tool(
            "preprocess_data", *args, "--output-prefix", prefix, "--tokenizer-type", tokenizer, "--quiet", "--force"
        )
    )  # a failing run allowed to replace the output keeps it


def test_refused_flags_say_why(tmp_path, existing):
    src = str(tmp_path / "good.jsonl")
    assert "--dataset-impl lazy is not supported" in _fail(existing, "--input", src, "--dataset-impl", "lazy")
    assert "use mmap" in _fail(existing, "--input", src, "--dataset-impl", "cached")
    assert "NLTK" in _fail(existing, "--input", src, "--split-sentences")
    assert "T5" in _fail(existing, "--input", src, "--vocab-extra-ids", "100")
    assert "TiktokenTokenizer needs" in _fail(existing, "--input", src, tokenizer="TiktokenTokenizer")
    assert "use SPMTokenizer" in _fail(existing, "--input", src, tokenizer="GPTSentencePieceTokenizer")
    assert "--merge-file merges.txt" in _fail(
        existing, "--input", src, "--vocab-file", src, tokenizer="GPT2BPETokenizer"
    )
    assert "only GPT2BPETokenizer and HFGPT2Tokenizer" in _fail(existing, "--input", src, "--merge-file", src)
    assert "--num-docs: 0 must lie in [1," in _fail(existing, "--input", src, "--num-docs", "0")
    line = _fail(existing, "--input", src, "--bogus-flag")
    assert "unrecognized arguments: --bogus-flag" in line


def test_damaged_compressed_inputs(tmp_path, existing):
    raw = b"".join(json.dumps({"text": "y" * 3000 + str(i)}).encode() + b"\n" for i in range(200))
    gz = tmp_path / "cut.jsonl.gz"
    gz.write_bytes(gzip.compress(raw)[:-40])
    assert "cut.jsonl.gz: truncated gzip stream" in _fail(existing, "--input", gz)
    junk = tmp_path / "junk.jsonl.gz"
    junk.write_bytes(b"not gzip at all\n" * 20)
    line = _fail(existing, "--input", junk)
    assert "junk.jsonl.gz: cannot read (BadGzipFile" in line and "not UTF-8" not in line
    xz = tmp_path / "cut.jsonl.xz"
    xz.write_bytes(lzma.compress(raw)[: len(lzma.compress(raw)) // 2])
    assert "cut.jsonl.xz: truncated xz stream" in _fail(existing, "--input", xz)
    txt = tmp_path / "notes.txt.gz"
    txt.write_bytes(gzip.compress(b"hello"))
    assert "notes.txt.gz: compressed inputs must be JSON lines" in _fail(existing, "--input", txt)
    # a good .gz with a bad line names the line, as for .jsonl
    bad = tmp_path / "badline.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"text": "a"}\n{"text": \n'))
    assert "badline.jsonl.gz:2: invalid JSON" in _fail(existing, "--input", bad)


def test_bad_parquet_and_datasets_inputs(tmp_path, existing):
    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "nocol.parquet")
    line = _fail(existing, "--input", tmp_path / "nocol.parquet")
    assert "nocol.parquet: no column 'text' (columns: body)" in line and "--jsonl-keys" in line
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 but not really")
    assert "junk.parquet: not a readable parquet file" in _fail(existing, "--input", tmp_path / "junk.parquet")
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "null.parquet")
    assert "null.parquet row 2: key 'text' holds NoneType" in _fail(existing, "--input", tmp_path / "null.parquet")
    proc = run_tool(
        "preprocess_data",
        "--input",
        tmp_path / "null.parquet",
        "--output-prefix",
        tmp_path / "s",
        "--tokenizer-type",
        "ByteLevel",
        "--skip-bad-lines",
        "--quiet",
        check=True,
    )
    assert "skipped 1 bad" in proc.stdout
    assert [MMapIndexedDataset(str(tmp_path / "s_text_document")).document(k).tolist() for k in (0, 1)] == [
        list(b"a"),
        list(b"c"),
    ]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]})}).save_to_disk(str(tmp_path / "dd"))
    line = _fail(existing, "--input", tmp_path / "dd", "--hf-split", "test")
    assert "no split 'test' (splits: train)" in line
    line = _fail(existing, "--hf-dataset", "json", "--hf-data-files", tmp_path / "missing.jsonl")
    assert line.startswith("error: json: cannot open as a HuggingFace dataset")
    assert "--hf-dataset" in _fail(existing, "--hf-subset", "x", "--input", tmp_path / "good.jsonl")


def test_train_tokenizer_reads_the_same_containers(corpus, tmp_path):
    """tools/train_tokenizer.py takes the same inputs: a tokenizer trained from the .jsonl.gz equals
    the one trained from the .jsonl."""
    outs = []
    for name, src in (("a", corpus["ref"]), ("b", f"{corpus['dir'] / 'c.jsonl.gz'}")):
        out = tmp_path / f"{name}.json"
        run_tool(
            "train_tokenizer", "--input", src, "--model-type", "bpe", "--vocab-size", 300, "--output", out, check=True
        )
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
