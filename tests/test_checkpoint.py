"""Sharded checkpoints: on-disk layout and atomicity, bit-exact resume under topo on 8 ranks,
consolidation, HuggingFace conversion (logits), generation, and refusing code in a checkpoint."""

import json
import os
import subprocess
import sys

import pytest
import torch

from megatron_topo.commands import consolidate_checkpoint, convert_to_hf, generate
from megatron_topo.commands import train as train_cli
from megatron_topo.training import Trainer
from megatron_topo.zero_topo import checkpoint as ckpt

from .dist_utils import run_distributed
from .train_utils import datasets, local_runtime, small_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the first AdamW imports torch._dynamo (seconds of CPU): do it once here, not in 8 forked ranks
torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], fused=True)


def _trainer(tmp_path, tag, steps=2, total=4, save=None, load=None, rank=0, world=1, gcds=1, gpus=None, **over):
    cfg = small_config(tmp_path, **{"train.train_iters": total, **over})
    cfg.logging.log_dir = str(tmp_path / tag)
    cfg.checkpoint.save, cfg.checkpoint.load = save, load
    tr = Trainer(cfg, local_runtime(rank, world, gcds, gpus), datasets=datasets(cfg), log=lambda *a, **k: None)
    tr.train(until=steps)
    return tr


# ------------------------------------------------------------------------------------ layout
def test_layout_metadata_keep_last_and_interrupted_saves(tmp_path):
    root = tmp_path / "ck"
    tr = _trainer(tmp_path, "a", steps=1, total=6, save=str(root), **{"checkpoint.keep_last": 2})
    sd = root / "global_step1"
    assert (root / "latest").read_text() == "global_step1\n"
    assert sorted(os.listdir(sd)) == ["config.yml", "meta.json", "rank_00000.pt"]
    meta = json.loads((sd / "meta.json").read_text())
    assert meta["format"] == ckpt.FORMAT_VERSION and meta["step"] == 1 and meta["world_size"] == 1
    assert meta["shard_holders"] == 1 and meta["plan"]["preset"] == "ddp"
    assert meta["trainer"]["consumed_samples"] == tr.state.consumed_samples
    size, digest = ckpt.file_digest(str(sd / "rank_00000.pt"))
    assert meta["files"]["rank_00000.pt"] == {"bytes": size, "sha256": digest}
    rf = torch.load(sd / "rank_00000.pt", weights_only=True)
    assert rf["holder"] and len(rf["shards"]) == len(meta["units"]) == len(tr.engine.units)
    for sh, u, m in zip(rf["shards"], tr.engine.units, meta["units"]):
        assert (sh["lo"], sh["hi"], sh["padded"], sh["numel"]) == (*u.optim_range, u.layout.padded, u.numel)
        assert m["padded"] == u.layout.padded and sh["master"].numel() == sh["hi"] - sh["lo"]
    # leftovers of interrupted saves: a half-written step directory and an '.old' copy whose new
    # copy is complete; neither is ever 'latest', and the next save removes both
    (root / ".tmp_global_step9").mkdir()
    (root / ".tmp_global_step9" / "rank_00000.pt.part").write_bytes(b"partial")
    os.makedirs(root / "global_step1.old")
    assert ckpt.resolve(str(root)) == str(sd)
    for _step in (2, 3):
        tr.train_step()
        tr.save()
    assert sorted(d for d in os.listdir(root)) == ["global_step2", "global_step3", "latest"]
    assert (root / "latest").read_text() == "global_step3\n"
    # pruning never removes what 'latest' names, even when it is not the newest step
    tr.state.step = 1
    tr.cfg.checkpoint.keep_last = 1
    tr.save()
    assert (root / "latest").read_text() == "global_step1\n" and (root / "global_step1" / "meta.json").is_file()
    # a crash while re-saving the same step leaves the complete old copy as global_stepN.old
    os.replace(root / "global_step1", root / "global_step1.old")
    assert ckpt.resolve(str(root)) == str(root / "global_step1.old")


def _resume_8(rank, world, tmp):
    over = {
        "zero_topo.preset": "topo",
        "zero_topo.quant_block_size": 64,
        "zero_topo.grad_quant_block_size": 64,
        "train.gradient_accumulation_steps": 2,
    }
    kw = dict(rank=rank, world=world, gcds=2, gpus=2, total=4, **over)
    straight = _trainer(tmp, "straight", steps=4, **kw)
    first = _trainer(tmp, "first", steps=2, save=str(tmp / "ck"), **kw)
    assert first.engine.plan.preset == "topo" and first.engine.plan.weight_bits == 8
    second = _trainer(tmp, "second", steps=4, load=str(tmp / "ck"), **kw)
    a, b = ckpt.gather_full_state(straight.engine), ckpt.gather_full_state(second.engine)
    same = all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in ckpt.STATE_KEYS)
    steps = [(x["step"], y["step"]) for x, y in zip(a, b)]
    pa, pb = straight.engine.full_parameters(), second.engine.full_parameters()
    return same, steps, all(torch.equal(pa[n], pb[n]) for n in pa)


def test_resume_topo_on_8_ranks_is_bit_exact(tmp_path):
    """2 nodes x 2 GPUs x 2 GCDs, quantized topo (INT8 weights/secondary, INT4 gradients): stop at
    step 2, resume, and steps 3-4 equal the uninterrupted run bit for bit on every rank."""
    res = run_distributed(_resume_8, 8, tmp_path)
    for rank, (same, steps, params) in enumerate(res):
        assert same and params, f"rank {rank}: resumed state differs from the uninterrupted run"
        assert all(x == y == 4.0 for x, y in steps), (rank, steps)
    la = [json.loads(x)["loss"] for x in open(tmp_path / "straight" / "metrics.jsonl")]
    lb = [json.loads(x)["loss"] for x in open(tmp_path / "second" / "metrics.jsonl")]
    assert la[2:] == lb and len(lb) == 2, (la, lb)
    meta = ckpt.read_meta(ckpt.resolve(str(tmp_path / "ck")))
    assert meta.world_size == 8 and meta.topology == {"world_size": 8, "gcds_per_gpu": 2, "gpus_per_node": 2}
    assert len(meta.files) == 8


# ------------------------------------------------------------------------------------ tools
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small model trained 2 steps and saved (ddp, one process), plus its live state."""
    tmp = tmp_path_factory.mktemp("trained")
    tr = _trainer(tmp, "run", steps=2, total=4, save=str(tmp / "ck"))
    return tmp, tr


def test_consolidate_to_one_torch_file_and_to_safetensors(trained, tmp_path, capsys):
    tmp, tr = trained
    live = tr.engine.full_parameters()
    out = tmp_path / "full.pt"
    assert consolidate_checkpoint.main(["--checkpoint", str(tmp / "ck"), "--output", str(out)]) == 0
    full = torch.load(out, weights_only=True)
    assert full["step"] == 2 and full["trainer"]["step"] == 2 and "zero_topo" in full["config_yaml"]
    assert set(full["model"]) == set(live)
    assert all(torch.equal(full["model"][n], live[n]) for n in live)
    st = ckpt.gather_full_state(tr.engine)
    for u, entry in zip(tr.engine.units, st):  # moments, parameter by parameter
        names = {id(p): n for n, p in tr.engine.module.named_parameters()}
        for s in u.specs:
            n = names[id(s.param)]
            want = entry["exp_avg_sq"][s.offset : s.offset + s.numel].view(s.shape)
            assert torch.equal(full["optimizer"]["exp_avg_sq"][n], want), n
            assert full["optimizer"]["step"][n] == 2.0
    # safetensors weights + optimizer next to them; the step directory works as input too
    out2 = tmp_path / "model.safetensors"
    assert consolidate_checkpoint.main(["--checkpoint", str(tmp / "ck" / "global_step2"), "--output", str(out2)]) == 0
    from safetensors.torch import load_file

    w = load_file(str(out2))
    assert all(torch.equal(w[n], live[n]) for n in live)
    opt = torch.load(tmp_path / "model.optim.pt", weights_only=True)
    assert torch.equal(
        opt["optimizer"]["exp_avg"]["layers.0.attention.dense.weight"],
        full["optimizer"]["exp_avg"]["layers.0.attention.dense.weight"],
    )
    # never overwrites without --force
    before = out.read_bytes()
    capsys.readouterr()
    assert consolidate_checkpoint.main(["--checkpoint", str(tmp / "ck"), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already exists" in err[0] and out.read_bytes() == before


def test_convert_to_hf_loads_in_transformers_with_equal_logits(trained, tmp_path):
    transformers = pytest.importorskip("transformers")
    tmp, tr = trained
    hf_dir = tmp_path / "hf"
    assert convert_to_hf.main(["--checkpoint", str(tmp / "ck"), "--output", str(hf_dir)]) == 0
    assert sorted(os.listdir(hf_dir)) == ["config.json", "model.safetensors"]
    hf = transformers.GPTNeoXForCausalLM.from_pretrained(str(hf_dir)).eval()
    ours = tr.engine.module.eval()
    ids = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = ours(ids)
        b = hf(input_ids=ids).logits
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    # a step directory works too, and an existing output needs --force
    step_dir = tmp / "ck" / "global_step2"
    assert convert_to_hf.main(["--checkpoint", str(step_dir), "--output", str(hf_dir)]) == 2
    assert convert_to_hf.main(["--checkpoint", str(step_dir), "--output", str(hf_dir), "--force"]) == 0
    assert transformers.GPTNeoXForCausalLM.from_pretrained(str(hf_dir)) is not None


def test_generate_prints_greedy_ids_and_text(trained, capsys):
    tmp, tr = trained
    model = tr.engine.module.eval()
    ids = [5, 6, 7]
    with torch.no_grad():  # our own greedy loop on the live model
        seq = list(ids)
        for _ in range(6):
            seq.append(int(model(torch.tensor([seq[-16:]]))[0, -1].argmax()))
    capsys.readouterr()
    assert (
        generate.main(["--checkpoint", str(tmp / "ck"), "--prompt-ids", "5,6,7", "--max-new-tokens", "6", "--greedy"])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "ids: " + " ".join(map(str, seq[3:]))
    assert out[1].startswith("text: ")  # the config names ByteLevel: text is printed too
    assert (
        generate.main(
            ["--checkpoint", str(tmp / "ck"), "--prompt", "0!", "--max-new-tokens", "3", "--seed", "1", "--top-k", "5"]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert len(out[0].split()) == 4 and all(0 <= int(x) < 64 for x in out[0].split()[1:])
    # a prompt whose tokens the model cannot embed is one clear error, not an IndexError
    assert generate.main(["--checkpoint", str(tmp / "ck"), "--prompt", "abc", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "outside the model's vocabulary" in err[0]


# ------------------------------------------------------------------------------------ security
class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoint_that_runs_code_is_refused(trained, tmp_path, capfd):
    """A rank file whose pickle would create a marker file on load: every entry point refuses it
    with one line and the marker never appears."""
    import shutil

    tmp, _ = trained
    bad = tmp_path / "ck"
    shutil.copytree(tmp / "ck", bad)
    marker = tmp_path / "PWNED"
    rf = bad / "global_step2" / "rank_00000.pt"
    torch.save({"shards": [], "evil": _Payload(str(marker))}, rf)
    cfg = tmp_path / "c.yml"
    cfg.write_text(
        f"num_layers: 2\nhidden_size: 32\nnum_attention_heads: 4\nseq_length: 16\n"
        f"max_position_embeddings: 16\ntrain_micro_batch_size_per_gpu: 2\nvocab_size: 64\n"
        f"rotary_pct: 0.25\ngpt_j_residual: true\nno_weight_tying: true\n"  # the trained model's, stated
        f"precision: fp32\nload: {bad}\nlog_dir: {tmp_path / 'log'}\ntrain_iters: 3\n"
        f"data_path: {tmp_path / 'nodata'}\n"
    )
    runs = [
        lambda: train_cli.main([str(cfg)]),
        lambda: consolidate_checkpoint.main(["--checkpoint", str(bad), "--output", str(tmp_path / "o.pt")]),
        lambda: convert_to_hf.main(["--checkpoint", str(bad), "--output", str(tmp_path / "hf")]),
        lambda: generate.main(["--checkpoint", str(bad), "--prompt-ids", "1", "--max-new-tokens", "1"]),
    ]
    for run in runs:
        capfd.readouterr()
        assert run() == 2
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "refusing to load it" in err[0] and "rank_00000.pt" in err[0], err
        assert not marker.exists()
    # the loader itself, with and without meta.json's digests
    with pytest.raises(ckpt.CheckpointError, match="refusing"):
        ckpt.load_rank_file(str(bad / "global_step2"), 0)
    assert not marker.exists()
    # and a YAML config that would construct Python objects is refused by the safe loader
    y = tmp_path / "evil.yml"
    y.write_text(f"num_layers: !!python/object/apply:builtins.open ['{marker}', 'w']\n")
    capfd.readouterr()
    assert train_cli.main([str(y)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "invalid YAML" in err[0] and not marker.exists()


def test_tools_run_as_scripts(trained, tmp_path):
    tmp, _ = trained
    p = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tools", "generate.py"),
            "--checkpoint",
            str(tmp / "ck"),
            "--prompt-ids",
            "1,2",
            "--max-new-tokens",
            "2",
            "--greedy",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and p.stdout.startswith("ids: "), p.stderr
