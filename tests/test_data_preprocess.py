"""tools/preprocess_data.py: every input kind, parallel == serial output, and bad input (one line
on stderr, exit 1, existing output untouched)."""

import filecmp
import json
import os

import pytest

from megatron_topo.data import MMapIndexedDataset
from megatron_topo.data.preprocess import preprocess

from .data_cases import error_line, read_pair, run_tool, write_jsonl


def _docs(ds):
    return [ds.document(k).tolist() for k in range(ds.num_documents)]


def _b(text):
    return list(text.encode())


def test_all_input_kinds_in_order(tmp_path):
    a = write_jsonl(str(tmp_path / "a.jsonl"), [{"text": "one"}, {"text": "two", "meta": {"pile_set_name": "X"}}])
    z = str(tmp_path / "b.jsonl.zst")  # two zstd frames back to back
    write_jsonl(z + ".1", [{"text": "zst ü"}], compress=True)
    write_jsonl(z + ".2", [{"text": "frame 2"}], compress=True)
    with open(z, "wb") as f:
        f.write(open(z + ".1", "rb").read() + open(z + ".2", "rb").read())
    os.remove(z + ".1")
    os.remove(z + ".2")
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("file b")
    (d / "sub" / "a.py").write_text("print('a')\n")
    (d / ".hidden").write_text("ignored")
    proc = run_tool(
        "preprocess_data",
        "--input",
        a,
        z,
        d,
        "--output-prefix",
        tmp_path / "out",
        "--tokenizer-type",
        "ByteLevel",
        "--append-eod",
        check=True,
    )
    assert "B/s" in proc.stderr  # the progress bar reports throughput
    assert "6 documents" in proc.stdout
    code, seqs, doc_idx = read_pair(str(tmp_path / "out_text_document"))
    assert code == 8  # uint16
    texts = ["one", "two", "zst ü", "frame 2", "file b", "print('a')\n"]
    assert seqs == [_b(t) + [256] for t in texts]
    assert doc_idx == list(range(7))


def test_parallel_output_identical_to_serial(tmp_path):
    docs = [{"text": f"document {i} " + "x" * (i % 97)} for i in range(6000)]  # several chunks
    src = write_jsonl(str(tmp_path / "in.jsonl.zst"), docs, compress=True)
    for w in (1, 2):
        st = preprocess([src], str(tmp_path / f"w{w}"), "ByteLevel", workers=w, append_eod=True, progress=False)
        assert (st.documents, st.workers) == (6000, w)
    for suffix in (".bin", ".idx"):
        assert filecmp.cmp(
            tmp_path / f"w1_text_document{suffix}", tmp_path / f"w2_text_document{suffix}", shallow=False
        )
    ds = MMapIndexedDataset(str(tmp_path / "w2_text_document"))
    assert ds.document(5999).tolist() == _b(docs[5999]["text"]) + [256]


def test_several_keys_and_empty_documents(tmp_path):
    src = write_jsonl(
        str(tmp_path / "in.jsonl"),
        [{"text": "body", "title": "T"}, {"text": "", "title": "U"}, b"   ", {"text": "b2", "title": "V"}],
    )  # blank line: skipped
    run_tool(
        "preprocess_data",
        "--input",
        src,
        "--output-prefix",
        tmp_path / "o",
        "--tokenizer-type",
        "ByteLevel",
        "--jsonl-keys",
        "text",
        "title",
        check=True,
    )
    assert _docs(MMapIndexedDataset(str(tmp_path / "o_text_document"))) == [_b("body"), _b("b2")]
    assert _docs(MMapIndexedDataset(str(tmp_path / "o_title_document"))) == [_b("T"), _b("U"), _b("V")]


def test_char_level_with_large_vocab_writes_int32(tmp_path):
    src = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": "日本"}])
    run_tool(
        "preprocess_data",
        "--input",
        src,
        "--output-prefix",
        tmp_path / "o",
        "--tokenizer-type",
        "CharLevelTokenizer",
        "--vocab-size",
        70000,
        check=True,
    )
    code, seqs, _ = read_pair(str(tmp_path / "o_text_document"))
    assert code == 4 and seqs == [list("日本".encode("utf-8"))]  # GPT-NeoX: UTF-8 bytes


@pytest.fixture
def existing(tmp_path):
    """A previous good output that failing runs must leave byte for byte unchanged."""
    prefix = tmp_path / "out"
    src = write_jsonl(str(tmp_path / "good.jsonl"), [{"text": "keep me"}])
    run_tool("preprocess_data", "--input", src, "--output-prefix", prefix, "--tokenizer-type", "ByteLevel", check=True)
    files = [tmp_path / f"out_text_document{s}" for s in (".bin", ".idx")]
    snapshot = {f: f.read_bytes() for f in files}
    yield prefix
    assert {f: f.read_bytes() for f in files} == snapshot
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]


