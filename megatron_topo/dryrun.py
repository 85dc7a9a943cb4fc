"""Dry run: one rank of a large job, in one process, on no real memory.

``python train.py configs/20B.yml configs/topo.yml configs/frontier.yml --dry-run --world-size 384``
runs the real code of a training step -- plan, process groups, layout, sharded initialisation,
forward/backward with every gather and reduction, the cross-node combine, the optimizer and the
post-step gather -- as rank R of W, with tensors on the meta device (shapes, no storage) and
PyTorch's fake process group bound to the GPU device type, so any collective handed a host
tensor fails as it would under NCCL/RCCL. It reads no data. Memory comes from the engine's own
tensors: model-state bytes from their storage, the peak from every allocation the step makes.
"""

from __future__ import annotations

import contextlib
import json
import weakref
from typing import Optional

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .config import Config, flat_dict
from .model import build_model
from .topology import LEVELS, Topology, topology_from_config
from .zero_topo import memory

META = torch.device("meta")


class PeakMemory(TorchDispatchMode):
    """Live and peak bytes of every tensor storage created while active (meta tensors included:
    their storage has a size and no data). Storages are counted once, however many views."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.phase_name: Optional[str] = None
        self.phase_peaks: dict[str, int] = {}  # the peak of each phase (forward, backward, step, ...)
        self.peak = 0

    @property
    def peak(self) -> int:
        return self._peak

    @peak.setter
    def peak(self, value: int) -> None:
        """Every update of the peak (after any change of ``current``) also updates the phase's."""
        self._peak = value
        if self.phase_name is not None:
            self.phase_peaks[self.phase_name] = max(self.phase_peaks[self.phase_name], self.current)

    def phase(self, name: Optional[str]) -> None:
        """From now on, allocations count toward ``name``'s peak (which starts at what is live)."""
        self.phase_name = name
        if name is not None:
            self.phase_peaks[name] = max(self.phase_peaks.get(name, 0), self.current)

    def track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return
        n = st.nbytes()
        self.live[key] = n
        self.current += n
        self.peak = max(self.peak, self.current)
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def _resized(self, storage, old: int) -> None:
        """A storage resized in place (the engine releases a gathered unit's storage after use
        and gives it back for the next gather, docs/design.md §4.6). One created before the
        tracker started counts from here on by its change in size."""
        key, n = storage._cdata, storage.nbytes()
        if key not in self.live:
            self.live[key] = old
            weakref.finalize(storage, self._free, key)
        self.current += n - self.live[key]
        self.live[key] = n
        self.peak = max(self.peak, self.current)

    def __enter__(self):
        real, tracker = torch.UntypedStorage.resize_, self

        def resize_(storage, nbytes):
            old = storage.nbytes()
            out = real(storage, nbytes)
            tracker._resized(storage, old)
            return out

        self._real_resize = real
        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._real_resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out


