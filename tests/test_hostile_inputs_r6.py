"""Hostile inputs, probe 6 (issue 29), the members fixed in the session that ran it: a NUL
character or a path longer than PATH_MAX in any text key of a config (a ValueError / RecursionError
traceback from os.path before), integers of more than 4,300 digits in meta.json or
metrics.jsonl (Python's int_max_str_digits ValueError from json before); and from the next session,
the trace's rank_N.jsonl written through a link, into a hard-linked file or a FIFO (opened with
open(path, "w") before), and an index cache record that is a FIFO or /dev/zero (read blocking and
uncapped before: a hang, or memory until the process died)."""

import contextlib
import json
import os
import threading
import warnings

import pytest

from megatron_topo.commands import train as train_cli
from megatron_topo.metrics import read_metrics
from megatron_topo.zero_topo.checkpoint import CheckpointError, storage

from .cli_cases import BASE_CFG, call, one_error_line


@pytest.mark.parametrize(
    "text, want",
    [
        ('save: "runs/a\\0b"', "save='runs/a\\x00b' holds a NUL character"),
        ('tensorboard_dir: "tb\\0"', "tensorboard_dir='tb\\x00' holds a NUL character"),
        ('train_data_paths: ["data/toy", "x\\0y"]', "train_data_paths='x\\x00y' holds a NUL character"),
        ('save: "' + "d/" * 3000 + '"', "save='d/d/d/d/d/d/d/d/d/d/...' (6,000 characters) is 6,000 bytes"),
        ('load: "' + "x" * 5000 + '"', "is 5,000 bytes; a path or name is at most 4,095"),
    ],
)
def test_a_text_key_with_nul_or_beyond_path_max_is_one_line(tmp_path, monkeypatch, capfd, text, want):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yml").write_text(BASE_CFG)
    (tmp_path / "x.yml").write_text(text + "\n")
    assert call(train_cli.main, ["cfg.yml", "x.yml", "--set", "train_iters=1"]) == 2
    line = one_error_line(capfd)
    assert want in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yml", "x.yml"]  # nothing made


def test_a_meta_json_with_a_5000_digit_integer_is_unreadable_in_one_line(tmp_path):
    step = tmp_path / "global_step2"
    step.mkdir()
    (step / "meta.json").write_text('{"step": ' + "9" * 5000 + "}")
    with pytest.raises(CheckpointError, match=r"meta.json is unreadable: Exceeds the limit"):
        storage.read_meta(str(step))


def test_a_metrics_line_with_a_5000_digit_integer_is_skipped(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n" + '{"step": 2, "loss": ' + "9" * 5000 + "}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = read_metrics(str(p))
    assert [r["step"] for r in recs] == [1]
    assert [str(w.message) for w in caught] == [
        f"{p}:2: skipping a line that is not a record (Exceeds the limit (4300 digits) for integer string conversion)"
    ]


@pytest.mark.parametrize("kind", ["symlink", "fifo", "dir"])
def test_a_trace_folder_whose_rank_file_is_not_a_file_is_one_line(tmp_path, monkeypatch, capfd, kind):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yml").write_text(BASE_CFG)
    (tmp_path / "tr").mkdir()
    rank0 = tmp_path / "tr" / "rank_0.jsonl"
    {"symlink": lambda: rank0.symlink_to(tmp_path / "cfg.yml"), "fifo": lambda: os.mkfifo(rank0), "dir": rank0.mkdir}[
        kind
    ]()
    args = ["cfg.yml", "--set", "train_iters=1", "--set", "distributed.trace_collectives=tr"]
    assert call(train_cli.main, args) == 2  # a FIFO opened for writing would block here
    line = one_error_line(capfd)
    want = {"symlink": "a symbolic link", "fifo": "a FIFO", "dir": "a directory"}[kind]
    assert f"rank_0.jsonl is {want}, not a trace file of an earlier run" in line, line
    assert (tmp_path / "cfg.yml").read_text() == BASE_CFG


def test_a_trace_file_replaces_and_never_writes_through_a_link_or_a_hard_link(tmp_path):
    from megatron_topo.zero_topo.trace import CollectiveTrace

    keep = tmp_path / "keep.txt"
    keep.write_text("user data\n")
    os.link(keep, tmp_path / "rank_0.jsonl")  # a hard link: the same bytes under two names
    (tmp_path / "rank_1.jsonl").symlink_to(keep)  # past the config check (a race, another tool)
    for rank in (0, 1):
        t = CollectiveTrace(str(tmp_path), rank)
        t.record("all_gather", [0, 1], 8, __import__("torch").float32)
        t.close()
        p = tmp_path / f"rank_{rank}.jsonl"
        assert not p.is_symlink() and json.loads(p.read_text())["op"] == "all_gather"
    assert keep.read_text() == "user data\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["keep.txt", "rank_0.jsonl", "rank_1.jsonl"]


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "huge"])
def test_an_index_cache_record_that_is_no_record_is_built_again(tmp_path, capfd, kind):
    from megatron_topo.data import cache as C

    rec = tmp_path / "tokens.json"
    if kind == "fifo":
        os.mkfifo(rec)
    elif kind == "dev_zero":
        rec.symlink_to("/dev/zero")
    else:  # over the record cap (sparse: no disk used)
        with open(rec, "wb") as f:
            f.truncate(C.MAX_RECORD_BYTES + 1)
    got = {}
    t = threading.Thread(
        target=lambda: got.update(v=C.IndexCache(str(tmp_path)).get_json("tokens", {"a": 1}, lambda: [3, 7]))
    )
    t.start()
    t.join(20)
    assert not t.is_alive(), "reading the record blocked"
    assert got["v"] == [3, 7]
    assert json.loads(rec.read_text())["value"] == [3, 7]  # rebuilt in place: a regular file now
    err = capfd.readouterr().err
    want = {"fifo": "is a FIFO, not a file", "dev_zero": "is a device, not a file", "huge": "not a record of ours"}
    assert want[kind] in err, err


