"""Files changed under a run or a save (issue 14): data rewritten in place at the same size and
mtime, a resume under another plan, and a full disk during a save, which keeps the previous
checkpoint."""

import errno
import os
import subprocess

import numpy as np
import pytest

from megatron_topo.commands import train as train_cli
from megatron_topo.data.gpt_dataset import data_fingerprint
from megatron_topo.data.indexed_dataset import MMapIndexedDataset

from .cli_cases import build_hostile_world, one_error_line, scratch, snapshot, write_dataset

LOAD = ["cfg.yml", "--set", "load=ck"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The hostile-input world (tests/cli_cases.py), built once."""
    return build_hostile_world(tmp_path_factory.mktemp("hostile"))


def test_fingerprint_sees_an_in_place_rewrite_with_the_same_size_and_mtime(tmp_path):
    write_dataset(tmp_path / "d", 16, 0)
    before = data_fingerprint(MMapIndexedDataset(str(tmp_path / "d")))
    p = tmp_path / "d.bin"
    st = os.stat(p)
    data = bytearray(p.read_bytes())
    data[len(data) // 2 + 1] ^= 0x7F  # one token id changed, far from the sampled blocks' edges
    p.write_bytes(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(p) == st.st_size and os.stat(p).st_mtime_ns == st.st_mtime_ns
    after = data_fingerprint(MMapIndexedDataset(str(tmp_path / "d")))
    assert after != before


def test_out_of_vocab_rewrite_in_place_is_caught_before_training(world, tmp_path, monkeypatch, capfd):
    """The token-range cache of a first run must not vouch for a .bin rewritten in place at the same
    size (mtime restored) with an id >= vocab_size (was: cache hit, IndexError mid-step)."""
    d = scratch(world, tmp_path, monkeypatch)
    assert train_cli.main(["cfg.yml", "--set", "log_dir=log1"]) == 0  # builds this copy's caches
    p = d / "data" / "toy.bin"
    st = os.stat(p)
    with open(p, "r+b") as f:
        f.seek(100)
        f.write(np.array([60000], np.uint16).tobytes())
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = snapshot(d, skip=("cache",))
    capfd.readouterr()
    rc = train_cli.main(["cfg.yml", "--set", "log_dir=log2"])
    line = one_error_line(capfd)
    assert rc == 2 and "data/toy: token id 60000 is >= vocab_size 64" in line, line
    assert snapshot(d, skip=("cache",)) == before and not (d / "log2").exists()


def test_resume_under_another_plan_is_not_an_error(world, tmp_path, monkeypatch):
    """Plan and world size may change on resume (resharding); the architecture may not, nor seq_length
    (its consumed_samples count samples of the saved length: tests/test_hostile_inputs_r4_silent.py)."""
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d / "ck", skip=("cache",))
    assert (
        train_cli.main(
            LOAD + ["--set", "zero_topo.preset=zero1", "--set", "train_iters=3", "--set", "hidden_dropout=0.1"]
        )
        == 0
    )
    assert snapshot(d / "ck", skip=("cache",)) == before


def _fill_disk_on(step_to_fail, monkeypatch, how):
    """Make the rank-file (``how='rank'``) or meta.json (``how='meta'``) write of ``step_to_fail``
    fail as a full disk does, after part of the file is on disk."""
    import torch

    from megatron_topo.zero_topo import checkpoint as ckpt

    real_save, real_write = torch.save, ckpt._atomic_write_bytes
    seen = {"step": None}

    def save(obj, f, *a, **k):
        seen["step"] = obj.get("step") if isinstance(obj, dict) else None
        if how == "rank" and seen["step"] == step_to_fail:
            f.write(b"PK\x03\x04" + b"\0" * 4096)  # the part that fit
            raise RuntimeError(
                "[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing "
                "file data/3: file write failed"
            )
        return real_save(obj, f, *a, **k)

    def write(path, data):
        if how == "meta" and seen["step"] == step_to_fail and path.endswith("meta.json"):
            with open(f"{path}.tmp.{os.getpid()}", "wb") as fh:
                fh.write(data[:10])
            ckpt._remove_quietly(f"{path}.tmp.{os.getpid()}")
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real_write(path, data)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(ckpt.storage, "_atomic_write_bytes", write)


@pytest.mark.parametrize("how", ["rank", "meta"])
def test_full_disk_during_save_keeps_the_previous_checkpoint(how, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d / "ck", skip=("cache",))
    _fill_disk_on(3, monkeypatch, how)
    capfd.readouterr()
    rc = train_cli.main(LOAD + ["--set", "save=ck", "--set", "train_iters=3"])
    line = one_error_line(capfd)
    assert rc == 2, line
    assert "saving step 3 into ck failed on rank 0" in line and "previous checkpoint (global_step2) is intact" in line
    assert ("PytorchStreamWriter failed writing file" if how == "rank" else "No space left on device") in line
    assert snapshot(d / "ck", skip=("cache",)) == before  # latest, global_step2 byte-identical; no .tmp_*, no .part
    assert sorted(os.listdir(d / "ck")) == ["global_step2", "latest"]


def test_full_disk_on_a_real_tiny_filesystem(world, tmp_path, monkeypatch, capfd):
    """A 600 KiB tmpfs holds one checkpoint of this model but not two (root only; skipped where
    mounting is not allowed)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()[:100]}")
    try:
        scratch(world, tmp_path, monkeypatch)
        save = str(mnt / "ck")
        capfd.readouterr()
        rc = train_cli.main(
            [
                "cfg.yml",
                "--set",
                f"save={save}",
                "--set",
                "checkpoint_factor=1",
                "--set",
                "train_iters=3",
                "--set",
                "log_dir=log3",
            ]
        )
        line = one_error_line(capfd)
        assert rc == 2 and "saving step 2" in line and "previous checkpoint (global_step1) is intact" in line, line
        assert sorted(os.listdir(save)) == ["global_step1", "latest"]
        assert not [f for f in os.listdir(os.path.join(save, "global_step1")) if f.endswith((".part", ".tmp"))]
        from megatron_topo.zero_topo import checkpoint as ckpt

        state = ckpt.read_full_state(save)  # every digest still verifies
        assert state["meta"].step == 1
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
