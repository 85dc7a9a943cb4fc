"""Look inside a GPT-NeoX/Megatron mmap dataset (PREFIX.bin + PREFIX.idx).

    python tools/inspect_data.py data/pile_text_document --stats     # {"documents": ..., "tokens": ...}
    python tools/inspect_data.py data/pile_text_document --doc 3     # [token ids of document 3]
    python tools/inspect_data.py PREFIX --doc 3 --tokenizer-type ByteLevel   # ... and its text
    python tools/inspect_data.py PREFIX --vocab-size 50432   # every token id < the model's vocabulary?

The index is checked first; a bad dataset prints one line on stderr and exits 1.
"""

from __future__ import annotations

import json
import sys

from megatron_topo.cli import OneLineParser, bounded, interruptible, path_arg
from megatron_topo.config import MAX_VOCAB
from megatron_topo.data import DataError, MMapIndexedDataset, build_tokenizer
from megatron_topo.data.build import check_token_range
from megatron_topo.data.errors import error_line
from megatron_topo.data.tokenizer import unused_tokenizer_args
from megatron_topo.error_lines import clean


def stats(ds: MMapIndexedDataset) -> dict:
    sizes = ds.sizes
    return {
        "prefix": ds.prefix,
        "documents": ds.num_documents,
        "sequences": len(ds),
        "tokens": ds.num_tokens,
        "dtype": ds.dtype.name,
        "bin_bytes": ds.bin_size,
        "min_sequence_tokens": int(sizes.min()) if len(sizes) else 0,
        "max_sequence_tokens": int(sizes.max()) if len(sizes) else 0,
    }


MAX_DOC = 2**63 - 1  # a document index of the .idx (int64)


def unused_args(args) -> list:
    """Notes for tokenizer flags that change nothing in this combination."""
    if args.tokenizer_type is None:
        return [f"--vocab-file {args.vocab_file} is ignored without --tokenizer-type"] if args.vocab_file else []
    if args.doc is None:
        return [f"--tokenizer-type {args.tokenizer_type} is ignored without --doc (it detokenizes one document)"]
    return unused_tokenizer_args(args.tokenizer_type, args.vocab_file)


@interruptible(preload=("numpy",))
def main(argv=None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("prefix", type=path_arg, help="dataset prefix (PREFIX.bin/.idx; a .bin or .idx path also works)")
    p.add_argument(
        "--doc", type=bounded(int, 0, MAX_DOC), default=None, help="print document N's token ids as a JSON list"
    )
    p.add_argument("--stats", action="store_true", help="print counts as JSON (the default without --doc)")
    p.add_argument("--tokenizer-type", default=None, help="with --doc: also print the detokenized text")
    p.add_argument("--vocab-file", type=path_arg, default=None)
    p.add_argument(
        "--vocab-size",
        type=bounded(int, 1, MAX_VOCAB),
        default=None,
        help="scan the .bin and fail unless every token id is in [0, VOCAB_SIZE)",
    )
    args = p.parse_args(argv)
    for note in unused_args(args):  # on stderr: stdout is JSON
        print(clean(f"note: {note}"), file=sys.stderr)
    try:
        ds = MMapIndexedDataset(args.prefix)
        if args.vocab_size is not None:
            check_token_range(ds, args.vocab_size, cache=None)
        if args.stats or args.doc is None:
            print(json.dumps(stats(ds)))
        if args.doc is not None:
            if not 0 <= args.doc < ds.num_documents:
                valid = f"0..{ds.num_documents - 1}" if ds.num_documents else "none, the dataset has no documents"
                raise DataError(f"{ds.prefix}: --doc {args.doc} is out of range; valid: {valid}")
            ids = ds.document(args.doc).tolist()
            print(json.dumps(ids))
            if args.tokenizer_type:
                print(build_tokenizer(args.tokenizer_type, args.vocab_file).detokenize(ids))
    except (DataError, OSError) as e:
        print(clean(f"error: {error_line(e)}"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
