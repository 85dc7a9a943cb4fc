"""The HF export streams: tools/convert_to_hf.py reads one unit's master weights at a time (never
the Adam moments) and writes each tensor straight into its safetensors file, so its peak memory is
about one unit, not the model. Sharded output (--max-shard-size) follows transformers' layout
(model-0000K-of-0000N.safetensors + model.safetensors.index.json) and loads with equal logits;
a single file is byte-identical to safetensors' own save_file."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from megatron_topo.commands import convert_to_hf
from megatron_topo.config import ModelConfig, ZeroTopoConfig, load_config
from megatron_topo.model.hf import SafetensorsWriter, ShardedSafetensorsWriter, parse_size, shard_names, to_hf_key
from megatron_topo.zero_topo import checkpoint as ckpt

from .engine_cases import make_engine
from .train_utils import small_config

safetensors = pytest.importorskip("safetensors")
MB = 2**20


def _save_checkpoint(root, model_cfg, seed=0) -> ModelConfig:
    """A step-1 checkpoint of ``model_cfg`` with master weights and (random, non-zero) Adam moments,
    saved through checkpoint.save (one rank, ddp plan): no training step needed."""
    cfg = small_config(root)
    cfg.model = model_cfg
    eng = make_engine(0, 1, ZeroTopoConfig(preset="ddp"), gcds=1, gpus=1, cfg=model_cfg)
    g = torch.Generator().manual_seed(seed)
    for i in range(len(eng.units)):
        m = eng.optimizer.shard_state(i)["master"]
        v = torch.rand(m.shape, generator=g)
        eng.optimizer.load_shard_state(i, m, v, v * 0.5, 1)
    ckpt.save(eng, str(root / "ck"), 1, ckpt.TrainerState(1), cfg.to_flat_yaml(), 0, lambda: None)
    return eng


def _big_cfg():
    # ~87M parameters, 14 units: full fp32 master 330 MiB (+ moments: 1 GiB on disk); a layer is 27 MiB
    return ModelConfig(
        num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=16, vocab_size=1024, no_weight_tying=True
    )


# ru_maxrss is no use in a child of pytest: Linux keeps the parent's peak across fork + exec. VmHWM
# is the peak of this process's own memory; writing 5 to clear_refs resets it to the current RSS,
# so after the imports the peak counts the export alone.
PROBE = textwrap.dedent("""
    import json
    import torch, transformers, safetensors.torch  # every import before the baseline
    import torch._dynamo  # the parameter-table check builds the model on the meta device, which imports it
    transformers.GPTNeoXConfig
    from megatron_topo.commands import convert_to_hf
    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # then the imports' own peak counts too (a stricter test)
    base = status("VmRSS")
    rc = convert_to_hf.main(["--checkpoint", {ck!r}, "--output", {out!r}, "--max-shard-size", "100MB"])
    print(json.dumps({{"rc": rc, "base": base, "peak": status("VmHWM")}}))
