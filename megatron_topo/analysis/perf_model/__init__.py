"""Analytic model of a sharding plan: model-state memory, bytes per link level, step time.

Pure functions over (model shape, ``Plan``, ``Topology``, ``SystemConfig``); presets are inputs
(``preset_plan``) and every rate comes from the ``SystemConfig``, so the same model runs on
Frontier, a DGX or an emulated cluster. docs/design.md §7 states the model; §7.3 gives each
constant's source. Frontier's values (configs/frontier.yml): 191.5 TFLOP/s peak and 125 TFLOP/s
measured GEMM per GCD, ``compute_efficiency`` 0.40 (seed 004 Table 5.2), 200 GB/s GCD-GCD,
50 GB/s GPU-GPU, 4 x 25 GB/s NICs per node, shared by the concurrent rings as in seed 004 Eq. 5.7
(``nic_sharing="ring"``). ``stack="engine"`` composes a step as megatron_topo's engine overlaps it;
``stack="deepspeed"`` as the DeepSpeed the ZeRO-topo paper measured (no overlap, 16-bit hpZ).

Modules: ``shape`` (model shape, plans, memory), ``collectives`` (the per-step collective table and
the time of one collective), ``step`` (composition into a step, predictions), ``search`` (every
legal plan, ranked). The emulated cluster's model builds on this one
(:mod:`megatron_topo.analysis.emulation.predict`).
"""

from ...zero_topo.sharding import Plan  # re-exported: callers build plans next to the model
from .collectives import (
    NIC_SHARING,
    Collective,
    bandwidth,
    bytes_per_level,
    collective_time,
    latency,
    plan_collectives,
    unit_collectives,
)
from .collectives import _block0 as _block0
from .collectives import _collective as _collective
from .collectives import _group_info as _group_info
from .collectives import _post_gather0 as _post_gather0
from .collectives import _replicas0 as _replicas0
from .collectives import _two_hop0 as _two_hop0
from .search import _legal as _legal
from .search import legal_plans, search_plans
from .shape import (
    ADAM_BYTES_PER_PARAM,
    GIB,
    OPTIMIZER_TRAFFIC_BYTES_PER_PARAM,
    PAPER_20B_384,
    PAPER_MAX_PARAMS_16_GCDS,
    PAPER_TOPO_SCALING_EFFICIENCY,
    Memory,
    Shape,
    max_params,
    model_state_memory,
    preset_plan,
    state_bytes_per_param,
    topology_for,
)
from .step import (
    REDUCTIONS_IN_FLIGHT,
    STACKS,
    StepEstimate,
    compose_passes,
    estimate_step,
    predict,
    ratios,
    scaling_efficiency,
)

__all__ = [
    "ADAM_BYTES_PER_PARAM",
    "GIB",
    "NIC_SHARING",
    "OPTIMIZER_TRAFFIC_BYTES_PER_PARAM",
    "PAPER_20B_384",
    "PAPER_MAX_PARAMS_16_GCDS",
    "PAPER_TOPO_SCALING_EFFICIENCY",
    "REDUCTIONS_IN_FLIGHT",
    "STACKS",
    "Collective",
    "Memory",
    "Plan",
    "Shape",
    "StepEstimate",
    "bandwidth",
    "bytes_per_level",
    "collective_time",
    "compose_passes",
    "estimate_step",
    "latency",
    "legal_plans",
    "max_params",
    "model_state_memory",
    "plan_collectives",
    "predict",
    "preset_plan",
    "ratios",
    "scaling_efficiency",
    "search_plans",
    "state_bytes_per_param",
    "topology_for",
    "unit_collectives",
]
