"""Plot loss, TFLOPS/GPU and tokens/s against step for one or more runs, side by side.

    python tools/plot_metrics.py runs/zero3 runs/topo --out compare.png --labels ZeRO-3 topo --smooth 10

Each RUN_DIR must hold the ``metrics.jsonl`` written by ``megatron_topo.metrics.MetricsWriter``
(a path to the .jsonl file itself works too). One subplot per metric, one line per run; the
legend shows ``--labels`` or the run directory's name. ``--smooth N`` draws an N-point trailing
moving average over the faint raw curve; ``eval_loss`` is drawn dashed in the loss panel. A
resumed run's steps count once: a job resumed from an earlier checkpoint supersedes the records
its predecessor wrote after that checkpoint (train.py moves them to metrics.jsonl.superseded; in an
older file they are dropped here, with a note), and the records of one step merge. Bad input prints
one line on stderr and exits 2.
"""

from __future__ import annotations

import math
import os
import re
import sys
import warnings

from megatron_topo.atomic import atomic_path
from megatron_topo.cli import OneLineParser, fail, interruptible, number, path_arg
from megatron_topo.error_lines import clean, escaped
from megatron_topo.metrics import drop_superseded, is_step, metrics_path, read_metrics
from megatron_topo.safe_files import why_not_a_file

# panel -> (title, keys tried in order: the canonical key first, then common spellings)
PANELS = {
    "loss": ("loss", ("loss", "lm_loss", "train/loss", "train_loss", "train/lm_loss")),
    "tflops": ("TFLOPS / GPU", ("tflops_per_gpu", "tflops", "runtime/tflops_per_gpu", "TFLOPS/GPU")),
    "tokens": ("tokens / s", ("tokens_per_sec", "tokens_per_s", "tokens/s", "runtime/tokens_per_s")),
}
ALWAYS = ("loss", "tflops")  # drawn even when no run has them ("no data"); tokens/s when present


class PlotError(Exception):
    pass


def parse_args(argv=None):
    p = OneLineParser(prog="plot_metrics.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "runs", type=path_arg, nargs="+", metavar="RUN_DIR", help="run directories (each with metrics.jsonl)"
    )
    p.add_argument("--out", type=path_arg, required=True, metavar="FILE.png", help="output image (PNG)")
    p.add_argument("--labels", nargs="+", default=None, help="legend labels, one per RUN_DIR")
    p.add_argument("--smooth", type=number(int), default=1, metavar="N", help="trailing moving average over N points")
    p.add_argument(
        "--metrics",
        nargs="+",
        default=None,
        metavar="KEY",
        help="plot these metrics.jsonl keys instead of loss / TFLOPS / tokens/s",
    )
    p.add_argument("--title", default=None, help="figure title (at most 200 characters; plain text, not TeX)")
    p.add_argument("--force", action="store_true", help="replace an existing --out that plot_metrics did not write")
    return p.parse_args(argv)


def _num(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def series(records: list[dict], keys) -> tuple[list[int], list[float], str | None]:
    """Steps and values of the first of ``keys`` any record has (NaN where a record lacks it)."""
    for k in keys:
        if any(k in r for r in records):
            pts = [(r["step"], _num(r[k])) for r in records if k in r]
            return [s for s, _ in pts], [v for _, v in pts], k
    return [], [], None


def _say_skipped(label: str, what: str, steps: list, vals: list) -> None:
    bad = [st for st, v in zip(steps, vals) if not math.isfinite(v)]
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        print(
            f"plot_metrics: warning: {label}: {what}: {len(bad)} non-finite value(s) not drawn (step {shown})",
            file=sys.stderr,
        )


def smooth(values: list[float], n: int) -> list[float]:
    """Trailing mean over the last ``n`` finite values (non-finite points stay gaps); a running
    sum, so the time does not grow with ``n``."""
    import collections

    if n <= 1:
        return list(values)
    out, window, total = [], collections.deque(), 0.0
    for v in values:
        if math.isfinite(v):
            window.append(v)
            total += v
            if len(window) > n:
                total -= window.popleft()
            out.append(total / len(window))
        else:
            out.append(math.nan)
    return out


def load_runs(run_dirs: list[str]) -> list[list[dict]]:
    runs = []
    for d in run_dirs:
        path = metrics_path(d)
        if not os.path.exists(d):
            raise PlotError(f"{d}: no such run directory")
        if os.path.lexists(path) and not os.path.isfile(path):
            raise PlotError(f"{path} {why_not_a_file(path)}")
        if not os.path.isfile(path):
            raise PlotError(f"{d}: no metrics.jsonl in this run directory (expected {path})")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                recs = read_metrics(path, keep_bad_steps=True)  # a bad step is refused below
            except UnicodeDecodeError as e:
                raise PlotError(f"{path}: not UTF-8 text (byte {e.start}); is it a metrics.jsonl?") from None
            except OSError as e:
                raise PlotError(f"{path}: cannot read it ({e.strerror or e})") from None
        for w in caught:
            print(clean(f"plot_metrics: warning: {w.message}"), file=sys.stderr)
        for r in recs:
            s = r["step"]
            if not is_step(s):  # a JSON integer: a float (1e-400 reads as 0.0, 5.0000000000000001 as 5.0) is not one
                shown = repr(s) if len(repr(s)) <= 40 else repr(s)[:40] + "..."
                kind = " (a JSON float)" if isinstance(s, float) else ""
                raise PlotError(
                    f"{path}: a record has step {shown}{kind}; steps must be integers (a metrics.jsonl "
                    f"written by megatron_topo.metrics.MetricsWriter)"
                )
        recs, dropped = drop_superseded(recs)  # one curve per run: a resume supersedes later steps
        if dropped:
            print(
                f"plot_metrics: note: {path}: {dropped} records of steps that a resumed job trained again "
                f"are not drawn (superseded by the resume)",
                file=sys.stderr,
            )
        by_step: dict = {}
        for r in recs:  # an eval record shares its step with the training record
            by_step.setdefault(int(r["step"]), {}).update(r)
        recs = [by_step[s] for s in sorted(by_step)]
        if not recs:
            size = os.path.getsize(path)
            raise PlotError(
                f"{path}: no records ("
                + ("the file is empty)" if not size else f"no line of its {size:,} bytes is a record)")
            )
        runs.append(recs)
    return runs


SOFTWARE = "megatron_topo plot_metrics"  # the PNG's Software text: an earlier plot is replaced without --force


def _check_out(out: str, run_dirs, force: bool) -> None:
    from megatron_topo.safe_outputs import check_output_file, head

    check_output_file(
        out,
        "--out",
        PlotError,
        force,
        inputs=[metrics_path(d) for d in run_dirs],
        ours=lambda p: SOFTWARE.encode() in head(p, 1 << 12),
        kind=lambda p: None if head(p, 8) == b"\x89PNG\r\n\x1a\n" else "is not a PNG image",
        artifacts=True,  # not into a checkpoint save folder or an HF export, as generate's samples
    )


def _check_distinct(run_dirs) -> None:
    """Each run is drawn once: two arguments naming one metrics.jsonl (the same folder twice, a
    symbolic link to it, a folder and its file, a hard link) are refused."""
    seen = {}
    for d in run_dirs:
        real = os.path.realpath(metrics_path(d))
        try:
            st = os.stat(real)
            key = (st.st_dev, st.st_ino)  # a hard link too
        except OSError:
            key = real  # (load_runs names what is wrong with it)
        if key in seen:
            raise PlotError(f"{d} and {seen[key]} are the same run ({real}); each run is drawn once: drop one of them")
        seen[key] = d


MAX_TEXT = 200  # --title, each --labels and --metrics name: longer ones only slow the layout down (200k: minutes)
MAX_METRICS = 16  # one panel each, side by side
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")  # C0 but the line break, DEL, C1, line separators


def _check_texts(labels, metrics, title) -> None:
    from megatron_topo.safe_files import excerpt

    for flag, texts in (
        ("--title", [title] if title is not None else []),
        ("--labels", labels or []),
        ("--metrics", metrics or []),
    ):
        for t in texts:
            if len(t) > MAX_TEXT:
                raise PlotError(f"{flag} {excerpt(t, 40)} is too long: at most {MAX_TEXT} characters")
            bad = CONTROL.search(t)
            if bad:  # drawn as a missing glyph, and matplotlib's warning prints it raw to the terminal
                raise PlotError(
                    f"{flag} {excerpt(t, 40)}: holds the control character U+{ord(bad.group()):04X}; "
                    f"give plain text (a line break is the only control allowed)"
                )
    if metrics and len(metrics) > MAX_METRICS:
        raise PlotError(f"--metrics: {len(metrics)} keys; at most {MAX_METRICS} (one panel each)")


def plot(run_dirs, out, labels=None, smooth_n=1, metrics=None, title=None, force: bool = False) -> str:
    _check_texts(labels, metrics, title)
    if labels is not None and len(labels) != len(run_dirs):
        raise PlotError(f"--labels: got {len(labels)} labels for {len(run_dirs)} run directories; give one per run")
    if smooth_n < 1:
        raise PlotError(f"--smooth: must be >= 1, got {smooth_n}")
    if not out.lower().endswith(".png"):
        raise PlotError(f"--out {out}: the output must be a .png file")
    _check_out(out, run_dirs, force)
    _check_distinct(run_dirs)
    runs = load_runs(run_dirs)
    if metrics:
        absent = [k for k in metrics if not any(series(r, (k,))[2] for r in runs)]
        if absent:
            keys = sorted({k for r in runs for rec in r for k in rec} - {"step"})
            raise PlotError(f"--metrics: no run has {absent[0]!r} (the records' keys: {', '.join(keys[:20])})")
    labels = labels or [os.path.basename(os.path.normpath(d)) or d for d in run_dirs]

    if metrics:
        panels = [(k, (k,)) for k in metrics]
    else:
        panels = []
        for name, (ttl, keys) in PANELS.items():
            present = any(series(r, keys)[2] for r in runs)
            if present or name in ALWAYS:
                panels.append((ttl, keys))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.0), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (ttl, keys) in zip(axes[0], panels):
        drew = False
        for i, (recs, label) in enumerate(zip(runs, labels)):
            steps, vals, _ = series(recs, keys)
            if not steps:
                continue
            _say_skipped(label, ttl, steps, vals)  # non-finite points are gaps in the curve: say which
            c = colors[i % len(colors)]
            if smooth_n > 1:
                ax.plot(steps, vals, color=c, alpha=0.25, linewidth=1)
                ax.plot(steps, smooth(vals, smooth_n), color=c, linewidth=1.8, label=label)
            else:
                ax.plot(steps, vals, color=c, linewidth=1.5, label=label, marker="." if len(steps) < 30 else None)
            drew = True
            if keys is PANELS["loss"][1]:  # held-out loss of the same run, dashed
                es, ev, _ = series(recs, ("eval_loss",))
                if es:
                    ax.plot(
                        es,
                        ev,
                        color=c,
                        linestyle="--",
                        linewidth=1.2,
                        marker="o",
                        markersize=3,
                        label=f"{label} (eval)",
                    )
        ax.set_title(ttl, parse_math=False)  # a metric's name is text, not TeX
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if drew:
            for t in ax.legend(fontsize="small").get_texts():
                t.set_parse_math(False)  # a label or run folder "$x^$" is text, not TeX
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
    if title:
        fig.suptitle(title, parse_math=False)
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(out))
    try:
        with atomic_path(out, tmp=os.path.join(d, f".{os.path.basename(out)}.tmp.{os.getpid()}.png")) as tmp:
            fig.savefig(tmp, dpi=110, format="png", metadata={"Software": SOFTWARE})
    finally:
        plt.close(fig)
    return out


@interruptible(preload=("numpy", "matplotlib"))
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        out = plot(args.runs, args.out, args.labels, args.smooth, args.metrics, args.title, args.force)
    except PlotError as e:
        return fail(e)
    print(escaped(f"wrote {out}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