""")


def _peak_rss(ck, out) -> dict:
    code = PROBE.format(ck=str(ck), out=str(out))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bigexport")
    _save_checkpoint(tmp, _big_cfg())  # the engine (model + master + moments) is freed here
    return tmp


def test_export_peak_memory_is_one_unit_not_the_model(big, tmp_path):
    """Peak RSS of the export (a subprocess; its peak minus the RSS after every import) stays below
    three units' fp32 master weights (the unit buffer, the mapped file pages being copied into it,
    and the previous unit's freed buffer, which glibc keeps in its heap for buffers under 32 MiB;
    a 20B model's units are mmapped and returned) plus 48 MiB of slack: less than half the model's
    fp32 master (330 MiB), let alone master + moments (1 GiB) that read_full_state reassembled in
    memory (the export before streaming: +2.9 GiB; this one measured +91..97 MiB)."""
    ck = big / "ck"
    meta = ckpt.read_meta(ckpt.resolve(str(ck)))
    unit_bytes = max(int(u.numel) for u in meta.units) * 4
    model_bytes = sum(int(u.numel) for u in meta.units) * 4
    assert len(meta.units) >= 14 and model_bytes > 300 * MB and unit_bytes < 30 * MB
    out = tmp_path / "hf"
    t0 = time.time()
    r = _peak_rss(ck, out)
    used = r["peak"] - r["base"]
    budget = 3 * unit_bytes + 48 * MB
    print(
        f"streaming export: peak RSS +{used / MB:.0f} MiB (budget {budget / MB:.0f} MiB, model fp32 "
        f"{model_bytes / MB:.0f} MiB) in {time.time() - t0:.1f} s"
    )
    assert r["rc"] == 0
    assert used < budget, (used / MB, budget / MB)
    assert used < model_bytes / 2
    # the output: 4 shards of at most 100 MB (decimal, as transformers) and the index
    files = sorted(os.listdir(out))
    shards = [f for f in files if f.endswith(".safetensors")]
    assert shards == [f"model-{k:05d}-of-00004.safetensors" for k in range(1, 5)]
    assert "model.safetensors.index.json" in files and "model.safetensors" not in files
    assert all(os.path.getsize(out / f) <= 100 * 10**6 for f in shards)
    index = json.load(open(out / "model.safetensors.index.json"))
    names = [to_hf_key(p[0]) for u in meta.units for p in u.params]
    assert sorted(index["weight_map"]) == sorted(names)
    assert index["metadata"]["total_size"] == model_bytes
    # every tensor is the checkpoint's master weights, bit for bit
    from safetensors import safe_open

    handles = {f: safe_open(str(out / f), "pt") for f in shards}
    files = {}  # each rank file opened (and its digest checked) once
    for i, u in enumerate(meta.units):
        flat = ckpt.full_unit_state(str(ck / "global_step1"), meta, i, files, keys=("master",))["master"]
        for name, off, numel, shape in u.params:
            got = handles[index["weight_map"][to_hf_key(name)]].get_tensor(to_hf_key(name))
            assert torch.equal(got, flat[off : off + numel].view(*shape)), name
    assert handles[shards[0]].metadata() == {"format": "pt", "source": "megatron_topo", "step": "1"}


def test_master_only_reader_never_touches_the_moments(big, monkeypatch):
    """full_unit_state(keys=("master",)) returns the master alone and never converts a moment."""
    sp = ckpt.resolve(str(big / "ck"))
    meta = ckpt.read_meta(sp)
    seen = []
    real = ckpt._shard_tensors
    monkeypatch.setattr(
        ckpt.storage, "_shard_tensors", lambda p, sh, u, keys=ckpt.STATE_KEYS: seen.append(keys) or real(p, sh, u, keys)
    )
    st = ckpt.full_unit_state(sp, meta, 1, keys=("master",))
    assert set(st) == {"master", "step"} and float(st["step"]) == 1.0
    assert seen == [("master",)]
    files = {}
    full = ckpt.full_unit_state(sp, meta, 1, files)  # the default still reads all three
    assert torch.equal(full["master"], st["master"]) and set(full) == {"master", "exp_avg", "exp_avg_sq", "step"}
    with pytest.raises(ValueError):
        ckpt.full_unit_state(sp, meta, 1, keys=("exp_avg",))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smallexport")
    cfg = ModelConfig(
        num_layers=3, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=64, no_weight_tying=True
    )
    eng = _save_checkpoint(tmp, cfg, seed=1)
    return tmp, eng.module.eval()


def test_sharded_export_loads_in_transformers_with_equal_logits(small, tmp_path):
    transformers = pytest.importorskip("transformers")
    tmp, ours = small
    one, many = tmp_path / "one", tmp_path / "many"
    assert convert_to_hf.main(["--checkpoint", str(tmp / "ck"), "--output", str(one)]) == 0
    assert convert_to_hf.main(["--checkpoint", str(tmp / "ck"), "--output", str(many), "--max-shard-size", "20KB"]) == 0
    assert "model.safetensors" in os.listdir(one) and "model.safetensors.index.json" not in os.listdir(one)
    shards = sorted(f for f in os.listdir(many) if f.endswith(".safetensors"))
    assert len(shards) > 3 and shards[0].startswith("model-00001-of-")
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ours(ids)
        for d in (one, many):
            hf = transformers.AutoModelForCausalLM.from_pretrained(str(d)).eval()
            torch.testing.assert_close(hf(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
    # bf16: the same layout, half the bytes
    b16 = tmp_path / "b16"
    assert (
        convert_to_hf.main(
            ["--checkpoint", str(tmp / "ck"), "--output", str(b16), "--dtype", "bf16", "--max-shard-size", "10KB"]
        )
        == 0
    )
    idx = json.load(open(b16 / "model.safetensors.index.json"))
    assert (
        idx["metadata"]["total_size"] * 2
        == json.load(open(many / "model.safetensors.index.json"))["metadata"]["total_size"]
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(b16), dtype=torch.bfloat16)
    assert hf.gpt_neox.layers[0].attention.dense.weight.dtype == torch.bfloat16
    # a bad size is one line, exit 2, nothing written
    assert (
        convert_to_hf.main(
            ["--checkpoint", str(tmp / "ck"), "--output", str(tmp_path / "x"), "--max-shard-size", "lots"]
        )
        == 2
    )
    assert not (tmp_path / "x").exists()


def _parts(path):
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    return n, json.loads(raw[8 : 8 + n]), raw[8 + n :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_writer_writes_what_save_file_writes(tmp_path, dtype):
    """Same header length, same header (as JSON: save_file orders __metadata__'s keys at random),
    same data bytes; with one metadata key the files are byte-identical."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    tensors = {
        "b.weight": torch.randn(3, 5, generator=g),
        "a.bias": torch.randn(7, generator=g),
        "gpt_neox.x": torch.randn(2, 2, 2, generator=g),
        "empty": torch.zeros(0, 4),
        "s": torch.tensor(3.0),
    }
    tensors = {k: v.to(dtype) for k, v in tensors.items()}
    table = {k: (tuple(v.shape), dtype) for k, v in tensors.items()}
    for md in ({"format": "pt", "source": "megatron_topo", "step": "7"}, {"format": "pt"}):
        save_file(tensors, str(tmp_path / "ref.safetensors"), metadata=md)
        w = SafetensorsWriter(str(tmp_path / "ours.safetensors"), table, md)
        for k in reversed(list(tensors)):  # any order
            w.put(k, tensors[k])
        w.close()
        assert _parts(tmp_path / "ours.safetensors") == _parts(tmp_path / "ref.safetensors")
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    w = SafetensorsWriter(str(tmp_path / "bad.safetensors"), {"a": ((2,), dtype)})
    with pytest.raises(ValueError, match="shape"):
        w.put("a", torch.zeros(3))
    with pytest.raises(ValueError, match="never written"):
        w.close()


