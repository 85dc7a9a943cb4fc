"""Block INT8/INT4 quantization: the dispatching API (sizes, argument checks, backend choice,
lazy Triton import, timing) and the tools that read it."""

import json
import os
import subprocess
import sys

import pytest
import torch

from megatron_topo.zero_topo import kernels
from megatron_topo.zero_topo.kernels import reference as R

from .kernel_cases import ROOT, assert_bitwise_equal, make_input, run_py


def test_empty_tensor():
    for bits in (8, 4):
        q, s = kernels.quantize(torch.zeros(0), bits, 64)
        assert q.numel() == 0 and s.numel() == 0
        assert kernels.dequantize(q, s, bits, 64, 0).numel() == 0


def test_sizes():
    assert kernels.num_blocks(1000, 64) == 16 and kernels.num_blocks(0, 64) == 0
    assert kernels.payload_nbytes(1000, 8, 64) == 1024
    assert kernels.payload_nbytes(1000, 4, 64) == 512


def test_argument_validation():
    x = torch.randn(1000)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        kernels.quantize(x, 3, 64)
    for bad in (32, 100, 16384, 64.0):
        with pytest.raises(ValueError, match="power of two in"):
            kernels.quantize(x, 8, bad)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        kernels.quantize(x.double(), 8, 64)
    q, s = kernels.quantize(x, 8, 64)
    with pytest.raises(ValueError, match="payload has 1024 elements, expected 2048"):
        kernels.dequantize(q, s, 8, 64, 2000)
    with pytest.raises(ValueError, match="int8"):
        kernels.dequantize(q.view(torch.uint8), s, 8, 64, 1000)
    with pytest.raises(ValueError, match="dtype must be"):
        kernels.dequantize(q, s, 8, 64, 1000, dtype=torch.float64)
    qs, ss = torch.stack([q, q]), torch.stack([s, s])
    with pytest.raises(ValueError, match="mismatched stacks"):
        kernels.dequantize_sum(qs, ss[:1], 8, 64, 1000)
    with pytest.raises(ValueError, match="mismatched stacks"):
        kernels.dequantize_sum(qs[:, :512], ss, 8, 64, 1000)
    with pytest.raises(ValueError, match="2-D"):
        kernels.dequantize_sum(q, s, 8, 64, 1000)
    with pytest.raises(ValueError, match="accumulate=True needs an out"):
        kernels.dequantize_sum(qs, ss, 8, 64, 1000, accumulate=True)
    with pytest.raises(ValueError, match="contiguous float32 tensor of 1000"):
        kernels.dequantize_sum(qs, ss, 8, 64, 1000, out=torch.zeros(1000, dtype=torch.float16))
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        kernels.dequantize_sum_requantize(qs, ss, 8, 64, out_bits=2)


