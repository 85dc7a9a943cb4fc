"""Training throughput of our path (GPTNeoX inside ZeroTopoEngine, ``ddp`` plan, one process)
against a minimal plain-PyTorch GPT-NeoX loop, on the same batch, precision and CPU threads.

    python tools/bench_model.py --steps 5 --repeats 5 --batch 8 --precision fp32 --json bench.json
    python tools/bench_model.py --config configs/tiny.yml --precision bf16
    python tools/bench_model.py --profile          # + torch.profiler / cProfile of both paths

ours  = ``build_model`` -> ``ZeroTopoEngine(plan=ddp, Comm(distributed=False))``;
        per step ``loss = CE(eng(x), y); eng.backward(loss); eng.step(lr)``.
plain = a self-contained nanoGPT-style GPT-NeoX (model_paths.py: parallel residual, partial rotary,
        LayerNorm, GeLU 4h MLP, SDPA causal, untied head) with ``torch.optim.AdamW`` (default
        implementation, decay / no-decay groups), ``loss.backward()`` and
        ``clip_grad_norm_`` (the engine clips too). bf16: ``torch.autocast`` over fp32 weights
        (the PyTorch idiom) or, with ``--plain-bf16 pure``, bf16 weights.
Both start from the same weights (ours is copied into the plain model; logits parity is
checked and reported). After warm-up the two are interleaved A B A B ... for ``--repeats``
rounds of ``--steps`` steps; the table gives median tokens/s, per-phase medians (ms/step) and
ours/plain = the median over rounds of (ours tokens/s / plain tokens/s) of the same round, which
cancels most of the drift other processes cause; the ratio of the medians, best/best and per
CPU-second ratios are printed too. The acceptance target is ours >= 0.95 x plain.

``--json OUT`` (with ``"tool": "bench_model"``) is checked before the models are built and replaces
only an earlier result of bench_model (megatron_topo.tool_outputs: never a link, a FIFO, a user's
file, a --config file, or a file inside a checkpoint, an HF export or a run's log folder).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from contextlib import nullcontext

import torch

from megatron_topo.analysis.bench.model_paths import OPT_IMPL, Ours, Plain
from megatron_topo.cli import OneLineParser, bounded, interruptible, path_arg, schema_bounded
from megatron_topo.config import ConfigError, ModelConfig, TrainConfig, load_config
from megatron_topo.error_lines import clean, escaped
from megatron_topo.metrics import flops_per_iteration
from megatron_topo.tool_outputs import OutputError, check_file, write_result

TARGET = 0.95
TOOL = "bench_model"
LEGACY = ("model", "tokens_per_s", "ratio_ours_over_plain", "target")  # a result before the "tool" field
MAX_THREADS = 4096


def parse_args(argv=None):
    """bench_model's options."""
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--config", type=path_arg, nargs="+", default=None, metavar="YML", help="model YAML(s); flags below override"
    )
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"):
        p.add_argument(f"--{key.replace('_', '-')}", type=schema_bounded(ModelConfig, key), default=None)
    p.add_argument("--checkpoint-activations", action="store_true", default=None)
    p.add_argument(
        "--batch",
        type=schema_bounded(TrainConfig, "train_micro_batch_size_per_gpu"),
        default=None,
        help="sequences per step (default: the config's train_micro_batch_size_per_gpu, else 8)",
    )
    # --steps/--repeats: a benchmark runs as long as asked (no upper bound, docs/reliability.md)
    p.add_argument("--steps", type=bounded(int, 1), default=2, help="timed steps per repeat")
    p.add_argument("--warmup", type=bounded(int, 0, 10_000), default=3, help="untimed steps of each path first")
    p.add_argument(
        "--repeats",
        type=bounded(int, 1),
        default=15,
        help="A B rounds (short rounds, many of them: robust to other processes on the machine)",
    )
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default=None,
        help="default: the config's precision (fp16 falls back to fp32), else fp32",
    )
    p.add_argument(
        "--plain-bf16",
        choices=("autocast", "pure"),
        default="autocast",
        help="plain loop's bf16: autocast over fp32 weights (default) or bf16 weights",
    )
    p.add_argument(
        "--plain-optimizer",
        choices=tuple(OPT_IMPL),
        default="default",
        help="plain AdamW implementation: PyTorch's default for CPU tensors (single-tensor loop), "
        "foreach or fused (ours uses fused AdamW on flat shards)",
    )
    p.add_argument(
        "--threads", type=bounded(int, 1, MAX_THREADS), default=None, help="torch threads (default: torch's)"
    )
    p.add_argument("--lr", type=bounded(float, 0.0, 10.0), default=1e-4)
    p.add_argument("--weight-decay", type=bounded(float, 0.0, 10.0), default=0.01)
    p.add_argument("--clip", type=bounded(float, 0.0, 1e6), default=1.0, help="gradient clipping for both (0: off)")
    p.add_argument("--seed", type=schema_bounded(TrainConfig, "seed"), default=1234)
    p.add_argument(
        "--json",
        type=path_arg,
        default=None,
        metavar="OUT",
        help="write the results as JSON (a new file or an earlier result of bench_model, which is replaced)",
    )
    p.add_argument("--profile", action="store_true", help="also profile a few steps of each path")
    p.add_argument("--profile-steps", type=bounded(int, 1, 1000), default=3)
    return p.parse_args(argv)


