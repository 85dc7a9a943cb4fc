"""``tools/generate.py CONFIG.yml [CONFIG2.yml ...] [--set KEY=VALUE ...]``: generation driven by
GPT-NeoX's text-generation keys (its ``configs/text_generation.yml``), the way its ``generate.py``
runs them; the files compose as for train.py (``load_config``).

* ``unconditional``: ``num_samples`` samples, each from the end-of-document token alone;
* ``input-file``: ``sample_input_file`` split at ``prompt_end``, each piece stripped, empty ones
  dropped: one sample per prompt;
* ``interactive``: prompts read from stdin until EOF (one per line, or, with another ``prompt_end``,
  lines until one holds it); each completion printed as ``Generated Text: ...``.

Samples are GPT-NeoX's JSON lines (context, text, length, finished, message, duration_seconds),
written atomically to ``sample_output_file``. A sample ends after ``maximum_tokens`` new tokens, at
the end-of-document token (not part of its text; ``finished``: true) or when the context holds
``seq_length`` tokens, as in GPT-NeoX. ``load`` names the checkpoint (``--checkpoint`` overrides);
the model is the checkpoint's, and a model key of the files that differs from it is refused."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from megatron_topo.cli import fail
from megatron_topo.error_lines import clean, escaped, first_line

FIELDS = ("context", "text", "length", "finished", "message", "duration_seconds")
MAX_INPUT_BYTES = 64 << 20
_FLAG_ONLY = {
    "prompt": "--prompt",
    "prompt_ids": "--prompt-ids",
    "max_new_tokens": "--max-new-tokens",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
}


def _ours(path: str) -> bool:
    """The file's first line is a sample record (this tool's or GPT-NeoX's generate.py's output)."""
    from megatron_topo.safe_files import NotJSON, parse_json
    from megatron_topo.safe_outputs import head

    line = head(path, 1 << 20).split(b"\n", 1)[0]
    try:
        rec = parse_json(line)
    except NotJSON:  # not JSON, nested too deeply, an integer past Python's digit limit, not UTF-8
        return False
    return isinstance(rec, dict) and set(rec) >= set(FIELDS)


def read_prompts(path: str, prompt_end: str, err) -> list[str]:
    from megatron_topo.safe_files import read_small_text, why_not_a_file

    if not os.path.isfile(path):
        raise err(f"sample_input_file {path}: {why_not_a_file(path)}")
    text = read_small_text(path, MAX_INPUT_BYTES, err, f"sample_input_file {path}")
    prompts = [p.strip() for p in text.split(prompt_end)]
    prompts = [p for p in prompts if p]
    if not prompts:
        raise err(
            f"sample_input_file {path} holds no prompt (it is split at prompt_end {prompt_end!r}, each "
            f"piece stripped, empty ones dropped)"
        )
    return prompts


def stdin_prompts(prompt_end: str, stream=None):
    """Prompts from ``stream`` until EOF, as GPT-NeoX's interactive mode reads them: a line each
    when ``prompt_end`` is a newline, else the lines up to the one holding ``prompt_end`` (joined
    by newlines, that line cut before it); text left at EOF is a last prompt."""
    stream = stream or sys.stdin
    ask = stream.isatty()
    raw = ""
    while True:
        if ask:
            print("Context prompt >>> ", end="", file=sys.stderr, flush=True)
        line = stream.readline()
        if not line:
            break
        line = line[:-1] if line.endswith("\n") else line
        if prompt_end == "\n":
            yield line
        elif prompt_end in line:
            yield raw + line.split(prompt_end)[0]
            raw = ""
        else:
            raw += line + "\n"
    if raw.strip():
        yield raw.rstrip("\n")


class Sampler:
    """One sample per context with the config's settings; one seeded generator for the whole run."""

    def __init__(self, model, tok, g, model_cfg, seed: int, err):
        import torch

        self.model, self.tok, self.g, self.err = model, tok, g, err
        self.seq, self.vocab = model_cfg.seq_length, model_cfg.vocab_size
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.greedy = g.temperature == 0 and g.top_k == 0 and g.top_p == 0  # GPT-NeoX's rule

    def sample(self, raw: str) -> dict:
        from megatron_topo.data import DataError
        from megatron_topo.model.sampling import generate_tokens

        start = time.time()
        try:
            ids = self.tok.tokenize(raw) if raw else []
        except DataError as e:  # a text the tokenizer cannot encode (e.g. CharLevel's ids below 256)
            raise self.err(f"prompt {raw[:40]!r}: {first_line(e)}") from None
        ids = ids or [self.tok.eod]  # an empty context is the end-of-document token (GPT-NeoX)
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            what = f"prompt {raw[:40]!r}: token" if raw else "an empty context is the end-of-document token, but"
            raise self.err(f"{what} {bad[0]} ({self.tok.name}) is outside the model's vocabulary 0..{self.vocab - 1}")
        room = self.seq - len(ids)
        text, new, ended, msg = None, [], False, None
        if room <= 0:
            msg = f"the context is {len(ids)} tokens and seq_length is {self.seq}: no room to generate"
        else:
            n = min(self.g.maximum_tokens or room, room)
            g = self.g
            kw = dict(temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, gen=self.gen, context=self.seq)
            new, ended = generate_tokens(self.model, ids, n, greedy=self.greedy, stop_id=self.tok.eod, **kw)
            if new:
                text = self.tok.detokenize(new)
            elif ended:
                msg = "the first generated token was the end-of-document token: no text"
        return dict(
            context=raw, text=text, length=len(new), finished=ended, message=msg, duration_seconds=time.time() - start
        )


