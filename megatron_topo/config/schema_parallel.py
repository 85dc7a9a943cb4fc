"""The ``topology``, ``zero_topo``, ``system`` and ``distributed`` blocks of the config: how ranks
are laid out and sharded, the machine the planner models, the process group, each field declared
once with its checks (``option``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..zero_topo import plan_space
from ..zero_topo.plan_space import PRESETS
from .options import _check_block, option


@dataclass
class TopologyConfig:
    gcds_per_gpu: int = option(1, "ranks per GPU package (2 on MI250X)", ge=1)
    gpus_per_node: Optional[int] = option(None, "default: LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE / world", ge=1)


@dataclass
class ZeroTopoConfig:
    preset: str = option(
        "ddp",
        "sharding preset (docs/design.md §4.2); auto: the fastest legal plan that "
        "fits, from the performance and memory models (needs a system: block)",
        choices=PRESETS + ("auto",),
    )
    weight_factor: Optional[int] = option(None, "ranks the 16-bit weights are split over", ge=1)
    grad_factor: Optional[int] = option(None, "ranks the gradients are split over", ge=1)
    optimizer_factor: Optional[int] = option(None, "ranks the fp32 master + Adam moments are split over", ge=1)
    secondary_degree: Optional[int] = option(None, "ranks of the secondary (hpZ) weight copy (0: none)", ge=0)
    weight_bits: Optional[int] = option(None, "bits of the weight all-gather", choices=plan_space.WEIGHT_BITS)
    secondary_bits: Optional[int] = option(None, "bits of the secondary copy", choices=plan_space.SECONDARY_BITS)
    grad_bits: Optional[int] = option(None, "bits of the gradient reduce-scatter", choices=plan_space.GRAD_BITS)
    combine_bits: Optional[int] = option(
        None,
        "bits of the once-per-step cross-replica gradient combine "
        "(16: the compute dtype; 8: INT8 reduce-scatter + all-gather, fp32 sums)",
        choices=plan_space.COMBINE_BITS,
    )
    publish_bits: Optional[int] = option(
        None,
        "bits of the post-step weight all-gather (8: INT8; each rank's own shard and the fp32 master stay exact)",
        choices=plan_space.PUBLISH_BITS,
    )
    error_feedback: bool = option(
        False,
        "add each low-bit gradient quantization's residual (in-node reduction, "
        "quantized combine) to the next one; fp32 residuals, kept in checkpoints",
    )
    quant_block_size: int = option(
        plan_space.QUANT_BLOCK_SIZE, "elements per weight quantization scale", check=_check_block
    )
    grad_quant_block_size: int = option(
        plan_space.GRAD_QUANT_BLOCK_SIZE, "elements per gradient quantization scale", check=_check_block
    )
    inter_node_reduce: str = option("allreduce", "cross-replica combine", choices=plan_space.INTER_NODE_REDUCES)
    prefetch: bool = option(True, "gather the next unit's weights while computing this one")
    max_combines_in_flight: int = option(
        4,
        "units whose cross-replica combine buffers (INT8 send/receive, 16-bit wire copy) are alive at "
        "once; one more finishes the oldest first (0: unbounded, every unit's during the step)",
        ge=0,
    )
    bucket_size: int = option(
        0,
        "reserved",
        choices=(0,),
        why="units (one per layer) are the communication buckets; coalescing is not implemented",
    )
    kernels: str = option(
        "auto",
        "quantization kernels (auto: triton on GPUs, cpu_fast on CPUs)",
        choices=("auto", "triton", "cpu_fast", "reference"),
    )
    auto_trials: int = option(
        4,
        "preset auto: time this many of the plans modelled within auto_trial_window of "
        "the fastest for a few steps before training and train with the fastest measured "
        "(0 or 1: the model's choice, untimed)",
        ge=0,
    )
    auto_trial_steps: int = option(
        3,
        "preset auto: timed optimizer steps per plan and pass (after one warm-up "
        "step; every plan gets two passes, the second in reverse order); per pass the "
        "median of the slowest rank's steps, the fastest pass decides",
        ge=1,
    )
    auto_trial_passes: int = option(
        4,
        "preset auto: the most passes a plan is timed; after the two passes of "
        "every plan, the two fastest get more while within 15 % of each other "
        "(1: one pass, no reverse pass)",
        ge=1,
    )
    auto_trial_window: float = option(
        0.25,
        "preset auto: time only plans modelled within this fraction of the "
        "fastest (0.25: the step models' validated error per plan)",
        ge=0.0,
    )
    # bitwise-reproducible cross-replica sums (all-gather + sum in rank order, W x the traffic):
    # any world size then equals one process with the same global batch, bit for bit
    deterministic: bool = option(False, "bitwise-reproducible cross-replica sums (W x the traffic)")


AUTO_TRIAL_KEYS = ("auto_trials", "auto_trial_steps", "auto_trial_passes", "auto_trial_window")  # preset auto only


@dataclass
class SystemConfig:
    """Machine description used by the planner and the performance model (not by training)."""

    name: str = option("local_cpu", "machine name")
    device_memory_gib: float = option(64.0, "memory per device", gt=0.0)
    memory_reserve_gib: Optional[float] = option(
        None,
        "memory per device kept free for what the engine's tensors do not count: the GPU context, "
        "NCCL/RCCL buffers, the caching allocator's fragmentation (default: 8 % of device_memory_gib; each "
        "configs/ system file states its own and where it comes from)",
        ge=0.0,
    )
    peak_tflops: float = option(191.5, "per device, advertised dense fp16/bf16", gt=0.0)
    gemm_tflops: float = option(125.0, "per device, measured large GEMM", gt=0.0)
    bw_intra_gpu_gbs: float = option(200.0, "GB/s per direction between the GCDs of one package", gt=0.0)
    bw_intra_node_gbs: float = option(50.0, "GB/s per direction between packages of one node", gt=0.0)
    bw_inter_node_gbs: float = option(25.0, "GB/s per direction per NIC", gt=0.0)
    nics_per_node: int = option(4, "NICs per node", ge=1)
    latency_intra_gpu_us: float = option(2.0, "per-message latency between GCDs of a package", ge=0.0)
    latency_intra_node_us: float = option(5.0, "per-message latency inside a node", ge=0.0)
    latency_inter_node_us: float = option(10.0, "per-message latency between nodes", ge=0.0)
    latency_small_message_us: float = option(
        5.0,
        "per ring step of a tiny collective: the quantization scales "
        "DeepSpeed sends apart from their payload (perf model, stack deepspeed)",
        ge=0.0,
    )
    # added for the performance model (megatron_topo/analysis/perf_model/)
    compute_efficiency: float = option(0.40, "achieved fraction of peak_tflops in GEMM-heavy training", gt=0.0, le=1.0)
    hbm_bw_gbs: float = option(1600.0, "device memory bandwidth, for memory-bound steps (optimizer)", gt=0.0)
    # which step model ranks plans (preset: auto, tools/plan.py)
    step_model: str = option(
        "device",
        "device: GPUs (megatron_topo.perf_model.estimate_step); emulated_cpu: gloo "
        "ranks sharing CPU cores (emulation.predict.estimate_emulated: compute, quantization "
        "and transport all cost CPU time)",
        choices=("device", "emulated_cpu"),
    )
    quant_ns_per_element: float = option(0.0, "emulated_cpu: CPU ns per element through a quantization kernel", ge=0.0)
    cpu_transport_gbs: float = option(0.84, "emulated_cpu: GB/s of gloo's copying, machine-wide", gt=0.0)
    cpu_call_us: float = option(0.0, "emulated_cpu: CPU us per ring step of a collective call", ge=0.0)
    cpu_optimizer_ns_per_param: float = option(
        0.0, "emulated_cpu: CPU ns per optimizer-shard parameter per step", ge=0.0
    )


@dataclass
class DistributedConfig:
    backend: str = option("auto", "auto: nccl on GPUs, gloo on CPU", choices=("auto", "nccl", "gloo", "mpi"))
    collective_timeout_s: float = option(
        600.0, "a collective waiting longer than this fails the run", ge=1.0, le=86400.0
    )
    rendezvous_timeout_s: float = option(
        300.0,
        "at start-up, rank 0 waits this long for every other rank to join (then names the missing ranks) "
        "and the others as long for rank 0",
        ge=1.0,
        le=86400.0,
    )
    device: str = option("auto", "auto: cuda when a GPU is visible, else cpu", choices=("auto", "cpu", "cuda"))
    trace_collectives: Optional[str] = option(
        None,
        "a directory: every rank writes rank_{r}.jsonl there, one JSON "
        "line per collective as it is issued (seq, op, group, bytes, dtype), "
        "flushed at once: the last collective of every rank after a hang",
    )
