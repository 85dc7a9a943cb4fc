"""Convert a zero_topo checkpoint into a HuggingFace ``GPTNeoXForCausalLM`` directory.

    python tools/convert_to_hf.py --checkpoint runs/tiny/checkpoints --output hf/tiny
    python -c "import transformers as t; t.GPTNeoXForCausalLM.from_pretrained('hf/tiny')"

``--checkpoint`` is a ``save`` directory (its ``latest`` step) or one ``global_stepN`` directory,
saved under any plan and world size. The output directory gets ``config.json`` (from the
checkpoint's own config.yml) and ``model.safetensors`` with the published GPT-NeoX tensor names
(``gpt_neox.*`` and ``embed_out.weight``, which transformers >= 5 maps onto ``lm_head``).
``--dtype`` picks the stored precision (default fp32: the master weights, bit for bit). A model
larger than ``--max-shard-size`` (default 5GB) is written as ``model-0000K-of-0000N.safetensors``
files + ``model.safetensors.index.json``, the layout ``save_pretrained`` writes.

The export streams: it reads one unit (layer) of master weights at a time from the memory-mapped
rank files (never the Adam moments) and writes each tensor straight into its file, so its memory
is about one unit, not the model (read_full_state would hold master + moments: ~250 GB for 20B).

The checkpoint's tokenizer (``data.tokenizer_type``/``vocab_file``/``merge_file``; override them with
``--tokenizer-type``/``--vocab-file``/``--merge-file`` if the files moved) is written too:
``tokenizer.json`` + ``tokenizer_config.json`` (and vocab.json + merges.txt or tokenizer.model),
``generation_config.json``, and bos/eos/pad ids (our EOD) in config.json, so that
``AutoTokenizer``, ``AutoModelForCausalLM`` and ``pipeline("text-generation")`` take the folder
as it is. A config tokenizer that cannot be built or has more ids than the model is left out
with a warning; an override that fails is an error.

The directory is written under a temporary name and renamed; an existing non-empty output is
never touched without ``--force``, and ``--force`` replaces only an earlier export of this tool
(export files only: config.json and weights whose safetensors metadata says ``source:
megatron_topo``, as every export carries; a user's tokenizer folder, a lone config.json, a
HuggingFace folder from elsewhere are refused, see :func:`not_an_export`); the new folder takes
the old one's place in one atomic exchange (Linux ``renameat2``; elsewhere the old one is moved
aside first and a crash in between is undone by the next conversion into that output, which also removes the hidden
temporary folders of killed conversions). Bad input prints one line on stderr and exits 2.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys

from megatron_topo.cli import OneLineParser, fail, interruptible, path_arg
from megatron_topo.commands.convert_to_hf_folders import (  # noqa: F401 (tests and tools use them from here)
    EXPORT_NAMES,
    MARKER,
    _check_own_temporary,
    _remove_marker,
    clean_stale_temporaries,
    not_an_export,
    temporary_name,
    write_marker,
)
from megatron_topo.error_lines import clean, escaped, first_line

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def parse_args(argv=None):
    p = OneLineParser(prog="convert_to_hf.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--checkpoint", type=path_arg, required=True, metavar="DIR", help="save directory or global_stepN directory"
    )
    p.add_argument(
        "--output", type=path_arg, required=True, metavar="DIR", help="HuggingFace model directory to create"
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="stored precision (default fp32)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing output directory that is an earlier export of this tool (config.json + "
        "weights it wrote); any other folder is never replaced",
    )
    p.add_argument(
        "--load-unverified",
        action="store_true",
        help="read a checkpoint whose meta.json records no size and SHA-256 for its rank files "
        "(saved before file records existed): the bytes are not verified",
    )
    p.add_argument("--tokenizer-type", default=None, help="override the checkpoint's data.tokenizer_type")
    p.add_argument("--vocab-file", type=path_arg, default=None, help="override data.vocab_file (e.g. the file moved)")
    p.add_argument(
        "--merge-file", type=path_arg, default=None, help="override data.merge_file (GPT2BPETokenizer merges.txt)"
    )
    p.add_argument(
        "--max-shard-size",
        default="5GB",
        metavar="SIZE",
        help="largest safetensors file (default 5GB; e.g. 500MB, 2GiB); a larger model is split "
        "into model-0000K-of-0000N.safetensors + model.safetensors.index.json",
    )
    return p.parse_args(argv)


def hf_config_dict(model_cfg, dtype: str, special_ids=None) -> dict:
    from megatron_topo.model.spec import spec_for

    arch, d = spec_for(model_cfg).hf_config(model_cfg)
    d["architectures"] = [arch]
    d["torch_dtype"] = DTYPES[dtype]
    d.pop("dtype", None)
    d["dtype"] = DTYPES[dtype]
    d.update(special_ids or {})  # our EOD as bos/eos (not transformers' default 2), pad
    return d


def convert(
    checkpoint: str,
    output: str,
    dtype: str = "fp32",
    force: bool = False,
    tokenizer=None,
    warn=None,
    max_shard_size="5GB",
    unverified: bool = False,
) -> str:
    """``tokenizer``: overrides {tokenizer_type, vocab_file, merge_file} of the checkpoint's data
    config. The tokenizer files are written when the tokenizer can be built and fits the model;
    otherwise ``warn`` says why (an error if ``tokenizer`` overrides were given).

    The weights stream: one unit's master weights are read at a time (never the Adam moments) and
    written into their safetensors shard, so the peak memory is about one unit, not the model."""
    import torch

    from megatron_topo.config import load_config
    from megatron_topo.model.hf import ShardedSafetensorsWriter, parse_size, to_hf_key
    from megatron_topo.safe_outputs import checkpoint_step_above
    from megatron_topo.zero_topo.checkpoint import CheckpointError, check_output_outside, load_model_config
    from megatron_topo.zero_topo.checkpoint.export import (
        check_model_table,
        check_output_parent,
        iter_checkpoint_units,
        open_checkpoint,
    )

    try:
        max_bytes = parse_size(max_shard_size)
    except ValueError as e:
        raise CheckpointError(f"--max-shard-size: {e}") from None
    check_output_outside(checkpoint, output)  # never the checkpoint, its run folder or a folder above it
    for line in clean_stale_temporaries(output):  # what a killed earlier conversion into `output` left behind
        if warn is not None:
            warn(line)
    if os.path.islink(output):
        raise CheckpointError(
            f"--output {output} is a symbolic link; it is not replaced (nor what it points to): give another path"
        )
    if os.path.exists(output) and not os.path.isdir(output):
        raise CheckpointError(f"--output {output} exists and is not a directory")
    step = checkpoint_step_above(output)
    if step is not None:
        raise CheckpointError(f"--output {output} lies inside the checkpoint folder {step}; write it elsewhere")
    if os.path.isdir(output) and os.listdir(output) and not force:
        raise CheckpointError(f"--output {output} exists and is not empty; pass --force to replace it")
    if os.path.isdir(output) and os.listdir(output):
        why = not_an_export(output)
        if why:
            raise CheckpointError(f"--output {output} {why}; it is not replaced, even with --force: write it elsewhere")
    check_output_parent(output)
    _check_own_temporary(temporary_name(output))  # before anything is read or said
    sp, meta, config_yaml = open_checkpoint(
        checkpoint, unverified, "pass --load-unverified"
    )  # fails before anything is written
    st = {"step_dir": sp, "meta": meta, "config_yaml": config_yaml}
    mcfg = load_model_config(st, lambda p: load_config([p]))
    check_model_table(sp, meta, mcfg)  # every name written is one the model has
    tdt = getattr(torch, DTYPES[dtype])
    from megatron_topo.model.spec import spec_for

    head = spec_for(mcfg).hf_head_name()
    entries = [(to_hf_key(name, head, mcfg), tuple(shape), tdt) for u in meta.units for name, _, _, shape in u.params]
    tok, special, why = _tokenizer(st, mcfg, tokenizer or {})
    if why and tokenizer and any(tokenizer.values()):
        raise CheckpointError(f"tokenizer: {why}")
    if why and warn is not None:
        warn(f"no tokenizer written ({why}); pass --tokenizer-type/--vocab-file/--merge-file to add one")
    tmp = temporary_name(output)
    _check_own_temporary(tmp)
    shutil.rmtree(tmp, ignore_errors=True)  # (only a folder a conversion marked and holding export files)
    os.makedirs(tmp)
    write_marker(tmp)
    writer = None
    try:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hf_config_dict(mcfg, dtype, special), f, indent=2, sort_keys=True)
        if tok is not None:
            from megatron_topo.model.hf import write_hf_tokenizer

            write_hf_tokenizer(tok, tmp, mcfg.vocab_size, mcfg.seq_length)
        writer = ShardedSafetensorsWriter(
            tmp, entries, max_bytes, metadata={"format": "pt", "source": "megatron_topo", "step": str(meta.step)}
        )
        for _, state, params in iter_checkpoint_units(sp, meta, keys=("master",), verify=False):
            flat = state["master"]
            for name, off, numel, shape in params:
                writer.put(to_hf_key(name, head, mcfg), flat[int(off) : int(off) + int(numel)].view(*shape))
            del state, flat  # before the next unit is read: one unit in memory at a time
        writer.close()
        writer = None
        umask = os.umask(0)
        os.umask(umask)
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o666 & ~umask)
        os.chmod(tmp, 0o777 & ~umask)
        if os.path.isdir(output):
            replace_dir(tmp, output)
        else:
            os.replace(tmp, output)
            _remove_marker(output)  # after the rename: a crash never leaves an unmarked temporary
    finally:
        if writer is not None:
            writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
    return output


def _exchange(a: str, b: str) -> bool:
    """Swap the directories ``a`` and ``b`` in one atomic step (Linux renameat2 RENAME_EXCHANGE);
    False where the kernel, libc or filesystem does not offer it."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def replace_dir(new: str, output: str) -> None:
    """Put the finished folder ``new`` in place of the folder ``output`` with no moment where
    ``output`` is missing: an atomic exchange where the system has one; elsewhere ``output`` is moved
    aside to ``new.old`` first, which :func:`clean_stale_temporaries` puts back after a crash."""
    from megatron_topo.atomic import fsync_dir

    try:
        write_marker(output)  # the previous export is ours to remove once aside (checked: export files only)
    except OSError:
        pass  # a folder we cannot write into: a crash from here on leaves it unmarked (kept, named)
    if _exchange(new, output):
        _remove_marker(output)
        fsync_dir(os.path.dirname(os.path.abspath(output)))
        shutil.rmtree(new, ignore_errors=True)  # the previous export, now under the temporary name
        return
    old = f"{new}.old"
    os.replace(output, old)
    os.replace(new, output)
    _remove_marker(output)
    fsync_dir(os.path.dirname(os.path.abspath(output)))
    shutil.rmtree(old, ignore_errors=True)


