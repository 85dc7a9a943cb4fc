"""Tokenize a corpus into GPT-NeoX/Megatron mmap datasets: {PREFIX}_{key}_document.bin/.idx.

    python tools/preprocess_data.py --input data/pile/00.jsonl.zst,data/pile/01.jsonl.zst \\
        --output-prefix data/pile --tokenizer-type HFTokenizer --vocab-file 20B_tokenizer.json \\
        --append-eod --workers 16
    python tools/preprocess_data.py --input data/owt --output-prefix data/owt \\
        --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
    python tools/preprocess_data.py --hf-dataset EleutherAI/SOME_DATASET --hf-split train \\
        --output-prefix data/x --tokenizer-type HFTokenizer --vocab-file tokenizer.json  # streamed

Inputs (``--input`` takes several values and GPT-NeoX's comma-separated lists): .jsonl/.json, also
compressed .zst (the Pile), .gz, .xz; .parquet; .arrow; folders written by ``datasets``'
save_to_disk; plain text files (one document per file); directories of them. ``--hf-dataset``
opens anything ``datasets.load_dataset`` does (a hub name, streamed by default; or a builder such
as json/parquet/arrow with ``--hf-data-files``). GPT-NeoX's and Megatron-LM's flags are accepted
(see docs/neox_compat.md); those that would change nothing here are accepted as no-ops, those we
cannot honour are refused with the reason. Bad input prints one line on stderr and exits 1;
existing output is never overwritten by a failed run.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from megatron_topo.cli import OneLineParser, bounded, interruptible, path_arg
from megatron_topo.data import TOKENIZERS, DataError
from megatron_topo.data.errors import error_line
from megatron_topo.data.preprocess import preprocess
from megatron_topo.data.tokenizer import MERGE_FILE_IGNORED, unused_tokenizer_args
from megatron_topo.error_lines import clean, escaped

MAX_COUNT = 10**15  # documents (a progress total, a log interval): more than any corpus holds
MAX_WORKERS = max(64, 4 * (os.cpu_count() or 1))  # as data.preprocess allows

# Megatron-LM flags we refuse (with why) when given a value other than their no-op default.
REFUSED = {
    "split_sentences": "--split-sentences is not supported: it needs NLTK's punkt model (a download) and "
    "writes *_sentence datasets for BERT-style training; GPT training reads whole documents",
    "vocab_extra_ids": "--vocab-extra-ids is not supported: T5 sentinel tokens are for encoder-decoder models; "
    "this trainer is GPT-NeoX (decoder) only",
}


def parse_args(argv=None):
    p = OneLineParser(prog="preprocess_data.py", description=__doc__.splitlines()[0], error_status=1)
    p.add_argument(
        "--input",
        type=path_arg,
        nargs="+",
        default=[],
        help="files/directories, also comma-separated: .jsonl[.zst|.gz|.xz], .parquet, .arrow, "
        "datasets save_to_disk folders, text files",
    )
    p.add_argument("--output-prefix", required=True, help="writes {PREFIX}_{key}_document.bin/.idx")
    p.add_argument("--tokenizer-type", required=True, help=f"one of {', '.join(TOKENIZERS)}")
    p.add_argument(
        "--vocab-file",
        "--vocab",
        type=path_arg,
        dest="vocab_file",
        default=None,
        help="tokenizer.json (HFTokenizer), .model (SPMTokenizer), vocab.json (GPT2BPETokenizer)",
    )
    p.add_argument("--merge-file", type=path_arg, default=None, help="merges.txt (GPT2BPETokenizer, HFGPT2Tokenizer)")
    p.add_argument(
        "--tokenizer-model",
        type=path_arg,
        default=None,
        help="Megatron's name for the tokenizer file (same as --vocab-file for SPM/HF models)",
    )
    p.add_argument(
        "--vocab-size",
        type=bounded(int, 1, 1 << 31, why="CharLevelTokenizer's ids are UTF-8 bytes: 256 or more holds any text"),
        default=None,
        help="CharLevelTokenizer only (default 512)",
    )
    p.add_argument(
        "--jsonl-keys",
        "--json-keys",
        dest="jsonl_keys",
        nargs="+",
        default=["text"],
        help="JSON keys / columns to tokenize (default: text); --json-keys is Megatron's name",
    )
    p.add_argument("--append-eod", action="store_true", help="append the end-of-document id to each document")
    p.add_argument("--ftfy", action="store_true", help="fix mojibake/unicode with ftfy.fix_text before tokenizing")
    p.add_argument(
        "--num-docs",
        type=bounded(int, 1, MAX_COUNT),
        default=None,
        help="expected number of documents (progress total)",
    )
    p.add_argument(
        "--log-interval", type=bounded(int, 1, MAX_COUNT), default=None, help="print a progress line every N documents"
    )
    p.add_argument("--dataset-impl", default="mmap", help="mmap (the only format written; lazy/cached refused)")
    p.add_argument(
        "--workers",
        type=bounded(int, 1, MAX_WORKERS, why="4 x the CPUs, at least 64"),
        default=1,
        help="tokenizing processes (default 1)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output dataset")
    p.add_argument("--skip-bad-lines", action="store_true", help="warn about and skip bad lines/files")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    hf = p.add_argument_group("HuggingFace datasets")
    hf.add_argument(
        "--hf-dataset",
        default=None,
        metavar="NAME_OR_PATH",
        help="datasets.load_dataset path: a hub name, a local dataset folder or script, or a "
        "builder (json, parquet, arrow, csv, text) with --hf-data-files",
    )
    hf.add_argument("--hf-subset", default=None, help="the dataset's configuration name")
    hf.add_argument(
        "--hf-split",
        default=None,
        help="split to read (default train); also for save_to_disk DatasetDict folders given to --input",
    )
    hf.add_argument("--hf-data-files", nargs="+", default=None, help="data_files for a builder")
    hf.add_argument("--hf-revision", default=None, help="hub revision (branch, tag or commit)")
    hf.add_argument("--hf-cache-dir", type=path_arg, default=None, help="datasets cache (non-streaming loads)")
    stream = hf.add_mutually_exclusive_group()
    stream.add_argument(
        "--hf-streaming",
        dest="hf_streaming",
        action="store_true",
        default=None,
        help="stream the dataset (the default: one pass, nothing cached)",
    )
    stream.add_argument(
        "--no-hf-streaming",
        dest="hf_streaming",
        action="store_false",
        help="download/convert into the datasets cache first",
    )
    mg = p.add_argument_group("Megatron-LM flags (accepted as no-ops or refused with a reason)")
    mg.add_argument("--split-sentences", action="store_true", help=argparse.SUPPRESS)
    mg.add_argument(
        "--keep-newlines", action="store_true", help="no-op: newlines are always kept (there is no sentence splitting)"
    )
    mg.add_argument("--lang", default="english", help="no-op: only used by sentence splitting")
    mg.add_argument(
        "--partitions",
        type=bounded(int, 1, 1 << 16),
        default=1,
        help="no-op: parallelism comes from --workers and the output is the same",
    )
    mg.add_argument(
        "--keep-sequential-samples", action="store_true", help="no-op: documents are always written in input order"
    )
    mg.add_argument(
        "--chunk-size", type=bounded(int, 1, MAX_COUNT), default=None, help="no-op: work is split in ~1 MB chunks"
    )
    mg.add_argument("--vocab-extra-ids", type=bounded(int, 0, 1 << 31), default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def check_args(args) -> None:
    if args.split_sentences:
        raise DataError(REFUSED["split_sentences"])
    if args.vocab_extra_ids:
        raise DataError(REFUSED["vocab_extra_ids"])
    if args.partitions < 1:
        raise DataError(f"--partitions {args.partitions}: must be >= 1")
    if args.tokenizer_model:
        if args.vocab_file and args.vocab_file != args.tokenizer_model:
            raise DataError("--tokenizer-model and --vocab-file name different files; give one of them")
        args.vocab_file = args.tokenizer_model
    if not args.input and not args.hf_dataset:
        raise DataError("no input given; pass --input FILE_OR_DIR[,...] or --hf-dataset NAME")
    if args.hf_dataset is None and (args.hf_subset or args.hf_data_files or args.hf_revision):
        raise DataError("--hf-subset/--hf-data-files/--hf-revision need --hf-dataset")


class Terminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP (a scheduler's kill, a closed terminal): unwound like Ctrl-C, so the partial
    output is removed and the worker pool shut down."""