def test_dequantize_into_out():
    """``out=``: the same bits written into the caller's buffer (the engine dequantizes a gathered
    unit straight into its flat buffer); a wrong buffer is refused."""
    x = torch.randn(3000)
    backends = ["reference"] + (["cpu_fast"] if kernels.cpu_fast_available() else [])
    for backend in backends:
        for bits, dtype in ((8, torch.bfloat16), (4, torch.float32)):
            q, s = kernels.quantize(x, bits, 64, backend=backend)
            want = kernels.dequantize(q, s, bits, 64, 3000, dtype=dtype, backend=backend)
            out = torch.full((3000,), 7.0, dtype=dtype)
            got = kernels.dequantize(q, s, bits, 64, 3000, dtype=dtype, backend=backend, out=out)
            assert got is out
            assert_bitwise_equal(out, want)
        with pytest.raises(ValueError, match="out must be a contiguous torch.float32 tensor of 3000"):
            kernels.dequantize(q, s, 4, 64, 3000, backend=backend, out=torch.empty(3000, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="out must be a contiguous"):
            kernels.dequantize(q, s, 4, 64, 3000, backend=backend, out=torch.empty(6000)[::2])
    qm, sm = q.to("meta"), s.to("meta")
    out = torch.empty(3000, device="meta")
    assert kernels.dequantize(qm, sm, 4, 64, 3000, out=out) is out


def test_backend_resolution(monkeypatch):
    x = torch.zeros(4)
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    auto_cpu = "cpu_fast" if kernels.cpu_fast_available() else "reference"
    assert kernels.resolve_backend(None, x) == auto_cpu  # auto on CPU
    monkeypatch.setattr(kernels, "cpu_fast_available", lambda: False)
    assert kernels.resolve_backend(None, x) == "reference"  # the fallback
    monkeypatch.undo()
    monkeypatch.setenv(kernels.ENV_VAR, "cpu_fast")
    assert kernels.resolve_backend(None, x) == "cpu_fast"
    monkeypatch.setenv(kernels.ENV_VAR, "triton")
    assert kernels.resolve_backend(None, x) == "triton"  # env read at call time
    assert kernels.resolve_backend("reference", x) == "reference"  # argument wins
    monkeypatch.setenv(kernels.ENV_VAR, "Reference")
    assert kernels.resolve_backend(None, x) == "reference"
    monkeypatch.setenv(kernels.ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="MEGATRON_TOPO_KERNELS must be one of"):
        kernels.quantize(x, 8, 64)
    with pytest.raises(ValueError, match="backend argument must be one of"):
        kernels.quantize(x, 8, 64, backend="fast")
    monkeypatch.setenv(kernels.ENV_VAR, "reference")
    q, s = kernels.quantize(make_input(300, torch.float32, 1), 4, 64)
    assert_bitwise_equal(
        kernels.dequantize_sum_requantize(q[None], s[None], 4, 64)[1],
        R.dequantize_sum_requantize(q[None], s[None], 4, 64)[1],
    )


def test_imports_and_falls_back_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from megatron_topo.zero_topo import kernels\n"
        "from megatron_topo.zero_topo.kernels import triton_kernels as T\n"
        "assert not T.available() and not kernels.triton_available()\n"
        "x = torch.randn(500)\n"
        "q, s = kernels.quantize(x, 8, 64)\n"
        "assert (kernels.dequantize(q, s, 8, 64, 500) - x).abs().max() <= s.max()\n"
        "try:\n"
        "    kernels.quantize(x, 8, 64, backend='triton')\n"
        "except RuntimeError as e:\n"
        "    assert 'failed to import' in str(e)\n"
        "else:\n"
        "    raise SystemExit('forced triton without triton did not raise')\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_lazy_triton_import_and_cpu_without_interpreter():
    pytest.importorskip("triton")
    code = (
        "import sys, torch\n"
        "from megatron_topo.zero_topo import kernels\n"
        "assert 'triton' not in sys.modules, 'import kernels must not import triton'\n"
        "kernels.quantize(torch.randn(100), 8, 64)\n"
        "assert 'triton' not in sys.modules, 'the CPU auto path must not import triton'\n"
        "try:\n"
        "    kernels.quantize(torch.randn(100), 8, 64, backend='triton')\n"
        "except ValueError as e:\n"
        "    assert 'TRITON_INTERPRET=1' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('triton on CPU without the interpreter did not raise')\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", kernels.ENV_VAR)}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_kernel_timer(tmp_path, monkeypatch):
    t = kernels.timer
    was = t.enabled
    t.reset()
    t.enable()
    try:
        x = make_input(5000, torch.float32, 1)
        q, s = kernels.quantize(x, 8, 64)
        kernels.dequantize(q, s, 8, 64, 5000, backend="reference")
        kernels.quantize(x.to("meta"), 8, 64)  # shapes only: not timed
        snap = t.snapshot()
        assert snap["calls"] == 2 and snap["seconds"] > 0
        fast = "cpu_fast" if kernels.cpu_fast_available() else "reference"
        assert set(snap["per_op"]) == {f"quantize/{fast}", "dequantize/reference"}
        assert abs(sum(v["seconds"] for v in snap["per_op"].values()) - snap["seconds"]) < 1e-9
    finally:
        t.enable(was)
        t.reset()
    t.add("x", "y", 1.0)
    t.reset()
    before = t.calls
    kernels.quantize(torch.zeros(64), 8, 64)
    assert t.calls == before  # disabled: nothing counted
    out = tmp_path / "times"
    code = (
        "import torch\n"
        "from megatron_topo.zero_topo import kernels\n"
        "q, s = kernels.quantize(torch.randn(1000), 4, 64)\n"
        "kernels.dequantize_sum(q[None], s[None], 4, 64, 1000)\n"
        "print('ok')\n"
    )
    run_py(code, {kernels.TIMES_ENV: str(out), "RANK": "3"})
    files = list(out.glob("kernel_times.3.*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    assert rec["rank"] == 3 and rec["calls"] == 2 and rec["seconds"] > 0
    assert {k.split("/")[0] for k in rec["per_op"]} == {"quantize", "dequantize_sum"}


def test_bench_sharding_reads_kernel_times(tmp_path):
    """bench_sharding's quant s column: each rank's kernels.timer file, per step, mean over ranks."""
    from megatron_topo.analysis.bench import measure as BS

    assert BS.KERNEL_TIMES_ENV == kernels.TIMES_ENV
    assert BS.read_kernel_times(str(tmp_path / "absent"), 8) == {"quant_s": 0.0, "quant_s_max": 0.0, "quant_ranks": 0}
    t = kernels.KernelTimer()
    for rank, secs in (("0", 0.8), ("1", 1.6)):
        t.reset()
        t.add("quantize", "cpu_fast", secs)
        os.environ["RANK"], prev = rank, os.environ.get("RANK")
        try:
            t.write(str(tmp_path))
        finally:
            os.environ.pop("RANK") if prev is None else os.environ.__setitem__("RANK", prev)
    got = BS.read_kernel_times(str(tmp_path), 8)
    assert got["quant_ranks"] == 2 and abs(got["quant_s"] - 0.15) < 1e-12 and abs(got["quant_s_max"] - 0.2) < 1e-12


def test_bench_kernels_smoke(tmp_path):
    """tools/bench_kernels.py runs both CPU backends side by side and writes its JSON."""
    out = tmp_path / "k.json"
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tools", "bench_kernels.py"),
            "--device",
            "cpu",
            "--sizes-mib",
            "0.25",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--rounds",
            "2",
            "--threads",
            "1",
            "--block-size",
            "256",
            "--dtype",
            "bfloat16",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