def _tokenizer(st, mcfg, overrides: dict):
    """(our tokenizer, special ids, None) or (None, None, why not)."""
    from megatron_topo.config import ConfigError, load_config
    from megatron_topo.data import DataError
    from megatron_topo.model.hf import hf_special_ids, tokenizer_from_config

    try:
        cfg = load_config([os.path.join(st["step_dir"], "config.yml")])
        tok = tokenizer_from_config(cfg, **overrides)
        if tok.vocab_size > mcfg.vocab_size:
            return None, None, f"{tok.name} has {tok.vocab_size} ids, more than the model's {mcfg.vocab_size}"
        return tok, hf_special_ids(tok), None
    except (ConfigError, DataError, ImportError, OSError) as e:
        return None, None, first_line(e)


@interruptible(preload=("torch",))
def main(argv=None) -> int:
    args = parse_args(argv)
    from megatron_topo.zero_topo.checkpoint import CheckpointError

    try:
        out = convert(
            args.checkpoint,
            args.output,
            args.dtype,
            args.force,
            tokenizer={
                "tokenizer_type": args.tokenizer_type,
                "vocab_file": args.vocab_file,
                "merge_file": args.merge_file,
            },
            max_shard_size=args.max_shard_size,
            unverified=args.load_unverified,
            warn=lambda msg: print(clean(f"warning: {msg}"), file=sys.stderr),
        )
    except (CheckpointError, OSError) as e:
        return fail(e, args.output)
    print(escaped(f"wrote {out}: {', '.join(sorted(os.listdir(out)))}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
