"""The global batch stays what the config (or the resumed checkpoint) says when the world size
changes: the accumulation count is derived as DeepSpeed does (train_batch_size = micro-batch x
accumulation x data-parallel size), the change is printed, and a world that cannot reach the
global batch is one line naming the nearest node counts that can."""

from __future__ import annotations

import json

import pytest

from megatron_topo.config import Config, ConfigError, check_batch_size

from .test_lifecycle import _args, _run, _start, cache  # noqa: F401


def _cfg(tbs=None, micro=1, accum=4) -> Config:
    cfg = Config()
    cfg.train.train_batch_size, cfg.train.train_micro_batch_size_per_gpu = tbs, micro
    cfg.train.gradient_accumulation_steps = accum
    return cfg


@pytest.mark.parametrize("nodes,accum", [(48, 4), (16, 12), (32, 6), (2, 96), (96, 2)])
def test_train_batch_size_derives_the_accumulation_on_every_node_count(nodes, accum):
    cfg = _cfg(tbs=1536)  # GPT-NeoX-20B's batch on Frontier's 8 GCDs per node
    note = check_batch_size(cfg, nodes * 8, 8)
    assert cfg.train.gradient_accumulation_steps == accum
    assert cfg.train.train_micro_batch_size_per_gpu * accum * nodes * 8 == 1536
    assert (note is None) == (accum == 4)
    if note:
        assert f"gradient_accumulation_steps 4 -> {accum}" in note and "global batch 1536" in note


def test_a_world_that_cannot_reach_the_global_batch_names_the_nearest_node_counts():
    with pytest.raises(ConfigError) as e:
        check_batch_size(_cfg(tbs=1536), 5 * 8, 8)
    msg = str(e.value)
    assert "global batch 1536" in msg and "40 ranks" in msg
    assert "nearest valid: 4 nodes (32 ranks) or 6 nodes (48 ranks)" in msg, msg
    with pytest.raises(ConfigError, match="nearest valid: 2 ranks or 4 ranks"):
        check_batch_size(_cfg(tbs=None, micro=4), 3, 1, keep_global=16, keep_from="the checkpoint's")


def test_without_a_global_batch_nothing_changes():
    cfg = _cfg(tbs=None, micro=2, accum=3)
    assert check_batch_size(cfg, 7, 1) is None and cfg.train.gradient_accumulation_steps == 3


def test_a_resume_on_another_world_size_keeps_the_global_batch(cache, tmp_path):  # noqa: F811
    """tiny.yml (micro-batch 4, accumulation 2, no train_batch_size): 2 ranks train at global batch
    16; resumed on 1 rank the run keeps 16 (accumulation 4, printed) and the data position
    advances by 16 per step; on 3 ranks 16 cannot be reached: one line naming 2 or 4 ranks."""
    procs = _start(_args(cache, tmp_path, 2), tmp_path, world=2)
    for p in procs:
        p.wait(timeout=240)
    out = (tmp_path / "a.out0").read_text()
    assert [p.returncode for p in procs] == [0, 0], out + (tmp_path / "a.err0").read_text()
    assert "global batch 16 x" in out
    rc, out, err = _run(_args(cache, tmp_path, 3, auto_resume="true"), tmp_path, tag="b")
    assert rc == 0, out + err
    assert (
        "global batch 16 (the checkpoint's, saved on 2 ranks) on 1 ranks x micro-batch 4: "
        "gradient_accumulation_steps 2 -> 4"
    ) in out, out
    assert "global batch 16 x" in out
    meta = json.loads((tmp_path / "ckpt" / "global_step3" / "meta.json").read_text())
    assert meta["trainer"]["consumed_samples"] == 3 * 16 and meta["trainer"]["global_batch"] == 16
    procs = _start(_args(cache, tmp_path, 4, auto_resume="true"), tmp_path, world=3, tag="c")
    for p in procs:
        p.wait(timeout=240)
    errs = [(tmp_path / f"c.err{r}").read_text() for r in range(3)]
    assert [p.returncode for p in procs] == [2, 2, 2], errs
    lines = [ln for e in errs for ln in e.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: global batch 16"), errs
    assert "nearest valid: 2 ranks or 4 ranks" in lines[0]


def test_an_error_under_the_launcher_is_one_line_without_torchrun_traceback(tmp_path):
    """python -m megatron_topo.launch (torchrun's arguments), 2 ranks, an unreachable global batch:
    exit 2, one `error:` line for the job, no ChildFailedError traceback."""
    import os
    import subprocess
    import sys

    from .test_lifecycle import ROOT

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_topo.launch",
            "--standalone",
            "--nproc_per_node",
            "2",
            os.path.join(ROOT, "train.py"),
            os.path.join(ROOT, "configs", "tiny.yml"),
            "--set",
            f"log_dir={tmp_path / 'run'}",
            "--set",
            "save=null",
            "--set",
            "train_batch_size=12",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    text = r.stdout + r.stderr
    assert r.returncode == 2, text
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "nearest valid: 1 rank or 3 ranks" in errors[0], text
    assert "Traceback" not in text and "ChildFailedError" not in text, text
