"""Generate tokens from a zero_topo checkpoint (one process, CPU or one GPU).

    python tools/generate.py --checkpoint runs/tiny/checkpoints --prompt "def main(" --max-new-tokens 40 --greedy
    python tools/generate.py --checkpoint runs/tiny/checkpoints/global_step150 --prompt-ids 100,101,58 \\
        --max-new-tokens 8 --temperature 0.8 --top-k 40 --seed 1

Prints ``ids: ...`` (the generated token ids, space separated) and, when the checkpoint's config
names a tokenizer that can be built (``tokenizer_type``/``vocab_file``), ``text: "..."`` (JSON
quoted: one line). ``--prompt`` needs that tokenizer; ``--prompt-ids`` never does. The context is
the last ``seq_length`` tokens. Bad input prints one line on stderr and exits 2.

    python tools/generate.py configs/125M.yml text_generation.yml --set load=runs/tiny/checkpoints

reads GPT-NeoX's text-generation keys (text_gen_type, maximum_tokens, temperature, top_k, top_p,
prompt_end, num_samples, sample_input_file, sample_output_file) as its generate.py does:
:mod:`megatron_topo.commands.generate_neox`.
"""

from __future__ import annotations

import json
import sys

from megatron_topo.cli import OneLineParser, ascii_number, comma_items, fail, interruptible, number, path_arg
from megatron_topo.commands.generate_load import GenerateError, build_tokenizer_or_none, check_device, load_model
from megatron_topo.error_lines import brief, first_line

__all__ = ["GenerateError", "build_tokenizer_or_none", "check_device", "generate", "load_model", "main", "parse_ids"]


