"""Trainer properties: data-parallel equals accumulation, resume is bit exact, fp16 overflow."""

import json
import os
import time

import torch

from megatron_topo.training import Trainer, learning_rate

from .dist_utils import run_distributed
from .train_utils import datasets, local_runtime, small_config


def _train(rank, world, tmp, accum, steps, deterministic=False):
    cfg = small_config(
        tmp,
        **{
            "train.gradient_accumulation_steps": accum,
            "train.train_iters": steps,
            "zero_topo.deterministic": deterministic,
        },
    )
    cfg.logging.log_dir = str(tmp / f"run_w{world}{'_det' if deterministic else ''}")
    tr = Trainer(cfg, local_runtime(rank, world), datasets=datasets(cfg))
    tr.train()
    return {n: p.clone() for n, p in tr.engine.full_parameters().items()}


def test_four_process_ddp_equals_one_process_with_accumulation(tmp_path):
    multi = run_distributed(_train, 4, tmp_path, 1, 5)[0]
    single = _train(0, 1, tmp_path, 4, 5)
    exact = run_distributed(_train, 4, tmp_path, 1, 5, True)[0]
    for name, want in single.items():
        assert torch.equal(exact[name], want), name  # ordered reduction: bit for bit
        # default all-reduce: gloo's ring sums in another order than accumulation does; Adam turns
        # that rounding into ~1e-6 relative differences on zero-initialised biases after 5 steps
        rel = ((multi[name] - want).norm() / want.norm().clamp_min(1e-12)).item()
        assert rel <= 1e-5, (name, rel)
    lines = [json.loads(x) for x in open(tmp_path / "run_w4" / "metrics.jsonl")]
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5]
    for key in (
        "loss",
        "lr",
        "grad_norm",
        "loss_scale",
        "tokens_per_sec",
        "samples_per_sec",
        "tflops_per_gpu",
        "peak_mem_bytes",
        "comm_bytes_intra_gpu",
        "comm_bytes_intra_node",
        "comm_bytes_inter_node",
    ):
        assert key in lines[0], key


def test_step_time_is_wall_clock_with_the_log_reduction_and_without_evaluation(tmp_path, monkeypatch):
    """step_time_s is wall clock over the log window: the log reduction, which waits for what the
    steps left running (made to take 0.4 s here), is in it; evaluation (2 s here) is not."""
    cfg = small_config(tmp_path, **{"train.train_iters": 4})
    cfg.logging.log_interval, cfg.logging.eval_interval = 2, 2
    cfg.logging.log_dir = str(tmp_path / "timed")
    reduce_log, evaluate = Trainer._reduce_log, Trainer.evaluate

    def slow_reduce(self, *a):
        time.sleep(0.4)
        return reduce_log(self, *a)

    def slow_eval(self):
        time.sleep(2.0)
        return evaluate(self)

    monkeypatch.setattr(Trainer, "_reduce_log", slow_reduce)
    monkeypatch.setattr(Trainer, "evaluate", slow_eval)
    Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg)).train()
    times = [
        r["step_time_s"] for r in map(json.loads, open(tmp_path / "timed" / "metrics.jsonl")) if "step_time_s" in r
    ]
    assert len(times) == 2
    assert all(0.2 <= t < 1.0 for t in times), times  # 2 steps + 0.4 s reduction, not + 2 s eval


