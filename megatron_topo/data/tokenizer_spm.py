"""``SPMTokenizer``: a sentencepiece ``.model`` file, and its HuggingFace ``tokenizers`` twin for
the HF export."""

from __future__ import annotations

import numpy as np

from ..error_lines import first_line
from .errors import DataError
from .tokenizer_base import Tokenizer, read_file


class SPMTokenizer(Tokenizer):
    name = "SPMTokenizer"

    def __init__(self, vocab_file: str):
        import sentencepiece as spm

        self.vocab_file = vocab_file
        raw = read_file(vocab_file, "a sentencepiece .model")  # capped: not read whole when huge
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=raw)
        except Exception as e:
            first = first_line(e)
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
