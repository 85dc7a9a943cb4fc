"""Tokenizers with GPT-NeoX's names and interface: ``vocab_size``, ``eod``, ``tokenize``, ``detokenize``.

- ``HFTokenizer``: a HuggingFace ``tokenizers`` JSON file (e.g. GPT-NeoX-20B's tokenizer.json).
- ``SPMTokenizer``: a sentencepiece ``.model`` file.
- ``ByteLevel``: no file; ids 0..255 are the UTF-8 bytes, 256 is the end-of-document id.
- ``CharLevelTokenizer``: no file; GPT-NeoX's, id = ``ord(c)``, eod 0, 512 ids by default.
"""
from __future__ import annotations

import hashlib
import os
from typing import Optional

import numpy as np

from .errors import DataError

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

    def fingerprint(self) -> dict:
        """What identifies this tokenizer's output (for cache keys)."""
        out = {"type": self.name, "vocab_size": self.vocab_size}
        if self.vocab_file:
            h = hashlib.sha256()
            with open(self.vocab_file, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out["vocab_sha256"] = h.hexdigest()
        return out


class ByteLevelTokenizer(Tokenizer):
    name = "ByteLevel"

    @property
    def vocab_size(self) -> int:
        return 257

    @property
    def eod(self) -> int:
        return 256

    def tokenize_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8", errors="replace"), np.uint8).astype(np.int64)

    def detokenize(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class CharLevelTokenizer(Tokenizer):
    name = "CharLevelTokenizer"

    def __init__(self, vocab_size: int = 512):
        self._vocab_size = int(vocab_size)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eod(self) -> int:
        return 0

    def tokenize_array(self, text: str) -> np.ndarray:
        ids = np.frombuffer(text.encode("utf-32-le", errors="replace"), np.uint32).astype(np.int64)
        if ids.size and ids.max() >= self._vocab_size:
            pos = int(np.argmax(ids >= self._vocab_size))
            raise DataError(f"CharLevelTokenizer: character {text[pos]!r} (U+{ord(text[pos]):04X}) at "
                            f"position {pos} is outside its {self._vocab_size} ids (valid: ord(c) < "
                            f"{self._vocab_size})")
        return ids

    def detokenize(self, ids) -> str:
        return "".join(chr(int(i)) for i in ids)


class HFTokenizer(Tokenizer):
    name = "HFTokenizer"

    def __init__(self, vocab_file: str):
        from tokenizers import Tokenizer as _HF

        self.vocab_file = vocab_file
        try:
            self._tok = _HF.from_file(vocab_file)
        except Exception as e:  # the Rust error is multi-line JSON detail
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DataError(f"{vocab_file}: not a HuggingFace tokenizers JSON file ({first})") from None
        self._eod = next((i for i in map(self._tok.token_to_id, EOD_NAMES) if i is not None), None)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eod(self) -> int:
        if self._eod is None:
            raise DataError(f"{self.vocab_file}: the tokenizer has no end-of-document token "
                            f"(looked for {', '.join(EOD_NAMES)})")
        return self._eod

    def tokenize(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)  # fast: no offsets
        return [np.asarray(e.ids, dtype=np.int64) for e in encode(texts)]

    def detokenize(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


class SPMTokenizer(Tokenizer):
    name = "SPMTokenizer"

    def __init__(self, vocab_file: str):
        import sentencepiece as spm

        self.vocab_file = vocab_file
        try:
            self._sp = spm.SentencePieceProcessor(model_file=vocab_file)
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DataError(f"{vocab_file}: not a sentencepiece model ({first})") from None
        eod = self._sp.piece_to_id("<|endoftext|>")
        self._eod = eod if eod != self._sp.unk_id() else self._sp.eos_id()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def eod(self) -> int:
        if self._eod < 0:
            raise DataError(f"{self.vocab_file}: the model has no <|endoftext|> piece and no eos id")
        return self._eod

    def tokenize(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def tokenize_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.int64) for ids in self._sp.encode(texts, out_type=int)]

    def detokenize(self, ids) -> str:
        return self._sp.decode([int(i) for i in ids])


TOKENIZERS = {"ByteLevel": ByteLevelTokenizer, "CharLevelTokenizer": CharLevelTokenizer,
              "HFTokenizer": HFTokenizer, "SPMTokenizer": SPMTokenizer}
_NEEDS_FILE = {"HFTokenizer": "a tokenizers JSON file such as GPT-NeoX-20B's tokenizer.json",
               "SPMTokenizer": "a sentencepiece .model file"}


def build_tokenizer(tokenizer_type: str, vocab_file: Optional[str] = None,
                    vocab_size: Optional[int] = None) -> Tokenizer:
    """Build a tokenizer by GPT-NeoX name (case-insensitive). ``vocab_size`` only applies to
    CharLevelTokenizer (default 512)."""
    names = {k.lower(): k for k in TOKENIZERS}
    name = names.get(str(tokenizer_type).lower())
    if name is None:
        raise DataError(f"tokenizer_type '{tokenizer_type}' is not valid; use one of {', '.join(TOKENIZERS)}")
    if name in _NEEDS_FILE:
        if not vocab_file:
            raise DataError(f"{name} needs vocab_file ({_NEEDS_FILE[name]})")
        if not os.path.isfile(vocab_file):
            raise DataError(f"vocab_file {vocab_file}: file not found ({name} needs {_NEEDS_FILE[name]})")
        return TOKENIZERS[name](vocab_file)
    if name == "CharLevelTokenizer":
        return CharLevelTokenizer(vocab_size or 512)
    return ByteLevelTokenizer()
