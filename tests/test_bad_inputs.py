"""Bad inputs across config, plan, topology, data, checkpoint, CLI and environment: each gives its
exit code, exactly one clear line on stderr, and leaves every file on disk as it was.

The table of cases is mirrored in docs/reliability.md (a test checks every id is listed there).
Entry points run in this process (``main(argv)`` of train.py and the tools) with the working
directory set to a scratch copy of a small world: a config, a token dataset and a checkpoint.
A resharded load (another world size or plan) is *not* an error and is not in this table.
"""

import os

import pytest

from megatron_topo.commands import consolidate_checkpoint, convert_to_hf, generate
from megatron_topo.commands import train as train_cli
from megatron_topo.training import fault_injection

from .cli_cases import BASE_CFG, ROOT, call, one_error_line, scratch, snapshot, train_checkpoint, write_dataset


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """cfg.yml + data/toy.{bin,idx} + ck/ (a real checkpoint at step 2), built once."""
    d = tmp_path_factory.mktemp("world")
    (d / "cfg.yml").write_text(BASE_CFG)
    write_dataset(d / "data" / "toy", 64, 0)
    train_checkpoint(d)
    return d


# ------------------------------------------------------------------------------ mutations
def _write(rel, text):
    def f(d):
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    return f


def _truncate(rel, keep=0.5):
    def f(d):
        p = d / rel
        data = p.read_bytes()
        p.write_bytes(data[: int(len(data) * keep)])

    return f


def _flip_byte(rel):
    def f(d):
        p = d / rel
        data = bytearray(p.read_bytes())
        i = data.find(b"data/0") + 64  # inside the first tensor's storage record
        data[i] ^= 0xFF
        p.write_bytes(bytes(data))

    return f


def _remove(rel):
    return lambda d: (d / rel).unlink()


def _pickle_payload(d):
    import torch

    class Payload:
        def __reduce__(self):
            return (open, (str(d / "PWNED"), "w"))

    torch.save({"shards": [], "x": Payload()}, d / "ck" / "global_step2" / "rank_00000.pt")


STEP = "ck/global_step2"
T, C, H, G = train_cli.main, consolidate_checkpoint.main, convert_to_hf.main, generate.main

