"""Memory you can trust on a device (issue 27 item 3): the engine frees its transport buffers when
a collective is done (no reference cycle waits for Python's collector), the preflight counts every
buffer the engine holds at its peak (upper bound of the dry run's measured peak, phase by phase)
and keeps a stated reserve per system file for what no tensor counts."""

import gc
import os
import weakref

import torch

from megatron_topo.zero_topo.comm import Handle, TwoStageHandle


class _TwoStage(TwoStageHandle):
    """A two-stage handle like TwoHopReduce / QuantizedCombine: buffers as attributes, stages as
    bound methods."""

    def __init__(self):
        self.buf = torch.zeros(1000)
        super().__init__([], self._second, self._finish)

    def _second(self):
        self.buf2 = torch.zeros(1000)
        return []

    def _finish(self):
        return self.buf.sum()


def test_a_finished_two_stage_handle_is_freed_without_the_cyclic_collector():
    was = gc.isenabled()
    gc.disable()
    try:
        h = _TwoStage()
        ref = weakref.ref(h)
        h.wait()
        del h
        assert ref() is None  # on 1d0c977 the bound methods kept it (and its buffers) alive
        one = Handle([], lambda: 1)
        ref = weakref.ref(one)
        one.wait()
        del one
        assert ref() is None
    finally:
        if was:
            gc.enable()


import pytest  # noqa: E402

from megatron_topo import preflight  # noqa: E402
from megatron_topo.config import ConfigError, load_config  # noqa: E402
from megatron_topo.dryrun import dry_run  # noqa: E402
from megatron_topo.topology import Topology  # noqa: E402
from megatron_topo.zero_topo import memory  # noqa: E402
from megatron_topo.zero_topo.sharding import resolve_plan  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = {
    "num_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "seq_length": 256,
    "max_position_embeddings": 256,
    "vocab_size": 4096,
    "no_weight_tying": True,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 2,
    "precision": "bf16",
    "checkpoint_activations": True,
    "zero_topo.quant_block_size": 256,
    "zero_topo.grad_quant_block_size": 256,
}


def _small(preset, *sets):
    over = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in SMALL.items()] + list(sets)
    return load_config([os.path.join(REPO, f"configs/{preset}.yml"), os.path.join(REPO, "configs/frontier.yml")], over)


@pytest.mark.parametrize(
    "preset,sets",
    [
        ("topo", ()),
        ("zeropp", ()),
        ("mics", ("precision=fp16",)),
        ("ddp", ()),
        ("topo", ("zero_topo.combine_bits=8", "zero_topo.publish_bits=8")),
        ("topo", ("zero_topo.combine_bits=8", "zero_topo.max_combines_in_flight=1")),
        ("mics", ("zero_topo.combine_bits=8", "zero_topo.max_combines_in_flight=2")),
        ("mics", ("zero_topo.combine_bits=8", "zero_topo.max_combines_in_flight=0")),
        ("zero3", ("checkpoint_activations=false",)),
        ("topo", ("zero_topo.error_feedback=true", "precision=fp32")),
    ],
)
def test_the_estimate_counts_every_buffer_the_dry_run_allocates(preset, sets):
    """The preflight's estimate bounds what the engine's step allocates (measured on meta tensors
    by the dry run: every storage the step creates), overall and in the step, where no
    activation is alive: there the buffers (combines of both stages, fp32 gradients, post-step
    gathers) are counted to within one optimizer shard's scratch copy and the step's scalars."""
    cfg = _small(preset, *sets)
    r = dry_run(cfg, 16, 5)
    est, states = r["estimate_bytes_per_rank"], r["model_state_bytes_per_rank"]["total"]
    assert est["model_states"] == states
    assert r["peak_bytes_per_rank"] <= est["total"]
    measured = r["phase_peak_bytes_per_rank"]
    for phase in ("forward", "backward", "last_backward", "step", "next_forward"):
        assert measured[phase] <= est["total"], phase
    step = measured["step"] - states
    slack = max(u["publish_tmp"] for u in [memory_unit(cfg, r, P) for P in _padded(cfg, r)])
    # within the scalars of the step (per-unit norms, overflow flags: a few KiB) and one shard's scratch
    assert step <= est["phases"]["step"] <= step + slack + memory.STEP_SCALARS, (step, est["phases"]["step"])


def _padded(cfg, r):
    from megatron_topo.model import unit_numels
    from megatron_topo.zero_topo import memory
    from megatron_topo.zero_topo.sharding import Plan

    return memory.padded_units(unit_numels(cfg.model), Plan(**r["plan"]), r["world_size"])


def memory_unit(cfg, r, P):
    from megatron_topo.zero_topo import memory
    from megatron_topo.zero_topo.sharding import Plan

    return memory.unit_buffers(P, Plan(**r["plan"]), r["world_size"], cfg.precision, 8)


CFG20 = [os.path.join(REPO, f"configs/{f}.yml") for f in ("20B", "topo", "frontier")]


def test_20b_topo_on_16_gcds_is_refused_only_because_of_the_reserve():
    """The estimate alone fits the 64 GiB of a GCD; with frontier.yml's reserve (context, RCCL
    buffers, fragmentation) it does not, and the line says so and where the reserve comes from.
    Without a reserve (system.memory_reserve_gib=0) the same plan passes."""
    topo = Topology(16, 2, 4)
    cfg = load_config(CFG20)
    plan = resolve_plan(cfg.zero_topo, topo)
    with pytest.raises(ConfigError) as e:
        preflight.check(cfg, plan, topo, torch.device("cpu"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("20.6B parameters under topo on 16 ranks need 52.7 GiB of model states per rank (+ ")
    assert (
        "+ 5.2 GiB reserve for context, communicators and fragmentation (system.memory_reserve_gib), "
        "64.0 GiB available (it fits the device only without the reserve): use >= 24 ranks"
    ) in msg
    est = preflight.check(load_config(CFG20, ["system.memory_reserve_gib=0"]), plan, topo, torch.device("cpu"))
    assert est["reserve"] == 0 and 60 * 2**30 < est["total"] <= 64 * 2**30


def test_a_system_block_without_a_reserve_keeps_8_percent_and_a_reserve_too_large_is_one_line():
    cfg = load_config(CFG20, ["system.device_memory_gib=100"])
    assert preflight.reserve_bytes(cfg, 100 * 2**30) == int(5.2 * 2**30)  # frontier.yml states one
    cfg.system.memory_reserve_gib = None
    assert preflight.reserve_bytes(cfg, 100 * 2**30) == int(0.08 * 100 * 2**30)
    cfg.system.memory_reserve_gib = 100.0
    with pytest.raises(
        ConfigError,
        match=r"^system.memory_reserve_gib 100 leaves nothing of the 100 GiB per "
        r"device; valid: 0 <= memory_reserve_gib < device_memory_gib$",
    ):
        preflight.reserve_bytes(cfg, 100 * 2**30)
    with pytest.raises(ConfigError, match="memory_reserve_gib"):
        load_config(CFG20, ["system.memory_reserve_gib=-1"])


def test_list_keys_lists_the_reserve():
    from megatron_topo.config import describe_keys

    assert "system.memory_reserve_gib" in describe_keys()