def _fail(prefix, *inputs, extra=()):
    """The error line of a failing run allowed to replace the previous output (--force)."""
    return error_line(
        run_tool(
            "preprocess_data",
            "--input",
            *inputs,
            "--output-prefix",
            prefix,
            "--tokenizer-type",
            "ByteLevel",
            "--force",
            *extra,
        )
    )


def test_invalid_json_line_names_file_and_line(tmp_path, existing):
    lines = [json.dumps({"text": f"doc {i}"}).encode() for i in range(3000)]
    lines.insert(2500, b'{"text": "unterminated')
    src = write_jsonl(str(tmp_path / "bad.jsonl"), lines)
    line = _fail(existing, src)
    assert "bad.jsonl:2501: invalid JSON" in line and "--skip-bad-lines" in line


def test_skip_bad_lines_goes_on(tmp_path):
    src = write_jsonl(
        str(tmp_path / "bad.jsonl"), [{"text": "a"}, b"not json", {"txt": "wrong key"}, {"text": 5}, {"text": "b"}]
    )
    proc = run_tool(
        "preprocess_data",
        "--input",
        src,
        "--output-prefix",
        tmp_path / "o",
        "--tokenizer-type",
        "ByteLevel",
        "--skip-bad-lines",
        check=True,
    )
    assert "bad.jsonl:2: invalid JSON" in proc.stderr and "bad.jsonl:3: no key 'text'" in proc.stderr
    assert "bad.jsonl:4: key 'text' holds int" in proc.stderr and "skipped 3 bad" in proc.stdout
    assert _docs(MMapIndexedDataset(str(tmp_path / "o_text_document"))) == [_b("a"), _b("b")]


@pytest.mark.parametrize("case", ["empty_file", "empty_dir", "missing", "blank_lines", "all_bad_skipped"])
def test_empty_or_missing_input(tmp_path, existing, case):
    extra = ()
    if case == "empty_file":
        src = tmp_path / "empty.jsonl"
        src.write_bytes(b"")
    elif case == "empty_dir":
        src = tmp_path / "nothing"
        src.mkdir()
    elif case == "missing":
        src = tmp_path / "missing.jsonl"
    elif case == "blank_lines":
        src = tmp_path / "blank.jsonl"
        src.write_bytes(b"\n  \n")
    else:
        src = write_jsonl(str(tmp_path / "bad.jsonl"), [b"[1, 2]"])
        extra = ("--skip-bad-lines",)
    line = _fail(existing, src, extra=extra)
    assert str(src) in line or "empty input" in line
    assert ("no such file" in line) if case == "missing" else ("empty input" in line)


def test_other_bad_inputs(tmp_path, existing):
    raw = tmp_path / "binary.txt"
    raw.write_bytes(b"ok\xff\xfe")
    assert "binary.txt: not UTF-8 text" in _fail(existing, raw)
    z = write_jsonl(str(tmp_path / "cut.jsonl.zst"), [{"text": "x" * 5000}] * 50, compress=True)
    with open(z, "r+b") as f:
        f.truncate(os.path.getsize(z) // 2)
    assert "cut.jsonl.zst: truncated zstd stream" in _fail(existing, z)
    junk = tmp_path / "junk.jsonl.zst"
    junk.write_bytes(b"not zstd at all" * 10)
    assert "junk.jsonl.zst: cannot read (ZstdError" in _fail(existing, junk)
    s = write_jsonl(str(tmp_path / "c.jsonl"), [{"text": "ok"}, {"text": "日"}])
    line = error_line(
        run_tool(
            "preprocess_data",
            "--input",
            s,
            "--output-prefix",
            existing,
            "--tokenizer-type",
            "CharLevelTokenizer",
            "--vocab-size",
            200,
            "--force",
        )
    )
    assert "c.jsonl:2: CharLevelTokenizer: byte 230" in line and "200 ids" in line
    line = error_line(
        run_tool("preprocess_data", "--input", s, "--output-prefix", existing, "--tokenizer-type", "Nope")
    )
    assert "'Nope' is not valid" in line


def test_zstd_lines_split_across_reads(tmp_path):
    from megatron_topo.data.corpus_files import _zst_lines

    docs = [{"text": "line %d " % i + "y" * (i % 13)} for i in range(200)]
    path = write_jsonl(str(tmp_path / "x.jsonl.zst"), docs, compress=True)
    got = list(_zst_lines(path, read_size=7))
    assert [json.loads(line)["text"] for line in got] == [d["text"] for d in docs]
    assert all(line.endswith(b"\n") for line in got)


def test_unwritable_output_is_one_line(tmp_path):
    src = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": "a"}])
    (tmp_path / "file").write_text("")
    line = error_line(
        run_tool(
            "preprocess_data",
            "--input",
            src,
            "--output-prefix",
            tmp_path / "file" / "o",
            "--tokenizer-type",
            "ByteLevel",
        )
    )
    assert "file" in line and "Errno" not in line