DEFAULT_MODEL = dict(
    num_layers=4,
    hidden_size=256,
    num_attention_heads=8,
    seq_length=256,
    vocab_size=4096,
    rotary_pct=0.25,
    gpt_j_residual=True,
    no_weight_tying=True,
    init_method="small_init",
    output_layer_init_method="wang_init",
)  # stated: the config defaults follow GPT-NeoX's


def model_config(args) -> ModelConfig:
    """The model to benchmark; also fills ``args.batch`` / ``args.precision`` when not given."""
    if args.config:
        full = load_config(args.config)
        cfg = full.model
        if args.batch is None:
            args.batch = full.train.train_micro_batch_size_per_gpu
        if args.precision is None:
            args.precision = full.precision if full.precision in ("fp32", "bf16") else "fp32"
    else:
        cfg = ModelConfig(**DEFAULT_MODEL)
    args.batch = 8 if args.batch is None else args.batch
    args.precision = args.precision or "fp32"
    for key in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "seq_length",
        "vocab_size",
        "checkpoint_activations",
    ):
        v = getattr(args, key)
        if v is not None:
            setattr(cfg, key, v)
    cfg.max_position_embeddings = max(cfg.max_position_embeddings or 0, cfg.seq_length)
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ConfigError(
            f"hidden_size {cfg.hidden_size} is not divisible by num_attention_heads {cfg.num_attention_heads}"
        )
    if not cfg.no_weight_tying:
        raise ConfigError(
            "no_weight_tying: false: bench_model's plain baseline loop has an untied head; "
            "set no_weight_tying: true to compare (the engine itself supports tied weights)"
        )
    return cfg


def check_memory(cfg: ModelConfig, batch: int) -> None:
    """Refuse, in one line, a model the host cannot hold: both paths' parameters, gradients and
    AdamW states (and the shared initial copy), ~40 bytes per parameter, plus one path's
    activations at a low estimate, against the available memory (before anything is allocated)."""
    from megatron_topo.data.gpt_dataset import available_memory_bytes
    from megatron_topo.model import unit_numels

    params = sum(unit_numels(cfg))
    tokens = batch * cfg.seq_length
    states = 40 * params
    acts = 4 * tokens * (10 * cfg.hidden_size * cfg.num_layers + 2 * cfg.vocab_size)
    have = available_memory_bytes()
    if states + acts > have:
        raise ConfigError(
            f"the model ({params:,} parameters; L={cfg.num_layers} h={cfg.hidden_size} V={cfg.vocab_size}) and "
            f"batch ({batch} x {cfg.seq_length} tokens) need at least {(states + acts) / 2**30:,.1f} GiB "
            f"(both paths' weights, gradients and AdamW states, one path's activations); "
            f"{have / 2**30:,.1f} GiB of host memory is available: use a smaller model or batch"
        )


