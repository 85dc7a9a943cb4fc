"""The INT8 post-step publish keeps at most ``max_in_flight`` units' receive buffers alive (all
units' at once before: about 10 GB for 20B topo), and what the step leaves allocated for the
publishes (freed when they are waited for) is memory.publish_buffer_bytes at most."""

import pytest

from megatron_topo.config import ZeroTopoConfig
from megatron_topo.dryrun import PeakMemory
from megatron_topo.zero_topo import memory

from .dist_utils import run_distributed
from .engine_cases import batch, loss_fn, make_engine, tiny_cfg


def _after_step(rank, world, in_flight):
    cfg = tiny_cfg(num_layers=6)
    tracker = PeakMemory()
    with tracker:
        eng = make_engine(
            rank,
            world,
            ZeroTopoConfig(preset="topo", publish_bits=8, quant_block_size=64, grad_quant_block_size=64),
            precision="bf16",
            cfg=cfg,
            max_in_flight=in_flight,
        )
        out = []
        for step in range(2):
            x, y = batch(step, rank, 0, cfg=cfg)
            eng.backward(loss_fn(eng(x), y), last_micro_batch=True)
            eng.step()
            pending = [u.index for u in eng.units if u.publish_receives()]
            held = tracker.current
            for u in eng.units:  # what the next forward does: the buffers go
                u.wait_publish()
            out.append((pending, held - tracker.current))
    numels = [u.numel for u in eng.units]
    return out, len(eng.units), memory.publish_buffer_bytes(numels, eng.plan, world, "bf16", in_flight)


@pytest.mark.parametrize("in_flight", [2])
def test_int8_publish_receive_buffers_are_bounded(in_flight):
    for rank, (steps, n_units, bound) in enumerate(run_distributed(_after_step, 8, in_flight)):
        assert n_units > in_flight + 1
        for pending, held in steps:
            # the last units' publishes overlap the next forward; the earlier ones are finished
            assert pending == list(range(n_units - in_flight, n_units)), (rank, pending)
            assert 0 < held <= bound, (rank, held, bound)