def test_resume_is_bit_exact(tmp_path):
    def run(steps, load=None, save=None, total=6, tag="a"):
        cfg = small_config(tmp_path, **{"train.train_iters": total})
        cfg.logging.log_dir = str(tmp_path / tag)
        cfg.checkpoint.save, cfg.checkpoint.load = save, load
        tr = Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg))
        tr.train(until=steps)
        return tr

    straight = run(6, tag="straight")
    ck = str(tmp_path / "ckpt")
    first = run(3, save=ck, tag="first")
    assert first.state.step == 3 and os.path.isfile(os.path.join(ck, "latest"))
    second = run(6, load=ck, tag="second")
    a, b = straight.engine.full_parameters(), second.engine.full_parameters()
    for n in a:
        assert torch.equal(a[n], b[n]), n
    la = [json.loads(x)["loss"] for x in open(tmp_path / "straight" / "metrics.jsonl")]
    lb = [json.loads(x)["loss"] for x in open(tmp_path / "second" / "metrics.jsonl")]
    assert la[3:] == lb, (la, lb)
    for st_a, st_b in zip(straight.engine.optimizer.opt.state.values(), second.engine.optimizer.opt.state.values()):
        assert torch.equal(st_a["exp_avg"], st_b["exp_avg"]) and torch.equal(st_a["exp_avg_sq"], st_b["exp_avg_sq"])


def test_fp16_overflow_skips_step_and_halves_scale(tmp_path):
    cfg = small_config(tmp_path, **{"train.precision": "fp16"})
    cfg.train.fp16.hysteresis = 1
    tr = Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg))
    eng = tr.engine
    tr.train_step()  # a normal step
    before = {n: p.clone() for n, p in eng.full_parameters().items()}
    scale = eng.loss_scale
    x, y = tr.train_batches.micro(tr.state.consumed_samples, 0)
    from megatron_topo.training import loss_fn

    eng.backward(loss_fn(eng(x), y) * float("inf"))  # the injected inf
    stats = eng.step(1e-2)
    assert stats["skipped"] and eng.loss_scale == scale / 2
    after = eng.full_parameters()
    for n, p in after.items():
        assert torch.isfinite(p).all() and torch.equal(p, before[n]), n
    # training goes on normally afterwards
    stats = tr.train_step()
    assert not stats["skipped"] and torch.isfinite(torch.tensor(stats["grad_norm"]))


def test_fp16_hysteresis_delays_the_backoff(tmp_path):
    cfg = small_config(tmp_path, **{"train.precision": "fp16"})
    cfg.train.fp16.hysteresis = 2
    tr = Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg))
    eng = tr.engine
    scale = eng.loss_scale
    x, y = tr.train_batches.micro(0, 0)
    from megatron_topo.training import loss_fn

    for expected in (scale, scale / 2):
        eng.backward(loss_fn(eng(x), y) * float("inf"))
        assert eng.step(1e-2)["skipped"] and eng.loss_scale == expected


def test_lr_schedule_warmup_then_cosine_to_min(tmp_path):
    cfg = small_config(tmp_path, **{"train.train_iters": 100, "train.warmup": 0.1, "train.min_lr": 1e-3})
    lrs = [learning_rate(cfg, s) for s in range(1, 101)]
    assert lrs[0] == 1e-3 and abs(lrs[9] - 1e-2) < 1e-12  # linear warmup over 10 steps
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # monotone decay
    assert abs(lrs[-1] - 1e-3) < 1e-12
    cfg.train.lr_decay_style = "linear"
    assert abs(learning_rate(cfg, 55) - (1e-2 - 9e-3 * 0.5)) < 1e-12


def test_backward_after_last_micro_batch_without_step_is_an_error():
    """The combine of the step's gradients starts during the last backward: one more backward
    before step() would add to shards already on the wire; the engine refuses it."""
    import pytest

    from megatron_topo.config import ZeroTopoConfig

    from .engine_cases import batch, loss_fn, make_engine

    eng = make_engine(0, 1, ZeroTopoConfig(preset="ddp"), gcds=1, gpus=1)
    x, y = batch(0, 0, 0)
    eng.backward(loss_fn(eng(x), y), last_micro_batch=True)
    with pytest.raises(RuntimeError, match="without step"):
        eng.backward(loss_fn(eng(x), y))
    eng.step()
    eng.backward(loss_fn(eng(x), y), last_micro_batch=True)  # fine again after step()
    eng.step()