class _FusedAttentionShapes(torch.autograd.Function):
    """Scaled-dot-product attention with the memory of a fused (flash) kernel, shapes only: it
    keeps q, k, v, the output and one fp32 log-sum-exp per row, never the s x s matrix that
    PyTorch's math fallback (the only one on the meta device) would allocate."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@contextlib.contextmanager
def fused_attention_on_meta():
    """Route meta-tensor attention through :class:`_FusedAttentionShapes` (also in the
    activation recompute, which runs inside autograd where function modes do not reach)."""
    F = torch.nn.functional
    real = F.scaled_dot_product_attention

    def sdpa(q, k, v, *args, **kwargs):
        if q.device.type == "meta":
            return _FusedAttentionShapes.apply(q, k, v)
        return real(q, k, v, *args, **kwargs)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = real


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int, device_type: str = "cuda"):
    """PyTorch's fake process group: collectives return at once without moving data; bound to
    ``device_type`` only, so a tensor on any other device (the host) is refused."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised; the dry run makes its own")
    dist.init_process_group(f"{device_type}:fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _step_inputs(cfg: Config):
    mb, seq = cfg.train.train_micro_batch_size_per_gpu, cfg.model.seq_length
    x = torch.zeros(mb, seq, dtype=torch.long, device=META)
    return x, x


def dry_run(cfg: Config, world_size: int, rank: int = 0, local_world_size: Optional[int] = None) -> dict:
    """Run one training step of ``cfg`` as ``rank`` of ``world_size``; returns the report."""
    from .training import Runtime, build_engine, loss_fn

    if not 0 <= rank < world_size:
        raise ValueError(f"--rank {rank} is outside the world of {world_size}; valid 0..{world_size - 1}")
    from .config import check_batch_size

    check_batch_size(cfg, world_size)  # DeepSpeed's train_batch_size against this world
    topo: Topology = topology_from_config(cfg.topology, world_size, local_world_size or world_size)
    from .analysis import autoplan

    plan, ranked = autoplan.resolve(cfg, topo)  # preset auto: the plan the trainer would choose
    with fake_process_group(world_size, rank):
        rt = Runtime(rank, world_size, rank % topo.ranks_per_node, topo, META, True, strict=True)
        # the meta model itself stands for no memory (a real run builds it on the meta device
        # too); from here on every storage is one the run would allocate on the GPU
        model = build_model(cfg.model, device=META)
        tracker = PeakMemory()
        with tracker, fused_attention_on_meta():
            eng = build_engine(cfg, rt, plan=plan, model=model)
            after_init = tracker.current
            init_peak = tracker.peak
            eng.comm.reset_counters()
            accum = cfg.train.gradient_accumulation_steps
            for m in range(accum):
                x, y = _step_inputs(cfg)
                tracker.phase("forward")
                loss = loss_fn(eng(x), y)
                tracker.phase("last_backward" if m == accum - 1 else "backward")
                eng.backward(loss / accum, last_micro_batch=m == accum - 1)
                del loss
            tracker.phase("step")
            eng.step(cfg.train.optimizer.params.lr)
            step_bytes = eng.comm.reset_counters()
            # the next step's forward, whose gathers wait for the post-step gathers one unit at a
            # time: the post-step buffers of the units not yet reached live beside its activations
            x, y = _step_inputs(cfg)
            tracker.phase("next_forward")
            loss = loss_fn(eng(x), y)
            tracker.phase(None)
            del loss
            for u in eng.units:
                u.free_full()
        states = eng.state_bytes_before_step
    numels = [u.numel for u in eng.units]
    formula = memory.state_bytes(numels, eng.plan, world_size, cfg.precision)
    limit = int(cfg.system.device_memory_gib * memory.GIB) if cfg.system is not None else None
    from . import preflight

    reserve = preflight.reserve_bytes(cfg, limit) if limit is not None else None
    est = preflight.estimate(cfg, eng.plan, world_size, numels)
    return {
        "parameters": sum(numels),
        "world_size": world_size,
        "rank": rank,
        "topology": topo.describe(),
        "plan": {k: v for k, v in vars(eng.plan).items()},
        "auto": autoplan.summary(ranked, cfg.system) if ranked else None,
        "auto_timed": autoplan.timed_note(ranked, cfg.zero_topo) if ranked else None,
        "precision": cfg.precision,
        "micro_batches_per_step": cfg.train.gradient_accumulation_steps,
        "model_state_bytes_per_rank": states,
        "model_state_bytes_formula": formula,
        "init_peak_bytes_per_rank": init_peak,
        "after_init_bytes_per_rank": after_init,
        "peak_bytes_per_rank": tracker.peak,
        "phase_peak_bytes_per_rank": dict(tracker.phase_peaks),
        "estimate_bytes_per_rank": est,
        "device_memory_bytes": limit,
        "reserve_bytes": reserve,
        # the measured peak and the preflight's estimate, each with the reserve kept free
        "fits": None if limit is None else tracker.peak + reserve <= limit,
        "estimate_fits": None if limit is None else est["total"] + reserve <= limit,
        "collective_bytes_per_step": {k: step_bytes[k] for k in (*LEVELS, "control")},
        "config": flat_dict(cfg),
    }


def render(r: dict) -> str:
    gib = memory.GIB
    st = r["model_state_bytes_per_rank"]
    lim = r["device_memory_bytes"]
    lines = [
        f"dry run: rank {r['rank']} of {r['world_size']} ({r['topology']}); {r['parameters']:,} parameters; "
        f"{r['precision']}; {r['micro_batches_per_step']} micro-batch(es) per step",
        *([r["auto"]] if r.get("auto") else []),
        *([r["auto_timed"] + "; this dry run runs the model's choice"] if r.get("auto_timed") else []),
        "plan: " + ", ".join(f"{k}={v}" for k, v in r["plan"].items()),
        "model states per rank (GiB, from the engine's tensors): "
        + ", ".join(f"{k} {v / gib:.2f}" for k, v in st.items()),
        f"peak allocated per rank: {r['peak_bytes_per_rank'] / gib:.2f} GiB during the step, "
        f"{r['init_peak_bytes_per_rank'] / gib:.2f} GiB during sharded init; the preflight's estimate "
        f"{r['estimate_bytes_per_rank']['total'] / gib:.2f} GiB",
        *(
            [
                f"device memory {lim / gib:.1f} GiB, reserve {r['reserve_bytes'] / gib:.1f} GiB "
                f"(context, communicators, fragmentation: system.memory_reserve_gib): "
                f"peak + reserve {'fits' if r['fits'] else 'DOES NOT FIT'}, "
                f"estimate + reserve {'fits' if r['estimate_fits'] else 'DOES NOT FIT'}"
            ]
            if lim
            else []
        ),
        "bytes sent by this rank in one step: "
        + ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in r["collective_bytes_per_step"].items()),
    ]
    return "\n".join(lines)


def main(cfg: Config, world_size: int, rank: int, local_world_size: Optional[int], out) -> int:
    import yaml

    report = dry_run(cfg, world_size, rank, local_world_size)
    print("effective config:", file=out)
    print(yaml.safe_dump(report["config"], sort_keys=False).rstrip(), file=out)
    from .config import note_lines

    for line in note_lines(cfg):  # accepted no-effect keys, DeepSpeed "auto" values
        print(line, file=out)
    print(render(report), file=out)
    print(json.dumps(report, default=str), file=out)
    return 0
