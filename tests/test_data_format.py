"""MMIDIDX interop: files built byte by byte from the format description read back exactly, our
writer's files parse with an independent reader, and every kind of damaged index is refused with
one clear line."""

import os
import random
import struct

import numpy as np
import pytest

from megatron_topo.data import DataError, MMapIndexedDataset, MMapIndexedDatasetBuilder
from megatron_topo.data.indexed_dataset import best_fitting_dtype

from .data_cases import CODES, error_line, pack_index, read_pair, run_tool, vm_rss_kb, write_pair


@pytest.mark.parametrize("code", sorted(CODES))
def test_struct_built_files_read_back_exactly(tmp_path, code):
    rng = random.Random(code)
    lo, hi = {1: (0, 255), 2: (-128, 127), 3: (-32768, 32767), 8: (0, 65535)}.get(code, (-(2**31), 2**31 - 1))
    docs = [[rng.randint(lo, hi) for _ in range(rng.randint(0, 40))] for _ in range(25)]
    if code in (6, 7):  # exactly representable values
        docs = [[float(x % 4096) / 8 for x in d] for d in docs]
    prefix = str(tmp_path / "ds")
    write_pair(prefix, code, docs)
    ds = MMapIndexedDataset(prefix)
    assert ds.dtype == np.dtype(CODES[code])
    assert len(ds) == ds.num_documents == 25
    assert [ds[i].tolist() for i in range(25)] == docs
    assert ds.sizes.tolist() == [len(d) for d in docs]
    assert ds.num_tokens == sum(map(len, docs))
    d = docs[3]
    if len(d) > 3:
        assert ds.get(3, offset=1, length=2).tolist() == d[1:3]


def test_multi_sequence_documents(tmp_path):
    """GPT-NeoX files may hold several sequences per document (doc_idx not 0..n)."""
    prefix = str(tmp_path / "ds")
    seqs = [[1, 2], [3], [4, 5, 6], [7], [8, 9]]
    write_pair(prefix, 8, seqs, doc_idx=[0, 2, 3, 5])
    ds = MMapIndexedDataset(prefix)
    assert len(ds) == 5 and ds.num_documents == 3
    assert [ds.document(k).tolist() for k in range(3)] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    proc = run_tool("inspect_data", prefix, "--doc", 2, check=True)
    assert proc.stdout.strip() == "[7, 8, 9]"


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint8, np.int64])
def test_our_writer_parses_with_independent_reader(tmp_path, dtype):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 250, rng.integers(0, 30)).tolist() for _ in range(40)]
    prefix = str(tmp_path / "ours")
    with MMapIndexedDatasetBuilder(prefix, dtype) as b:
        for d in docs[:20]:
            b.add_document(d)
        flat = np.concatenate([np.asarray(d, dtype) for d in docs[20:]])
        b.add_documents(flat.tobytes(), [len(d) for d in docs[20:]])
        b.finalize()
    code, seqs, doc_idx = read_pair(prefix)
    assert CODES[code] == np.dtype(dtype).str or np.dtype(CODES[code]) == np.dtype(dtype)
    assert seqs == docs and doc_idx == list(range(41))
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]


def test_dtype_rule_follows_gpt_neox():
    assert best_fitting_dtype(257) == np.uint16
    assert best_fitting_dtype(50277) == np.uint16
    assert best_fitting_dtype(65499) == np.uint16
    assert best_fitting_dtype(65500) == np.int32


def test_failed_write_leaves_existing_dataset(tmp_path):
    prefix = str(tmp_path / "ds")
    write_pair(prefix, 8, [[1, 2, 3]])
    before = {s: open(prefix + s, "rb").read() for s in (".bin", ".idx")}
    with pytest.raises(RuntimeError):
        with MMapIndexedDatasetBuilder(prefix, np.uint16) as b:
            b.add_document([9, 9, 9, 9])
            raise RuntimeError("boom")
    assert {s: open(prefix + s, "rb").read() for s in (".bin", ".idx")} == before
    assert sorted(os.listdir(tmp_path)) == ["ds.bin", "ds.idx"]


# ------------------------------------------------------------------------------ damaged input
def _damage(prefix, kind):
    idx = open(prefix + ".idx", "rb").read()
    if kind == "truncated_header":
        idx = idx[:20]
    elif kind == "truncated_arrays":
        idx = idx[:-5]
    elif kind == "wrong_magic":
        idx = b"NOTANIDX\x00" + idx[9:]
    elif kind == "unknown_dtype":
        idx = idx[:17] + struct.pack("<B", 11) + idx[18:]
    elif kind == "bad_version":
        idx = idx[:9] + struct.pack("<Q", 2) + idx[17:]
    elif kind == "corrupted_sizes":  # a size no longer matches the pointers
        idx = idx[:34] + struct.pack("<i", 1000) + idx[38:]
    elif kind == "corrupted_doc_idx":
        idx = idx[:-8] + struct.pack("<q", 99)
    elif kind == "trailing_garbage":
        idx = idx + b"\x01" * 5
    elif kind == "short_bin":
        with open(prefix + ".bin", "r+b") as f:
            f.truncate(os.path.getsize(prefix + ".bin") - 2)
    with open(prefix + ".idx", "wb") as f:
        f.write(idx)


