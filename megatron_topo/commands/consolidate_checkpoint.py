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

The checkpoint is read one unit at a time (memory-mapped rank files); the weights of a
``.safetensors`` output are written as they are read, so that output needs memory for the
moments only, a ``.pt`` output for master + moments (the file is one pickle).

Nothing in the checkpoint can run code (torch.load(weights_only=True), JSON, safe YAML). An
existing output is never overwritten without ``--force``; files are written under a temporary
name and renamed. Bad input prints one line on stderr and exits 2.
"""

from __future__ import annotations

import json
import os
import sys

from megatron_topo.cli import OneLineParser, fail, interruptible, path_arg
from megatron_topo.error_lines import escaped

FORMAT = "megatron_topo.consolidated/1"


def parse_args(argv=None):
    p = OneLineParser(prog="consolidate_checkpoint.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--checkpoint", type=path_arg, required=True, metavar="DIR", help="save directory or global_stepN directory"
    )
    p.add_argument(
        "--output", type=path_arg, required=True, metavar="FILE", help="FILE.pt, or FILE.safetensors (+ FILE.optim.pt)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument(
        "--load-unverified",
        action="store_true",
        help="read a checkpoint whose meta.json records no size and SHA-256 for its rank files "
        "(saved before file records existed): the bytes are not verified",
    )
    return p.parse_args(argv)


def _not_ours(path: str):
    """Why the existing ``path`` is not a file consolidation writes (None when it is one)."""
    from megatron_topo.safe_files import NotJSON, parse_json
    from megatron_topo.safe_outputs import head

    if path.endswith(".safetensors"):
        import struct

        raw = head(path, 8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0
        try:
            meta = parse_json(head(path, 8 + n)[8:]).get("__metadata__") if 0 < n <= 1 << 27 else None
        except (NotJSON, AttributeError):  # not JSON (too deep, too long an integer ...), not an object
            meta = None
        return (
            None
            if isinstance(meta, dict) and meta.get("format") == FORMAT
            else f"is not a safetensors file written by consolidation ({FORMAT})"
        )
    return None if head(path, 4) == b"PK\x03\x04" else "is not a torch archive"


def consolidate(checkpoint: str, output: str, force: bool = False, unverified: bool = False) -> list[str]:
    """Reads the checkpoint one unit at a time: the weights of a ``.safetensors`` output stream
    into their file, so only the moments are gathered in memory (a ``.pt`` output holds the whole
    state, as the file it writes does); never a second copy of the model."""
    import torch

    from megatron_topo.atomic import atomic_path, commit, remove_quietly, temp_name
    from megatron_topo.config import load_config
    from megatron_topo.model.hf import SafetensorsWriter
    from megatron_topo.safe_outputs import check_output_file
    from megatron_topo.zero_topo.checkpoint import STATE_KEYS, CheckpointError, load_model_config
    from megatron_topo.zero_topo.checkpoint.export import (
        check_model_table,
        check_output_parent,
        iter_checkpoint_units,
        open_checkpoint,
    )

    safet = output.endswith(".safetensors")
    optim_path = output[: -len(".safetensors")] + ".optim.pt" if safet else None
    outs = [output] + ([optim_path] if optim_path else [])
    if not output.endswith((".pt", ".safetensors")):
        raise CheckpointError(f"--output {output}: give FILE.pt or FILE.safetensors (the format follows the name)")
    for o in outs:
        if os.path.isdir(o):
            raise CheckpointError(f"--output {o} is a directory; give a file name")
        check_output_file(o, "--output", CheckpointError, force, kind=_not_ours, artifacts=True)
        check_output_parent(o)
    sp, meta, config_yaml = open_checkpoint(
        checkpoint, unverified, "pass --load-unverified"
    )  # fails before any shard is read
    if config_yaml is not None:  # the names written are the model's (a checkpoint without config.yml: as saved)
        st = {"step_dir": sp, "meta": meta, "config_yaml": config_yaml}
        check_model_table(sp, meta, load_model_config(st, lambda p: load_config([p])))
    model, exp_avg, exp_avg_sq, adam_step = {}, {}, {}, {}
    tmp = temp_name(output)
    writer = None
    try:
        if safet:
            table = {name: (tuple(shape), torch.float32) for u in meta.units for name, _, _, shape in u.params}
            writer = SafetensorsWriter(tmp, table, {"format": FORMAT, "step": str(meta.step)})
        for _, state, params in iter_checkpoint_units(sp, meta, keys=STATE_KEYS, verify=False):
            step = None if state["step"] is None else float(state["step"])
            for name, off, numel, shape in params:
                sl = slice(int(off), int(off) + int(numel))
                if writer is not None:
                    writer.put(name, state["master"][sl].view(*shape))
                else:
                    model[name] = state["master"][sl].view(*shape).clone()
                if step is not None:
                    exp_avg[name] = state["exp_avg"][sl].view(*shape).clone()
                    exp_avg_sq[name] = state["exp_avg_sq"][sl].view(*shape).clone()
                    adam_step[name] = step
            del state
        rest = {
            "format": FORMAT,
            "step": meta.step,
            "optimizer": {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "step": adam_step},
            "trainer": meta.record["trainer"],  # as saved (the schema requires it)
            "meta_json": json.dumps(meta.record),
            "config_yaml": config_yaml or "",
        }
        if writer is not None:
            writer.close()
            writer = None
            commit(tmp, output)  # the writer fsynced the file
            with atomic_path(optim_path) as p:
                torch.save(rest, p)
        else:
            with atomic_path(output) as p:
                torch.save({**rest, "model": model}, p)
    finally:
        if writer is not None:
            writer.abort()
        remove_quietly(tmp)
    return outs


@interruptible(preload=("torch",))
def main(argv=None) -> int:
    args = parse_args(argv)
    from megatron_topo.zero_topo.checkpoint import CheckpointError, check_output_outside

    try:
        check_output_outside(args.checkpoint, args.output)  # never a file of the checkpoint it reads
        outs = consolidate(args.checkpoint, args.output, args.force, args.load_unverified)
    except (CheckpointError, OSError) as e:
        return fail(e, args.output)
    for o in outs:
        print(escaped(f"wrote {o}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
