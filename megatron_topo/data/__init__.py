"""Data pipeline: tokenizers, GPT-NeoX/Megatron mmap datasets (.bin/.idx), GPT samples, blending.

Trainer entry points: ``build_tokenizer`` and ``build_datasets``; bad input raises ``DataError``.
"""

from .blending import BlendedDataset
from .build import build_datasets
from .errors import DataError
from .gpt_dataset import GPTDataset
from .indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder
from .tokenizer import TOKENIZERS, Tokenizer, build_tokenizer

__all__ = [
    "BlendedDataset",
    "DataError",
    "GPTDataset",
    "MMapIndexedDataset",
    "MMapIndexedDatasetBuilder",
    "TOKENIZERS",
    "Tokenizer",
    "build_datasets",
    "build_tokenizer",
]
