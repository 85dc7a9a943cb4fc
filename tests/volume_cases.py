"""The per-step volume table of docs/design.md §4.8 written out by hand (not from the engine) for
8 ranks = 2 nodes x 2 GPUs x 2 GCDs: the preset cases and the bytes one rank sends per link level;
tests/test_engine_volumes.py checks the engine's counters against it, tests/test_bench_sharding.py
the formulas module."""

W, N, P, G = 8, 2, 4, 2  # world, nodes, ranks per node, GCDs per GPU
MICRO = 2
BW = BG = 256  # weight / gradient quantization block sizes


def level(f, kind="block"):
    """Link level of a group of f ranks: consecutive blocks, or strided replicas."""
    if kind == "strided":  # ranks r, r+f, ...: spans nodes whenever there is more than one
        return "inter_node"
    if f <= G:
        return "intra_gpu"
    return "intra_node" if f <= P else "inter_node"


def expected(kind: str, Ls: list[int]) -> dict:
    """Bytes one rank sends in one step, from the docs/design.md §4.8 table."""
    e = {"intra_gpu": 0, "intra_node": 0, "inter_node": 0}
    ag = lambda S, d: S * (d - 1) / d  # all-gather / reduce-scatter / all-to-all
    ar = lambda S, d: 2 * S * (d - 1) / d
    q8 = lambda L, d: ag(L, d) + ag(4 * L / BW, d)  # INT8 payload + fp32 scales
    q4 = lambda L, d: ag(L / 2, d) + ag(4 * L / BG, d)  # INT4 payload + fp32 scales
    last = len(Ls) - 1
    for i, L in enumerate(Ls):
        M = 2 * L
        fwd_bwd = MICRO * (2 if i != last else 1)  # the last unit stays gathered into backward
        if kind == "zero3":
            e["inter_node"] += fwd_bwd * ag(M, W) + MICRO * ag(M, W)
        elif kind == "zeropp":
            e["inter_node"] += MICRO * q8(L, W)  # forward all-gather, INT8 over the world
            if i != last:
                e["intra_node"] += MICRO * q8(L, P)  # backward from the INT8 secondary in the node
            e["intra_node"] += MICRO * q4(L, P)  # hop 1: INT4 all-to-all in the node
            e["inter_node"] += MICRO * (ag(L / 2 / P, N) + ag(4 * L / BG / P, N))  # hop 2
        elif kind.startswith("topo"):
            s = 2 if kind != "topo_sec8" else P
            e["intra_gpu"] += MICRO * q8(L, 2)  # forward all-gather inside the GCD pair
            if i != last:
                e[level(s)] += MICRO * q8(L, s)  # backward from the INT8 secondary
            e["intra_node"] += MICRO * q4(L, P)  # INT4 all-to-all reduce-scatter in the node
            if kind == "topo_rs":
                e["inter_node"] += ag(M / P, N)  # cross-node reduce-scatter, once per step
            elif kind == "topo_q":  # INT8 all-to-all reduce-scatter of the L/P shard (os = world: no gather)
                e["inter_node"] += ag(L / P, N) + ag(4 * L / P / BG, N)
            else:
                e["inter_node"] += ar(M / P, N)  # cross-node all-reduce, once per step
            if kind == "topo_q":  # post-step all-gather of the primary shard in INT8
                e["inter_node"] += ag(L / 2, W // 2) + ag(4 * L / 2 / BW, W // 2)
            else:
                e["inter_node"] += ag(M / 2, W // 2)  # post-step all-gather of the primary shard
        elif kind in ("mics", "mics_q"):
            e["intra_node"] += fwd_bwd * ag(M, P) + MICRO * ag(M, P)
            if kind == "mics_q":  # INT8 reduce-scatter + INT8 all-gather of the summed slices
                e["inter_node"] += 2 * (ag(L / P, N) + ag(4 * L / P / BG, N))
            else:
                e["inter_node"] += ar(M / P, N)
        elif kind == "ddp":
            e["inter_node"] += ar(M, W)
        elif kind == "zero1":
            e["inter_node"] += ar(M, W) + ag(M, W)
        elif kind == "zero2":
            e["inter_node"] += MICRO * ag(M, W) + ag(M, W)  # + post-step all-gather of weights
        elif kind == "paro_iig":  # weights and grads in the node, optimizer over the world
            e["intra_node"] += fwd_bwd * ag(M, P) + MICRO * ag(M, P)
            e["inter_node"] += ar(M / P, N) + ag(M / P, N)
        elif kind == "paro_nig":
            e["intra_node"] += MICRO * ag(M, P)
            e["inter_node"] += ar(M / P, N) + ag(M, W)
    return e


CASES = {
    "ddp": dict(preset="ddp"),
    "zero1": dict(preset="zero1"),
    "zero2": dict(preset="zero2"),
    "zero3": dict(preset="zero3"),
    "zeropp": dict(preset="zeropp"),
    "mics": dict(preset="mics"),
    "topo": dict(preset="topo"),
    "topo_sec8": dict(preset="topo", secondary_degree=P),
    "topo_rs": dict(preset="topo", inter_node_reduce="reduce_scatter"),
    "paro_iig": dict(preset="paro_iig"),
    "paro_nig": dict(preset="paro_nig"),
    "topo_q": dict(preset="topo", combine_bits=8, publish_bits=8),
    "mics_q": dict(preset="mics", combine_bits=8),
}
