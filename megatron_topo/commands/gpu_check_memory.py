"""gpu_check's memory row: the dry run's projection of the check's own config, and the device
memory the training step used against it, the preflight's estimate and the reserve for what no
tensor counts (context, communicators, allocator overhead, BLAS workspaces)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from megatron_topo.error_lines import child_error


def dry_run_projection(configs: list[str], sets: list[str], world: int, rank: int) -> dict:
    """The dry run of the check's own config (a separate process: it makes its own process group)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [
        sys.executable,
        os.path.join(root, "train.py"),
        *configs,
        *[a for s in sets for a in ("--set", s)],
        "--dry-run",
        "--world-size",
        str(world),
        "--rank",
        str(rank),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(child_error(out.stderr, "dry run failed"))  # its error line, not a warning after it
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory_row(everyone, projection, cfg, plan, rt, preflight, memory):
    from .gpu_check_cases import Row

    gib = memory.GIB
    est = preflight.estimate(cfg, plan, rt.topo.world_size)
    proj = ""
    if projection and "error" in projection:
        proj = f"dry run failed: {projection['error']}; "
    elif projection:
        proj = f"dry run peak {projection['peak_bytes_per_rank'] / gib:.2f} GiB; "
    text = f"{proj}estimate {est['total'] / gib:.2f} GiB"
    if "memory" not in everyone[0]:
        return Row("memory", "SKIP", f"no device memory on CPU; {text}")
    # the BLAS libraries' workspaces go through the allocator but are no tensor of the engine
    libs = max(e["memory"].get("libraries", 0) for e in everyone)
    peak = max(e["memory"]["allocated"] - e["memory"].get("libraries", 0) for e in everyone)
    # what no tensor counts: the context and communicator buffers (device use beyond the
    # allocator's), the allocator's own overhead (reserved beyond allocated) and those workspaces
    other = max(e["memory"]["used"] - e["memory"]["reserved"] for e in everyone)
    frag = max(e["memory"]["reserved"] - e["memory"]["allocated"] for e in everyone)
    limit = preflight.device_memory_bytes(cfg, rt.device)
    reserve = preflight.reserve_bytes(cfg, limit)
    detail = (
        f"step peak {peak / gib:.2f} GiB allocated (max over ranks); {text}; context + communicators "
        f"{other / gib:.2f} GiB, allocator overhead {frag / gib:.2f} GiB, BLAS workspaces "
        f"{libs / gib:.2f} GiB vs reserve {reserve / gib:.1f} GiB"
    )
    if peak > est["total"]:
        return Row("memory", "FAIL", f"the step allocated more than the preflight's estimate: {detail}")
    if other + frag + libs > reserve:
        return Row(
            "memory",
            "FAIL",
            f"the reserve is too small for this machine (set system.memory_reserve_gib "
            f">= {(other + frag + libs) / gib:.1f}): {detail}",
        )
    return Row("memory", "PASS", detail)
