#!/usr/bin/env python
"""Train a tokenizer on a corpus: byte-level BPE (HuggingFace ``tokenizers`` JSON, GPT-NeoX-20B
style, for --tokenizer-type HFTokenizer) or sentencepiece (.model, for SPMTokenizer).

Launcher for :mod:`megatron_topo.commands.train_tokenizer` (``--help`` lists the options).
"""

from megatron_topo.commands.train_tokenizer import main

if __name__ == "__main__":
    raise SystemExit(main())
