"""The plan space: the presets, bit widths, block sizes and cross-replica reductions a sharding plan
may choose (docs/design.md §4.1-§4.3), each written once.

It imports nothing, so every reader can take its choices from here: the config's declared choices
and checks (config/schema.py, config/options.py), the kernels' argument checks, the plan's
validation (``sharding.validate_plan``, which adds the legal factors of a topology) and the plan
search (``perf_model.legal_plans``, ``analysis.autoplan``).
"""

from __future__ import annotations

from typing import Optional

UNQUANTIZED = 16  # bits of a wire in the compute dtype (nothing quantized)

# the legal bit widths of each plan field, most precise first (the search's order)
WEIGHT_BITS = (16, 8)
SECONDARY_BITS = (16, 8)
GRAD_BITS = (16, 8, 4)
COMBINE_BITS = (16, 8)
PUBLISH_BITS = (16, 8)
BITS = {
    "weight_bits": WEIGHT_BITS,
    "secondary_bits": SECONDARY_BITS,
    "grad_bits": GRAD_BITS,
    "combine_bits": COMBINE_BITS,
    "publish_bits": PUBLISH_BITS,
}

# quantization block sizes (elements per fp32 scale, docs/design.md §5): a power of two in this range
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 64, 8192
BLOCK_SIZE_RULE = f"a power of two in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}]"
QUANT_BLOCK_SIZE = 2048  # default for weight gathers, secondary copies and the INT8 publish
GRAD_QUANT_BLOCK_SIZE = 512  # default for the gradient reduction and the INT8 combine

INTER_NODE_REDUCES = ("allreduce", "reduce_scatter")  # the 16-bit cross-replica combine


def is_block_size(b: int) -> bool:
    return MIN_BLOCK_SIZE <= b <= MAX_BLOCK_SIZE and not b & (b - 1)


def preset_table(W: int, P: int, G: int) -> dict[str, dict]:
    """Factors and bits of every named preset (docs/design.md §4.2) on W ranks, P per node, G per GPU
    package; unlisted fields take the plan's defaults."""
    return {
        "ddp": dict(weight_factor=1, grad_factor=1, optimizer_factor=1),
        "zero1": dict(weight_factor=1, grad_factor=1, optimizer_factor=W),
        "zero2": dict(weight_factor=1, grad_factor=W, optimizer_factor=W),
        "zero3": dict(weight_factor=W, grad_factor=W, optimizer_factor=W),
        "zeropp": dict(
            weight_factor=W,
            grad_factor=W,
            optimizer_factor=W,
            secondary_degree=P,
            weight_bits=8,
            secondary_bits=8,
            grad_bits=4,
        ),
        "mics": dict(weight_factor=P, grad_factor=P, optimizer_factor=P),
        "topo": dict(
            weight_factor=G,
            grad_factor=P,
            optimizer_factor=W,
            secondary_degree=G,
            weight_bits=8,
            secondary_bits=8,
            grad_bits=4,
        ),
        "paro_iig": dict(weight_factor=P, grad_factor=P, optimizer_factor=W),
        "paro_nig": dict(weight_factor=1, grad_factor=P, optimizer_factor=W),
    }


PRESETS = tuple(preset_table(1, 1, 1))

# The bits at which the software the papers measured (DeepSpeed 0.13, whose hpZ keeps its secondary
# copy in fp16) holds a preset's secondary, where they differ from ours (docs/design.md §4.2):
# read through ``Plan.measured_secondary_bits`` by the paper-convention memory and the deepspeed stack.
MEASURED_SECONDARY_BITS = {"zeropp": 16}


def measured_secondary_bits(preset: str) -> Optional[int]:
    return MEASURED_SECONDARY_BITS.get(preset)