@pytest.mark.parametrize("key", ["keep_last", "seed", "num_workers", "checkpoint_factor", "eval_iters"])
@pytest.mark.parametrize("how", ["set", "yaml"])
def test_a_float_that_underflows_to_zero_is_no_integer(tmp_path, monkeypatch, capfd, key, how):
    """1e-400 reads as 0.0, which is integral: integer keys took it as 0 (keep_last 0: keep every
    step) while 1e-5 was refused; a float literal is an integer only if its text is one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yml").write_text(BASE_CFG)
    args = ["cfg.yml", "--set", "train_iters=1"]
    if how == "set":
        args += ["--set", f"{key}=1e-400"]
    else:
        (tmp_path / "x.yml").write_text(f"{key}: 1e-400\n")
        args.insert(1, "x.yml")
    assert call(train_cli.main, args) == 2
    line = one_error_line(capfd)
    assert f"{key}: expected an integer, got float 1e-400" in line, line


def test_an_integral_float_literal_is_still_an_integer():
    from megatron_topo.config import load_config

    cfg = load_config(["configs/tiny.yml"], ["keep_last=2.0", "seed=5e3", "eval_iters=1_0"])
    assert (cfg.checkpoint.keep_last, cfg.train.seed, cfg.logging.eval_iters) == (2, 5000, 10)


def test_a_file_name_with_a_nul_is_named_as_such_not_as_an_absolute_path(tmp_path):
    from megatron_topo.safe_files import inside

    with pytest.raises(ValueError) as e:
        inside(str(tmp_path), "model.safetensors\0", "model.safetensors.index.json weight_map", ValueError)
    assert "'model.safetensors\\x00', which holds a NUL character; no file name can" in str(e.value)
    assert "absolute" not in str(e.value)


_REC = '{"seq": 0, "op": "all_reduce", "group": [0, 1], "bytes": 8, "dtype": "float32"}\n'


@pytest.mark.parametrize(
    "content, want",
    [
        ("fifo", "rank_1.jsonl is a FIFO, not a trace file; refusing to read it"),
        (b"\xff\xfe garbage\n" + _REC.encode(), "rank_1.jsonl: line 1 is not a trace record (not UTF-8: byte 0xff"),
        ('{"seq": 0, "group": [0, 1], "bytes": 8, "dtype": "float32"}\n', "its 'op' is missing, not a string"),
        ("[1, 2, 3]\n", "its last line is not a trace record (a JSON list, not an object)"),
        (_REC.replace("[0, 1]", "[]"), "its 'group' is not a non-empty list of rank numbers"),
        (_REC.replace('"bytes": 8', '"bytes": true'), "its 'bytes' is True, not an integer"),
        ("[" * 100000 + "\n" + _REC, "line 1 is not a trace record (not JSON)"),
        ("sparse", "rank_1.jsonl: line 1 is longer than 16,777,216 bytes, not a trace record"),
    ],
)
def test_the_trace_comparison_reads_a_bad_rank_file_in_one_line(tmp_path, capfd, content, want):
    """python -m megatron_topo.zero_topo.trace on a folder whose rank_1.jsonl is a FIFO (a hang
    before), holds bytes that are not UTF-8 (UnicodeDecodeError), a record without a field
    (KeyError in the comparison), or garbage before good lines (the rest silently dropped)."""
    from megatron_topo.zero_topo import trace as T

    (tmp_path / "rank_0.jsonl").write_text(_REC)
    bad = tmp_path / "rank_1.jsonl"
    if content == "fifo":
        os.mkfifo(bad)
    elif content == "sparse":  # 3 GiB of NUL bytes without a newline (no disk used)
        with open(bad, "wb") as f:
            f.truncate(3 << 30)
    elif isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content)
    got = {}
    t = threading.Thread(target=lambda: got.update(rc=T.main([str(tmp_path)])))
    t.start()
    t.join(20)
    assert not t.is_alive(), "the comparison blocked"
    assert got["rc"] == 2
    assert want in one_error_line(capfd)


@pytest.mark.parametrize(
    "args, want",
    [
        ([], "holds no rank_N.jsonl trace files"),
        (["--world-size", "0"], "--world-size: 0 must lie in [1, 1,048,576]"),
        (["--world-size", "1e12"], "'1e12' is not an integer"),
    ],
)
def test_the_trace_comparison_refuses_an_empty_folder_and_a_bad_world_size(tmp_path, capfd, args, want):
    from megatron_topo.zero_topo import trace as T

    with pytest.raises(SystemExit) if args else contextlib.nullcontext():
        assert T.main([str(tmp_path), *args]) == 2
    assert want in one_error_line(capfd)
