"""Train a tokenizer on a corpus: byte-level BPE (HuggingFace ``tokenizers`` JSON, GPT-NeoX-20B
style, for --tokenizer-type HFTokenizer) or sentencepiece (.model, for SPMTokenizer).

    python tools/train_tokenizer.py --input data/pile/00.jsonl.zst --model-type bpe \\
        --vocab-size 50000 --output data/tokenizer.json

Inputs as for preprocess_data.py (.jsonl[.zst|.gz|.xz], .parquet, .arrow, datasets save_to_disk
folders, text files, directories; comma-separated lists too). Both models get
an ``<|endoftext|>`` token (the EOD id) and reproduce any text exactly (byte-level alphabet for
BPE; byte fallback, identity normalization and no dummy prefix for sentencepiece). The output is
written atomically; bad input prints one line on stderr and exits 1.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from megatron_topo.atomic import atomic_path
from megatron_topo.cli import OneLineParser, bounded, interruptible, number, path_arg
from megatron_topo.data import DataError
from megatron_topo.data.errors import error_line
from megatron_topo.data.preprocess import expand_sources, iter_source_documents
from megatron_topo.error_lines import clean, escaped
from megatron_topo.safe_outputs import check_output_file, head

MAX_VOCAB = 1 << 24  # 16,777,216 ids: far beyond any tokenizer trained for a model (the 20B's: 50,277)

SPECIAL = ["<|endoftext|>", "<|padding|>"]
SPM_PIECE_CHARS = 2048  # documents are cut at line ends into pieces below sentencepiece's limit


def train_bpe(texts, vocab_size: int, output: str, min_frequency: int = 2) -> int:
    """Train and save a byte-level BPE tokenizer; returns the number of ids it has (below
    ``vocab_size`` when the corpus has too few pairs of at least ``min_frequency`` occurrences)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(output)
    return tok.get_vocab_size(with_added_tokens=True)


def _spm_pieces(texts):
    for text in texts:
        piece = ""
        for line in text.splitlines(keepends=True):
            if piece and len(piece) + len(line) > SPM_PIECE_CHARS:
                yield piece
                piece = ""
            piece += line[:SPM_PIECE_CHARS]
        if piece:
            yield piece


def train_sentencepiece(texts, vocab_size: int, output: str, model_type: str = "unigram") -> int:
    """Train and save a sentencepiece model; returns its number of pieces."""
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "spm")
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=_spm_pieces(texts),
                model_prefix=prefix,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=1.0,
                byte_fallback=True,
                normalization_rule_name="identity",
                add_dummy_prefix=False,
                remove_extra_whitespaces=False,
                split_digits=True,
                allow_whitespace_only_pieces=True,
                user_defined_symbols=SPECIAL[:1],
                max_sentence_length=4 * SPM_PIECE_CHARS + 16,
                input_sentence_size=2_000_000,
                shuffle_input_sentence=True,
                num_threads=os.cpu_count() or 1,
                minloglevel=2,
            )
        except (RuntimeError, OSError) as e:
            raise DataError(f"sentencepiece training failed: {str(e).splitlines()[0] if str(e) else e}") from None
        shutil.copyfile(prefix + ".model", output)
        return spm.SentencePieceProcessor(model_file=prefix + ".model").get_piece_size()


TOKENIZER_CAP = 1 << 30  # an existing --output larger than 1 GiB is no tokenizer file this tool wrote


