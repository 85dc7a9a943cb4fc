"""Hostile and careless inputs (issue 14): each case either gives its exit code and exactly one
``error:`` line naming the problem, with every file on disk unchanged, or behaves correctly.

Families: config values out of range or of the wrong kind (declared bounds), YAML that tries to
turn strings into numbers, hang the loader or is not UTF-8, keys that would do nothing, data whose
.idx/.bin disagree or whose contents changed in place, checkpoints resumed with another
architecture or too few steps, checkpoints whose config.yml was edited or whose format is
unknown, a full disk during a save, tool outputs that would clobber their input, and every
tool's arguments. Entry points run in this process (``main(argv)``) in a scratch copy of a small
world (a config, two token datasets, a step-2 checkpoint) so the module stays fast on 2 cores.
"""
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from megatron_topo import fault_injection
from megatron_topo.commands import consolidate_checkpoint, convert_to_hf, generate, inspect_data, plot_metrics
from megatron_topo.commands import plan as plan_tool
from megatron_topo.commands import train as train_cli
from megatron_topo.config import ConfigError, describe_keys, load_config
from megatron_topo.data import MMapIndexedDatasetBuilder
from megatron_topo.data.gpt_dataset import data_fingerprint
from megatron_topo.data.indexed_dataset import MMapIndexedDataset

from .tool_loader import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BASE_CFG = """\
num_layers: 2
hidden_size: 32
num_attention_heads: 4
seq_length: 16
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
ENV_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "SLURM_NTASKS", "SLURM_PROCID", "SLURM_NPROCS", fault_injection.ENV)
STEP = "ck/global_step2"


def _dataset(prefix, docs, seed, high=64):
    rng = np.random.default_rng(seed)
    with MMapIndexedDatasetBuilder(str(prefix)) as b:
        for _ in range(docs):
            b.add_document(rng.integers(0, high, 40))
        b.finalize()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """cfg.yml, data/toy (64 docs), data/other (80 docs), ck/ (a checkpoint at step 2), a system
    file with zero inter-node bandwidth and three metrics files; built once."""
    d = tmp_path_factory.mktemp("hostile")
    (d / "cfg.yml").write_text(BASE_CFG)
    _dataset(d / "data" / "toy", 64, 0)
    _dataset(d / "data" / "other", 80, 1)
    frontier = open(os.path.join(ROOT, "configs", "frontier.yml")).read()
    assert "bw_inter_node_gbs:" in frontier
    (d / "sys0.yml").write_text("\n".join(
        "  bw_inter_node_gbs: 0" if line.strip().startswith("bw_inter_node_gbs:") else line
        for line in frontier.splitlines()) + "\n")
    for name, text in (("pm_str", '{"step": "ten", "loss": 1.0}\n'), ("pm_list", '{"step": [1, 2], "loss": 1.0}\n'),
                       ("pm_frac", '{"step": 1.5, "loss": 1.0}\n')):
        (d / name).mkdir()
        (d / name / "metrics.jsonl").write_text(text)
    (d / "pm_latin1").mkdir()
    (d / "pm_latin1" / "metrics.jsonl").write_bytes(b'{"step": 1, "loss": 1.0, "note": "caf\xe9"}\n')
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
    return d


# ------------------------------------------------------------------------------ mutations
def _write(rel, data):
    def f(d):
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        (p.write_bytes if isinstance(data, bytes) else p.write_text)(data)
    return f


def _edit_meta(**kw):
    def f(d):
        p = d / STEP / "meta.json"
        meta = json.loads(p.read_text())
        meta.update(kw)
        p.write_text(json.dumps(meta))
    return f


def _edit_saved_config(d):
    p = d / STEP / "config.yml"
    text = p.read_text()
    assert "rotary_pct: 0.25" in text
    p.write_text(text.replace("rotary_pct: 0.25", "rotary_pct: 0.5"))


def _swap_bin(d):  # toy.idx with other.bin: a larger .bin from another dataset
    shutil.copy(d / "data" / "other.bin", d / "data" / "toy.bin")


def _alias_bomb(d):  # 9**10 values once expanded, in the value of a real key (its type error rendered it)
    flow = "[&b0 [x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"&b{i} [" + ", ".join([f"*b{i - 1}"] * 9) + "]" for i in range(1, 10)) + "]"
    (d / "bomb.yml").write_text(f"num_layers: {flow}\n")


T, C, H, G = train_cli.main, consolidate_checkpoint.main, convert_to_hf.main, generate.main
I, PL, PM = inspect_data.main, plan_tool.main, plot_metrics.main
LOAD = ["cfg.yml", "--set", "load=ck"]
GEN = ["--checkpoint", "ck", "--prompt-ids", "1,2", "--max-new-tokens", "2"]
PLAN = ["--model", os.path.join(ROOT, "configs", "20B.yml"), "--system", os.path.join(ROOT, "configs", "frontier.yml")]


def S(*sets):  # train.py cfg.yml --set a --set b ...
    out = ["cfg.yml"]
    for s in sets:
        out += ["--set", s]
    return out


# (id, entry point, argv, mutation, exit code, text the one stderr line contains)
CASES = [
    # ---- config: numbers out of their declared range (issue 14, found items 3 and 9)
    ("cfg-negative-gradient-clipping", T, S("gradient_clipping=-1"), None, 2, "gradient_clipping must be >= 0, got -1"),
    ("cfg-negative-lr", T, S("optimizer.params.lr=-1e-3"), None, 2, "optimizer.params.lr must be >= 0"),
    ("cfg-nan-lr", T, S("optimizer.params.lr=.nan"), None, 2, "optimizer.params.lr must be a finite number"),
    ("cfg-beta-above-one", T, S("optimizer.params.betas=[0.9, 1.5]"), None, 2,
     "optimizer.params.betas[1] must lie in [0, 1), got 1.5"),
    ("cfg-beta-negative", T, S("optimizer.params.betas=[-0.1, 0.9]"), None, 2, "optimizer.params.betas[0] must lie in [0, 1)"),
    ("cfg-three-betas", T, S("optimizer.params.betas=[0.9, 0.95, 0.99]"), None, 2,
     "optimizer.params.betas must have 2 values, got 3"),
    ("cfg-zero-eps", T, S("optimizer.params.eps=0"), None, 2, "optimizer.params.eps must be > 0"),
    ("cfg-negative-seed", T, S("seed=-1"), None, 2, "seed must lie in [0, 4294967295], got -1"),
    ("cfg-seed-too-big", T, S("seed=4294967296"), None, 2, "seed must lie in [0, 4294967295]"),
    ("cfg-zero-heads", T, S("num_attention_heads=0"), None, 2, "num_attention_heads must be >= 1, got 0"),
    ("cfg-zero-layers", T, S("num_layers=0"), None, 2, "num_layers must be >= 1, got 0"),
    ("cfg-negative-hidden", T, S("hidden_size=-32"), None, 2, "hidden_size must be >= 1, got -32"),
    ("cfg-huge-vocab", T, S("vocab_size=1000000000000"), None, 2, "vocab_size must lie in [1, 2147483647]"),
    ("cfg-huge-vocab-exponent", T, S("vocab_size=1e12"), None, 2, "vocab_size must lie in [1, 2147483647]"),
    ("cfg-dropout-one", T, S("hidden_dropout=1.0"), None, 2, "hidden_dropout must lie in [0, 1), got 1"),
    ("cfg-warmup-above-one", T, S("warmup=2"), None, 2, "warmup must lie in [0, 1], got 2"),
    ("cfg-rotary-above-one", T, S("rotary_pct=1.5"), None, 2, "rotary_pct must lie in [0, 1], got 1.5"),
    ("cfg-zero-timeout", T, S("distributed.collective_timeout_s=0"), None, 2,
     "distributed.collective_timeout_s must be > 0"),
    ("cfg-zero-micro-batch", T, S("train_micro_batch_size_per_gpu=0"), None, 2,
     "train_micro_batch_size_per_gpu must be >= 1"),
    ("cfg-model-too-large-for-memory", T, S("hidden_size=1048576"), None, 1,
     "rank 0: out of memory (an allocation of 52776612659200 bytes failed)"),
    # ---- config: choices
    ("cfg-bad-backend", T, S("distributed.backend=pigeon"), None, 2,
     "distributed.backend='pigeon' is not valid; use one of auto, nccl, gloo, mpi"),
    ("cfg-bad-decay-style", T, S("lr_decay_style=exp"), None, 2, "lr_decay_style='exp' is not valid"),
    ("cfg-bad-optimizer", T, S("optimizer.type=SGD"), None, 2, "optimizer.type='SGD' is not valid; use one of AdamW, Adam"),
    ("cfg-bad-tokenizer", T, S("tokenizer_type=GPT3"), None, 2, "tokenizer_type='GPT3' is not valid"),
    ("cfg-bad-split", T, S("split=a,b"), None, 2, "split='a,b' is not valid; expected up to 3 non-negative numbers"),
    # ---- config: keys that would do nothing are refused
    ("cfg-noop-bucket-size", T, S("zero_topo.bucket_size=1000"), None, 2,
     "zero_topo.bucket_size=1000 is not valid; use one of 0 (units (one per layer) are the communication buckets"),
    # (num_workers and DeepSpeed's bucket sizes are accepted no-ops since issue 15: GPT-NeoX's and DeepSpeed's
    # stock files set them; a value no setting could have is still refused)
    ("cfg-bad-num-workers", T, S("num_workers=-2"), None, 2, "num_workers must be >= 0, got -2"),
    ("cfg-noop-overlap-comm", T, S("zero_optimization.overlap_comm=false"), None, 2,
     "zero_optimization.overlap_comm=false is not valid; use one of true"),
    ("cfg-noop-contiguous-gradients", T, S("zero_optimization.contiguous_gradients=false"), None, 2,
     "zero_optimization.contiguous_gradients=false is not valid"),
    ("cfg-bad-reduce-bucket", T, S("zero_optimization.reduce_bucket_size=-1"), None, 2,
     "zero_optimization.reduce_bucket_size must be >= 0, got -1"),
    ("cfg-bad-allgather-bucket", T, S("zero_optimization.allgather_bucket_size=5e8x"), None, 2,
     "zero_optimization.allgather_bucket_size: expected an integer"),
    ("cfg-noop-zero-optimization-with-preset", T, S("zero_topo.preset=zero3", "zero_optimization.stage=3"), None, 2,
     "zero_optimization and zero_topo.preset=zero3 both choose the sharding"),
    ("cfg-noop-weights-without-paths", T, S("train_data_weights=[1.0]"), None, 2,
     "train_data_weights is set but train_data_paths is not"),
    ("cfg-noop-valid-paths-without-train", T, S("valid_data_paths=[data/other]"), None, 2,
     "valid_data_paths is set but train_data_paths is not"),
    # ---- config: shapes of values
    ("cfg-dict-to-scalar", T, S("train_iters={a: 1}"), None, 2, "train_iters: expected an integer, got dict {'a': 1}"),
    ("cfg-list-to-scalar", T, S("hidden_size=[1, 2]"), None, 2, "hidden_size: expected an integer, got list"),
    ("cfg-scalar-to-block", T, S("optimizer=3"), None, 2, "optimizer: expected a mapping, got int 3"),
    ("cfg-yes-is-not-a-boolean", T, S("progress_bar=yes"), None, 2, "progress_bar: expected a boolean (true/false), got str 'yes'"),
    ("cfg-empty-key-part", T, ["cfg.yml", "--set", "a..b=1"], None, 2, "empty key name in 'a..b'"),
    ("cfg-blend-weight-inf", T, S("train_data_paths=[data/toy, data/other]", "train_data_weights=[1.0, .inf]"), None, 2,
     "train_data_weights[1] must be a finite number, got inf"),
    ("cfg-blend-weight-count", T, S("train_data_paths=[data/toy, data/other]", "train_data_weights=[1.0]"), None, 2,
     "train_data_weights has 1 values for 2 train_data_paths"),
    ("cfg-empty-train-split", T, S("split=0,100,0"), None, 2, "split '0,100,0' gives the train split no share"),
    # ---- config: the YAML itself
    ("yaml-alias-bomb", T, ["bomb.yml"], _alias_bomb, 2, "bomb.yml: the YAML expands to more than 100,000 values"),
    ("yaml-latin1", T, ["cfg.yml", "l1.yml"], _write("l1.yml", b"log_dir: caf\xe9\n"), 2,
     "l1.yml: not valid UTF-8 text (byte 0xe9 at offset 12)"),
    ("yaml-utf16-without-bom", T, ["cfg.yml", "u16.yml"], _write("u16.yml", "seed: 3\n".encode("utf-16-le")), 2,
     "u16.yml: invalid YAML: unacceptable character #x0000"),
    ("yaml-deeply-nested", T, ["cfg.yml", "deep.yml"], _write("deep.yml", "seed: " + "[" * 5000 + "]" * 5000 + "\n"), 2,
     "deep.yml: invalid YAML: nested too deeply"),
    ("yaml-config-is-a-directory", T, ["data"], None, 2, "config file data is a directory"),
    ("yaml-merge-key-repeats-a-key", T, ["cfg.yml", "m.yml"],
     _write("m.yml", "base: &b {seed: 3}\n<<: *b\n"), 2, "m.yml: unknown key 'base'"),
    # ---- data (issue 14, found items 4, 5 and 9)
    ("data-larger-bin-from-other-dataset", T, ["cfg.yml"], _swap_bin, 2,
     "data/toy.bin: .bin is 6400 bytes but the index describes exactly 5120 bytes"),
    ("data-inspect-stats-larger-bin", I, ["data/toy", "--stats"], _swap_bin, 1, "come from different datasets"),
    ("data-train-split-rounds-to-zero", T, S("split=1,1000,0"), None, 2,
     "data/toy: split '1,1000,0' gives the train split 0 of the 64 documents"),
    ("data-train-iters-1e10", T, S("train_iters=10000000000"), None, 2, "whose index arrays take"),
    ("data-train-iters-1e10-exponent", T, S("train_iters=1e10"), None, 2, "whose index arrays take"),
    ("data-inspect-vocab-zero", I, ["data/toy", "--vocab-size", "0"], None, 1, "--vocab-size 0: must be >= 1"),
    # ---- checkpoints (issue 14, found item 8)
    ("ckpt-resume-other-heads", T, LOAD + ["--set", "num_attention_heads=8"], None, 2,
     "the model config differs from the checkpoint's (num_attention_heads 4 -> 8)"),
    ("ckpt-resume-other-rotary", T, LOAD + ["--set", "rotary_pct=0.5"], None, 2, "(rotary_pct 0.25 -> 0.5)"),
    ("ckpt-resume-other-residual", T, LOAD + ["--set", "gpt_j_residual=false", "--set", "layernorm_epsilon=1e-6"], None,
     2, "(gpt_j_residual True -> False; layernorm_epsilon 1e-05 -> 1e-06)"),
    ("ckpt-train-iters-below-step", T, LOAD + ["--set", "save=ck", "--set", "train_iters=1"], None, 2,
     "is at step 2 but train_iters is 1; set train_iters above 2"),
    ("ckpt-config-edited-resume", T, LOAD + ["--set", "train_iters=3"], _edit_saved_config, 2,
     "config.yml was changed after the save"),
    ("ckpt-config-edited-convert", H, ["--checkpoint", "ck", "--output", "hf"], _edit_saved_config, 2,
     "config.yml was changed after the save"),
    ("ckpt-config-edited-generate", G, GEN, _edit_saved_config, 2, "config.yml was changed after the save"),
    ("ckpt-format-from-the-future", T, LOAD, _edit_meta(format=99), 2,
     "checkpoint format 99 is not supported; this megatron_topo reads formats 1, 2"),
    ("ckpt-format-not-a-number", C, ["--checkpoint", "ck", "--output", "o.pt"], _edit_meta(format="2"), 2,
     "checkpoint format '2' is not supported"),
    ("ckpt-fresh-run-into-another-runs-folder", T, S("save=ck"), None, 2,
     "checkpoint.save ck already holds checkpoints (latest step 2) and this run starts fresh"),  # issue 13's rule
    # ---- tools that write: never over their input (issue 14, found item 1)
    ("convert-force-output-is-checkpoint", H, ["--checkpoint", "ck", "--output", "ck", "--force"], None, 2,
     "--output ck is the checkpoint it reads"),
    ("convert-force-output-contains-checkpoint", H, ["--checkpoint", "ck/global_step2", "--output", ".", "--force"],
     None, 2, "--output . contains the checkpoint it reads"),
    ("convert-force-output-is-step-dir", H, ["--checkpoint", "ck", "--output", STEP, "--force"], None, 2,
     f"--output {STEP} lies inside the checkpoint it reads"),
    ("convert-output-inside-checkpoint", H, ["--checkpoint", "ck", "--output", f"{STEP}/hf"], None, 2,
     f"--output {STEP}/hf lies inside the checkpoint it reads"),
    ("convert-force-output-holds-a-checkpoint", H, ["--checkpoint", "ck", "--output", "runs", "--force"],
     lambda d: shutil.copytree(d / "ck", d / "runs" / "old" / "ck"), 2, "--output runs holds a checkpoint"),
    ("consolidate-force-output-is-a-shard", C, ["--checkpoint", "ck", "--output", f"{STEP}/rank_00000.pt", "--force"],
     None, 2, "lies inside the checkpoint it reads"),
    # ---- generate (issue 14, found item 9)
    ("generate-temperature-nan", G, GEN + ["--temperature", "nan"], None, 2, "--temperature nan: must be a finite number > 0"),
    ("generate-temperature-inf", G, GEN + ["--temperature", "inf"], None, 2, "--temperature inf: must be a finite number > 0"),
    ("generate-temperature-negative", G, GEN + ["--temperature", "-1"], None, 2, "--temperature -1.0: must be"),
    ("generate-top-k-negative", G, GEN + ["--top-k", "-1"], None, 2, "--top-k -1: must be >= 0"),
    ("generate-seed-too-big", G, GEN + ["--seed", str(2**64)], None, 2, "must lie in [-2**63, 2**64)"),
    ("generate-device-unknown", G, GEN + ["--device", "banana"], None, 2, "--device 'banana' is not a device"),
    ("generate-device-mps", G, GEN + ["--device", "mps"], None, 2, "--device 'mps': only cpu and cuda are supported"),
    ("generate-device-cuda-without-gpu", G, GEN + ["--device", "cuda"], None, 2, "--device cuda: no GPU is visible"),
    # ---- plot_metrics (issue 14, found item 9)
    ("plot-step-not-a-number", PM, ["pm_str", "--out", "o.png"], None, 2, "a record has step 'ten'; steps must be integers"),
    ("plot-step-a-list", PM, ["pm_list", "--out", "o.png"], None, 2, "a record has step [1, 2]"),
    ("plot-step-fractional", PM, ["pm_frac", "--out", "o.png"], None, 2, "a record has step 1.5"),
    ("plot-not-utf8", PM, ["pm_latin1", "--out", "o.png"], None, 2, "metrics.jsonl: not UTF-8 text"),
    ("plot-unknown-option", PM, ["pm_str", "--out", "o.png", "--smoth", "3"], None, 2, "unrecognized arguments: --smoth"),
    # ---- plan.py (issue 14, found item 9)
    ("plan-zero-inter-node-bandwidth", PL, ["--model", os.path.join(ROOT, "configs", "20B.yml"), "--system", "sys0.yml",
                                            "--nodes", "2"], None, 2, "system.bw_inter_node_gbs must be > 0, got 0"),
    ("plan-nodes-1e9", PL, PLAN + ["--nodes", "1000000000"], None, 2, "--nodes must lie in [1, 100,000]"),
    ("plan-nodes-not-integer", PL, PLAN + ["--nodes", "1e9"], None, 2, "argument --nodes: invalid int value: '1e9'"),
    ("plan-reserve-nan", PL, PLAN + ["--nodes", "2", "--reserve-gib", "nan"], None, 2, "--reserve-gib must be a finite"),
    ("plan-reserve-everything", PL, PLAN + ["--nodes", "2", "--reserve-gib", "64"], None, 2,
     "--reserve-gib 64 leaves nothing of the 64 GiB per device"),
]


def _snapshot(root):
    """SHA-256 of every file under ``root`` except the derived caches (cache/: index arrays and
    token-range records a run may build or refresh before it fails)."""
    out = {}
    for dp, dirs, fs in os.walk(root):
        if dp == str(root):
            dirs[:] = [x for x in dirs if x != "cache"]
        for f in fs:
            p = os.path.join(dp, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _scratch(world, tmp_path, monkeypatch):
    d = tmp_path / "w"
    shutil.copytree(world, d)
    monkeypatch.chdir(d)
    for k in ENV_VARS:
        monkeypatch.delenv(k, raising=False)
    return d


def _call(entry, argv):
    try:
        return entry(argv)
    except SystemExit as e:  # argparse
        return e.code


def _one_error_line(capfd):
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(case, world, tmp_path, monkeypatch, capfd):
    cid, entry, argv, mutate, code, needle = case
    if cid == "generate-device-cuda-without-gpu":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible here")
    d = _scratch(world, tmp_path, monkeypatch)
    if mutate:
        mutate(d)
    before = _snapshot(d)
    capfd.readouterr()
    t0 = time.perf_counter()
    rc = _call(entry, argv)
    took = time.perf_counter() - t0
    line = _one_error_line(capfd)
    assert rc == code, (rc, line)
    assert needle in line, line
    assert took < 20, f"{cid} took {took:.1f} s"  # no hang, no 56-s MemoryError
    print(f"{cid}: exit {rc}: {line}")
    after = _snapshot(d)
    assert after == before, ({p for p in before if before[p] != after.get(p)}, set(after) - set(before))


def test_cases_are_documented():
    doc = open(os.path.join(ROOT, "docs", "reliability.md")).read()
    missing = [c[0] for c in CASES if f"`{c[0]}`" not in doc]
    assert not missing, missing


# ------------------------------------------------------------------------------ every tool's arguments
TOOLS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "tools")) if f.endswith(".py"))


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_refuses_an_unknown_option_in_one_line(tool, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    mod = load_tool(tool)
    capfd.readouterr()
    rc = _call(mod.main, ["--no-such-option-xyz"])
    line = _one_error_line(capfd)
    assert rc in (1, 2) and ("--no-such-option-xyz" in line or "required" in line), line
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------ correct behaviour
def test_yaml_strings_stay_strings(tmp_path):
    """YAML 1.1 would read these as octal 493, sexagesimal 5400, true and 1000.0."""
    p = tmp_path / "s.yml"
    p.write_text("save: 0755\nlog_dir: 1:30\ndata_cache_dir: on\nvocab_file: 1e3\nload: no\ndata_path: 2024-01-01\n")
    cfg = load_config([str(p)], ["tensorboard_dir=0x1F"])
    assert (cfg.checkpoint.save, cfg.logging.log_dir, cfg.data.data_cache_dir, cfg.data.vocab_file,
            cfg.checkpoint.load, cfg.logging.tensorboard_dir, cfg.data.data_path) == \
        ("0755", "1:30", "on", "1e3", "no", "0x1F", "2024-01-01")
    again = tmp_path / "eff.yml"
    again.write_text(cfg.to_flat_yaml())
    assert load_config([str(again)]) == cfg
    # numbers still read as numbers where a number is declared
    q = tmp_path / "n.yml"
    q.write_text("optimizer: {params: {lr: 6e-4}}\ntrain_iters: 1_000\nhidden_size: 0x40\nnum_attention_heads: 0o4\n")
    c = load_config([str(q)])
    assert (c.train.optimizer.params.lr, c.train.train_iters, c.model.hidden_size, c.model.num_attention_heads) == \
        (6e-4, 1000, 64, 4)


def test_yaml_merge_keys_and_utf16_and_bom(tmp_path):
    m = tmp_path / "m.yml"
    m.write_text("zero_topo:\n  <<: {preset: topo, prefetch: false}\n  prefetch: true\nnum_layers: 3\n")
    cfg = load_config([str(m)])
    assert cfg.zero_topo.preset == "topo" and cfg.zero_topo.prefetch is True and cfg.model.num_layers == 3
    for enc in ("utf-16", "utf-8-sig"):
        u = tmp_path / f"{enc}.yml"
        u.write_bytes("num_layers: 3\nlog_dir: runs/café\n".encode(enc))
        c = load_config([str(u)])
        assert c.model.num_layers == 3 and c.logging.log_dir == "runs/café"


def test_alias_bomb_is_refused_fast(tmp_path):
    """9**12 values through aliases, in a file and in a --set value: refused in well under a second
    (was: the loader hung rendering the value for its type error)."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    p = tmp_path / "bomb.yml"
    p.write_text("\n".join(lines) + "\nnum_layers: *a11\n")
    flow = "[&b0 [x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"&b{i} [" + ", ".join([f"*b{i - 1}"] * 9) + "]" for i in range(1, 12)) + "]"
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="expands to more than 100,000 values"):
        load_config([str(p)])
    with pytest.raises(ConfigError, match="expands to more than 100,000 values"):
        load_config([], [f"num_layers={flow}"])
    assert time.perf_counter() - t0 < 2


def test_every_key_is_declared_and_listed():
    """The listing comes from the declarations: every key, its type, default and bounds."""
    import dataclasses

    from megatron_topo import config as C

    text = describe_keys()
    keys = [line.split()[0] for line in text.splitlines()]
    flat = C.flat_dict(C.Config(zero_optimization=C.ZeroOptimizationBlock(), system=C.SystemConfig()))

    def paths(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from paths(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"
    assert sorted(keys) == sorted(paths(flat))
    row = {line.split()[0]: line for line in text.splitlines()}
    assert "in [0, 1)" in row["optimizer.params.betas"] and "2 values" in row["optimizer.params.betas"]
    assert ">= 0" in row["gradient_clipping"] and "one of 0" in row["zero_topo.bucket_size"]
    for sec in (C.ModelConfig, C.TrainConfig, C.OptimizerParams, C.ZeroTopoConfig, C.ZeroOptimizationBlock):
        undocumented = [f.name for f in dataclasses.fields(sec)
                        if not dataclasses.is_dataclass(f.type) and not f.metadata.get("doc")
                        and f.name not in ("optimizer", "params", "fp16", "bf16")]
        assert not undocumented, (sec.__name__, undocumented)
    r = subprocess.run([sys.executable, "-m", "megatron_topo.config"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == text


def test_train_py_list_keys(capsys):
    assert train_cli.main(["--list-keys"]) == 0
    assert capsys.readouterr().out.strip() == describe_keys()


def test_fingerprint_sees_an_in_place_rewrite_with_the_same_size_and_mtime(tmp_path):
    _dataset(tmp_path / "d", 16, 0)
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
    d = _scratch(world, tmp_path, monkeypatch)
    assert train_cli.main(["cfg.yml", "--set", "log_dir=log1"]) == 0  # builds this copy's caches
    p = d / "data" / "toy.bin"
    st = os.stat(p)
    with open(p, "r+b") as f:
        f.seek(100)
        f.write(np.array([60000], np.uint16).tobytes())
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = _snapshot(d)
    capfd.readouterr()
    rc = train_cli.main(["cfg.yml", "--set", "log_dir=log2"])
    line = _one_error_line(capfd)
    assert rc == 2 and "data/toy: token id 60000 is >= vocab_size 64" in line, line
    assert _snapshot(d) == before and not (d / "log2").exists()


def test_resume_under_another_plan_is_not_an_error(world, tmp_path, monkeypatch):
    """Plan and world size may change on resume (resharding); only the architecture may not."""
    d = _scratch(world, tmp_path, monkeypatch)
    before = _snapshot(d / "ck")
    assert train_cli.main(LOAD + ["--set", "zero_topo.preset=zero1", "--set", "train_iters=3",
                                  "--set", "hidden_dropout=0.1", "--set", "seq_length=8"]) == 0
    assert _snapshot(d / "ck") == before


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
            raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing "
                               "file data/3: file write failed")
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
    d = _scratch(world, tmp_path, monkeypatch)
    before = _snapshot(d / "ck")
    _fill_disk_on(3, monkeypatch, how)
    capfd.readouterr()
    rc = train_cli.main(LOAD + ["--set", "save=ck", "--set", "train_iters=3"])
    line = _one_error_line(capfd)
    assert rc == 2, line
    assert "saving step 3 into ck failed on rank 0" in line and "previous checkpoint (global_step2) is intact" in line
    assert ("PytorchStreamWriter failed writing file" if how == "rank" else "No space left on device") in line
    assert _snapshot(d / "ck") == before  # latest, global_step2 byte-identical; no .tmp_*, no .part
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
        _scratch(world, tmp_path, monkeypatch)
        save = str(mnt / "ck")
        capfd.readouterr()
        rc = train_cli.main(["cfg.yml", "--set", f"save={save}", "--set", "checkpoint_factor=1",
                             "--set", "train_iters=3", "--set", "log_dir=log3"])
        line = _one_error_line(capfd)
        assert rc == 2 and "saving step 2" in line and "previous checkpoint (global_step1) is intact" in line, line
        assert sorted(os.listdir(save)) == ["global_step1", "latest"]
        assert not [f for f in os.listdir(os.path.join(save, "global_step1")) if f.endswith((".part", ".tmp"))]
        from megatron_topo.zero_topo import checkpoint as ckpt

        state = ckpt.read_full_state(save)  # every digest still verifies
        assert state["meta"]["step"] == 1
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
