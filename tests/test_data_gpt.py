"""GPT samples (Megatron semantics, checked against a port of Megatron-LM's reference loops),
train/valid/test split, cached indices, blending, the built-in corpus and build_datasets' contract."""

import pickle
import threading

import numpy as np
import pytest

from megatron_topo.config import DataConfig
from megatron_topo.data import BlendedDataset, DataError, GPTDataset, MMapIndexedDataset, build_datasets
from megatron_topo.data import gpt_dataset as G
from megatron_topo.data.blending import build_blending_indices

from .data_cases import write_pair


# ------------------------------------------------------------------ Megatron-LM reference (ported)
def _ref_doc_idx(documents, num_epochs, rng, separate_last_epoch):
    if not separate_last_epoch or num_epochs == 1:
        doc_idx = np.mgrid[0:num_epochs, 0 : len(documents)][1]
        doc_idx[:] = documents
        doc_idx = doc_idx.reshape(-1).astype(np.int32)
        rng.shuffle(doc_idx)
        return doc_idx
    first = _ref_doc_idx(documents, num_epochs - 1, rng, False)
    last = _ref_doc_idx(documents, 1, rng, False)
    return np.concatenate((first, last))


def _ref_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch):  # helpers.cpp
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    out = np.zeros((num_samples + 1, 2), np.int64)
    index, offset = 0, 0
    for s in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            length = sizes[doc_idx[index]] - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                index += 1
                offset = 0
        out[s] = (index, offset)
    return out


def _ref_shuffle_idx(num_samples, total_size, rng):
    first = np.arange(num_samples, dtype=np.uint32)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=np.uint32)
    rng.shuffle(last)
    return np.concatenate((first, last))


