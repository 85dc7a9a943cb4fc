"""The ``generation`` section: GPT-NeoX's text-generation keys (its ``configs/text_generation.yml``),
read by ``tools/generate.py CONFIG.yml ...`` (megatron_topo/commands/generate_neox.py). Training
does not use them (GPT-NeoX's train.py ignores them too): the trainer names any it is given in a
note line. Defaults are GPT-NeoX's (neox_args.py, NeoXArgsTextgen)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .options import option

TEXT_GEN_TYPES = ("unconditional", "input-file", "interactive")
MAX_NEW_TOKENS = 1 << 20  # one forward pass each: a bound that makes a run's length sane
MAX_SAMPLES = 1 << 20


def _prompt_end(v) -> Optional[str]:
    return None if isinstance(v, str) and v else "give a non-empty string (GPT-NeoX's default: a newline)"


def _file_name(v) -> Optional[str]:
    return None if v is None or (isinstance(v, str) and v.strip()) else "give a file name, or null"


@dataclass
class GenerationConfig:
    text_gen_type: Optional[str] = option(
        None,
        "tools/generate.py CONFIG.yml: unconditional (num_samples from the end-of-document token), "
        "input-file (prompts of sample_input_file) or interactive (prompts from stdin)",
        choices=TEXT_GEN_TYPES,
        why="GPT-NeoX's t5 and precompute modes are not implemented",
        neox="implemented",
    )
    maximum_tokens: int = option(
        64,
        "new tokens per sample at most (0: until the context holds seq_length tokens); a sample also "
        "ends at the end-of-document token or at seq_length tokens in all, as in GPT-NeoX",
        ge=0,
        le=MAX_NEW_TOKENS,
        neox="implemented",
    )
    prompt_end: str = option(
        "\n",
        "where one prompt ends: sample_input_file is split at it (each piece stripped, empty ones "
        "dropped) and interactive input is read until a line holds it (GPT-NeoX's generate.py "
        "never passes it on and always uses a newline)",
        check=_prompt_end,
        neox="implemented",
    )
    temperature: float = option(
        0.0,
        "divides the logits (0: not divided; greedy decoding when temperature, top_k and top_p "
        "are all 0, as in GPT-NeoX)",
        ge=0.0,
        neox="implemented",
    )
    top_p: float = option(
        0.0,
        "nucleus sampling: the smallest set of most likely tokens whose probabilities sum to >= top_p (0: off)",
        ge=0.0,
        le=1.0,
        neox="implemented",
    )
    top_k: int = option(0, "sample from the top_k most likely tokens (0: all)", ge=0, neox="implemented")
    recompute: bool = option(
        False,
        "recompute the whole context for each new token: tools/generate.py always does (it keeps no "
        "KV cache), so false (GPT-NeoX's cached decoding) gives the same tokens",
        neox="implemented",
    )
    num_samples: int = option(1, "samples of text_gen_type unconditional", ge=1, le=MAX_SAMPLES, neox="implemented")
    sample_input_file: Optional[str] = option(
        None, "prompts of text_gen_type input-file", check=_file_name, neox="implemented"
    )
    sample_output_file: Optional[str] = option(
        "samples.txt",
        "JSON lines written by input-file and unconditional (null: input-file writes "
        "sample_input_file + '.output.jsonl', unconditional prints them)",
        check=_file_name,
        neox="implemented",
    )


def generation_settings(g: GenerationConfig) -> list[str]:
    """``key=value`` of every generation key that differs from its default (the trainer's note)."""
    import dataclasses

    return [f"{f.name}={getattr(g, f.name)!r}" for f in dataclasses.fields(g) if getattr(g, f.name) != f.default]
