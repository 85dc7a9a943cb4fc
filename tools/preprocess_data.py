#!/usr/bin/env python
"""Tokenize a corpus into GPT-NeoX/Megatron mmap datasets: {PREFIX}_{key}_document.bin/.idx.

    python tools/preprocess_data.py --input data/pile/00.jsonl.zst --output-prefix data/pile \\
        --tokenizer-type HFTokenizer --vocab-file 20B_tokenizer.json --append-eod --workers 16

Inputs: .jsonl, .jsonl.zst (the Pile), plain text files (one document per file), directories.
Bad input prints one line on stderr and exits 1; existing output is never overwritten by a
failed run.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_topo.data import DataError, TOKENIZERS  # noqa: E402
from megatron_topo.data.errors import error_line  # noqa: E402
from megatron_topo.data.preprocess import preprocess  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", nargs="+", required=True, help=".jsonl, .jsonl.zst, text files or directories")
    p.add_argument("--output-prefix", required=True, help="writes {PREFIX}_{key}_document.bin/.idx")
    p.add_argument("--tokenizer-type", required=True, help=f"one of {', '.join(TOKENIZERS)}")
    p.add_argument("--vocab-file", default=None, help="tokenizer.json (HFTokenizer) or .model (SPMTokenizer)")
    p.add_argument("--vocab-size", type=int, default=None, help="CharLevelTokenizer only (default 512)")
    p.add_argument("--jsonl-keys", nargs="+", default=["text"], help="JSON keys to tokenize (default: text)")
    p.add_argument("--append-eod", action="store_true", help="append the end-of-document id to each document")
    p.add_argument("--workers", type=int, default=1, help="tokenizing processes (default 1)")
    p.add_argument("--skip-bad-lines", action="store_true", help="warn about and skip bad lines/files")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        stats = preprocess(args.input, args.output_prefix, args.tokenizer_type, args.vocab_file,
                           keys=args.jsonl_keys, append_eod=args.append_eod, workers=args.workers,
                           skip_bad_lines=args.skip_bad_lines, vocab_size=args.vocab_size,
                           progress=not args.quiet)
    except (DataError, OSError) as e:
        print(f"error: {error_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; no output written", file=sys.stderr)
        return 130
    for key, prefix in stats.outputs.items():
        print(f"wrote {prefix}.bin/.idx ({key})")
    print(f"{stats.documents} documents, {stats.tokens} tokens ({stats.dtype}), "
          f"{stats.input_bytes / 1e6:.1f} MB in {stats.seconds:.1f} s: {stats.mb_per_s:.2f} MB/s, "
          f"{stats.tokens_per_s:,.0f} tokens/s with {stats.workers} worker(s)"
          + (f"; skipped {stats.skipped} bad" if stats.skipped else "")
          + (f"; {stats.empty} empty documents left out" if stats.empty else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
