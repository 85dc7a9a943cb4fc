"""Hostile and careless inputs (issue 14), the table: each case gives its exit code and exactly one
``error:`` line naming the problem, with every file on disk unchanged.

Families: config values out of range or of the wrong kind (declared bounds), YAML that tries to
hang the loader or is not UTF-8, keys that would do nothing, data whose .idx/.bin disagree,
checkpoints resumed with another architecture or too few steps, checkpoints whose config.yml was
edited or whose format is unknown, tool outputs that would clobber their input. Entry points run
in this process (``main(argv)``) in a scratch copy of a small world (a config, two token datasets,
a step-2 checkpoint) so the module stays fast on 2 cores. The behaviour tests are in
tests/test_hostile_config.py, tests/test_hostile_files.py and tests/test_hostile_tool_args.py.
"""

import json
import os
import shutil
import time

import pytest

from megatron_topo.commands import consolidate_checkpoint, convert_to_hf, generate, inspect_data, plot_metrics
from megatron_topo.commands import plan as plan_tool
from megatron_topo.commands import train as train_cli

from .cli_cases import ROOT, build_hostile_world, call, one_error_line, scratch, snapshot

STEP = "ck/global_step2"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The hostile-input world (tests/cli_cases.py), built once."""
    return build_hostile_world(tmp_path_factory.mktemp("hostile"))


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
    flow = (
        "[&b0 [x, x, x, x, x, x, x, x, x], "
        + ", ".join(f"&b{i} [" + ", ".join([f"*b{i - 1}"] * 9) + "]" for i in range(1, 10))
        + "]"
    )
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
    (
        "cfg-negative-gradient-clipping",
        T,
        S("gradient_clipping=-1"),
        None,
        2,
        "gradient_clipping must lie in [0, 1000000], got -1",
    ),
    ("cfg-negative-lr", T, S("optimizer.params.lr=-1e-3"), None, 2, "optimizer.params.lr must lie in [0, 10]"),
    ("cfg-nan-lr", T, S("optimizer.params.lr=.nan"), None, 2, "optimizer.params.lr must be a finite number"),
    (
        "cfg-beta-above-one",
        T,
        S("optimizer.params.betas=[0.9, 1.5]"),
        None,
        2,
        "optimizer.params.betas[1] must lie in [0, 1), got 1.5",
    ),
    (
        "cfg-beta-negative",
        T,
        S("optimizer.params.betas=[-0.1, 0.9]"),
        None,
        2,
        "optimizer.params.betas[0] must lie in [0, 1)",
    ),
    (
        "cfg-three-betas",
        T,
        S("optimizer.params.betas=[0.9, 0.95, 0.99]"),
        None,
        2,
        "optimizer.params.betas must have 2 values, got 3",
    ),
    ("cfg-zero-eps", T, S("optimizer.params.eps=0"), None, 2, "optimizer.params.eps must lie in (0, 1]"),
    ("cfg-negative-seed", T, S("seed=-1"), None, 2, "seed must lie in [0, 4294967295], got -1"),
    ("cfg-seed-too-big", T, S("seed=4294967296"), None, 2, "seed must lie in [0, 4294967295]"),
    ("cfg-zero-heads", T, S("num_attention_heads=0"), None, 2, "num_attention_heads must lie in [1, 16384], got 0"),
    ("cfg-zero-layers", T, S("num_layers=0"), None, 2, "num_layers must lie in [1, 4096], got 0"),
    ("cfg-negative-hidden", T, S("hidden_size=-32"), None, 2, "hidden_size must lie in [1, 262144], got -32"),
    ("cfg-huge-vocab", T, S("vocab_size=1000000000000"), None, 2, "vocab_size must lie in [1, 2147483647]"),
    ("cfg-huge-vocab-exponent", T, S("vocab_size=1e12"), None, 2, "vocab_size must lie in [1, 2147483647]"),
    ("cfg-dropout-one", T, S("hidden_dropout=1.0"), None, 2, "hidden_dropout must lie in [0, 1), got 1"),
    ("cfg-warmup-above-one", T, S("warmup=2"), None, 2, "warmup must lie in [0, 1], got 2"),
    ("cfg-rotary-above-one", T, S("rotary_pct=1.5"), None, 2, "rotary_pct must lie in [0, 1], got 1.5"),
    (
        "cfg-zero-timeout",
        T,
        S("distributed.collective_timeout_s=0"),
        None,
        2,
        "distributed.collective_timeout_s must lie in [1, 86400]",
    ),
    (
        "cfg-zero-micro-batch",
        T,
        S("train_micro_batch_size_per_gpu=0"),
        None,
        2,
        "train_micro_batch_size_per_gpu must lie in [1, 65536], got 0",
    ),
    (
        "cfg-model-too-large-for-memory",
        T,
        S("hidden_size=262144"),
        None,
        2,
        "1649.3B parameters under ddp on 1 ranks need 30,720.8 GiB of model states per rank",
    ),
    # ---- config: choices
    (
        "cfg-bad-backend",
        T,
        S("distributed.backend=pigeon"),
        None,
        2,
        "distributed.backend='pigeon' is not valid; use one of auto, nccl, gloo, mpi",
    ),
    ("cfg-bad-decay-style", T, S("lr_decay_style=exp"), None, 2, "lr_decay_style='exp' is not valid"),
    (
        "cfg-bad-optimizer",
        T,
        S("optimizer.type=SGD"),
        None,
        2,
        "optimizer.type='SGD' is not valid; use one of AdamW, Adam",
    ),
    ("cfg-bad-tokenizer", T, S("tokenizer_type=GPT3"), None, 2, "tokenizer_type='GPT3' is not valid"),
    ("cfg-bad-split", T, S("split=a,b"), None, 2, "split='a,b' is not valid; expected up to 3 non-negative numbers"),
    # ---- config: keys that would do nothing are refused
    (
        "cfg-noop-bucket-size",
        T,
        S("zero_topo.bucket_size=1000"),
        None,
        2,
        "zero_topo.bucket_size=1000 is not valid; use one of 0 (units (one per layer) are the communication buckets",
    ),
    # (num_workers and DeepSpeed's bucket sizes are accepted no-ops since issue 15: GPT-NeoX's and DeepSpeed's
    # stock files set them; a value no setting could have is still refused)
    ("cfg-bad-num-workers", T, S("num_workers=-2"), None, 2, "num_workers must be >= 0, got -2"),
    (
        "cfg-noop-overlap-comm",
        T,
        S("zero_optimization.overlap_comm=2"),
        None,
        2,
        "zero_optimization.overlap_comm: expected a boolean (true/false), got int 2",
    ),
    (
        "cfg-noop-contiguous-gradients",
        T,
        S("zero_optimization.contiguous_gradients=yes"),
        None,
        2,
        "zero_optimization.contiguous_gradients: expected a boolean (true/false), got str 'yes'",
    ),
    (
        "cfg-bad-reduce-bucket",
        T,
        S("zero_optimization.reduce_bucket_size=-1"),
        None,
        2,
        "zero_optimization.reduce_bucket_size must be >= 0, got -1",
    ),
    (
        "cfg-bad-allgather-bucket",
        T,
        S("zero_optimization.allgather_bucket_size=5e8x"),
        None,
        2,
        "zero_optimization.allgather_bucket_size: expected an integer",
    ),
    (
        "cfg-noop-zero-optimization-with-preset",
        T,
        S("zero_topo.preset=zero3", "zero_optimization.stage=3"),
        None,
        2,
        "zero_optimization and zero_topo.preset=zero3 both choose the sharding",
    ),
    (
        "cfg-noop-weights-without-paths",
        T,
        S("train_data_weights=[1.0]"),
        None,
        2,
        "train_data_weights is set but train_data_paths is not",
    ),
    (
        "cfg-noop-valid-paths-without-train",
        T,
        S("valid_data_paths=[data/other]"),
        None,
        2,
        "valid_data_paths is set but train_data_paths is not",
    ),
    # ---- config: shapes of values
    ("cfg-dict-to-scalar", T, S("train_iters={a: 1}"), None, 2, "train_iters: expected an integer, got dict {'a': 1}"),
    ("cfg-list-to-scalar", T, S("hidden_size=[1, 2]"), None, 2, "hidden_size: expected an integer, got list"),
    ("cfg-scalar-to-block", T, S("optimizer=3"), None, 2, "optimizer: expected a mapping, got int 3"),
    (
        "cfg-yes-is-not-a-boolean",
        T,
        S("progress_bar=yes"),
        None,
        2,
        "progress_bar: expected a boolean (true/false), got str 'yes'",
    ),
    ("cfg-empty-key-part", T, ["cfg.yml", "--set", "a..b=1"], None, 2, "empty key name in 'a..b'"),
    (
        "cfg-blend-weight-inf",
        T,
        S("train_data_paths=[data/toy, data/other]", "train_data_weights=[1.0, .inf]"),
        None,
        2,
        "train_data_weights[1] must be a finite number, got inf",
    ),
    (
        "cfg-blend-weight-count",
        T,
        S("train_data_paths=[data/toy, data/other]", "train_data_weights=[1.0]"),
        None,
        2,
        "train_data_weights has 1 values for 2 train_data_paths",
    ),
    ("cfg-empty-train-split", T, S("split=0,100,0"), None, 2, "split '0,100,0' gives the train split no share"),
    # ---- config: the YAML itself
    ("yaml-alias-bomb", T, ["bomb.yml"], _alias_bomb, 2, "bomb.yml: the YAML expands to more than 100,000 values"),
    (
        "yaml-latin1",
        T,
        ["cfg.yml", "l1.yml"],
        _write("l1.yml", b"log_dir: caf\xe9\n"),
        2,
        "l1.yml: not valid UTF-8 text (byte 0xe9 at offset 12)",
    ),
    (
        "yaml-utf16-without-bom",
        T,
        ["cfg.yml", "u16.yml"],
        _write("u16.yml", "seed: 3\n".encode("utf-16-le")),
        2,
        "u16.yml: invalid YAML: unacceptable character #x0000",
    ),
    (
        "yaml-deeply-nested",
        T,
        ["cfg.yml", "deep.yml"],
        _write("deep.yml", "seed: " + "[" * 5000 + "]" * 5000 + "\n"),
        2,
        "deep.yml: invalid YAML: nested too deeply",
    ),
    ("yaml-config-is-a-directory", T, ["data"], None, 2, "config file data is a directory"),
    (
        "yaml-merge-key-repeats-a-key",
        T,
        ["cfg.yml", "m.yml"],
        _write("m.yml", "base: &b {seed: 3}\n<<: *b\n"),
        2,
        "m.yml: unknown key 'base'",
    ),
    # ---- data (issue 14, found items 4, 5 and 9)
    (
        "data-larger-bin-from-other-dataset",
        T,
        ["cfg.yml"],
        _swap_bin,
        2,
        "data/toy.bin: .bin is 6400 bytes but the index describes exactly 5120 bytes",
    ),
    ("data-inspect-stats-larger-bin", I, ["data/toy", "--stats"], _swap_bin, 1, "come from different datasets"),
    (
        "data-train-split-rounds-to-zero",
        T,
        S("split=1,1000,0"),
        None,
        2,
        "data/toy: split '1,1000,0' gives the train split 0 of the 64 documents",
    ),
    ("data-train-iters-1e10", T, S("train_iters=10000000000"), None, 2, "whose index arrays take"),
    ("data-train-iters-1e10-exponent", T, S("train_iters=1e10"), None, 2, "whose index arrays take"),
    (
        "data-inspect-vocab-zero",
        I,
        ["data/toy", "--vocab-size", "0"],
        None,
        2,
        "argument --vocab-size: 0 must lie in [1,",
    ),
    # ---- checkpoints (issue 14, found item 8)
    (
        "ckpt-resume-other-heads",
        T,
        LOAD + ["--set", "num_attention_heads=2"],  # (8 heads: head dim 4 x rotary_pct 0.25 = 1 dim, refused first)
        None,
        2,
        "the model config differs from the checkpoint's (num_attention_heads 4 -> 2)",
    ),
    ("ckpt-resume-other-rotary", T, LOAD + ["--set", "rotary_pct=0.5"], None, 2, "(rotary_pct 0.25 -> 0.5)"),
    (
        "ckpt-resume-other-residual",
        T,
        LOAD + ["--set", "gpt_j_residual=false", "--set", "layernorm_epsilon=1e-6"],
        None,
        2,
        "(gpt_j_residual True -> False; layernorm_epsilon 1e-05 -> 1e-06)",
    ),
    (
        "ckpt-train-iters-below-step",
        T,
        LOAD + ["--set", "save=ck", "--set", "train_iters=1"],
        None,
        2,
        "is at step 2 but train_iters is 1; set train_iters above 2",
    ),
    (
        "ckpt-config-edited-resume",
        T,
        LOAD + ["--set", "train_iters=3"],
        _edit_saved_config,
        2,
        "config.yml was changed after the save",
    ),
    (
        "ckpt-config-edited-convert",
        H,
        ["--checkpoint", "ck", "--output", "hf"],
        _edit_saved_config,
        2,
        "config.yml was changed after the save",
    ),
    ("ckpt-config-edited-generate", G, GEN, _edit_saved_config, 2, "config.yml was changed after the save"),
    (
        "ckpt-format-from-the-future",
        T,
        LOAD,
        _edit_meta(format=99),
        2,
        "checkpoint format 99 is not supported; this megatron_topo reads formats 1, 2",
    ),
    (
        "ckpt-format-not-a-number",
        C,
        ["--checkpoint", "ck", "--output", "o.pt"],
        _edit_meta(format="2"),
        2,
        "checkpoint format '2' is not supported",
    ),
    (
        "ckpt-fresh-run-into-another-runs-folder",
        T,
        S("save=ck"),
        None,
        2,
        "checkpoint.save ck already holds checkpoints (latest step 2) and this run starts fresh",
    ),  # issue 13's rule
    # ---- tools that write: never over their input (issue 14, found item 1)
    (
        "convert-force-output-is-checkpoint",
        H,
        ["--checkpoint", "ck", "--output", "ck", "--force"],
        None,
        2,
        "--output ck is the checkpoint it reads",
    ),
    (
        "convert-force-output-contains-checkpoint",
        H,
        ["--checkpoint", "ck/global_step2", "--output", ".", "--force"],
        None,
        2,
        "--output . contains the checkpoint it reads",
    ),
    (
        "convert-force-output-is-step-dir",
        H,
        ["--checkpoint", "ck", "--output", STEP, "--force"],
        None,
        2,
        f"--output {STEP} lies inside the checkpoint it reads",
    ),
    (
        "convert-output-inside-checkpoint",
        H,
        ["--checkpoint", "ck", "--output", f"{STEP}/hf"],
        None,
        2,
        f"--output {STEP}/hf lies inside the checkpoint it reads",
    ),
    (
        "convert-force-output-holds-a-checkpoint",
        H,
        ["--checkpoint", "ck", "--output", "runs", "--force"],
        lambda d: shutil.copytree(d / "ck", d / "runs" / "old" / "ck"),
        2,
        "--output runs holds a checkpoint",
    ),
    (
        "consolidate-force-output-is-a-shard",
        C,
        ["--checkpoint", "ck", "--output", f"{STEP}/rank_00000.pt", "--force"],
        None,
        2,
        "lies inside the checkpoint it reads",
    ),
    # ---- generate (issue 14, found item 9)
    (
        "generate-temperature-nan",
        G,
        GEN + ["--temperature", "nan"],
        None,
        2,
        "--temperature nan: must be a finite number > 0",
    ),
    (
        "generate-temperature-inf",
        G,
        GEN + ["--temperature", "inf"],
        None,
        2,
        "--temperature inf: must be a finite number > 0",
    ),
    ("generate-temperature-negative", G, GEN + ["--temperature", "-1"], None, 2, "--temperature -1.0: must be"),
    ("generate-top-k-negative", G, GEN + ["--top-k", "-1"], None, 2, "--top-k -1: must be >= 0"),
    ("generate-seed-too-big", G, GEN + ["--seed", str(2**64)], None, 2, "must lie in [-2**63, 2**64)"),
    ("generate-device-unknown", G, GEN + ["--device", "banana"], None, 2, "--device 'banana' is not a device"),
    ("generate-device-mps", G, GEN + ["--device", "mps"], None, 2, "--device 'mps': only cpu and cuda are supported"),
    ("generate-device-cuda-without-gpu", G, GEN + ["--device", "cuda"], None, 2, "--device cuda: no GPU is visible"),
    # ---- plot_metrics (issue 14, found item 9)
    (
        "plot-step-not-a-number",
        PM,
        ["pm_str", "--out", "o.png"],
        None,
        2,
        "a record has step 'ten'; steps must be integers",
    ),
    ("plot-step-a-list", PM, ["pm_list", "--out", "o.png"], None, 2, "a record has step [1, 2]"),
    ("plot-step-fractional", PM, ["pm_frac", "--out", "o.png"], None, 2, "a record has step 1.5"),
    ("plot-not-utf8", PM, ["pm_latin1", "--out", "o.png"], None, 2, "metrics.jsonl: not UTF-8 text"),
    (
        "plot-unknown-option",
        PM,
        ["pm_str", "--out", "o.png", "--smoth", "3"],
        None,
        2,
        "unrecognized arguments: --smoth",
    ),
    # ---- plan.py (issue 14, found item 9)
    (
        "plan-zero-inter-node-bandwidth",
        PL,
        ["--model", os.path.join(ROOT, "configs", "20B.yml"), "--system", "sys0.yml", "--nodes", "2"],
        None,
        2,
        "system.bw_inter_node_gbs must be > 0, got 0",
    ),
    (
        "plan-nodes-1e9",
        PL,
        PLAN + ["--nodes", "1000000000"],
        None,
        2,
        "argument --nodes: 1000000000 must lie in [1, 100,000]",
    ),
    ("plan-nodes-not-integer", PL, PLAN + ["--nodes", "1e9"], None, 2, "argument --nodes: '1e9' is not an integer"),
    (
        "plan-reserve-nan",
        PL,
        PLAN + ["--nodes", "2", "--reserve-gib", "nan"],
        None,
        2,
        "argument --reserve-gib: nan is not finite",
    ),
    (
        "plan-reserve-everything",
        PL,
        PLAN + ["--nodes", "2", "--reserve-gib", "64"],
        None,
        2,
        "--reserve-gib 64 leaves nothing of the 64 GiB per device",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(case, world, tmp_path, monkeypatch, capfd):
    cid, entry, argv, mutate, code, needle = case
    if cid == "generate-device-cuda-without-gpu":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible here")
    d = scratch(world, tmp_path, monkeypatch)
    if mutate:
        mutate(d)
    before = snapshot(d, skip=("cache",))
    capfd.readouterr()
    t0 = time.perf_counter()
    rc = call(entry, argv)
    took = time.perf_counter() - t0
    line = one_error_line(capfd)
    assert rc == code, (rc, line)
    assert needle in line, line
    assert took < 20, f"{cid} took {took:.1f} s"  # no hang, no 56-s MemoryError
    print(f"{cid}: exit {rc}: {line}")
    after = snapshot(d, skip=("cache",))
    assert after == before, ({p for p in before if before[p] != after.get(p)}, set(after) - set(before))


def test_cases_are_documented():
    doc = open(os.path.join(ROOT, "docs", "reliability.md")).read()
    missing = [c[0] for c in CASES if f"`{c[0]}`" not in doc]
    assert not missing, missing
