"""The HuggingFace ``tokenizers`` family: ``HFTokenizer`` (a tokenizer.json), GPT-2's byte-level
BPE from vocab.json + merges.txt (``GPT2BPETokenizer``) and GPT-NeoX's ``HFGPT2Tokenizer``."""

from __future__ import annotations

import io
import os
from typing import Optional

import numpy as np

from ..error_lines import first_line
from ..safe_files import NotJSON, excerpt, parse_json, why_not_a_file
from .errors import DataError
from .tokenizer_base import EOD_NAMES, Tokenizer, read_file


class HFTokenizer(Tokenizer):
    name = "HFTokenizer"

    def __init__(self, vocab_file: str):
        from tokenizers import Tokenizer as _HF

        self.vocab_file = vocab_file
        text = _text(vocab_file, "a tokenizers JSON file")  # capped: not read whole when huge
        try:
            self._tok = _HF.from_str(text)
        except Exception as e:  # the Rust error is multi-line JSON detail
            first = first_line(e)
            raise DataError(f"{vocab_file}: not a HuggingFace tokenizers JSON file ({first})") from None
        self._eod = next((i for i in map(self._tok.token_to_id, EOD_NAMES) if i is not None), None)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eod(self) -> int:
        if self._eod is None:
            raise DataError(
                f"{self.vocab_file}: the tokenizer has no end-of-document token (looked for {', '.join(EOD_NAMES)})"
            )
        return self._eod

    def tokenize(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)  # fast: no offsets
        return [np.asarray(e.ids, dtype=np.int64) for e in encode(texts)]

    def detokenize(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def hf_backend(self):
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as _HF

        tok = _HF.from_str(self._tok.to_str())
        if self._eod is not None:
            tok.add_special_tokens([AddedToken(self.eod_token_name, special=True, normalized=False)])
        return tok

    @property
    def eod_token_name(self) -> str:
        return self._tok.id_to_token(self.eod)


class GPT2BPETokenizer(HFTokenizer):
    """GPT-2's byte-level BPE from vocab.json + merges.txt (GPT-NeoX/Megatron ``GPT2BPETokenizer``)."""

    name = "GPT2BPETokenizer"
    split_special_tokens = True  # GPT-2's encoder never makes <|endoftext|> from text

    def __init__(self, vocab_file: str, merge_file: Optional[str]):
        self.vocab_file, self.merge_file = vocab_file, merge_file
        self._tok = _gpt2_bpe(self.name, vocab_file, merge_file)
        self._eod = self._tok.token_to_id("<|endoftext|>")
        if self._eod is None:
            raise DataError(f"{vocab_file}: vocabulary has no <|endoftext|> token ({self.name} uses it as EOD)")

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


class HFGPT2Tokenizer(HFTokenizer):
    """GPT-NeoX's ``HFGPT2Tokenizer``: ``GPT2TokenizerFast`` plus a ``<|padding|>`` token."""

    name = "HFGPT2Tokenizer"

    def __init__(self, vocab_file: str, merge_file: Optional[str]):
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as _HF

        if os.path.isdir(vocab_file):  # a from_pretrained folder
            if os.path.isfile(os.path.join(vocab_file, "tokenizer.json")):
                vocab_file = os.path.join(vocab_file, "tokenizer.json")
            elif os.path.isfile(os.path.join(vocab_file, "vocab.json")):
                merge_file = merge_file or os.path.join(vocab_file, "merges.txt")
                vocab_file = os.path.join(vocab_file, "vocab.json")
            else:
                raise DataError(f"{vocab_file}: folder has neither tokenizer.json nor vocab.json + merges.txt")
        self.vocab_file, self.merge_file = vocab_file, merge_file
        if vocab_file.endswith(".json") and merge_file is None:
            text = _text(vocab_file, "a tokenizers JSON file")
            try:
                self._tok = _HF.from_str(text)
            except Exception as e:
                first = first_line(e)
                raise DataError(
                    f"{vocab_file}: not a HuggingFace tokenizers JSON file ({first}); for a GPT-2 "
                    f"vocab.json also give --merge-file"
                ) from None
        else:
            self._tok = _gpt2_bpe(self.name, vocab_file, merge_file)
        eod = self._tok.token_to_id("<|endoftext|>")
        if eod is None:
            raise DataError(f"{vocab_file}: vocabulary has no <|endoftext|> token ({self.name} uses it as EOD)")
        self._tok.add_special_tokens(
            [
                AddedToken("<|endoftext|>", special=True, normalized=False),
                AddedToken("<|padding|>", special=True, normalized=False),
            ]
        )
        self._eod = eod
        self.pad = self._tok.token_to_id("<|padding|>")


def _text(path: str, kind: str) -> str:
    """The tokenizer file ``path`` as UTF-8 text (capped: :func:`.tokenizer_base.read_file`)."""
    raw = read_file(path, kind)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); {kind} is UTF-8 text"
        ) from None


def _gpt2_bpe(name: str, vocab_file: str, merge_file: Optional[str]):
    """GPT-2's byte-level BPE (its regex pre-split, no prefix space) as a ``tokenizers`` object."""
    from tokenizers import Tokenizer as _HF
    from tokenizers import decoders, models, pre_tokenizers

    if not merge_file:
        raise DataError(f"{name} needs merge_file (--merge-file merges.txt) next to vocab_file (vocab.json)")
    if not os.path.isfile(merge_file):
        raise DataError(f"merge_file {merge_file}: {why_not_a_file(merge_file)} ({name} needs GPT-2's merges.txt)")
    try:
        vocab = parse_json(read_file(vocab_file, "GPT-2's vocab.json"))
    except NotJSON as e:  # a syntax error, nested too deeply, a 5,000-digit integer, not UTF-8
        raise DataError(f"{vocab_file}: not a GPT-2 vocab.json ({e})") from None
    if not isinstance(vocab, dict):
        raise DataError(f"{vocab_file}: not a GPT-2 vocab.json (expected a JSON object of token -> id)")
    for token, i in vocab.items():
        if any("\ud800" <= c <= "\udfff" for c in token):  # a JSON escape such as "\ud800"
            raise DataError(f"{vocab_file}: not a GPT-2 vocab.json: token {excerpt(token)} holds a lone surrogate")
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < 1 << 32:
            shown = repr(i) if len(repr(i)) <= 40 else repr(i)[:40] + "..."
            raise DataError(
                f"{vocab_file}: not a GPT-2 vocab.json: token {excerpt(token)} has id {shown}; ids are integers "
                f"in [0, {(1 << 32) - 1:,}]"
            )
    merges = []
    text = _text(merge_file, "GPT-2's merges.txt")
    for n, line in enumerate(io.StringIO(text, newline=None), 1):  # the lines open() would give
        if (n == 1 and line.startswith("#version")) or not line.strip():
            continue
        parts = line.rstrip("\r\n").split(" ")
        if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab:
            raise DataError(f"{merge_file}:{n}: not a merges.txt line of two vocabulary tokens ({line.strip()[:40]!r})")
        merges.append((parts[0], parts[1]))
    tok = _HF(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok
