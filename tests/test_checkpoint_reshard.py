"""Resharding on load: a checkpoint saved under any plan and world size loads under any other with
the same fp32 master weights, Adam moments and step (reassembled, compared bit for bit), and --
for plans that gather exact weights -- the same logits as a plain model holding those masters.

Matrix: ddp, zero3, zeropp, mics, topo (secondary over the GCD pair) and topo with the secondary
over the node ("sec 8" on Frontier; 4 ranks per node on the test topology), on world sizes 1, 4
(1 node x 2 GPUs x 2 GCDs) and 8 (2 nodes x 2 x 2). Each (world) process group trains and saves
under every plan, then loads all 18 checkpoints into every plan; world 8 does both in one run.
"""

import torch
import torch.distributed as dist

from megatron_topo.config import ZeroTopoConfig
from megatron_topo.model import build_model
from megatron_topo.topology import Topology
from megatron_topo.zero_topo import checkpoint as ckpt
from megatron_topo.zero_topo.comm import Comm
from megatron_topo.zero_topo.engine import ZeroTopoEngine
from megatron_topo.zero_topo.sharding import resolve_plan

from .dist_utils import run_distributed
from .engine_cases import BETAS, CLIP, EPS, LR, WD, batch, tiny_cfg, train_steps

WORLDS = {1: (1, 1), 4: (2, 2), 8: (2, 2)}  # world -> (gcds_per_gpu, gpus_per_node)
PLANS = ("ddp", "zero3", "zeropp", "mics", "topo", "topo_sec_node")
EXACT_WEIGHTS = ("ddp", "zero3", "mics")  # no quantized weight gathers: logits must be bit-equal
BLOCK = 64
STEPS = {1: 1, 4: 2, 8: 3}  # Adam steps before saving: a stale step after a load cannot pass
# the first AdamW imports torch._dynamo (seconds of CPU): do it once here, not in 8 forked ranks
torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], fused=True)


def _zcfg(plan: str, world: int) -> ZeroTopoConfig:
    gcds, gpus = WORLDS[world]
    z = ZeroTopoConfig(
        preset="topo" if plan.startswith("topo") else plan, quant_block_size=BLOCK, grad_quant_block_size=BLOCK
    )
    if plan == "topo_sec_node":
        z.secondary_degree = gcds * gpus if world > 1 else 1
    return z


def _engine(rank, world, plan, comm):
    """Like engine_cases.make_engine, but every plan shares one Comm so the process groups that
    several plans use (GCD pair, node, world, ...) are created once per process."""
    model = build_model(tiny_cfg(), seed=7)
    return ZeroTopoEngine(
        model,
        model.shard_units(),
        resolve_plan(_zcfg(plan, world), comm.topo),
        comm,
        precision="fp32",
        lr=LR,
        betas=BETAS,
        eps=EPS,
        weight_decay=WD,
        grad_clip=CLIP,
    )


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def _ids():
    return batch(99, 0, 0, mb=2)[0]


def _truth(path: str) -> dict:
    st = ckpt.read_full_state(path)
    model = build_model(tiny_cfg(), seed=0).eval()
    model.load_state_dict(st["params"])
    with torch.no_grad():
        logits = model(_ids())
    return {"units": st["units"], "logits": logits}


def _compare(tag_loaded: str, plan: str, world: int, got: list, want: dict) -> list[str]:
    rank = dist.get_rank() if dist.is_initialized() else 0
    tag_loaded = f"[rank {rank}] {tag_loaded}"
    bad = []
    for i, (g, w) in enumerate(zip(got, want["units"])):
        for k in ckpt.STATE_KEYS:
            if not torch.equal(g[k], w[k]):
                bad.append(f"{tag_loaded} -> {plan}@{world}: unit {i} {k} differs")
        if g["step"] != float(w["step"]):
            bad.append(f"{tag_loaded} -> {plan}@{world}: unit {i} step {g['step']} != {float(w['step'])}")
    return bad


def _run(rank, world, root, save: bool, load_tags, truths):
    """Save under every plan (when ``save``), then load every checkpoint in ``load_tags`` into
    every plan and compare with the truth read from the files."""
    comm = Comm(Topology(world, *WORLDS[world]), rank)
    engines, failures = {}, []
    for plan in PLANS:
        eng = _engine(rank, world, plan, comm)
        if save:
            train_steps(eng, rank, steps=STEPS[world], accum=1)
            live = ckpt.gather_full_state(eng)
            tag = f"{plan}_w{world}"
            ckpt.save(eng, str(root / tag), STEPS[world], ckpt.TrainerState(STEPS[world]), "", rank, _barrier)
            # what is on disk is exactly the live state
            failures += _compare(f"live {tag}", plan, world, live, _truth(str(root / tag)))
        engines[plan] = eng
    _barrier()
    truths = dict(truths or {})
    for tag in load_tags:
        if tag not in truths:
            truths[tag] = _truth(str(root / tag))
    for plan, eng in engines.items():
        for tag in load_tags:
            trainer = ckpt.load(eng, str(root / tag), rank)
            assert trainer.step == STEPS[int(tag.rsplit("_w", 1)[1])]
            failures += _compare(tag, plan, world, ckpt.gather_full_state(eng), truths[tag])
            if plan in EXACT_WEIGHTS:
                eng.eval()
                with torch.no_grad():
                    logits = eng(_ids())
                if not torch.equal(logits, truths[tag]["logits"]):
                    failures.append(
                        f"{tag} -> {plan}@{world}: logits differ "
                        f"(max {float((logits - truths[tag]['logits']).abs().max()):.3g})"
                    )
                eng.train()
    return failures


def test_every_checkpoint_loads_under_every_plan_and_world(tmp_path):
    tags = [f"{p}_w{w}" for w in WORLDS for p in PLANS]
    fails = _run(0, 1, tmp_path, True, [], None)  # world 1: in this process
    # every rank reports (its own Adam step included: a rank whose new shard is all padding
    # must still get the step)
    fails += sum(run_distributed(_run, 4, tmp_path, True, [], None), [])
    fails += sum(run_distributed(_run, 8, tmp_path, True, tags, None), [])
    truths = {t: _truth(str(tmp_path / t)) for t in tags}
    fails += sum(run_distributed(_run, 4, tmp_path, False, tags, truths), [])
    fails += _run(0, 1, tmp_path, False, tags, truths)
    assert not fails, "\n".join(fails[:20]) + f"\n({len(fails)} mismatches)"
    # replicas are not written twice: ddp on 8 ranks stores its tensors in rank 0's file only
    meta = ckpt.read_meta(str(tmp_path / "ddp_w8" / "global_step3"))
    assert meta.shard_holders == 1 and meta.world_size == 8
    sizes = {n: f.bytes for n, f in meta.files.items()}
    assert sizes["rank_00000.pt"] > 20 * sizes["rank_00007.pt"], sizes
    assert ckpt.read_meta(str(tmp_path / "zero3_w8" / "global_step3")).shard_holders == 8