def make_batches(cfg: ModelConfig, batch: int, n: int, seed: int):
    """``n`` random (inputs, targets) batches, the targets shifted by one token."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_length + 1), generator=g)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


def run(path, batches, n, start, times):
    """``n`` steps; returns (wall seconds, process CPU seconds, losses)."""
    losses = []
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        x, y = batches[(start + i) % len(batches)]
        losses.append(path.step(x, y, times))
    return time.perf_counter() - t0, time.process_time() - c0, losses


def parity(ours: Ours, plain: Plain, x) -> float:
    """max |logits_ours - logits_plain| on the shared initial weights (before any step)."""
    with torch.no_grad():
        ours.model.eval()
        plain.model.eval()
        a = ours.model(x).float()
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if plain.autocast else nullcontext()
        with ctx:
            b = plain.model(x).float()
        ours.model.train()
        plain.model.train()
    return float((a - b).abs().max())


def profile(paths, batches, steps):
    """torch.profiler top ops of each path and cProfile of the engine's Python functions."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    report = {}
    for path in paths:
        with tprofile(activities=[ProfilerActivity.CPU]) as prof:
            run(path, batches, steps, 0, [])
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18)
        print(f"\n== torch.profiler: {path.name}, {steps} steps, top ops by self CPU time ==")
        print(table)
        report[f"torch_profiler_{path.name}"] = table
        pr = cProfile.Profile()
        pr.enable()
        run(path, batches, steps, 0, [])
        pr.disable()
        s = io.StringIO()
        st = pstats.Stats(pr, stream=s)
        st.sort_stats("tottime").print_stats(25)
        if path.name == "ours":  # where the engine spends its time, by function (inclusive)
            st.sort_stats("cumulative").print_stats("megatron_topo/zero_topo", 25)
        print(
            f"\n== cProfile: {path.name}, {steps} steps, by own time"
            f"{' + engine functions by cumulative time' if path.name == 'ours' else ''} =="
        )
        print(s.getvalue())
        report[f"cprofile_{path.name}"] = s.getvalue()
    return report