def no_effect_notes(cfg) -> list[str]:
    """A ``note:`` line for sampling settings that do not do what their values suggest (as the
    trainer notes keys without effect). Keys a text_gen_type does not read (num_samples,
    sample_input_file...) get none: GPT-NeoX's stock text_generation.yml sets them all."""
    g = cfg.generation
    out = []
    if g.temperature == 0 and (g.top_k or g.top_p):
        knobs = " and ".join(f"{k} {getattr(g, k)}" for k in ("top_k", "top_p") if getattr(g, k))
        out.append(
            f"note: temperature 0 with {knobs} samples (temperature 0 leaves the logits undivided, as 1 would; "
            f"decoding is greedy only when temperature, top_k and top_p are all 0, as in GPT-NeoX)"
        )
    return out


def _check_model(cfg, ck, checkpoint: str, err) -> None:
    """A model key the files set must agree with the checkpoint's (whose model is the one run)."""
    from megatron_topo.config.schema import ModelConfig

    for f in dataclasses.fields(ModelConfig):
        if f.name in cfg.origin and getattr(cfg.model, f.name) != getattr(ck.model, f.name):
            raise err(
                f"{f.name} is {getattr(cfg.model, f.name)!r} in {cfg.origin[f.name]} but "
                f"{getattr(ck.model, f.name)!r} in the config.yml of checkpoint {checkpoint}; generation runs the "
                f"checkpoint's model: drop the key or load the checkpoint it describes"
            )


def main(args, err) -> int:
    from megatron_topo.commands.generate_load import check_device, load_model
    from megatron_topo.config import ConfigError, load_config
    from megatron_topo.data import DataError, build_tokenizer
    from megatron_topo.safe_outputs import check_output_file
    from megatron_topo.zero_topo.checkpoint import CheckpointError

    out = None
    try:
        given = [flag for attr, flag in _FLAG_ONLY.items() if getattr(args, attr) is not None] + (
            ["--greedy"] if args.greedy else []
        )
        if given:
            raise err(
                f"{given[0]} is for the flag interface; with config files the prompts come from "
                f"text_gen_type and the settings from maximum_tokens, temperature, top_k, top_p (or --set)"
            )
        cfg = load_config(args.configs, args.set or [], require=False)
        g = cfg.generation
        if g.text_gen_type is None:
            raise err(
                "text_gen_type is not set: give unconditional, input-file or interactive "
                "(GPT-NeoX's configs/text_generation.yml sets it)"
            )
        checkpoint = args.checkpoint or cfg.checkpoint.load
        if not checkpoint:
            raise err("no checkpoint: set load in a config file (as for GPT-NeoX's generate.py) or pass --checkpoint")
        if args.seed is not None and not -(2**63) <= args.seed < 2**64:
            raise err(f"--seed {args.seed}: must lie in [-2**63, 2**64)")
        check_device(args.device)
        prompts = None
        if g.text_gen_type == "input-file":
            if g.sample_input_file is None:
                raise err("text_gen_type input-file needs sample_input_file (one prompt per line)")
            prompts = read_prompts(g.sample_input_file, g.prompt_end, err)
            out = g.sample_output_file or g.sample_input_file + ".output.jsonl"
        elif g.text_gen_type == "unconditional":
            prompts, out = [""] * g.num_samples, g.sample_output_file
        if out is not None:
            inputs = [*args.configs, g.sample_input_file or ""]
            check_output_file(out, "sample_output_file", err, args.force, ours=_ours, inputs=inputs, artifacts=True)
        model, ck = load_model(checkpoint, args.device, args.load_unverified)
        _check_model(cfg, ck, checkpoint, err)
        # the tokenizer the files name (as GPT-NeoX), else the checkpoint's
        tok_data = (cfg if {"tokenizer_type", "vocab_file"} & set(cfg.origin) else ck).data
        try:
            tok = build_tokenizer(tok_data.tokenizer_type, tok_data.vocab_file, ck.model.vocab_size)
        except (DataError, ImportError, OSError) as e:
            raise err(f"text generation needs the tokenizer, which cannot be built ({e})") from None
        seed = args.seed if args.seed is not None else cfg.train.seed
        sampler = Sampler(model, tok, g, ck.model, seed, err)
        for line in no_effect_notes(cfg):
            print(clean(line), file=sys.stderr)
        if prompts is None:  # interactive: until EOF (Ctrl-D); Ctrl-C ends it quietly too
            refused = 0
            try:
                for raw in stdin_prompts(g.prompt_end):
                    try:
                        rec = sampler.sample(raw)
                    except err as e:  # a prompt the tokenizer or the model cannot take: said, next one
                        print(clean(f"error: {e}"), file=sys.stderr, flush=True)
                        refused += 1
                        continue
                    print("Generated Text: " + (rec["text"] or ""), flush=True)
                    if rec["message"]:
                        print(clean(f"note: {rec['message']}"), file=sys.stderr, flush=True)
            except KeyboardInterrupt:
                return 130
            return 1 if refused else 0
        lines = "".join(json.dumps(sampler.sample(p)) + "\n" for p in prompts)
        if out is not None:
            from megatron_topo import atomic

            atomic.write_text(out, lines)
    except (ConfigError, CheckpointError, err) as e:
        return fail(e)
    except OSError as e:
        return fail(e, out or "")
    if out is None:
        sys.stdout.write(lines)
        return 0
    print(escaped(f"wrote {len(prompts)} sample(s) ({g.text_gen_type}) to {out}"))
    return 0
