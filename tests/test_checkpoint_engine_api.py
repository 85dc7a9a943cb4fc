"""The checkpoint package reaches an engine only through its public state API
(``state_dict``/``load_state_dict`` and a few named methods and attributes), and meta.json has one
typed record that the save writes and the readers read back unchanged."""

import ast
import json
import pathlib

import torch

from megatron_topo.config import ZeroTopoConfig
from megatron_topo.zero_topo import checkpoint as ckpt
from megatron_topo.zero_topo.checkpoint import meta_schema

from .engine_cases import make_engine, train_steps

PACKAGE = pathlib.Path(ckpt.__file__).parent
# what the checkpoint package may use of an engine: its state API and what describes it
ENGINE_API = {
    "state_dict",
    "load_state_dict",
    "unit_table",
    "shard_ranges",
    "full_state",
    "plan",
    "topo",
    "precision",
    "comm",
    "scaler",
}


ENGINE_PARTS = {
    "units",
    "optimizer",
    "groups",
    "module",
    "ef_reduce",
    "ef_combine",
    "grad_acc",
    "republish",
}  # what an engine is made of, under any name


def engine_uses(src: str, name: str) -> list[str]:
    """``name:line: X.attr`` for every use of an engine beyond ENGINE_API in one module's source:
    ``engine.X`` for any X outside it, and the engine's parts (units, optimizer ...) reached through
    any other name (``eng.units``; ``meta.units`` and Meta's own ``self.units`` are meta.json's)."""
    out = []
    for n in ast.walk(ast.parse(src)):
        if not isinstance(n, ast.Attribute):
            continue
        base = n.value.id if isinstance(n.value, ast.Name) else "..."
        if (base == "engine" and n.attr not in ENGINE_API) or (n.attr in ENGINE_PARTS and base not in ("meta", "self")):
            out.append(f"{name}:{n.lineno}: {base}.{n.attr}")
    return out


def test_the_checkpoint_package_uses_only_the_engine_state_api():
    used = [u for p in sorted(PACKAGE.glob("*.py")) for u in engine_uses(p.read_text(), p.name)]
    assert not used, "\n".join(used)


def test_state_dict_round_trips_into_another_engine():
    """load_state_dict(state_dict()) makes a fresh engine of the same plan equal, master weights,
    Adam moments and step included."""
    z = ZeroTopoConfig(preset="ddp")
    a = make_engine(0, 1, z, gcds=1, gpus=1)
    train_steps(a, 0, steps=2, accum=1)
    b = make_engine(0, 1, z, gcds=1, gpus=1)
    state = a.state_dict()
    b.load_state_dict(state)
    for x, y in zip(a.full_state(), b.full_state()):
        assert x["step"] == y["step"] == 2.0
        for k in ckpt.STATE_KEYS:
            assert torch.equal(x[k], y[k]), k
    assert [s["lo"] for s in state["shards"]] == [lo for lo, _ in b.shard_ranges()]


def test_meta_record_round_trips_byte_for_byte():
    """A meta.json the save writes reads back into the typed Meta and writes out as the same bytes."""
    record = {
        "format": 2,
        "step": 3,
        "world_size": 2,
        "topology": {"world_size": 2, "gcds_per_gpu": 1, "gpus_per_node": 2},
        "plan": {"weight_factor": 2, "grad_factor": 2, "optimizer_factor": 2, "preset": "zero3"},
        "precision": "bf16",
        "shard_holders": 2,
        "units": [{"padded": 8, "numel": 6, "params": [["w", 0, 4, [2, 2]], ["b", 4, 2, [2]]]}],
        "trainer": {"step": 3, "consumed_samples": 24, "consumed_valid": 4, "global_batch": 8},
        "files": {f"rank_0000{r}.pt": {"bytes": 100 + r, "sha256": "ab" * 32} for r in range(2)},
        "config": {"file": "config.yml", "bytes": 7, "sha256": "cd" * 32},
    }
    meta = meta_schema.validate(record, ckpt.SUPPORTED_FORMATS)
    assert meta.units[0].params[1] == ("b", 4, 2, (2,)) and meta.trainer.global_batch == 8 and meta.holders == 2
    assert json.dumps(meta.to_record(), indent=1) == json.dumps(record, indent=1)