# (id, category, entry point, argv, env, mutation, exit code, text the one stderr line contains)
CASES = [
    # ---- config
    ("config-missing", "config", T, ["nope.yml"], {}, None, 2, "config file not found: nope.yml"),
    (
        "config-invalid-yaml",
        "config",
        T,
        ["cfg.yml", "bad.yml"],
        {},
        _write("bad.yml", "num_layers: [1, 2\n"),
        2,
        "bad.yml: line 2: invalid YAML",
    ),
    (
        "config-python-tag",
        "config",
        T,
        ["evil.yml"],
        {},
        _write("evil.yml", "num_layers: !!python/object/apply:builtins.open ['PWNED', 'w']\n"),
        2,
        "invalid YAML",
    ),
    (
        "config-unknown-key",
        "config",
        T,
        ["cfg.yml", "typo.yml"],
        {},
        _write("typo.yml", "num_layerz: 3\n"),
        2,
        "did you mean 'num_layers'",
    ),
    (
        "config-wrong-type",
        "config",
        T,
        ["cfg.yml", "--set", "train_iters=lots"],
        {},
        None,
        2,
        "train_iters: expected an integer",
    ),
    (
        "config-key-in-two-files",
        "config",
        T,
        ["cfg.yml", "two.yml"],
        {},
        _write("two.yml", "hidden_size: 64\n"),
        2,
        "is set in both cfg.yml and two.yml",
    ),
    (
        "config-heads-do-not-divide",
        "config",
        T,
        ["cfg.yml", "--set", "num_attention_heads=5"],
        {},
        None,
        2,
        "not divisible by num_attention_heads 5",
    ),
    (
        "config-bad-precision",
        "config",
        T,
        ["cfg.yml", "--set", "precision=fp8"],
        {},
        None,
        2,
        "precision='fp8' is not valid",
    ),
    (
        "config-set-without-value",
        "config",
        T,
        ["cfg.yml", "--set", "train_iters"],
        {},
        None,
        2,
        "expected dotted.key=value",
    ),
    # ---- plan
    (
        "plan-unknown-preset",
        "plan",
        T,
        ["cfg.yml", "--set", "zero_topo.preset=zero4"],
        {},
        None,
        2,
        "zero_topo.preset='zero4' is not valid",
    ),
    (
        "plan-bad-factor",
        "plan",
        T,
        ["cfg.yml", "--set", "zero_topo.weight_factor=3"],
        {},
        None,
        2,
        "zero_topo.weight_factor=3 does not fit the topology",
    ),
    (
        "plan-bad-block-size",
        "plan",
        T,
        ["cfg.yml", "--set", "zero_topo.quant_block_size=100"],
        {},
        None,
        2,
        "quant_block_size=100 is not valid",
    ),
    (
        "plan-bad-bits",
        "plan",
        T,
        ["cfg.yml", "--set", "zero_topo.grad_bits=2"],
        {},
        None,
        2,
        "zero_topo.grad_bits=2 is not valid",
    ),
    (
        "plan-bad-inter-node-reduce",
        "plan",
        T,
        ["cfg.yml", "--set", "zero_topo.inter_node_reduce=ring"],
        {},
        None,
        2,
        "inter_node_reduce='ring' is not valid",
    ),
    # ---- topology
    (
        "topology-gcds-do-not-divide",
        "topology",
        T,
        ["cfg.yml", "--set", "topology.gcds_per_gpu=2"],
        {},
        None,
        2,
        "gcds_per_gpu=2 does not divide the world size 1",
    ),
    (
        "topology-zero-gpus",
        "topology",
        T,
        ["cfg.yml", "--set", "topology.gpus_per_node=0"],
        {},
        None,
        2,
        "gpus_per_node must be >= 1",
    ),
    # ---- data
    (
        "data-path-missing",
        "data",
        T,
        ["cfg.yml", "--set", "data_path=data/nothing"],
        {},
        None,
        2,
        "data/nothing.idx: file not found",
    ),
    ("data-token-out-of-vocab", "data", T, ["cfg.yml", "--set", "vocab_size=32"], {}, None, 2, "32"),
    ("data-truncated-index", "data", T, ["cfg.yml"], {}, _truncate("data/toy.idx", 0.3), 2, "toy.idx"),
    # ---- checkpoint
    (
        "ckpt-path-missing",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=nowhere"],
        {},
        None,
        2,
        "checkpoint path does not exist: nowhere",
    ),
    (
        "ckpt-not-a-checkpoint",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=data"],
        {},
        None,
        2,
        "not a checkpoint directory",
    ),
    (
        "ckpt-missing-shard",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=ck"],
        {},
        _remove(f"{STEP}/rank_00000.pt"),
        2,
        "missing shard file",
    ),
    (
        "ckpt-model-shape-mismatch",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=ck", "--set", "hidden_size=64"],
        {},
        None,
        2,
        "parameter embed_in.weight has shape (64, 32) in the checkpoint but (64, 64) in the model",
    ),
    (
        "ckpt-layer-count-mismatch",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=ck", "--set", "num_layers=3"],
        {},
        None,
        2,
        "checkpoint has 4 units, the model has 5",
    ),
    (
        "ckpt-corrupt-meta",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=ck"],
        {},
        _write(f"{STEP}/meta.json", "{oops"),
        2,
        "meta.json is unreadable",
    ),
    (
        "ckpt-meta-missing-keys",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=ck"],
        {},
        _write(f"{STEP}/meta.json", "{}"),
        2,
        "meta.json is incomplete: missing step",
    ),
    (
        "ckpt-truncated-rank-file",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=ck"],
        {},
        _truncate(f"{STEP}/rank_00000.pt"),
        2,
        "is corrupt or truncated",
    ),
    (
        "ckpt-flipped-byte",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=ck"],
        {},
        _flip_byte(f"{STEP}/rank_00000.pt"),
        2,
        "corrupt",
    ),
    (
        "ckpt-latest-to-missing-dir",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=ck"],
        {},
        _write("ck/latest", "global_step99\n"),
        2,
        "points to global_step99, which is missing",
    ),
    (
        "ckpt-code-in-pickle",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "load=ck"],
        {},
        _pickle_payload,
        2,
        "refusing to load it",
    ),
    (
        "ckpt-save-is-a-file",
        "checkpoint",
        T,
        ["cfg.yml", "--set", "save=cfg.yml"],
        {},
        None,
        2,
        "save cfg.yml exists and is not a directory",
    ),
    # ---- CLI
    ("cli-no-arguments", "CLI", T, [], {}, None, 2, "the following arguments are required: configs"),
    ("cli-unknown-option", "CLI", T, ["cfg.yml", "--bogus"], {}, None, 2, "unrecognized arguments: --bogus"),
    (
        "cli-convert-missing-checkpoint",
        "CLI",
        H,
        ["--checkpoint", "nowhere", "--output", "hf"],
        {},
        None,
        2,
        "checkpoint path does not exist",
    ),
    (
        "cli-convert-output-not-empty",
        "CLI",
        H,
        ["--checkpoint", "ck", "--output", "data"],
        {},
        None,
        2,
        "--output data exists and is not empty",
    ),
    (
        "cli-consolidate-output-exists",
        "CLI",
        C,
        ["--checkpoint", "ck", "--output", "full.pt"],
        {},
        _write("full.pt", "PK\x03\x04 an earlier consolidation"),
        2,
        "--output full.pt already exists",
    ),
    (
        "cli-generate-bad-ids",
        "CLI",
        G,
        ["--checkpoint", "ck", "--prompt-ids", "1,x", "--max-new-tokens", "2"],
        {},
        None,
        2,
        "expected comma-separated integers",
    ),
    (
        "cli-generate-id-out-of-vocab",
        "CLI",
        G,
        ["--checkpoint", "ck", "--prompt-ids", "999", "--max-new-tokens", "2"],
        {},
        None,
        2,
        "token id 999 is outside the model's vocabulary 0..63",
    ),
    (
        "cli-generate-no-prompt",
        "CLI",
        G,
        ["--checkpoint", "ck", "--max-new-tokens", "2"],
        {},
        None,
        2,
        "one of the arguments --prompt --prompt-ids is required",
    ),
    # ---- environment
    (
        "env-no-master-addr",
        "environment",
        T,
        ["cfg.yml"],
        {"WORLD_SIZE": "2", "RANK": "0"},
        None,
        2,
        "MASTER_ADDR is not set",
    ),
    (
        "env-rank-outside-world",
        "environment",
        T,
        ["cfg.yml"],
        {"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
        None,
        2,
        "RANK=5 is outside WORLD_SIZE=2",
    ),
    ("env-world-not-integer", "environment", T, ["cfg.yml"], {"WORLD_SIZE": "two"}, None, 2, "must be integers"),
    (
        "env-master-port-not-number",
        "environment",
        T,
        ["cfg.yml"],
        {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"},
        None,
        2,
        "MASTER_PORT='http' is not a port number",
    ),
    (
        "env-cuda-without-gpu",
        "environment",
        T,
        ["cfg.yml", "--set", "distributed.device=cuda"],
        {},
        None,
        2,
        "no GPU is visible",
    ),
    (
        "env-bad-fault-spec",
        "environment",
        T,
        ["cfg.yml"],
        {fault_injection.ENV: "explode:step=1"},
        None,
        2,
        "fault 'explode'",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, world, tmp_path, monkeypatch, capfd):
    cid, _, entry, argv, env, mutate, code, needle = case
    if cid == "env-cuda-without-gpu":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible here")
    d = scratch(world, tmp_path, monkeypatch)
    if mutate:
        mutate(d)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = snapshot(d)
    capfd.readouterr()
    rc = call(entry, argv)
    line = one_error_line(capfd)
    assert rc == code, (rc, line)
    assert needle in line, line
    print(f"{cid}: {line}")
    after = snapshot(d)
    lost = [p for p in before if p not in after]
    changed = [p for p in before if p in after and after[p] != before[p]]
    assert not lost and not changed, (lost, changed)
    assert not (d / "PWNED").exists()


def test_table_is_documented():
    doc = open(os.path.join(ROOT, "docs", "reliability.md")).read()
    missing = [c[0] for c in CASES if f"`{c[0]}`" not in doc]
    assert not missing and len(CASES) >= 25, missing
