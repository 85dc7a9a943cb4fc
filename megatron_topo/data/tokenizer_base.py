"""The tokenizer interface with GPT-NeoX's names (``vocab_size``, ``eod``, ``tokenize``,
``detokenize``), its cache fingerprint and HF-export hook, and GPT-2's byte alphabet that the
byte-level tokenizers' HF export uses."""

from __future__ import annotations

import hashlib
import os
from typing import Optional

import numpy as np

EOD_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")


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
