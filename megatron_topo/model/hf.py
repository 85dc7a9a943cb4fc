"""HF export/import helpers: name and config mapping (asked of the model spec), tokenizer files,
streaming safetensors writers."""

from __future__ import annotations

import os

from ..config.schema import ModelConfig


def _spec(cfg=None):
    from .spec import get, spec_for

    return spec_for(cfg) if cfg is not None else get("gpt_neox")


def to_hf_key(name: str, head_name: str = "embed_out", cfg=None) -> str:
    """Our parameter name -> the HF name (the spec of ``cfg``; GPT-NeoX when None). GPT-NeoX's
    ``head_name``: ``embed_out`` (the published checkpoints; transformers 5 renames it on load) or
    ``lm_head`` (transformers >= 5 module name)."""
    return _spec(cfg).to_hf_key(name, head_name)


def from_hf_key(name: str, cfg=None) -> str:
    return _spec(cfg).from_hf_key(name)


def to_hf_state_dict(state: dict, head_name: str = "embed_out", cfg=None) -> dict:
    return {to_hf_key(k, head_name, cfg): v for k, v in state.items()}


def hf_head_name(hf_model) -> str:
    """The output projection's name in an instantiated HF model."""
    return "lm_head" if hasattr(hf_model, "lm_head") else "embed_out"


def hf_config_kwargs(cfg: ModelConfig) -> dict:
    """Keyword arguments for ``transformers.GPTNeoXConfig`` describing the same model."""
    return _spec(cfg).hf_config_kwargs(cfg)


# ------------------------------------------------------------------------------ tokenizer export
PAD_NAMES = ("<|padding|>", "<pad>", "[PAD]")


def tokenizer_from_config(cfg, tokenizer_type=None, vocab_file=None, merge_file=None):
    """Our tokenizer as the checkpoint's config names it (``data.tokenizer_type`` / ``vocab_file`` /
    ``merge_file``), each overridable (files moved since training). Raises DataError."""
    from ..data import build_tokenizer

    data = cfg.data
    ttype = tokenizer_type or data.tokenizer_type
    vfile = vocab_file or getattr(data, "vocab_file", None)
    mfile = merge_file or getattr(data, "merge_file", None)
    char_vocab = cfg.model.vocab_size if str(ttype).lower() == "charleveltokenizer" else None
    return build_tokenizer(ttype, vfile, char_vocab, mfile)


def hf_special_ids(tok) -> dict:
    """bos/eos/pad for the export: GPT-NeoX uses its EOD token as both bos and eos; pad is the
    tokenizer's padding token where it has one (``<|padding|>`` in GPT-NeoX-20B's and
    HFGPT2Tokenizer's vocabularies), else EOD."""
    backend = tok.hf_backend()
    eod = tok.eod
    pad = next((i for i in map(backend.token_to_id, PAD_NAMES) if i is not None), eod)
    return {"bos_token_id": eod, "eos_token_id": eod, "pad_token_id": pad}


