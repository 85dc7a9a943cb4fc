"""tools/plot_metrics.py: PNG from two runs; one clear error line for a run without metrics."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from megatron_topo.commands import plot_metrics
from megatron_topo.metrics import MetricsWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "plot_metrics.py")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _fake_run(path, speed, steps=40, nan_at=None):
    w = MetricsWriter(str(path), tensorboard=False)
    for s in range(1, steps + 1):
        loss = float("nan") if s == nan_at else 6.0 * math.exp(-s / 15) + 2.0
        w.log(s, {"loss": loss, "tflops_per_gpu": 0.1 * speed, "tokens_per_sec": 1000.0 * speed})
        if s % 10 == 0:
            w.log(s, {"eval_loss": loss + 0.3})
    w.close()


def test_two_runs_png(tmp_path):
    _fake_run(tmp_path / "zero3", 1.0)
    _fake_run(tmp_path / "topo", 1.4, nan_at=5)
    out = tmp_path / "plots" / "cmp.png"
    rc = plot_metrics.main(
        [
            str(tmp_path / "zero3"),
            str(tmp_path / "topo"),
            "--out",
            str(out),
            "--labels",
            "ZeRO-3",
            "topo",
            "--smooth",
            "5",
        ]
    )
    assert rc == 0
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 3 * height  # three panels side by side
    import matplotlib.image

    img = matplotlib.image.imread(str(out))  # decodes as a real PNG
    assert img.shape[0] == height and img.shape[1] == width
    assert not [f for f in os.listdir(out.parent) if f != "cmp.png"]  # no temp file left


def test_missing_metrics_one_line_nonzero(tmp_path):
    _fake_run(tmp_path / "good", 1.0, steps=3)
    (tmp_path / "empty_run").mkdir()
    out = tmp_path / "x.png"
    r = subprocess.run(
        [sys.executable, TOOL, str(tmp_path / "good"), str(tmp_path / "empty_run"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert len(err) == 1, r.stderr
    assert "empty_run" in err[0] and "metrics.jsonl" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("extra, match", [(["--labels", "a"], "--labels"), (["--smooth", "0"], "--smooth")])
def test_bad_options(tmp_path, capsys, extra, match):
    _fake_run(tmp_path / "a", 1.0, steps=2)
    _fake_run(tmp_path / "b", 1.0, steps=2)
    rc = plot_metrics.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "o.png"), *extra])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]