def not_a_tokenizer(path: str, model_type: str):
    """Why the existing file ``path`` is not a tokenizer of ``model_type``'s kind (None when it is,
    and --force may replace it): bpe, a tokenizers JSON (an object with a ``model`` object);
    sentencepiece, a model sentencepiece loads. An empty file (a killed earlier write) is replaced."""
    from megatron_topo.safe_files import NotJSON, parse_json, read_small

    if not head(path, 1):
        return None
    try:
        raw = read_small(path, TOKENIZER_CAP, OSError)
    except OSError as e:
        return f"cannot be checked ({str(e)[:200]})"
    if model_type == "bpe":
        try:
            doc = parse_json(raw)
        except NotJSON:
            return "is not a tokenizers JSON file"
        if not (isinstance(doc, dict) and isinstance(doc.get("model"), dict)):
            return 'is not a tokenizers JSON file (no "model" object)'
        return None
    import sentencepiece as spm

    try:
        if spm.SentencePieceProcessor(model_proto=raw).get_piece_size() > 0:
            return None
    except (RuntimeError, OSError, ValueError, TypeError):
        pass
    return "is not a sentencepiece model"


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--input",
        type=path_arg,
        nargs="+",
        required=True,
        help=".jsonl[.zst|.gz|.xz], .parquet, .arrow, datasets folders, text files or directories",
    )
    p.add_argument("--model-type", required=True, choices=["bpe", "sentencepiece"])
    p.add_argument("--vocab-size", type=number(int), required=True)
    p.add_argument("--output", type=path_arg, required=True, help="tokenizer.json (bpe) or NAME.model (sentencepiece)")
    p.add_argument(
        "--spm-model-type", default=None, choices=["unigram", "bpe"], help="sentencepiece: its model (default unigram)"
    )
    p.add_argument(
        "--min-frequency",
        type=bounded(int, 0, 2**64 - 1, why="the tokenizers library's u64"),
        default=2,
        help="bpe: minimum pair frequency",
    )
    p.add_argument("--jsonl-keys", nargs=1, default=["text"], help="JSON key holding the text")
    p.add_argument("--skip-bad-lines", action="store_true")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing --output that is a tokenizer of the same kind (a tokenizers JSON with a "
        "model, or a sentencepiece model); any other file, and anything inside a checkpoint or a "
        "HuggingFace model folder, is never replaced",
    )
    return p.parse_args(argv)


@interruptible(preload=("numpy",))
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        smallest = 256 + len(SPECIAL) + 1 if args.model_type == "bpe" else 256 + 4 + 1
        if not smallest <= args.vocab_size <= MAX_VOCAB:
            raise DataError(
                f"--vocab-size {args.vocab_size}: must lie in [{smallest}, {MAX_VOCAB:,}] (at least the "
                f"byte alphabet plus special tokens)"
            )
        if args.min_frequency < 0:
            raise DataError(f"--min-frequency {args.min_frequency}: must be >= 0")
        if args.spm_model_type is not None and args.model_type != "sentencepiece":
            note = f"--spm-model-type {args.spm_model_type} is ignored: it applies to --model-type sentencepiece"
            print(clean(f"note: {note}"), file=sys.stderr)
        args.spm_model_type = args.spm_model_type or "unigram"
        files = expand_sources(args.input)
        check_output_file(
            args.output,
            "--output",
            DataError,
            args.force,
            inputs=[s.path for s in files],
            kind=lambda p: not_a_tokenizer(p, args.model_type),
            artifacts=True,  # never into a checkpoint or an HF export (their tokenizer.json/config.json)
        )
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        warn = lambda msg: print(clean(f"warning: {msg}"), file=sys.stderr)  # noqa: E731
        count, failure = [0], []

        def texts():  # a reading error stops training cleanly and is raised afterwards
            try:
                for text in iter_source_documents(files, tuple(args.jsonl_keys), args.skip_bad_lines, warn):
                    count[0] += 1
                    yield text
            except DataError as e:
                failure.append(e)

        with atomic_path(args.output) as tmp:  # fsynced and renamed; removed on any error
            trained, built = None, None
            try:
                if args.model_type == "bpe":
                    built = train_bpe(texts(), args.vocab_size, tmp, args.min_frequency)
                else:
                    built = train_sentencepiece(texts(), args.vocab_size, tmp, args.spm_model_type)
            except DataError as e:
                trained = e
            if failure:  # the input's fault comes first, then an empty corpus, then training errors
                raise failure[0]
            if count[0] == 0:
                raise DataError(f"no documents found in {', '.join(args.input)} (empty input)")
            if trained is not None:
                raise trained
    except (DataError, OSError) as e:
        print(clean(f"error: {error_line(e)}"), file=sys.stderr)
        return 1
    if built < args.vocab_size:
        why = f" with --min-frequency {args.min_frequency}" if args.model_type == "bpe" else ""
        warn(
            f"the tokenizer has {built:,} ids, fewer than --vocab-size {args.vocab_size:,}: the corpus "
            f"({count[0]} documents) has no more tokens to learn{why}; train on more text for a larger vocabulary"
        )
    size = f"vocab {built:,}" + (f" of {args.vocab_size:,} asked" if built != args.vocab_size else "")
    print(escaped(f"wrote {args.output} ({args.model_type}, {size}, {count[0]} documents)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
