#!/usr/bin/env python
"""Merge a sharded zero_topo checkpoint into one full-state file (any plan, any world size).

    python tools/consolidate_checkpoint.py --checkpoint runs/tiny/checkpoints --output full.pt
    python tools/consolidate_checkpoint.py --checkpoint runs/tiny/checkpoints/global_step50 \\
        --output model.safetensors            # weights + model.optim.pt next to it

``--checkpoint`` is a ``save`` directory (its ``latest`` step) or one ``global_stepN`` directory.

* ``FILE.pt`` (any name not ending in ``.safetensors``): one torch file that loads with
  ``torch.load(FILE, weights_only=True)``: ``{"format", "step", "model": {name: fp32 tensor},
  "optimizer": {"exp_avg": {name: t}, "exp_avg_sq": {name: t}, "step": {name: float}},
  "trainer": {...}, "meta_json": str, "config_yaml": str}``.
* ``FILE.safetensors``: the fp32 weights (GPT-NeoX names as in our model) with the step in the
  safetensors metadata, plus ``FILE-stem.optim.pt`` holding everything else as above.

Nothing in the checkpoint can run code (torch.load(weights_only=True), JSON, safe YAML). An
existing output is never overwritten without ``--force``; files are written under a temporary
name and renamed. Bad input prints one line on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FORMAT = "megatron_topo.consolidated/1"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        usage = " ".join(self.format_usage().split())[len("usage: "):]
        self.exit(2, f"error: {message} (usage: {usage})\n")


def parse_args(argv=None):
    p = _Parser(prog="consolidate_checkpoint.py", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="save directory or global_stepN directory")
    p.add_argument("--output", required=True, metavar="FILE", help="FILE.pt, or FILE.safetensors (+ FILE.optim.pt)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    return p.parse_args(argv)


def _atomic(path: str, write):
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def consolidate(checkpoint: str, output: str, force: bool = False) -> list[str]:
    import torch

    from megatron_topo.zero_topo.checkpoint import CheckpointError, read_full_state

    safet = output.endswith(".safetensors")
    optim_path = output[: -len(".safetensors")] + ".optim.pt" if safet else None
    outs = [output] + ([optim_path] if optim_path else [])
    for o in outs:
        if os.path.isdir(o):
            raise CheckpointError(f"--output {o} is a directory; give a file name")
        if os.path.exists(o) and not force:
            raise CheckpointError(f"--output {o} already exists; pass --force to replace it")
        parent = os.path.dirname(os.path.abspath(o))
        if not os.path.isdir(parent):
            raise CheckpointError(f"--output {o}: directory {parent} does not exist")
    st = read_full_state(checkpoint)
    meta = st["meta"]
    rest = {
        "format": FORMAT,
        "step": int(meta["step"]),
        "optimizer": {"exp_avg": {n: v["exp_avg"] for n, v in st["optimizer"].items()},
                      "exp_avg_sq": {n: v["exp_avg_sq"] for n, v in st["optimizer"].items()},
                      "step": dict(st["adam_step"])},
        "trainer": meta.get("trainer", {}),
        "meta_json": json.dumps(meta),
        "config_yaml": st["config_yaml"] or "",
    }
    if safet:
        from safetensors.torch import save_file

        weights = {n: t.contiguous() for n, t in st["params"].items()}
        _atomic(output, lambda p: save_file(weights, p, metadata={"format": FORMAT, "step": str(meta["step"])}))
        _atomic(optim_path, lambda p: torch.save(rest, p))
    else:
        _atomic(output, lambda p: torch.save({**rest, "model": st["params"]}, p))
    return outs


def main(argv=None) -> int:
    args = parse_args(argv)
    from megatron_topo.zero_topo.checkpoint import CheckpointError, check_output_outside

    try:
        check_output_outside(args.checkpoint, args.output)  # never a file of the checkpoint it reads
        outs = consolidate(args.checkpoint, args.output, args.force)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or args.output}: {e.strerror or e}", file=sys.stderr)
        return 2
    for o in outs:
        print(f"wrote {o}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
