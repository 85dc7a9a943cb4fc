"""No host synchronisation inside backward: no host data is turned into a tensor (which on a GPU
is a host-to-device copy) and no tensor value is read on the host, with error feedback and the
INT8 combine that the last backward launches (8 ranks, 2 nodes: the in-node quantized reduction
for topo, the 2-hop one for zeropp)."""

from torch.utils._python_dispatch import TorchDispatchMode

from megatron_topo.config import ZeroTopoConfig

from .dist_utils import run_distributed
from .engine_cases import batch, loss_fn, make_engine

# ops that move values between host and tensors: a Python list/scalar made a tensor, a tensor
# read as a Python number or bool
HOST_OPS = ("aten.lift_fresh", "aten._local_scalar_dense", "aten.is_nonzero", "aten.equal")


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _backward_ops(rank, world, preset):
    eng = make_engine(
        rank,
        world,
        ZeroTopoConfig(
            preset=preset,
            error_feedback=True,
            combine_bits=8,
            publish_bits=8,
            quant_block_size=64,
            grad_quant_block_size=64,
        ),
    )
    out = []
    for step in range(2):  # the second step's backward adds the first step's residuals
        x, y = batch(step, rank, 0, cfg=eng.module.cfg)
        loss = loss_fn(eng(x), y)
        rec = _Ops()
        with rec:
            eng.backward(loss, last_micro_batch=True)
        out.append(sorted({o for o in rec.ops if o.startswith(HOST_OPS)}))
        eng.step()
    return out


def test_backward_makes_no_host_sync():
    for preset in ("topo", "zeropp"):
        for rank, per_step in enumerate(run_distributed(_backward_ops, 8, preset)):
            assert per_step == [[], []], (preset, rank, per_step)
