"""One document is read with a cap (corpus_files.MAX_DOCUMENT_BYTES): a single endless line or a
huge plain-text file is one ``error:`` line naming the file and the line, not a read that grows
until the kernel kills the job (issue 29, probe 4's tt-input-huge-sparse: a 3 GiB line without a
newline grew train_tokenizer to ~24 GiB). Every reader is capped: plain, .zst, .gz, .xz JSON lines,
and plain-text files; lines up to the cap, and the zstd reader's output, stay byte-identical."""

import gzip
import io
import lzma
import time

import pytest
import zstandard

from megatron_topo.commands import preprocess_data, train_tokenizer
from megatron_topo.data import corpus_files
from megatron_topo.data.corpus import expand_sources, iter_source_documents
from megatron_topo.data.errors import DataError

from .cli_cases import call

CAP = 1 << 16


def _write(path, data: bytes):
    if path.suffix == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    elif path.suffix == ".gz":
        data = gzip.compress(data)
    elif path.suffix == ".xz":
        data = lzma.compress(data)
    path.write_bytes(data)


def _doc(n: int) -> bytes:
    return b'{"text": "' + b"a" * (n - len(b'{"text": ""}\n')) + b'"}\n'


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst", ".jsonl.gz", ".jsonl.xz"])
def test_a_line_over_the_cap_is_an_error_naming_file_and_line(tmp_path, monkeypatch, suffix):
    monkeypatch.setattr(corpus_files, "MAX_DOCUMENT_BYTES", CAP)
    p = tmp_path / f"in{suffix}"
    _write(p, _doc(100) + _doc(CAP) + _doc(CAP + 1) + _doc(100))
    with pytest.raises(DataError) as e:
        list(iter_source_documents(expand_sources([str(p)])))
    assert f"{p}: line 3 is longer than {CAP} bytes" in str(e.value), e.value


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst", ".jsonl.gz"])
def test_an_unterminated_last_line_over_the_cap_is_an_error(tmp_path, monkeypatch, suffix):
    monkeypatch.setattr(corpus_files, "MAX_DOCUMENT_BYTES", CAP)
    p = tmp_path / f"in{suffix}"
    _write(p, _doc(100) + b'{"text": "' + b"\0" * (4 * CAP))
    with pytest.raises(DataError, match="line 2 is longer than"):
        list(iter_source_documents(expand_sources([str(p)])))


def test_lines_up_to_the_cap_are_read_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_files, "MAX_DOCUMENT_BYTES", CAP)
    docs = [_doc(n) for n in (20, CAP, 300, CAP - 1, 17)]
    for suffix in (".jsonl", ".jsonl.zst", ".jsonl.gz", ".jsonl.xz"):
        p = tmp_path / f"ok{suffix}"
        _write(p, b"".join(docs))
        assert [len(t) for t in iter_source_documents(expand_sources([str(p)]))] == [
            len(d) - len(b'{"text": ""}\n') for d in docs
        ], suffix


def test_zst_reader_is_exact_across_frames_and_tiny_feeds(tmp_path):
    """Lines that span many feeds, several frames, and a last line without newline."""
    data = b"".join(b"x" * (i * 37 % 5000) + b"\n" for i in range(400)) + b"tail"
    c = zstandard.ZstdCompressor()
    p = tmp_path / "m.zst"
    p.write_bytes(c.compress(data[:70000]) + c.compress(data[70000:]))
    for feed in (1, 7, 4096):
        got = list(corpus_files._zst_lines(str(p), read_size=1000, feed_size=feed))
        assert got == io.BytesIO(data).readlines(), feed


def test_zst_reader_output_per_call_is_bounded(tmp_path):
    """A zstd bomb (GiB of one byte value from KiB of input) is never decompressed whole: with the
    cap at 1 MiB, a 2 GiB line ends as an error at once, holding at most a few feeds' output."""
    c = zstandard.ZstdCompressor(level=1)
    p = tmp_path / "bomb.jsonl.zst"
    zeros = b"\0" * (64 << 20)
    with open(p, "wb") as f, c.stream_writer(f) as w:
        for _ in range(32):
            w.write(zeros)
    assert p.stat().st_size < 1 << 20
    old = corpus_files.MAX_DOCUMENT_BYTES
    corpus_files.MAX_DOCUMENT_BYTES = 1 << 20
    try:
        t = time.monotonic()
        with pytest.raises(DataError, match="line 1 is longer than 1 MiB"):
            list(corpus_files._zst_lines(str(p)))
        assert time.monotonic() - t < 5
    finally:
        corpus_files.MAX_DOCUMENT_BYTES = old


def test_plain_text_file_over_the_cap_is_skippable_bad_input(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_files, "MAX_DOCUMENT_BYTES", CAP)
    (tmp_path / "big.txt").write_bytes(b"b" * (CAP + 1))
    (tmp_path / "ok.txt").write_bytes(b"c" * CAP)
    srcs = expand_sources([str(tmp_path / "big.txt"), str(tmp_path / "ok.txt")])
    with pytest.raises(DataError, match=r"big.txt: longer than 65536 bytes.*--skip-bad-lines"):
        list(iter_source_documents(srcs))
    seen = []
    docs = list(iter_source_documents(srcs, skip_bad_lines=True, warn=seen.append))
    assert docs == ["c" * CAP] and len(seen) == 1 and "big.txt" in seen[0]


@pytest.mark.parametrize("tool", ["train_tokenizer", "preprocess_data"])
@pytest.mark.parametrize("kind", ["txt", "jsonl", "zst"])
def test_tools_refuse_a_huge_document_quickly(tmp_path, monkeypatch, capfd, tool, kind):
    """At the real cap: a 300 MiB document (sparse, or 300 KiB of zstd) is one error line within
    seconds, before any output is written."""
    monkeypatch.chdir(tmp_path)
    n = 300 << 20
    if kind == "txt":
        name = "h.txt"
        with open(name, "wb") as f:
            f.truncate(n)
    elif kind == "jsonl":
        name = "h.jsonl"
        with open(name, "wb") as f:
            f.write(b'{"text": "')
            f.seek(n)
            f.write(b'"}\n')
    else:
        name = "h.jsonl.zst"
        with open(name, "wb") as f, zstandard.ZstdCompressor(level=1).stream_writer(f) as w:
            w.write(b'{"text": "')
            for _ in range(n >> 24):
                w.write(b"\0" * (1 << 24))
            w.write(b'"}\n')
    if tool == "train_tokenizer":
        argv = ["--input", name, "--model-type", "bpe", "--vocab-size", "300", "--output", "t.json"]
        entry = train_tokenizer.main
    else:
        argv = ["--input", name, "--output-prefix", "out/x", "--tokenizer-type", "CharLevelTokenizer"]
        entry = preprocess_data.main
    t = time.monotonic()
    assert call(entry, argv) not in (0, None)
    assert time.monotonic() - t < 30
    err = capfd.readouterr().err
    errors = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-2000:]
    line = errors[0]
    assert name in line and "longer than 256 MiB" in line, line
    assert not (tmp_path / "t.json").exists() and not list((tmp_path).glob("out/*"))
