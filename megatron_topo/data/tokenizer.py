"""Tokenizers with GPT-NeoX's names and interface: ``vocab_size``, ``eod``, ``tokenize``, ``detokenize``.

- ``HFTokenizer``: a HuggingFace ``tokenizers`` JSON file (e.g. GPT-NeoX-20B's tokenizer.json).
- ``SPMTokenizer``: a sentencepiece ``.model`` file.
- ``ByteLevel``: no file; ids 0..255 are the UTF-8 bytes, 256 is the end-of-document id.
- ``CharLevelTokenizer``: no file; GPT-NeoX's, ids = the text's UTF-8 bytes, eod 0, 512 ids by default.
- ``GPT2BPETokenizer``: GPT-2's byte-level BPE from ``vocab.json`` (``vocab_file``) and ``merges.txt``
  (``merge_file``), as GPT-NeoX's/Megatron's: ``<|endoftext|>`` is the EOD id and is *not*
  recognised inside text.
- ``HFGPT2Tokenizer``: GPT-NeoX's wrapper of ``GPT2TokenizerFast``: the same BPE (from vocab.json +
  merges.txt, or a folder holding them or a tokenizer.json), ``<|endoftext|>`` recognised inside
  text, plus a ``<|padding|>`` token appended when the vocabulary has none (so 50258 ids for GPT-2).

Every tokenizer can describe itself as a HuggingFace ``tokenizers`` object (``hf_backend``), which
the HF export writes as ``tokenizer.json`` (megatron_topo/model/hf.py).
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
            try:
                self._tok = _HF.from_file(vocab_file)
            except Exception as e:
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
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


def _gpt2_bpe(name: str, vocab_file: str, merge_file: Optional[str]):
    """GPT-2's byte-level BPE (its regex pre-split, no prefix space) as a ``tokenizers`` object."""
    import json

    from tokenizers import Tokenizer as _HF
    from tokenizers import decoders, models, pre_tokenizers

    if not merge_file:
        raise DataError(f"{name} needs merge_file (--merge-file merges.txt) next to vocab_file (vocab.json)")
    if not os.path.isfile(merge_file):
        raise DataError(f"merge_file {merge_file}: file not found ({name} needs GPT-2's merges.txt)")
    try:
        with open(vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
        if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
            raise ValueError("expected a JSON object of token -> id")
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{vocab_file}: not a GPT-2 vocab.json ({str(e).splitlines()[0]})") from None
    merges = []
    with open(merge_file, encoding="utf-8", errors="strict") as f:
        for n, line in enumerate(f, 1):
            if (n == 1 and line.startswith("#version")) or not line.strip():
                continue
            parts = line.rstrip("\r\n").split(" ")
            if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab:
                raise DataError(
                    f"{merge_file}:{n}: not a merges.txt line of two vocabulary tokens ({line.strip()[:40]!r})"
                )
            merges.append((parts[0], parts[1]))
    tok = _HF(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


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

    def hf_backend(self):
        """The sentencepiece model as a ``tokenizers`` object: Unigram (Viterbi with the same scores)
        or BPE (merges ranked by the merged piece's score, as sentencepiece merges), byte fallback,
        whitespace as U+2581, the model's dummy-prefix / extra-whitespace / charsmap normalization;
        control and user-defined pieces become special tokens."""
        from sentencepiece import sentencepiece_model_pb2 as pb
        from tokenizers import AddedToken, Regex, decoders, models, normalizers
        from tokenizers import Tokenizer as _HF

        m = pb.ModelProto()
        m.ParseFromString(self._sp.serialized_model_proto())
        T = pb.ModelProto.SentencePiece
        pieces = [(p.piece, p.score, p.type) for p in m.pieces]
        vocab = [(piece, score) for piece, score, _ in pieces]
        unk = self._sp.unk_id()
        kind = m.trainer_spec.model_type
        if kind == pb.TrainerSpec.UNIGRAM:
            model = models.Unigram(vocab, unk_id=unk if unk >= 0 else None, byte_fallback=m.trainer_spec.byte_fallback)
        elif kind == pb.TrainerSpec.BPE:
            ids = {piece: i for i, (piece, _, _) in enumerate(pieces)}
            normal = {piece for piece, _, t in pieces if t in (T.NORMAL, T.USER_DEFINED, T.UNUSED)}
            merges = []
            for piece in normal:
                for k in range(1, len(piece)):
                    a, b = piece[:k], piece[k:]
                    if a in ids and b in ids:
                        merges.append((ids[piece], ids[a], ids[b], a, b))
            merges.sort()
            model = models.BPE(
                vocab=ids,
                merges=[(a, b) for *_, a, b in merges],
                unk_token=pieces[unk][0] if unk >= 0 else None,
                byte_fallback=m.trainer_spec.byte_fallback,
                fuse_unk=True,
            )
        else:
            raise DataError(
                f"{self.vocab_file}: HuggingFace export supports sentencepiece unigram and bpe "
                f"models, not model_type {pb.TrainerSpec.ModelType.Name(kind)}"
            )
        tok = _HF(model)
        ns = m.normalizer_spec
        steps = []
        if ns.precompiled_charsmap:
            steps.append(normalizers.Precompiled(ns.precompiled_charsmap))
        if ns.remove_extra_whitespaces:  # sentencepiece: spaces only (not newlines or tabs)
            steps += [normalizers.Replace(Regex("\\A +| +\\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
        if ns.add_dummy_prefix:
            steps.append(normalizers.Prepend("\u2581"))
        if ns.escape_whitespaces or not ns.HasField("escape_whitespaces"):
            steps.append(normalizers.Replace(" ", "\u2581"))
        if steps:
            tok.normalizer = normalizers.Sequence(steps)
        dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if unk >= 0 and m.trainer_spec.unk_surface:  # how sentencepiece writes <unk> back (" \u2047 ")
            dec.insert(0, decoders.Replace(pieces[unk][0], m.trainer_spec.unk_surface))
        if ns.add_dummy_prefix:
            dec.append(decoders.Strip(" ", 1, 0))
        tok.decoder = decoders.Sequence(dec)
        eod = self._eod if self._eod >= 0 else None
        tok.add_special_tokens(
            [
                AddedToken(piece, special=True, normalized=False)
                for i, (piece, _, t) in enumerate(pieces)
                if t in (T.CONTROL, T.UNKNOWN) or i == eod
            ]
        )
        tok.add_tokens(
            [
                AddedToken(piece, special=False, normalized=False)
                for i, (piece, _, t) in enumerate(pieces)
                if t == T.USER_DEFINED and i != eod
            ]
        )
        return tok


TOKENIZERS = {
    "ByteLevel": ByteLevelTokenizer,
    "CharLevelTokenizer": CharLevelTokenizer,
    "HFTokenizer": HFTokenizer,
    "SPMTokenizer": SPMTokenizer,
    "GPT2BPETokenizer": GPT2BPETokenizer,
    "HFGPT2Tokenizer": HFGPT2Tokenizer,
}
_NEEDS_FILE = {
    "HFTokenizer": "a tokenizers JSON file such as GPT-NeoX-20B's tokenizer.json",
    "SPMTokenizer": "a sentencepiece .model file",
    "GPT2BPETokenizer": "GPT-2's vocab.json, with merge_file merges.txt",
    "HFGPT2Tokenizer": "GPT-2's vocab.json (with merge_file merges.txt), a tokenizer.json or a "
    "folder holding them; the hub's 'gpt2' cannot be fetched here",
}
# Other projects' names: why they are not accepted, and what to use instead.
REJECTED = {
    "tiktokentokenizer": "TiktokenTokenizer needs tiktoken's downloaded encodings; convert the encoding to a "
    "tokenizer.json and use HFTokenizer",
    "sentencepiecetokenizer": "Megatron's SentencePieceTokenizer adds its own special tokens; for a plain "
    "sentencepiece model use SPMTokenizer",
    "gptsentencepiecetokenizer": "use SPMTokenizer (EOD is <|endoftext|> if the model has it, else its eos id)",
    "llama2tokenizer": "use SPMTokenizer with the Llama tokenizer.model",
    "huggingfacetokenizer": "use HFTokenizer with the model folder's tokenizer.json as --vocab-file",
    "bertwordpiecelowercase": "BERT tokenizers are for encoder models; this trainer is GPT-NeoX (decoder) only",
    "bertwordpiececase": "BERT tokenizers are for encoder models; this trainer is GPT-NeoX (decoder) only",
    "nulltokenizer": "NullTokenizer reads pre-tokenized ids; write .bin/.idx directly with MMapIndexedDatasetBuilder",
}


# tokenizer types whose merge file GPT-NeoX's build_tokenizer ignores (a note, not an error, here)
MERGE_FILE_IGNORED = ("HFTokenizer", "SPMTokenizer", "CharLevelTokenizer")


def build_tokenizer(
    tokenizer_type: str,
    vocab_file: Optional[str] = None,
    vocab_size: Optional[int] = None,
    merge_file: Optional[str] = None,
) -> Tokenizer:
    """Build a tokenizer by GPT-NeoX name (case-insensitive). ``vocab_size`` only applies to
    CharLevelTokenizer (default 512); ``merge_file`` to GPT2BPETokenizer / HFGPT2Tokenizer."""
    names = {k.lower(): k for k in TOKENIZERS}
    name = names.get(str(tokenizer_type).lower())
    if name is None:
        why = REJECTED.get(str(tokenizer_type).lower())
        if why:
            raise DataError(f"tokenizer_type '{tokenizer_type}' is not supported: {why}")
        raise DataError(f"tokenizer_type '{tokenizer_type}' is not valid; use one of {', '.join(TOKENIZERS)}")
    if merge_file and name in MERGE_FILE_IGNORED:
        merge_file = None  # GPT-NeoX ignores it for these (its corpora.py passes it with HFTokenizer)
    elif merge_file and name not in ("GPT2BPETokenizer", "HFGPT2Tokenizer"):
        raise DataError(
            f"merge_file {merge_file}: only GPT2BPETokenizer and HFGPT2Tokenizer use a merges file, not {name}"
        )
    if name in _NEEDS_FILE:
        if not vocab_file:
            raise DataError(f"{name} needs vocab_file ({_NEEDS_FILE[name]})")
        if not (os.path.isfile(vocab_file) or (name == "HFGPT2Tokenizer" and os.path.isdir(vocab_file))):
            raise DataError(f"vocab_file {vocab_file}: file not found ({name} needs {_NEEDS_FILE[name]})")
        if name in ("GPT2BPETokenizer", "HFGPT2Tokenizer"):
            return TOKENIZERS[name](vocab_file, merge_file)
        return TOKENIZERS[name](vocab_file)
    if name == "CharLevelTokenizer":
        if vocab_size is not None and not 1 <= vocab_size <= 1 << 31:
            raise DataError(
                f"--vocab-size {vocab_size}: must lie in [1, {1 << 31:,}] (CharLevelTokenizer's ids are "
                f"UTF-8 bytes: 256 or more holds any text; default 512)"
            )
        return CharLevelTokenizer(512 if vocab_size is None else vocab_size)
    return ByteLevelTokenizer()
