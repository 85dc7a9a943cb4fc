"""The tokenizer interface with GPT-NeoX's names (``vocab_size``, ``eod``, ``tokenize``,
``detokenize``), its cache fingerprint and HF-export hook, and GPT-2's byte alphabet that the
byte-level tokenizers' HF export uses."""

from __future__ import annotations

import hashlib
import os
from typing import Optional

import numpy as np

EOD_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
# A tokenizer file (tokenizer.json, vocab.json, merges.txt, a sentencepiece .model) is a few MiB;
# a larger one is refused before it is read (a 3 GiB sparse file was read and parsed for minutes).
FILE_CAP = 1 << 30


def read_file(path: str, kind: str) -> bytes:
    """The bytes of the tokenizer file ``path`` (``kind``: what it should be, e.g. "GPT-2's
    vocab.json"): a regular file of at most FILE_CAP bytes, opened non-blocking (a FIFO or device is
    refused, not waited on). A DataError line naming the file otherwise."""
    from ..safe_files import NotAFile, OverCap, _kind, read_capped
    from .errors import DataError

    try:
        return read_capped(path, FILE_CAP)
    except NotAFile as e:
        raise DataError(f"{path} is {_kind(e.mode)}, not a file; refusing to read it ({kind})") from None
    except OverCap as e:
        size = f"{e.size:,} bytes" if e.size is not None else "grew past the cap while being read"
        raise DataError(
            f"{path}: {size}; a tokenizer file ({kind}) is at most {FILE_CAP:,} bytes (1 GiB): is it the right file?"
        ) from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e}) ({kind})") from None


class Tokenizer:
    name = "Tokenizer"
    vocab_file: Optional[str] = None

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def eod(self) -> int:
        raise NotImplementedError

    def tokenize(self, text: str) -> list[int]:
        return self.tokenize_array(text).tolist()

    def tokenize_array(self, text: str) -> np.ndarray:
        """Token ids as an int64 array (the preprocessing path)."""
        return np.asarray(self.tokenize(text), dtype=np.int64)

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.tokenize_array(t) for t in texts]

    def detokenize(self, ids) -> str:
        raise NotImplementedError

    merge_file: Optional[str] = None

    def fingerprint(self) -> dict:
        """What identifies this tokenizer's output (for cache keys)."""
        out = {"type": self.name, "vocab_size": self.vocab_size}
        for key, path in (("vocab_sha256", self.vocab_file), ("merges_sha256", self.merge_file)):
            if path and os.path.isfile(path):
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                out[key] = h.hexdigest()
        return out

    # ---- HuggingFace export
    split_special_tokens = False  # True where our tokenize() never turns text into a special token

    def hf_backend(self):
        """A ``tokenizers.Tokenizer`` giving the same ids as ``tokenize`` (and the same text as
        ``detokenize``), with the EOD token registered as a special token."""
        raise NotImplementedError


def _bytes_to_unicode() -> dict:
    """GPT-2's reversible byte -> printable character table (byte-level BPE's alphabet)."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
