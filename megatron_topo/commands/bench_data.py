"""Preprocessing throughput: MB/s of input text and tokens/s with 1 and 2 workers.

    python tools/bench_data.py                      # ByteLevel + a BPE trained on the corpus
    python tools/bench_data.py --tokenizer-type HFTokenizer --vocab-file 20B_tokenizer.json --workers 1 8

The corpus is generated: the Python standard library's source as Pile-style ``.jsonl.zst``
({"text": ..., "meta": {"pile_set_name": "stdlib"}}), or ``--input`` files. Prints a table and
writes JSON (``--json``, with ``"tool": "bench_data"``): the path is checked before the benchmark
runs and replaces only an earlier result of bench_data (megatron_topo.tool_outputs: never a link, a
FIFO, a user's file, an input, or a file inside a checkpoint, an HF export or a run's log folder).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
import tempfile

from megatron_topo.cli import OneLineParser, bounded, interruptible, path_arg
from megatron_topo.commands.preprocess_data import Terminated
from megatron_topo.data import DataError
from megatron_topo.data.builtin import stdlib_files
from megatron_topo.data.errors import error_line
from megatron_topo.data.preprocess import preprocess
from megatron_topo.error_lines import clean, escaped
from megatron_topo.tool_outputs import OutputError, check_file, write_result

TOOL = "bench_data"
LEGACY = ("cpu_count", "input", "repeat", "rows")  # a result written before the "tool" field


def make_corpus(directory: str, megabytes: float) -> str:
    """Stdlib sources as a Pile-style .jsonl.zst; returns its path."""
    import zstandard

    path = os.path.join(directory, "stdlib.jsonl.zst")
    files = stdlib_files(int(megabytes * 1e6))
    have = sum(os.path.getsize(f) for f in files)
    if have < megabytes * 1e6:
        print(
            f"note: --mb {megabytes:g}: the standard library holds {have / 1e6:.1f} MB of Python source; "
            f"the corpus is all of it",
            file=sys.stderr,
        )
    with open(path, "wb") as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw) as out:
        for src in files:
            with open(src, encoding="utf-8", errors="replace") as f:
                doc = {"text": f.read(), "meta": {"pile_set_name": "stdlib"}}
            out.write(json.dumps(doc).encode() + b"\n")
    return path


def train_bpe_for_bench(inputs, directory: str, vocab_size: int) -> str:
    from megatron_topo.commands.train_tokenizer import train_bpe
    from megatron_topo.data.corpus import expand_sources, iter_source_documents

    path = os.path.join(directory, "bench_bpe.json")
    train_bpe(iter_source_documents(expand_sources(inputs)), vocab_size, path)
    return path


MAX_MB = 256  # MB of generated source (more than the standard library holds)
MAX_WORKERS = max(64, 4 * (os.cpu_count() or 1))  # what preprocess allows
MIN_BPE_VOCAB = 512  # the byte alphabet, special tokens and some merges
MAX_BPE_VOCAB = 1 << 20  # as train_tokenizer.py's bpe bound (a benchmark's tokenizer)


@interruptible(preload=("numpy",))
def main(argv=None) -> int:
    """SIGTERM/SIGHUP unwind like Ctrl-C (preprocess_data's handlers): the worker pool is shut down
    and the generated corpus removed; a SIGKILL leaves no worker either (they die with their
    parent: data.preprocess.die_with_parent)."""
    from megatron_topo.commands.preprocess_data import unwinding_stop_signals

    return unwinding_stop_signals(_main, argv)


def _main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--input", type=path_arg, nargs="+", default=None, help="corpus files (default: generated stdlib .jsonl.zst)"
    )
    p.add_argument(
        "--mb",
        type=bounded(float, 0, MAX_MB, lo_open=True, unit="MB"),
        default=8.0,
        help=f"size of the generated corpus in MB of source, at most {MAX_MB} (the standard library holds "
        "a few tens of MB: all of it is used when it holds less)",
    )
    p.add_argument(
        "--workers",
        type=bounded(int, 1, MAX_WORKERS, why="as preprocess_data.py --workers: 4 x the CPUs, at least 64"),
        nargs="+",
        default=[1, 2],
    )
    p.add_argument("--tokenizer-type", default=None, help="bench this tokenizer only (default: ByteLevel and BPE)")
    p.add_argument("--vocab-file", type=path_arg, default=None)
    p.add_argument("--bpe-vocab-size", type=bounded(int, MIN_BPE_VOCAB, MAX_BPE_VOCAB), default=8192)
    p.add_argument(  # a benchmark runs as long as asked: no upper bound (docs/reliability.md)
        "--repeat", type=bounded(int, 1), default=1, help="runs per setting; the fastest is reported"
    )
    p.add_argument(
        "--json",
        type=path_arg,
        default="runs/bench_data.json",
        help="where to write the results (a new file or an earlier result of bench_data, which is replaced)",
    )
    args = p.parse_args(argv)
    try:
        check_file(args.json, "--json", TOOL, LEGACY, inputs=[*(args.input or []), args.vocab_file or ""])
    except OutputError as e:
        print(clean(f"error: {e}"), file=sys.stderr)
        return 2
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            inputs = args.input or [make_corpus(tmp, args.mb)]
            if args.tokenizer_type:
                tokenizers = [(args.tokenizer_type, args.tokenizer_type, args.vocab_file)]
            else:
                bpe = train_bpe_for_bench(inputs, tmp, args.bpe_vocab_size)
                tokenizers = [("ByteLevel", "ByteLevel", None), (f"BPE-{args.bpe_vocab_size}", "HFTokenizer", bpe)]
            for label, ttype, vocab in tokenizers:
                for w in args.workers:
                    runs = [
                        preprocess(
                            inputs,
                            os.path.join(tmp, f"out_{w}"),
                            ttype,
                            vocab,
                            append_eod=True,
                            workers=w,
                            progress=False,
                            force=True,
                        )  # its temp dir, N times
                        for _ in range(args.repeat)
                    ]
                    st = min(runs, key=lambda r: r.seconds)  # best of N: least disturbed by other load
                    rows.append({"tokenizer": label, **st.to_dict()})
                    print(
                        f"{label:>12} workers={w}: {st.mb_per_s:7.2f} MB/s {st.tokens_per_s:12,.0f} tokens/s "
                        f"(start-up {st.startup_seconds:.2f} s)",
                        file=sys.stderr,
                    )
    except (DataError, OSError) as e:
        print(clean(f"error: {error_line(e)}"), file=sys.stderr)
        return 1
    except Terminated as e:
        print(clean(f"error: stopped by {e}; nothing written"), file=sys.stderr)
        return 128 + int(getattr(signal, str(e)))
    except KeyboardInterrupt:
        print("error: interrupted; nothing written", file=sys.stderr)
        return 130
    header = (
        f"{'tokenizer':>12} {'workers':>7} {'MB':>7} {'seconds':>8} {'start-up':>8} {'MB/s':>8} "
        f"{'tokens/s':>12} {'steady MB/s':>11} {'tokens':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['tokenizer']:>12} {r['workers']:>7} {r['input_bytes'] / 1e6:7.2f} {r['seconds']:8.2f} "
            f"{r['startup_seconds']:8.2f} {r['mb_per_s']:8.2f} {r['tokens_per_s']:12,.0f} "
            f"{r['steady_mb_per_s']:11.2f} {r['tokens']:10d}"
        )
    print("MB/s and tokens/s: whole runs; steady MB/s: after the worker processes started")
    result = {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "input": args.input or f"generated stdlib .jsonl.zst ({args.mb} MB)",
        "repeat": args.repeat,
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    try:
        write_result(args.json, result, TOOL)
    except OSError as e:
        print(clean(f"error: --json {args.json}: {e.strerror or e}; nothing written"), file=sys.stderr)
        return 1
    print(escaped(f"wrote {args.json}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