@interruptible
def main(argv=None) -> int:
    """Warm up, time both paths interleaved, print the table and the verdict, write --json."""
    args = parse_args(argv)
    try:
        if args.json:
            check_file(args.json, "--json", TOOL, LEGACY, inputs=list(args.config or []))
    except OutputError as e:
        print(clean(f"error: {e}"), file=sys.stderr)
        return 2
    try:
        cfg = model_config(args)
        check_memory(cfg, args.batch)
    except ConfigError as e:
        print(clean(f"error: {e}"), file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    ours = Ours(cfg, args)
    plain = Plain(cfg, args, [ours.init_state[n] for n, _ in ours.model.named_parameters()])
    batches = make_batches(cfg, args.batch, 8, args.seed + 1)
    max_diff = parity(ours, plain, batches[0][0])
    n_params = sum(p.numel() for p in plain.model.parameters())
    tokens = args.batch * cfg.seq_length
    flops = flops_per_iteration(cfg, args.batch, cfg.checkpoint_activations)

    print(
        f"model: L={cfg.num_layers} h={cfg.hidden_size} heads={cfg.num_attention_heads} s={cfg.seq_length} "
        f"V={cfg.vocab_size} params={n_params / 1e6:.2f}M  batch={args.batch} ({tokens} tokens/step)  "
        f"precision={args.precision}  plain AdamW={args.plain_optimizer}  threads={torch.get_num_threads()}  "
        f"logits parity max|d|={max_diff:.2e}",
        flush=True,
    )

    load0 = list(os.getloadavg())
    paths = (ours, plain)
    for p in paths:  # warm-up (allocator, optimizer state, autocast caches)
        run(p, batches, args.warmup, 0, [])
    tps = {p.name: [] for p in paths}
    tps_cpu = {p.name: [] for p in paths}
    phase = {p.name: [] for p in paths}
    losses = {p.name: [] for p in paths}
    for r in range(args.repeats):
        for p in paths:  # A B A B ...
            dt, dc, ls = run(p, batches, args.steps, args.warmup + r * args.steps, phase[p.name])
            tps[p.name].append(tokens * args.steps / dt)
            tps_cpu[p.name].append(tokens * args.steps / dc)
            losses[p.name] = ls
        print(
            f"  repeat {r + 1}/{args.repeats}: ours {tps['ours'][-1]:9.1f} tok/s   plain {tps['plain'][-1]:9.1f} tok/s",
            flush=True,
        )

    med = {k: statistics.median(v) for k, v in tps.items()}
    med_cpu = {k: statistics.median(v) for k, v in tps_cpu.items()}
    ratio = med["ours"] / med["plain"]
    ratio_cpu = med_cpu["ours"] / med_cpu["plain"]
    paired = statistics.median(a / b for a, b in zip(tps["ours"], tps["plain"]))
    ph = {k: [1e3 * statistics.median(t[i] for t in v) for i in range(3)] for k, v in phase.items()}

    print()
    print(
        f"{'path':<6} {'tokens/s (median)':>18} {'min':>9} {'max':>9} {'tok/CPU-s':>10} {'TFLOPS':>8} "
        f"{'fwd ms':>8} {'bwd ms':>8} {'step ms':>8} {'final loss':>10}"
    )
    for k in ("ours", "plain"):
        tf = flops / (tokens / med[k]) / 1e12
        print(
            f"{k:<6} {med[k]:>18.1f} {min(tps[k]):>9.1f} {max(tps[k]):>9.1f} {med_cpu[k]:>10.1f} {tf:>8.4f} "
            f"{ph[k][0]:>8.2f} {ph[k][1]:>8.2f} {ph[k][2]:>8.2f} {losses[k][-1]:>10.4f}"
        )
    best = max(tps["ours"]) / max(tps["plain"])
    verdict = "PASS" if paired >= TARGET else "FAIL"
    print(
        f"ours/plain = {paired:.3f}  (median of the per-repeat A/B ratios; ratio of median tokens/s {ratio:.3f}, "
        f"best/best {best:.3f}, per CPU-second {ratio_cpu:.3f});  target >= {TARGET}: {verdict}"
    )
    load = os.getloadavg()
    if load[0] > os.cpu_count():
        print(
            f"note: load average {load[0]:.1f} on {os.cpu_count()} CPUs: other processes share the machine, "
            f"absolute tokens/s are noisy; the paired ratio is the robust number"
        )

    result = {
        "model": {
            k: getattr(cfg, k)
            for k in (
                "num_layers",
                "hidden_size",
                "num_attention_heads",
                "seq_length",
                "vocab_size",
                "rotary_pct",
                "gpt_j_residual",
                "checkpoint_activations",
            )
        },
        "params": n_params,
        "batch": args.batch,
        "tokens_per_step": tokens,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "precision": args.precision,
        "plain_bf16": args.plain_bf16 if args.precision == "bf16" else None,
        "plain_optimizer": args.plain_optimizer,
        "threads": torch.get_num_threads(),
        "clip": args.clip,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "logits_parity_max_abs_diff": max_diff,
        "tokens_per_s": {k: {"median": med[k], "all": tps[k]} for k in tps},
        "tokens_per_cpu_s": {k: {"median": med_cpu[k], "all": tps_cpu[k]} for k in tps_cpu},
        "phase_ms_median": {k: dict(zip(("forward", "backward", "step"), v)) for k, v in ph.items()},
        "final_loss": {k: v[-1] for k, v in losses.items()},
        "ratio_ours_over_plain": paired,  # median of per-repeat ratios (the verdict)
        "ratio_of_medians": ratio,
        "ratio_best": best,
        "ratio_per_cpu_s": ratio_cpu,
        "target": TARGET,
        "pass": paired >= TARGET,
        "loadavg_start": load0,
        "loadavg_end": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "command": " ".join([os.path.basename(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
    }
    if args.profile:
        result["profile"] = profile(paths, batches, args.profile_steps)
    if args.json:
        try:
            write_result(args.json, result, TOOL, indent=2, allow_nan=False, default=str)
        except (OSError, ValueError) as e:
            print(
                clean(f"error: --json {args.json}: {getattr(e, 'strerror', None) or e}; nothing written"),
                file=sys.stderr,
            )
            return 1
        print(escaped(f"wrote {args.json}"))
    return 0 if all(math.isfinite(v) for v in med.values()) else 1