def _raise_terminated(signum, frame):
    raise Terminated(signal.Signals(signum).name)


def unwinding_stop_signals(fn, argv=None) -> int:
    """``fn(argv)`` with SIGTERM/SIGHUP raised as :class:`Terminated` (unwound like Ctrl-C: pools shut
    down, temporaries removed); the workers are spawned, so they keep the default handlers; a
    caller's handlers come back after."""
    old = {sig: signal.signal(sig, _raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return fn(argv)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@interruptible(preload=("numpy",))
def main(argv=None) -> int:
    return unwinding_stop_signals(_main, argv)


def _main(argv=None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
        if args.merge_file and str(args.tokenizer_type).lower() in {t.lower() for t in MERGE_FILE_IGNORED}:
            print(
                f"note: --merge-file {args.merge_file} is ignored: {args.tokenizer_type} does not read a merges file "
                f"(GPT-NeoX ignores it too)"
            )
            args.merge_file = None
        for note in unused_tokenizer_args(args.tokenizer_type, args.vocab_file, args.vocab_size):
            print(clean(f"note: {note}"))  # beside the --merge-file note (stdout)
        hf = None
        if args.hf_dataset:
            hf = {
                "path": args.hf_dataset,
                "name": args.hf_subset,
                "split": args.hf_split,
                "data_files": args.hf_data_files,
                "streaming": args.hf_streaming,
                "revision": args.hf_revision,
                "cache_dir": args.hf_cache_dir,
            }
        stats = preprocess(
            args.input,
            args.output_prefix,
            args.tokenizer_type,
            args.vocab_file,
            keys=args.jsonl_keys,
            append_eod=args.append_eod,
            workers=args.workers,
            skip_bad_lines=args.skip_bad_lines,
            vocab_size=args.vocab_size,
            progress=not args.quiet,
            merge_file=args.merge_file,
            ftfy=args.ftfy,
            num_docs=args.num_docs,
            log_interval=args.log_interval,
            dataset_impl=args.dataset_impl,
            hf_dataset=hf,
            hf_split=args.hf_split,
            force=args.force,
        )
    except (DataError, OSError) as e:
        print(clean(f"error: {error_line(e)}"), file=sys.stderr)
        return 1
    except Terminated as e:
        print(clean(f"error: stopped by {e}; no output written"), file=sys.stderr)
        return 128 + int(getattr(signal, str(e)))
    except KeyboardInterrupt:
        print(clean("error: interrupted; no output written"), file=sys.stderr)
        return 130
    for key, prefix in stats.outputs.items():
        print(escaped(f"wrote {prefix}.bin/.idx ({key})"))
    print(
        f"{stats.documents} documents, {stats.tokens} tokens ({stats.dtype}), "
        f"{stats.input_bytes / 1e6:.1f} MB in {stats.seconds:.1f} s: {stats.mb_per_s:.2f} MB/s, "
        f"{stats.tokens_per_s:,.0f} tokens/s with {stats.workers} worker(s)"
        + (f"; skipped {stats.skipped} bad" if stats.skipped else "")
        + (f"; {stats.empty} empty documents left out" if stats.empty else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