def write_hf_tokenizer(tok, out_dir: str, model_vocab_size: int, max_length: int) -> dict:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json
    (and the tokenizer's own source files: vocab.json + merges.txt, or tokenizer.model) so that
    ``AutoTokenizer.from_pretrained(out_dir)`` gives our ids and ``generate`` stops at our EOD.
    Returns the special ids (also to be put into config.json). Raises DataError if the tokenizer
    has more ids than the model."""
    import json
    import shutil

    from ..data import DataError

    if tok.vocab_size > model_vocab_size:
        raise DataError(f"the tokenizer ({tok.name}) has {tok.vocab_size} ids but the model only {model_vocab_size}")
    backend = tok.hf_backend()
    ids = hf_special_ids(tok)
    names = {k: backend.id_to_token(v) for k, v in ids.items()}
    backend.save(os.path.join(out_dir, "tokenizer.json"))
    special = {
        "bos_token": names["bos_token_id"],
        "eos_token": names["eos_token_id"],
        "pad_token": names["pad_token_id"],
    }
    conf = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "model_max_length": int(max_length),
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "split_special_tokens": bool(tok.split_special_tokens),
        "megatron_topo_tokenizer_type": tok.name,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(conf, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2, ensure_ascii=False)
    gen = {**ids, "_from_model_config": False}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    if tok.name in ("GPT2BPETokenizer", "HFGPT2Tokenizer") and tok.merge_file:
        shutil.copyfile(tok.vocab_file, os.path.join(out_dir, "vocab.json"))
        shutil.copyfile(tok.merge_file, os.path.join(out_dir, "merges.txt"))
    elif tok.name == "SPMTokenizer":
        shutil.copyfile(tok.vocab_file, os.path.join(out_dir, "tokenizer.model"))
    return ids


# ------------------------------------------------------------------------------ streaming export
# A checkpoint is read one unit at a time (master weights only, from memory-mapped rank files) and
# every tensor is written straight to its place in the output file, so the peak memory of an export
# is about one unit, never the model (a 20B checkpoint's master + moments are ~250 GB).
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(text) -> int:
    """``5GB`` (10**9, as transformers' ``max_shard_size``), ``500MiB``, ``1e9`` or a byte count. An
    empty or blank value, digits other than ASCII 0-9 and Unicode spaces (a no-break space) are
    refused, as for the emulator's rates."""
    import re

    from megatron_topo.cli import ascii_number
    from megatron_topo.error_lines import brief

    expect = "a size such as 5GB, 500MB, 2GiB or a number of bytes"
    if not str(text).strip(" \t\r\n"):
        raise ValueError(f"'{brief(str(text), 40)}' is empty; expected {expect}")
    if not ascii_number(text):
        raise ValueError(f"'{brief(str(text), 40)}' is not written in ASCII (digits 0-9); expected {expect}")
    m = re.fullmatch(r"[ \t]*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)[ \t]*([A-Za-z]*)[ \t]*", str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _SIZE_UNITS or not 1 <= float(m.group(1)) * _SIZE_UNITS[unit] < 1 << 60:
        raise ValueError(f"{text!r} is not a size (e.g. 5GB, 500MB, 2GiB or a number of bytes)")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


class SafetensorsWriter:
    """One ``.safetensors`` file whose tensor table is known up front (``entries``: name -> (shape,
    torch dtype)); :meth:`put` writes each tensor at its place as it comes, in any order. The
    header is what ``safetensors.torch.save_file`` writes for the same tensors (names sorted,
    compact JSON, space padded to 8 bytes), so the file is byte-identical to it."""

    def __init__(self, path: str, entries: dict, metadata: dict | None = None):
        import json

        self.path, self.entries, self.done = path, dict(entries), set()
        header, offsets, pos = {}, {}, 0
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
        for name in sorted(self.entries, key=lambda s: s.encode()):
            shape, dtype = self.entries[name]
            nbytes = _numel(shape) * _itemsize(dtype)
            header[name] = {
                "dtype": _ST_DTYPES[str(dtype).split(".")[-1]],
                "shape": [int(x) for x in shape],
                "data_offsets": [pos, pos + nbytes],
            }
            offsets[name] = pos
            pos += nbytes
        raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        raw += b" " * (-len(raw) % 8)
        self.data_start = 8 + len(raw)
        self.offsets, self.nbytes = offsets, pos
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            _pwrite_all(self.fd, len(raw).to_bytes(8, "little") + raw, 0)
            os.ftruncate(self.fd, self.data_start + pos)
        except BaseException:
            self.abort()
            raise

    def put(self, name: str, tensor) -> None:
        import torch

        shape, dtype = self.entries[name]
        if name in self.done:
            raise ValueError(f"{self.path}: tensor {name} written twice")
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{self.path}: tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
        t = tensor.detach().to(device="cpu", dtype=dtype).contiguous().reshape(-1)
        if t.numel():
            _pwrite_all(self.fd, t.view(torch.uint8).numpy(), self.data_start + self.offsets[name])
        self.done.add(name)

    def close(self) -> None:
        missing = sorted(set(self.entries) - self.done)
        if missing:
            self.abort()
            raise ValueError(f"{self.path}: {len(missing)} tensors were never written ({missing[0]}, ...)")
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = None

    def abort(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= int(x)
    return n


def _itemsize(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def _pwrite_all(fd: int, data, pos: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n


def shard_names(entries: list, max_shard_bytes: int) -> list[list[str]]:
    """Split ``entries`` (ordered ``(name, shape, dtype)``) into consecutive shards of at most
    ``max_shard_bytes`` (a larger tensor gets a shard of its own), as transformers'
    ``save_pretrained`` does."""
    shards, size = [[]], 0
    for name, shape, dtype in entries:
        n = _numel(shape) * _itemsize(dtype)
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


class ShardedSafetensorsWriter:
    """HF's sharded layout in ``out_dir``: ``model.safetensors`` when everything fits in one
    ``max_shard_bytes`` file, else ``model-0000K-of-0000N.safetensors`` + ``model.safetensors.index.json``
    (``{"metadata": {"total_size"}, "weight_map": {name: file}}``). :meth:`put` writes a tensor into
    its file as soon as it is read; a file is created at its first tensor and closed at its last,
    so tensors put in ``entries`` order keep one or two files open, however many there are."""

    def __init__(self, out_dir: str, entries: list, max_shard_bytes: int, metadata: dict | None = None):
        self.out_dir, self.metadata = out_dir, metadata
        self.table = {name: (tuple(shape), dtype) for name, shape, dtype in entries}
        if len(self.table) != len(entries):
            raise ValueError("duplicate tensor names")
        self.groups = shard_names(entries, max_shard_bytes)
        n = len(self.groups)
        self.files = (
            ["model.safetensors"] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
        )
        self.where = {m: k for k, names in enumerate(self.groups) for m in names}
        self.writers: dict = {}  # shard -> its open SafetensorsWriter
        self.finished: set = set()
        self.total_size = sum(_numel(shape) * _itemsize(dtype) for shape, dtype in self.table.values())

    def put(self, name: str, tensor) -> None:
        k = self.where[name]
        if k in self.finished:
            raise ValueError(f"{self.files[k]}: tensor {name} written twice")
        w = self.writers.get(k)
        if w is None:
            w = self.writers[k] = SafetensorsWriter(
                os.path.join(self.out_dir, self.files[k]), {m: self.table[m] for m in self.groups[k]}, self.metadata
            )
        w.put(name, tensor)
        if len(w.done) == len(w.entries):
            del self.writers[k]
            w.close()
            self.finished.add(k)

    def close(self) -> list[str]:
        import json

        missing = [self.groups[k][0] for k in range(len(self.files)) if k not in self.finished]
        if missing:
            self.abort()
            raise ValueError(f"{self.out_dir}: tensors were never written ({missing[0]}, ...)")
        if len(self.files) > 1:
            index = {
                "metadata": {"total_size": self.total_size},
                "weight_map": {m: self.files[k] for m, k in sorted(self.where.items())},
            }
            with open(os.path.join(self.out_dir, "model.safetensors.index.json"), "w") as f:
                json.dump(index, f, indent=2)
                f.write("\n")
            return self.files + ["model.safetensors.index.json"]
        return list(self.files)

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()
        self.writers.clear()
