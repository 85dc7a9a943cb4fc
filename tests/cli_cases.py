"""Helpers shared by the bad- and hostile-input tests (no tests here): a small world (a config, token
datasets, a step-2 checkpoint), a scratch copy of it, an entry point run in this process, the one
``error:`` line it must print, and file snapshots taken before and after."""

import hashlib
import os
import shutil

import numpy as np

from megatron_topo.commands import train as train_cli
from megatron_topo.data import MMapIndexedDatasetBuilder
from megatron_topo.training import fault_injection

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BASE_CFG = """\
num_layers: 2
hidden_size: 32
num_attention_heads: 4
seq_length: 16
max_position_embeddings: 16
vocab_size: 64
rotary_pct: 0.25            # the architecture stated (the defaults follow GPT-NeoX's since issue 15)
gpt_j_residual: true
no_weight_tying: true
train_micro_batch_size_per_gpu: 2
train_iters: 2
precision: fp32
optimizer: {type: AdamW, params: {lr: 1.0e-3}}
data_path: data/toy
data_cache_dir: cache
split: "100,0,0"
log_dir: log
log_interval: 1
eval_interval: 0
progress_bar: false
distributed: {backend: gloo, device: cpu}
"""
ENV_VARS = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_NPROCS",
    fault_injection.ENV,
)


def write_dataset(prefix, docs, seed, high=64):
    """``docs`` documents of 40 random token ids below ``high`` at ``prefix``.{bin,idx}."""
    rng = np.random.default_rng(seed)
    with MMapIndexedDatasetBuilder(str(prefix)) as b:
        for _ in range(docs):
            b.add_document(rng.integers(0, high, 40))
        b.finalize()


def train_checkpoint(d):
    """Train ``d``/cfg.yml for 2 steps into ``d``/ck (no distributed environment), drop its logs."""
    cwd = os.getcwd()
    saved = {k: os.environ.pop(k) for k in ENV_VARS if k in os.environ}
    os.chdir(d)
    try:
        assert train_cli.main(["cfg.yml", "--set", "save=ck"]) == 0
    finally:
        os.chdir(cwd)
        os.environ.update(saved)
    shutil.rmtree(d / "log")
    assert (d / "ck" / "latest").read_text() == "global_step2\n"


def build_hostile_world(d):
    """The hostile-input world in ``d``: cfg.yml, data/toy (64 docs), data/other (80 docs), ck/ (a
    checkpoint at step 2), a system file with zero inter-node bandwidth and metrics files that
    plot_metrics must refuse; returns ``d``."""
    (d / "cfg.yml").write_text(BASE_CFG)
    write_dataset(d / "data" / "toy", 64, 0)
    write_dataset(d / "data" / "other", 80, 1)
    frontier = open(os.path.join(ROOT, "configs", "frontier.yml")).read()
    assert "bw_inter_node_gbs:" in frontier
    (d / "sys0.yml").write_text(
        "\n".join(
            "  bw_inter_node_gbs: 0" if line.strip().startswith("bw_inter_node_gbs:") else line
            for line in frontier.splitlines()
        )
        + "\n"
    )
    for name, text in (
        ("pm_str", '{"step": "ten", "loss": 1.0}\n'),
        ("pm_list", '{"step": [1, 2], "loss": 1.0}\n'),
        ("pm_frac", '{"step": 1.5, "loss": 1.0}\n'),
    ):
        (d / name).mkdir()
        (d / name / "metrics.jsonl").write_text(text)
    (d / "pm_latin1").mkdir()
    (d / "pm_latin1" / "metrics.jsonl").write_bytes(b'{"step": 1, "loss": 1.0, "note": "caf\xe9"}\n')
    train_checkpoint(d)
    return d


def scratch(world, tmp_path, monkeypatch):
    """A copy of ``world`` as the working directory, with no distributed environment."""
    d = tmp_path / "w"
    shutil.copytree(world, d)
    monkeypatch.chdir(d)
    for k in ENV_VARS:
        monkeypatch.delenv(k, raising=False)
    return d


def snapshot(root, skip=()):
    """SHA-256 of every file under ``root``, except in the top-level folders named in ``skip``."""
    out = {}
    for dp, dirs, fs in os.walk(root):
        if dp == str(root):
            dirs[:] = [x for x in dirs if x not in skip]
        for f in fs:
            p = os.path.join(dp, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def call(entry, argv):
    """``entry(argv)``'s exit code, also when argparse exits."""
    try:
        return entry(argv)
    except SystemExit as e:  # argparse
        return e.code


def one_error_line(capfd):
    """The single non-blank stderr line, which starts with ``error: ``."""
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]