EXPECT = {
    "truncated_header": "truncated index",
    "truncated_arrays": "truncated index",
    "wrong_magic": "wrong magic",
    "unknown_dtype": "unknown dtype code 11",
    "bad_version": "version 2",
    "corrupted_sizes": "corrupted index",
    "corrupted_doc_idx": "corrupted index",
    "trailing_garbage": "trailing",
    "short_bin": "truncated .bin",
}


@pytest.mark.parametrize("kind", sorted(EXPECT))
def test_damaged_index_is_refused(tmp_path, kind):
    prefix = str(tmp_path / "ds")
    write_pair(prefix, 8, [[1, 2, 3], [4, 5], [6, 7, 8, 9]])
    _damage(prefix, kind)
    with pytest.raises(DataError) as e:
        MMapIndexedDataset(prefix)
    msg = str(e.value)
    assert EXPECT[kind] in msg and "\n" not in msg
    assert (prefix + ".bin" if kind == "short_bin" else prefix + ".idx") in msg
    if kind == "unknown_dtype":
        assert "8 (uint16)" in msg  # names what is valid
    line = error_line(run_tool("inspect_data", prefix, "--stats"))  # the CLI: one line, exit 1
    assert EXPECT[kind] in line


def test_damaged_index_cli_one_line(tmp_path):
    prefix = str(tmp_path / "ds")
    write_pair(prefix, 8, [[1, 2, 3]])
    _damage(prefix, "wrong_magic")
    line = error_line(run_tool("inspect_data", prefix, "--stats"))
    assert "wrong magic" in line and "ds.idx" in line
    missing = error_line(run_tool("inspect_data", str(tmp_path / "nope")))
    assert "file not found" in missing


def test_token_id_out_of_vocab_cli(tmp_path):
    prefix = str(tmp_path / "ds")
    write_pair(prefix, 8, [[1, 2, 3], [50432, 7]])
    line = error_line(run_tool("inspect_data", prefix, "--vocab-size", 50432))
    assert "token id 50432 is >= vocab_size 50432" in line and "ds" in line
    run_tool("inspect_data", prefix, "--vocab-size", 50433, check=True)


def test_inspect_stats_and_doc(tmp_path):
    import json

    prefix = str(tmp_path / "ds")
    write_pair(prefix, 8, [[1, 2, 3], [], [65535]])
    out = run_tool("inspect_data", prefix + ".idx", "--stats", check=True).stdout
    st = json.loads(out)
    assert (st["documents"], st["tokens"], st["dtype"]) == (3, 4, "uint16")
    assert json.loads(run_tool("inspect_data", prefix, "--doc", 2, check=True).stdout) == [65535]
    assert "out of range" in error_line(run_tool("inspect_data", prefix, "--doc", 3))


def test_reading_1gb_file_keeps_memory_flat(tmp_path):
    """Random samples from a 1 GiB (sparse) .bin: resident memory grows far less than 1 GiB."""
    from megatron_topo.data.gpt_dataset import GPTDataset

    prefix = str(tmp_path / "big")
    n_docs, doc_tokens = 1024, 512 * 1024  # uint16: 1 GiB
    with open(prefix + ".bin", "wb") as f:
        f.truncate(n_docs * doc_tokens * 2)
    with open(prefix + ".idx", "wb") as f:
        f.write(pack_index(8, [doc_tokens] * n_docs))
    before = vm_rss_kb()
    ds = MMapIndexedDataset(prefix)
    rng = np.random.default_rng(0)
    total = 0
    for _ in range(3000):
        i = int(rng.integers(n_docs))
        off = int(rng.integers(doc_tokens - 2049))
        total += int(ds.get(i, off, 2049).astype(np.int64).sum())
    gpt = GPTDataset("train", ds, (0, n_docs), 2000, 2048, 1234, cache=None)
    for i in rng.integers(len(gpt), size=2000):
        assert gpt[int(i)].shape == (2049,)
    grown_mb = (vm_rss_kb() - before) / 1024
    assert total == 0
    assert grown_mb < 128, f"resident memory grew by {grown_mb:.0f} MB reading a 1 GiB file"
