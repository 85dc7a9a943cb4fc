"""The tokenizers that need no file: ``ByteLevel`` (ids 0..255 the UTF-8 bytes, 256 the
end-of-document id) and GPT-NeoX's ``CharLevelTokenizer`` (the text's UTF-8 bytes, eod 0)."""

from __future__ import annotations

import numpy as np

from .errors import DataError
from .tokenizer_base import Tokenizer, _bytes_to_unicode


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

    split_special_tokens = True

    def hf_backend(self):
        """BPE without merges over GPT-2's byte alphabet: id of byte b is b; EOD 256."""
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as _HF

        vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
        tok = _HF(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
        assert tok.token_to_id("<|endoftext|>") == 256
        return tok


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
        # GPT-NeoX: ``np.fromstring(text, dtype=np.uint8)``, i.e. the text's UTF-8 bytes (ids 0..255)
        ids = np.frombuffer(text.encode("utf-8", errors="replace"), np.uint8).astype(np.int64)
        if ids.size and ids.max() >= self._vocab_size:
            pos = int(np.argmax(ids >= self._vocab_size))
            raise DataError(
                f"CharLevelTokenizer: byte {int(ids[pos])} at byte position {pos} of the UTF-8 text "
                f"is outside its {self._vocab_size} ids (ids are UTF-8 bytes, as GPT-NeoX's: use "
                f"--vocab-size 256 or more)"
            )
        return ids

    def detokenize(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    split_special_tokens = True  # the EOD id 0 is also byte 0: text never turns into EOD

    def hf_backend(self):
        """BPE without merges over GPT-2's byte alphabet (id of byte b is b, as here); EOD is id 0."""
        from tokenizers import Tokenizer as _HF
        from tokenizers import decoders, models, pre_tokenizers

        vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
        tok = _HF(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        return tok