def test_sizes_and_shard_split():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size("100") == 100
    assert parse_size("1.5MB") == 1_500_000 and parse_size(" 10kb ") == 10_000
    for bad in ("", "lots", "-1GB", "5 XB", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)
    f = torch.float32
    entries = [("a", (10,), f), ("b", (10,), f), ("c", (30,), f), ("d", (5,), f)]
    assert shard_names(entries, 80) == [["a", "b"], ["c"], ["d"]]  # c (120 bytes) alone
    assert shard_names(entries, 10**9) == [["a", "b", "c", "d"]]


def _save_on_two_ranks(rank, world, root):
    """zero3 over 2 ranks (2 shard holders, one file each), one Adam step, saved."""
    import torch.distributed as dist

    from .engine_cases import train_steps

    cfg = ModelConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=64, no_weight_tying=True
    )
    eng = make_engine(rank, world, ZeroTopoConfig(preset="zero3"), gcds=1, gpus=2, cfg=cfg)
    train_steps(eng, rank, steps=1, accum=1)
    yaml = small_config(root).to_flat_yaml() if rank == 0 else ""
    ckpt.save(eng, str(root / "ck"), 1, ckpt.TrainerState(1), yaml, rank, dist.barrier)
    # load it under another plan (zero1: the same optimizer ranges, so the resharding path) and
    # record which rank files this rank opens and whose tensors it copies
    other = make_engine(rank, world, ZeroTopoConfig(preset="zero1"), gcds=1, gpus=2, cfg=cfg)
    opened, read = [], []
    real_load, real_tensors = ckpt.load_rank_file, ckpt._shard_tensors
    ckpt.storage.load_rank_file = lambda sp, r, *a, **k: opened.append(r) or real_load(sp, r, *a, **k)
    ckpt.storage._shard_tensors = lambda path, sh, unit, keys=ckpt.STATE_KEYS: (
        read.append((os.path.basename(path), unit, tuple(keys))) or real_tensors(path, sh, unit, keys)
    )
    try:
        ckpt.load(other, str(root / "ck"), rank)
    finally:
        ckpt.storage.load_rank_file, ckpt.storage._shard_tensors = real_load, real_tensors
    same = all(
        torch.equal(a["master"], b["master"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
        for a, b in zip(ckpt.gather_full_state(eng), ckpt.gather_full_state(other))
    )
    reshard = eng.plan != other.plan and eng.plan.optimizer_factor == other.plan.optimizer_factor == 2
    return {"opened": sorted(set(opened)), "read": read, "units": len(eng.units), "same": same, "reshard": reshard}


def test_export_of_a_checkpoint_sharded_over_ranks(tmp_path):
    """Every unit's master is split over two rank files: the streamed export equals the full state
    read_full_state reassembles, and transformers gives our model's logits. Loading it into an
    engine with another plan reads each rank's own range from its own file only."""
    transformers = pytest.importorskip("transformers")
    from megatron_topo.model import build_model

    from .dist_utils import run_distributed

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], fused=True)  # import torch._dynamo once, not per rank
    loads = run_distributed(_save_on_two_ranks, 2, tmp_path)
    # checkpoint.load under another plan: each rank opens and copies from its own range's file only
    # (never another rank's master or moments), and gets the saved state
    for r, got in enumerate(loads):
        assert got["reshard"] and got["same"] and got["opened"] == [r], got
        assert got["read"] == [(f"rank_{r:05d}.pt", i, ckpt.STATE_KEYS) for i in range(got["units"])], got
    meta = ckpt.read_meta(ckpt.resolve(str(tmp_path / "ck")))
    assert meta.shard_holders == 2 and meta.world_size == 2
    out = tmp_path / "hf"
    assert (
        convert_to_hf.main(["--checkpoint", str(tmp_path / "ck"), "--output", str(out), "--max-shard-size", "30KB"])
        == 0
    )
    full = ckpt.read_full_state(str(tmp_path / "ck"))
    from safetensors.torch import load_file

    got = {}
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            got.update(load_file(str(out / f)))
    assert got.keys() == {to_hf_key(n) for n in full["params"]}
    assert all(torch.equal(got[to_hf_key(n)], t) for n, t in full["params"].items())
    assert full["optimizer"] and set(full["adam_step"].values()) == {1.0}
    weights = ckpt.read_full_state(str(tmp_path / "ck"), keys=("master",))  # weights only
    assert weights["optimizer"] == {} and weights["adam_step"] == {}
    assert all(torch.equal(weights["params"][n], t) for n, t in full["params"].items())
    model = build_model(ckpt.load_model_config(full, lambda p: load_config([p])), seed=0).eval()
    model.load_state_dict(full["params"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, model(ids), rtol=1e-5, atol=1e-5)


def test_sharded_writer_keeps_few_files_open(tmp_path):
    """400 shards written in order: at most one file open at a time; out of order works too (the
    files stay open until complete); a tensor never written is an error."""
    from safetensors.torch import load_file

    f = torch.float32
    tensors = {f"t{i:03d}": torch.full((4, 2), float(i)) for i in range(400)}
    entries = [(n, (4, 2), f) for n in tensors]
    w = ShardedSafetensorsWriter(str(tmp_path), entries, 32)
    most = 0
    for n, t in tensors.items():
        w.put(n, t)
        most = max(most, len(w.writers))
    files = w.close()
    assert most <= 1 and len(files) == 401 and files[-1] == "model.safetensors.index.json"
    index = json.load(open(tmp_path / files[-1]))
    assert index["weight_map"]["t399"] == "model-00400-of-00400.safetensors"
    assert index["metadata"]["total_size"] == 400 * 32
    assert torch.equal(load_file(str(tmp_path / index["weight_map"]["t123"]))["t123"], tensors["t123"])
    out = tmp_path / "rev"
    out.mkdir()
    w = ShardedSafetensorsWriter(str(out), entries[:6], 64)
    for n, _, _ in reversed(entries[:6]):
        w.put(n, tensors[n])
    assert w.close()[:3] == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    w = ShardedSafetensorsWriter(str(out), entries[:6], 10**6)
    w.put("t000", tensors["t000"])
    with pytest.raises(ValueError, match="never written"):
        w.close()