def _ref_mappings(sizes, documents, num_samples, seq_length, seed):
    tokens_per_epoch = int(np.sum(sizes[documents]))
    num_epochs, tokens = 0, 0
    while True:
        num_epochs += 1
        tokens += tokens_per_epoch
        if (tokens - 1) // seq_length >= num_samples:
            break
    rng = np.random.RandomState(seed=seed)
    separate = False
    if num_epochs > 1:
        minus_one = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        separate = num_samples - minus_one < int(0.80 * ((tokens_per_epoch - 1) // seq_length))
    doc_idx = _ref_doc_idx(documents, num_epochs, rng, separate)
    sample_idx = _ref_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)
    shuffle_idx = _ref_shuffle_idx(minus_one if separate else len(sample_idx) - 1, len(sample_idx) - 1, rng)
    return doc_idx, sample_idx, shuffle_idx


def _ref_blend(weights, size):
    current = [0] * len(weights)
    di, si = [], []
    for i in range(size):
        x = max(float(i), 1.0)
        errors = [w * x - c for w, c in zip(weights, current)]
        best = max(range(len(weights)), key=lambda d: (errors[d], -d))
        di.append(best)
        si.append(current[best])
        current[best] += 1
    return di, si


# ------------------------------------------------------------------ fixtures
def _make(prefix, n_docs=60, seed=0, low=0, high=1000, zero_every=0):
    rng = np.random.default_rng(seed)
    docs = []
    for k in range(n_docs):
        size = 0 if zero_every and k % zero_every == 0 else int(rng.integers(1, 90))
        docs.append(rng.integers(low, high, size).tolist())
    write_pair(str(prefix), 8, docs)
    return docs


@pytest.fixture
def data(tmp_path):
    prefix = tmp_path / "corpus_text_document"
    docs = _make(prefix)
    return str(prefix), docs


def _cfg(tmp_path, **kw):
    return DataConfig(data_cache_dir=str(tmp_path / "cache"), **kw)


# ------------------------------------------------------------------ tests
def test_split_ranges_follow_megatron():
    assert G.split_ranges("949,50,1", 1000) == [(0, 949), (949, 999), (999, 1000)]
    assert G.split_ranges("98/2", 51) == [(0, 50), (50, 51), (51, 51)]
    assert G.split_ranges("1", 7) == [(0, 7), (7, 7), (7, 7)]
    assert G.split_ranges("1,1,1", 10) == [(0, 4), (4, 7), (7, 10)]
    for bad in ("", "a,b", "1,2,3,4", "-1,2", "0,0,0"):
        with pytest.raises(DataError, match="expected up to 3 non-negative numbers"):
            G.split_ranges(bad, 10)


@pytest.mark.parametrize(
    "n_docs,zero_every,num_samples,seq_length,seed",
    [(40, 0, 10, 16, 1), (40, 5, 200, 16, 2), (25, 3, 37, 7, 3), (60, 0, 1, 128, 4), (30, 0, 95, 20, 5)],
)
def test_index_mappings_match_megatron_reference(tmp_path, n_docs, zero_every, num_samples, seq_length, seed):
    docs = _make(tmp_path / "d", n_docs, seed, zero_every=zero_every)
    sizes = np.array([len(d) for d in docs], np.int32)
    documents = np.arange(3, n_docs, dtype=np.int32)
    ours = G.build_index_mappings(sizes, documents, num_samples, seq_length, seed)
    ref_doc, ref_sample, ref_shuffle = _ref_mappings(sizes, documents, num_samples, seq_length, seed)
    assert np.array_equal(ours["doc_idx"], ref_doc)
    assert np.array_equal(ours["shuffle_idx"], ref_shuffle)
    assert np.array_equal(ours["sample_idx"][1:], ref_sample[1:])  # row 0 may skip leading empty docs
    ds = GPTDataset(
        "train", MMapIndexedDataset(str(tmp_path / "d")), (3, n_docs), num_samples, seq_length, seed, cache=None
    )
    stream = np.concatenate([docs[d] for d in ref_doc])  # the epochs' documents, back to back
    assert len(ds) >= num_samples
    for i in range(len(ds)):
        j = int(ref_shuffle[i])
        sample = ds[i]
        assert sample.dtype == np.int64 and sample.shape == (seq_length + 1,)
        assert np.array_equal(sample, stream[j * seq_length : j * seq_length + seq_length + 1])


def test_build_datasets_split_and_determinism(tmp_path, data):
    prefix, docs = data
    kw = dict(seq_length=32, seed=7, num_samples=(100, 20, 5), vocab_size=1024)
    train, valid, test = build_datasets(_cfg(tmp_path, data_path=prefix, split="80,15,5"), **kw)
    assert (train.doc_idx.min(), train.doc_idx.max()) == (0, 47)
    assert set(np.unique(valid.doc_idx)) == set(range(48, 57)) and set(np.unique(test.doc_idx)) == set(range(57, 60))
    assert len(train) >= 100 and len(valid) >= 20 and len(test) >= 5
    other = tmp_path / "other"
    again = build_datasets(_cfg(other, data_path=prefix, split="80,15,5"), **kw)
    for a, b in zip((train, valid, test), again):
        assert all(np.array_equal(a[i], b[i]) for i in range(len(a)))
    reseeded = build_datasets(_cfg(other, data_path=prefix, split="80,15,5"), **{**kw, "seed": 8})[0]
    assert not all(np.array_equal(train[i], reseeded[i]) for i in range(20))
    none_valid = build_datasets(_cfg(tmp_path, data_path=prefix, split="100,0,0"), **kw)
    assert none_valid[1] is None and none_valid[2] is None
    assert build_datasets(_cfg(tmp_path, data_path=prefix), **{**kw, "num_samples": (10, 0, 0)})[1:] == (None, None)


def test_index_cache_is_reused_and_rebuilt_when_stale(tmp_path, data, monkeypatch):
    prefix, _ = data
    cfg = _cfg(tmp_path, data_path=prefix, split="1")
    kw = dict(seq_length=16, seed=1, num_samples=(50, 0, 0), vocab_size=1024)
    first = build_datasets(cfg, **kw)[0]
    cache = tmp_path / "cache" / "index"
    assert len(list(cache.glob("*.json"))) == 2 and len(list(cache.glob("*.npy"))) == 3  # + token range
    expected = [first[i].copy() for i in range(len(first))]
    calls = []
    real = G.build_index_mappings
    monkeypatch.setattr(G, "build_index_mappings", lambda *a: calls.append(a) or real(*a))
    second = build_datasets(cfg, **kw)[0]
    assert calls == [] and isinstance(second.shuffle_idx, np.memmap)
    assert all(np.array_equal(second[i], e) for i, e in enumerate(expected))
    _make(prefix, n_docs=70, seed=9)  # the data under the same prefix changed: params no longer match
    third = build_datasets(cfg, **kw)[0]
    assert len(calls) == 1 and third.doc_idx.max() == 69
    assert not list(cache.glob("*.tmp.*"))


def test_barrier_protocol_builder_and_loader(tmp_path, data):
    prefix, _ = data
    kw = dict(seq_length=16, seed=3, num_samples=(40, 8, 0), vocab_size=1024)
    cfg = _cfg(tmp_path, data_path=prefix)
    with pytest.raises(DataError, match="missing after the barrier"):
        build_datasets(cfg, **kw, is_builder=False, barrier=lambda: None)
    sync = threading.Barrier(2, timeout=60)
    counts, results = {True: 0, False: 0}, {}

    def rank(is_builder):
        def barrier():
            counts[is_builder] += 1
            sync.wait()

        results[is_builder] = build_datasets(cfg, **kw, is_builder=is_builder, barrier=barrier)

    threads = [threading.Thread(target=rank, args=(b,)) for b in (False, True)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert counts == {True: 1, False: 1}
    for a, b in zip(results[True][:2], results[False][:2]):
        assert all(np.array_equal(a[i], b[i]) for i in range(len(a)))


def test_builder_failure_still_releases_the_barrier(tmp_path):
    calls = []
    with pytest.raises(DataError, match="file not found"):
        build_datasets(
            _cfg(tmp_path, data_path=str(tmp_path / "missing")),
            seq_length=8,
            seed=1,
            num_samples=(4, 0, 0),
            vocab_size=10,
            is_builder=True,
            barrier=lambda: calls.append(1),
        )
    assert calls == [1]


def test_blending_tracks_weights(tmp_path):
    a, b, c = (tmp_path / f"{n}_text_document" for n in "abc")
    _make(a, 30, 1, 0, 100)
    _make(b, 30, 2, 100, 200)
    _make(c, 30, 3, 200, 300)
    cfg = _cfg(
        tmp_path, train_data_paths=[str(a), str(b), str(c)], train_data_weights=[5, 3, 2], valid_data_paths=[str(b)]
    )
    train, valid, test = build_datasets(cfg, seq_length=8, seed=5, num_samples=(500, 10, 10), vocab_size=300)
    assert isinstance(train, BlendedDataset) and len(train) == 500 and test is None
    di, si = _ref_blend([0.5, 0.3, 0.2], 500)
    assert train.dataset_index.tolist() == di and train.dataset_sample_index.tolist() == si
    counts = np.cumsum(np.eye(3)[train.dataset_index], axis=0)
    n = np.arange(1, 501)[:, None]
    assert np.abs(counts - n * np.array([0.5, 0.3, 0.2])).max() <= 1.0  # tracks the weights at every prefix
    for i in range(0, 500, 7):
        assert train[i].min() // 100 == train.dataset_index[i]  # each sample comes from its dataset
    assert isinstance(valid, GPTDataset) and 100 <= valid[0].min() and valid[0].max() < 200
    with pytest.raises(DataError, match="2 weights for 3 datasets"):
        build_datasets(
            _cfg(tmp_path, train_data_paths=[str(a), str(b), str(c)], train_data_weights=[1, 2]),
            seq_length=8,
            seed=5,
            num_samples=(10, 0, 0),
            vocab_size=300,
        )
    assert build_blending_indices([0.25, 0.75], 8)[0].tolist() == _ref_blend([0.25, 0.75], 8)[0]
    clone = pickle.loads(pickle.dumps(train))
    assert len(pickle.dumps(train)) < 50_000 and np.array_equal(clone[123], train[123])


def test_token_id_at_or_above_vocab_size(tmp_path):
    prefix = tmp_path / "big_text_document"
    write_pair(str(prefix), 8, [[1, 2, 3], [4, 300, 5]])
    kw = dict(seq_length=2, seed=1, num_samples=(2, 0, 0))
    with pytest.raises(DataError) as e:
        build_datasets(_cfg(tmp_path, data_path=str(prefix)), vocab_size=300, **kw)
    msg = str(e.value)
    assert "big_text_document" in msg and "token id 300" in msg and "vocab_size 300" in msg
    assert build_datasets(_cfg(tmp_path, data_path=str(prefix)), vocab_size=301, **kw)[0] is not None


def test_bad_data_config_errors(tmp_path, data):
    prefix, _ = data
    kw = dict(seq_length=8, seed=1, num_samples=(4, 0, 0), vocab_size=1024)
    with pytest.raises(DataError, match="did you mean .*corpus_text_document"):
        build_datasets(_cfg(tmp_path, data_path=prefix[: -len("_text_document")]), **kw)
    with pytest.raises(DataError, match="split 'x'"):
        build_datasets(_cfg(tmp_path, data_path=prefix, split="x"), **kw)
    with pytest.raises(DataError, match="no data given"):
        build_datasets(_cfg(tmp_path, data_path=None), **kw)
    empty = tmp_path / "empty"
    write_pair(str(empty), 8, [[], []])
    with pytest.raises(DataError, match="no tokens"):
        build_datasets(_cfg(tmp_path, data_path=str(empty)), **kw)


def test_builtin_corpus_built_once_and_reused(tmp_path):
    from megatron_topo.data import build_tokenizer
    from megatron_topo.data.builtin import stdlib_files

    cfg = _cfg(tmp_path, builtin_corpus_bytes=300_000, split="949,50,1")  # a validation split at this size
    train, valid, _ = build_datasets(cfg, seq_length=64, seed=1, num_samples=(64, 8, 0), vocab_size=512)
    bins = list((tmp_path / "cache").glob("builtin_stdlib_*_text_document.bin"))
    assert len(bins) == 1 and train is not None and valid is not None
    mtime = bins[0].stat().st_mtime_ns
    again = build_datasets(cfg, seq_length=64, seed=1, num_samples=(64, 8, 0), vocab_size=512)[0]
    assert bins[0].stat().st_mtime_ns == mtime
    assert all(np.array_equal(train[i], again[i]) for i in range(len(train)))
    ds = train.indexed
    assert ds.document(0).tolist()[-1] == 256  # EOD after each file
    text = build_tokenizer("ByteLevel", None).detokenize(ds.document(0).tolist())
    with open(stdlib_files(300_000)[0], encoding="utf-8") as f:
        assert text == f.read()
    state = pickle.dumps(train)
    assert len(state) < 20_000  # DataLoader workers re-map the files instead of copying arrays
    clone = pickle.loads(state)
    assert np.array_equal(clone[3], train[3])
