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

The interface is ``tokenizer_base``; the families are ``tokenizer_bytes`` (ByteLevel,
CharLevelTokenizer), ``tokenizer_hf`` (HFTokenizer, GPT2BPETokenizer, HFGPT2Tokenizer) and
``tokenizer_spm`` (SPMTokenizer); this module holds the registry and ``build_tokenizer`` and
re-exports them.
"""

from __future__ import annotations

import os
from typing import Optional

from ..safe_files import why_not_a_file
from .errors import DataError
from .tokenizer_base import EOD_NAMES, Tokenizer
from .tokenizer_bytes import ByteLevelTokenizer, CharLevelTokenizer
from .tokenizer_hf import GPT2BPETokenizer, HFGPT2Tokenizer, HFTokenizer
from .tokenizer_spm import SPMTokenizer

# the tokenizer classes are re-exported: callers import them from here
__all__ = [
    "EOD_NAMES",
    "MERGE_FILE_IGNORED",
    "REJECTED",
    "TOKENIZERS",
    "ByteLevelTokenizer",
    "CharLevelTokenizer",
    "GPT2BPETokenizer",
    "HFGPT2Tokenizer",
    "HFTokenizer",
    "SPMTokenizer",
    "Tokenizer",
    "build_tokenizer",
]


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


def unused_tokenizer_args(tokenizer_type: str, vocab_file: Optional[str] = None, vocab_size: Optional[int] = None):
    """The ``note:`` texts (without the prefix) for tokenizer arguments that have no effect with
    ``tokenizer_type`` (as ``--merge-file`` with CharLevelTokenizer gets one): a vocabulary size
    for a tokenizer other than CharLevelTokenizer, a vocabulary file for one that reads none. An
    unknown type gives none (building it refuses it)."""
    name = {k.lower(): k for k in TOKENIZERS}.get(str(tokenizer_type).lower())
    out = []
    if name is None:
        return out
    if vocab_size is not None and name != "CharLevelTokenizer":
        fixed = "its vocabulary comes from its file" if name in _NEEDS_FILE else "its vocabulary is fixed"
        out.append(f"--vocab-size {vocab_size} is ignored: only CharLevelTokenizer takes a size ({name}: {fixed})")
    if vocab_file and name not in _NEEDS_FILE:
        out.append(f"--vocab-file {vocab_file} is ignored: {name} reads no vocabulary file")
    return out


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
            raise DataError(f"vocab_file {vocab_file}: {why_not_a_file(vocab_file)} ({name} needs {_NEEDS_FILE[name]})")
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