def parse_args(argv=None):
    p = OneLineParser(prog="generate.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "configs",
        type=path_arg,
        nargs="*",
        metavar="CONFIG.yml",
        help="GPT-NeoX config files with the text-generation keys (text_gen_type, maximum_tokens, "
        "temperature, top_k, top_p, ...) and load: GPT-NeoX's generate.py interface (docs/neox_compat.md)",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (with CONFIG.yml)")
    p.add_argument("--force", action="store_true", help="replace a sample_output_file this tool did not write")
    p.add_argument("--checkpoint", type=path_arg, metavar="DIR", help="save directory or global_stepN directory")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", metavar="TEXT", help="prompt text (needs the config's tokenizer)")
    src.add_argument("--prompt-ids", metavar="I,J,K", help="prompt as comma-separated token ids")
    p.add_argument(
        "--max-new-tokens", type=number(int), metavar="N", help="new tokens, at most 64 x the model's seq_length"
    )
    p.add_argument("--greedy", action="store_true", help="argmax decoding (default: sampling)")
    p.add_argument("--temperature", type=number(float), help="divide the logits by it (default 1.0)")
    p.add_argument("--top-k", type=number(int), help="sample from the k most likely tokens (default 0: all)")
    p.add_argument(
        "--top-p",
        type=number(float),
        help="sample from the smallest set of most likely tokens whose probabilities sum to >= p (default 0: all)",
    )
    p.add_argument("--seed", type=number(int), help="sampling seed (default 0; with CONFIG.yml: the config's seed)")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--load-unverified",
        action="store_true",
        help="read a checkpoint whose meta.json records no size and SHA-256 for its rank files "
        "(saved before file records existed): the bytes are not verified",
    )
    args = p.parse_intermixed_args(argv)
    if not args.configs:  # the flag interface: its required options, its defaults
        missing = [
            f for f, v in (("--checkpoint", args.checkpoint), ("--max-new-tokens", args.max_new_tokens)) if v is None
        ]
        if missing:
            p.error(f"the following arguments are required: {', '.join(missing)}")
        if args.prompt is None and args.prompt_ids is None:
            p.error("one of the arguments --prompt --prompt-ids is required")
        for flag in ("set", "force"):
            if getattr(args, flag):
                p.error(f"--{flag} goes with CONFIG.yml files (GPT-NeoX's text-generation keys)")
        given = [
            f
            for f, v in (("--temperature", args.temperature), ("--top-k", args.top_k), ("--top-p", args.top_p))
            if v is not None
        ]
        args.no_effect = given if args.greedy else []  # argmax decoding reads none of them
        args.temperature = 1.0 if args.temperature is None else args.temperature
        args.top_k = 0 if args.top_k is None else args.top_k
        args.top_p = 0.0 if args.top_p is None else args.top_p
        args.seed = 0 if args.seed is None else args.seed
    return args


MAX_NEW_TOKENS = 1 << 20  # one forward pass each: a bound that makes the run's length sane
CONTEXTS_PER_RUN = 64  # and at most 64 contexts' worth: the window slides past seq_length, each token a full pass


def check_max_new(n: int, seq_length: int) -> None:
    """The flag interface slides its window past ``seq_length`` (every new token one forward pass
    over a full context): at most ``CONTEXTS_PER_RUN`` contexts' worth of new tokens."""
    cap = min(MAX_NEW_TOKENS, CONTEXTS_PER_RUN * seq_length)
    if n > cap:
        raise GenerateError(
            f"--max-new-tokens {n:,} is more than this model generates in one run: at most {cap:,} "
            f"({CONTEXTS_PER_RUN} x seq_length {seq_length:,}; every token is one forward pass over the context)"
        )


def parse_ids(text: str, vocab: int) -> list[int]:
    if not text.strip():
        raise GenerateError("--prompt-ids is empty; give at least one token id")
    # 1,,2 or 1,2, : a token id left out, not silently skipped (cli.comma_items' rule)
    items = comma_items(text, "--prompt-ids", "comma-separated integers, e.g. 1,2,3", error=GenerateError)
    try:
        if not all(ascii_number(x) for x in items):
            raise ValueError
        ids = [int(x) for x in items]
    except ValueError:
        raise GenerateError(
            f"--prompt-ids '{brief(text, 40)}': expected comma-separated integers, e.g. 1,2,3"
        ) from None
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise GenerateError(f"--prompt-ids: token id {bad[0]} is outside the model's vocabulary 0..{vocab - 1}")
    return ids


def generate(
    model, ids: list[int], n: int, greedy: bool, temperature: float, top_k: int, seed: int, context: int, top_p=0.0
) -> list[int]:
    import torch

    from megatron_topo.model.sampling import generate_tokens

    gen = torch.Generator(device="cpu").manual_seed(seed)
    kw = dict(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, gen=gen, context=context)
    return generate_tokens(model, ids, n, **kw)[0]


def check_args(args) -> None:
    import math

    if not 0 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise GenerateError(
            f"--max-new-tokens {args.max_new_tokens}: must lie in [0, {MAX_NEW_TOKENS:,}] (2**20, "
            f"the longest seq_length a model may have)"
        )
    if not math.isfinite(args.temperature) or args.temperature <= 0:
        raise GenerateError(f"--temperature {args.temperature}: must be a finite number > 0")
    if args.top_k < 0:
        raise GenerateError(f"--top-k {args.top_k}: must be >= 0 (0: all tokens)")
    if not 0.0 <= args.top_p <= 1.0:  # NaN fails too
        raise GenerateError(f"--top-p {args.top_p}: must lie in [0, 1] (0: all tokens)")
    if not -(2**63) <= args.seed < 2**64:  # what torch.Generator.manual_seed takes
        raise GenerateError(f"--seed {args.seed}: must lie in [-2**63, 2**64)")
    check_device(args.device)


@interruptible(preload=("torch",))
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.configs:
        from megatron_topo.commands import generate_neox

        return generate_neox.main(args, GenerateError)
    from megatron_topo.data import DataError
    from megatron_topo.zero_topo.checkpoint import CheckpointError

    try:
        check_args(args)
        if args.no_effect:
            verb = "has" if len(args.no_effect) == 1 else "have"
            print(
                f"note: {', '.join(args.no_effect)} {verb} no effect with --greedy (argmax decoding): "
                f"drop {'it' if len(args.no_effect) == 1 else 'them'}, or drop --greedy to sample",
                file=sys.stderr,
            )
        model, cfg = load_model(args.checkpoint, args.device, args.load_unverified)
        check_max_new(args.max_new_tokens, cfg.model.seq_length)
        tok, why = build_tokenizer_or_none(cfg)
        if args.prompt is not None:
            if tok is None:
                raise GenerateError(
                    f"--prompt needs the checkpoint's tokenizer, which cannot be built ({why}); use --prompt-ids"
                )
            try:
                ids = tok.tokenize(args.prompt)
            except DataError as e:  # a text the tokenizer cannot encode (e.g. CharLevel's ids below 256)
                raise GenerateError(f"--prompt: {first_line(e)}") from None
            if not ids:
                raise GenerateError("--prompt is empty after tokenization")
            bad = [i for i in ids if not 0 <= i < cfg.model.vocab_size]
            if bad:
                raise GenerateError(
                    f"--prompt: token {bad[0]} ({tok.name}) is outside the model's vocabulary "
                    f"0..{cfg.model.vocab_size - 1}"
                )
        else:
            ids = parse_ids(args.prompt_ids, cfg.model.vocab_size)
        new = generate(
            model,
            ids,
            args.max_new_tokens,
            args.greedy,
            args.temperature,
            args.top_k,
            args.seed,
            cfg.model.seq_length,
            args.top_p,
        )
    except (CheckpointError, GenerateError) as e:
        return fail(e)
    print("ids: " + " ".join(map(str, new)))
    if tok is not None:
        print("text: " + json.dumps(tok.detokenize(new), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
